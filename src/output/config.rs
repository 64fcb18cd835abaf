//! `[output]` in `codebox.toml`: the model-facing budget and how long and how much of
//! the cut streams is kept.

use serde::Deserialize;

use super::{Budget, KeptLimits, MIN_CHARS};
use crate::units::{parse_duration, parse_size};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("output.{key}: {why}")]
    Invalid { key: &'static str, why: String },
}

/// The section as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSection {
    /// Characters of stdout and stderr together a result carries (default 20000).
    pub budget: Option<usize>,
    /// The most a call may ask for with `output_budget` (default 200000).
    pub max_budget: Option<usize>,
    /// How long the whole streams of a cut result stay readable (default 15m).
    pub keep_for: Option<String>,
    /// Bytes of kept streams in all (default 64M); the oldest go first.
    pub keep_size: Option<String>,
}

impl OutputSection {
    pub fn settings(&self) -> Result<(Budget, KeptLimits), Error> {
        let mut budget = Budget::default();
        let mut kept = KeptLimits::default();
        if let Some(n) = self.max_budget {
            budget.max_chars = n;
        }
        if let Some(n) = self.budget {
            budget.default_chars = n;
        }
        if budget.default_chars < MIN_CHARS || budget.default_chars > budget.max_chars {
            return Err(Error::Invalid {
                key: "budget",
                why: format!(
                    "{} is not between {MIN_CHARS} and max_budget ({})",
                    budget.default_chars, budget.max_chars
                ),
            });
        }
        if let Some(v) = &self.keep_for {
            kept.ttl = parse_duration(v).map_err(|why| Error::Invalid {
                key: "keep_for",
                why,
            })?;
        }
        if let Some(v) = &self.keep_size {
            kept.max_bytes = parse_size(v)
                .map_err(|why| Error::Invalid {
                    key: "keep_size",
                    why,
                })
                .map(|b| usize::try_from(b).unwrap_or(usize::MAX))?;
        }
        Ok((budget, kept))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_bad_values() {
        let s: OutputSection = toml::from_str("").unwrap();
        assert_eq!(
            s.settings().unwrap(),
            (Budget::default(), KeptLimits::default())
        );
        let s: OutputSection = toml::from_str("budget = 5000\nkeep_for = \"2m\"").unwrap();
        let (b, k) = s.settings().unwrap();
        assert_eq!((b.default_chars, k.ttl.as_secs()), (5000, 120));
        for bad in [
            "budget = 10",
            "budget = 300000",
            "keep_for = \"soon\"",
            "keep_size = \"1T\"",
        ] {
            let s: OutputSection = toml::from_str(bad).unwrap();
            assert!(s.settings().is_err(), "{bad}");
        }
        assert!(toml::from_str::<OutputSection>("budjet = 1").is_err());
    }
}
