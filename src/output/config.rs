//! `[output]` in `codebox.toml`: the model-facing budget, how long and how much of the
//! cut streams and output files is kept, and the bounds on output files.

use serde::Deserialize;

use super::{Budget, KeptLimits, OutFilesLimits, MIN_CHARS};
use crate::units::{parse_duration, parse_size};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("output.{key}: {why}")]
    Invalid { key: &'static str, why: String },
}

/// The section as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputSection {
    /// Characters of stdout and stderr together a result carries (default 20000).
    pub budget: Option<usize>,
    /// The most a call may ask for with `output_budget` (default 200000).
    pub max_budget: Option<usize>,
    /// How long the whole streams of a cut result stay readable (default 15m).
    pub keep_for: Option<String>,
    /// Bytes of kept streams and files in all (default 64M); the oldest go first.
    pub keep_size: Option<String>,
    /// Output files returned per execution (default 50); the rest are counted.
    pub max_files: Option<usize>,
    /// Bytes of output files per execution, all together (default 16M).
    pub files_size: Option<String>,
    /// Bytes of images shown inline in one result, all together (default 512K; at most
    /// 640K, so that a result stays within one MCP message); others become links.
    pub images_size: Option<String>,
}

/// What the section sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputSettings {
    pub budget: Budget,
    pub kept: KeptLimits,
    pub files: OutFilesLimits,
}

/// The most image bytes one result may show inline (base64 of it, with the text and
/// structuredContent, stays within the wire budget of a message).
const MAX_IMAGES_BYTES: u64 = 640 << 10;

impl OutputSection {
    pub fn settings(&self) -> Result<OutputSettings, Error> {
        let mut budget = Budget::default();
        let mut kept = KeptLimits::default();
        let mut files = OutFilesLimits::default();
        let size =
            |key: &'static str, v: &str| parse_size(v).map_err(|why| Error::Invalid { key, why });
        if let Some(n) = self.max_files {
            if n == 0 || n > 1000 {
                return Err(Error::Invalid {
                    key: "max_files",
                    why: format!("{n} is not between 1 and 1000"),
                });
            }
            files.max_files = n;
        }
        if let Some(v) = &self.files_size {
            files.max_bytes = usize::try_from(size("files_size", v)?).unwrap_or(usize::MAX);
        }
        if let Some(v) = &self.images_size {
            let n = size("images_size", v)?;
            if n > MAX_IMAGES_BYTES {
                return Err(Error::Invalid {
                    key: "images_size",
                    why: format!("{n} bytes is more than {MAX_IMAGES_BYTES}: a result must fit in one MCP message"),
                });
            }
            files.image_bytes = n as usize;
        }
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
        Ok(OutputSettings {
            budget,
            kept,
            files,
        })
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
            OutputSettings {
                budget: Budget::default(),
                kept: KeptLimits::default(),
                files: OutFilesLimits::default(),
            }
        );
        let s: OutputSection = toml::from_str(
            "budget = 5000\nkeep_for = \"2m\"\nmax_files = 5\nfiles_size = \"1M\"\nimages_size = \"100K\"",
        )
        .unwrap();
        let o = s.settings().unwrap();
        assert_eq!((o.budget.default_chars, o.kept.ttl.as_secs()), (5000, 120));
        assert_eq!(
            (o.files.max_files, o.files.max_bytes, o.files.image_bytes),
            (5, 1 << 20, 100 << 10)
        );
        for bad in [
            "budget = 10",
            "budget = 300000",
            "keep_for = \"soon\"",
            "keep_size = \"1T\"",
            "max_files = 0",
            "max_files = 100000",
            "files_size = \"lots\"",
            "images_size = \"1M\"",
        ] {
            let s: OutputSection = toml::from_str(bad).unwrap();
            assert!(s.settings().is_err(), "{bad}");
        }
        assert!(toml::from_str::<OutputSection>("budjet = 1").is_err());
    }
}
