//! Personal data (PII) in what codebox hands back to the model: detected, replaced by
//! stable tokens such as `[EMAIL_1]`, and restored only on the way to upstream tools.
//!
//! # Modes ([`PiiMode`])
//!
//! - `off`: nothing is detected or replaced.
//! - `output`: everything codebox returns to the model (program stdout and stderr,
//!   `structuredContent`, tool error messages, records of tool calls) is tokenized; tokens
//!   in the arguments that sandboxed code sends to upstream tools are restored to the real
//!   values before the call leaves codebox. The sandbox itself sees real tool results.
//! - `strict`: as `output`, and tool results are also tokenized before they enter the
//!   sandbox, so the sandboxed program only ever handles tokens.
//!
//! # Where it is applied
//!
//! The proxy (`crate::proxy`, the sandbox's tool channel) calls [`Vault::restore_json`] on
//! the arguments of each `tools/call` and, in `strict` mode, [`Vault::tokenize_json`] on
//! each result. The server (`crate::server`) calls [`Vault::tokenize`] and
//! [`Vault::tokenize_json`] on everything it sends back to the model. One [`Vault`] lives
//! per session, so the same value keeps its token across executions of a session; the
//! compiled [`Detector`] is built once from the configuration and shared.
//!
//! # Tokens
//!
//! `[<LABEL>_<n>]`, `n` counting from 1 per label in each vault: `[EMAIL_1]`, `[PHONE_2]`,
//! `[EMPLOYEE_ID_1]` for a custom label. The same raw value gets the same token (emails
//! compared without regard to case; they restore to the first spelling seen). A vault
//! holds at most [`MAX_ENTRIES`] values; beyond that new values become
//! `[<LABEL>_REDACTED]`, which restores to nothing. Detection runs again over its own
//! output until it settles (a value glued to one that became a token is free then); a
//! text that has not settled after a bounded number of rounds is redacted whole, as one
//! `[<LABEL>_REDACTED]`: never a value in clear. Text shaped like a token is never
//! tokenized again, and [`Vault::restore`] replaces only tokens its own vault issued.
//!
//! # The never-logged rule
//!
//! Raw values exist only inside a vault's map and in the restored arguments that go
//! upstream. They must never reach a log, a `tracing` field, an error message or a
//! `Debug` impl: [`Vault`]'s `Debug` prints counts only and [`Match`] holds offsets, not
//! text. There is no way to ask a vault for a value by token other than restoring tool
//! arguments, so nothing the model can call turns a token back into the value.
//!
//! # Layout
//!
//! - `detectors`: [`Detector`]: the built-in and custom detectors and how overlapping
//!   matches are resolved
//! - `scan`: the built-in detectors, one function each (regex candidates, then checks)
//! - `validate`: check digits (Luhn, ISO 13616 mod-97), SSN and NANP rules, boundaries
//! - `vault`: [`Vault`]: one session's token map
//!
//! Every detector uses the `regex` crate (finite automata, linear time), so hostile
//! output cannot stall the supervisor.

mod detectors;
mod scan;
mod validate;
mod vault;

#[cfg(test)]
mod detectors_tests;
#[cfg(test)]
mod vault_tests;

use std::fmt;
use std::str::FromStr;

pub use detectors::Detector;
pub use vault::Vault;

/// Most values one [`Vault`] holds; later new values are replaced by
/// `[<LABEL>_REDACTED]`.
pub const MAX_ENTRIES: usize = 100_000;

/// The labels of the built-in detectors, in the order they take precedence.
pub const BUILTIN_LABELS: [&str; 7] = ["EMAIL", "PHONE", "SSN", "CARD", "IPV4", "IPV6", "IBAN"];

/// Whether and where PII is replaced by tokens (see the module documentation).
/// Ordered from weakest to strictest.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum PiiMode {
    /// Nothing is detected or replaced.
    #[default]
    Off,
    /// What goes back to the model is tokenized; tool arguments are restored.
    Output,
    /// As `Output`, and tool results are tokenized before they enter the sandbox.
    Strict,
}

impl PiiMode {
    fn as_str(self) -> &'static str {
        match self {
            PiiMode::Off => "off",
            PiiMode::Output => "output",
            PiiMode::Strict => "strict",
        }
    }
}

impl fmt::Display for PiiMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PiiMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<PiiMode> {
        match s {
            "off" => Ok(PiiMode::Off),
            "output" => Ok(PiiMode::Output),
            "strict" => Ok(PiiMode::Strict),
            other => Err(Error::BadMode(other.to_string())),
        }
    }
}

/// A detector from the configuration: values matching `regex` become `[<label>_<n>]`.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, schemars::JsonSchema)]
pub struct CustomPattern {
    /// `^[A-Z][A-Z0-9_]{0,31}$`, not one of [`BUILTIN_LABELS`], e.g. `EMPLOYEE_ID`.
    pub label: String,
    /// A `regex` crate pattern; it must not match the empty string.
    pub regex: String,
}

/// One detected value: byte offsets into the text searched, never the text itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    /// The detector's label, e.g. `EMAIL` or a custom label.
    pub kind: String,
    pub start: usize,
    pub end: usize,
}

/// Why a PII configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("PII mode {0:?} is not one of \"off\", \"output\", \"strict\"")]
    BadMode(String),
    #[error("custom PII label {label:?} {reason}")]
    BadLabel { label: String, reason: &'static str },
    #[error("custom PII pattern {label}: regex {regex:?} does not compile: {error}")]
    BadRegex {
        label: String,
        regex: String,
        error: regex::Error,
    },
    #[error(
        "custom PII pattern {label}: regex compiles to more than {limit} bytes; make it smaller"
    )]
    RegexTooBig { label: String, limit: usize },
    #[error(
        "custom PII pattern {label}: regex {regex:?} matches the empty string; it must match at least one character"
    )]
    MatchesEmpty { label: String, regex: String },
}

type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_parses_and_explains() {
        assert_eq!("off".parse::<PiiMode>().unwrap(), PiiMode::Off);
        assert_eq!("output".parse::<PiiMode>().unwrap(), PiiMode::Output);
        assert_eq!("strict".parse::<PiiMode>().unwrap(), PiiMode::Strict);
        assert_eq!(PiiMode::default(), PiiMode::Off);
        let err = "Strict".parse::<PiiMode>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "PII mode \"Strict\" is not one of \"off\", \"output\", \"strict\""
        );
    }

    #[test]
    fn mode_serde_is_lowercase() {
        for mode in [PiiMode::Off, PiiMode::Output, PiiMode::Strict] {
            let json = serde_json::to_string(&mode).unwrap();
            assert_eq!(json, format!("\"{mode}\""));
            assert_eq!(serde_json::from_str::<PiiMode>(&json).unwrap(), mode);
        }
        assert!(serde_json::from_str::<PiiMode>("\"Output\"").is_err());
    }

    #[test]
    fn custom_pattern_deserializes() {
        let p: CustomPattern =
            serde_json::from_str(r#"{"label": "EMPLOYEE_ID", "regex": "E-[0-9]{6}"}"#).unwrap();
        assert_eq!(
            p,
            CustomPattern {
                label: "EMPLOYEE_ID".into(),
                regex: "E-[0-9]{6}".into()
            }
        );
    }
}
