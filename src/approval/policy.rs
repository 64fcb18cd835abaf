//! `[approval]` as written and as checked, and the decision which call needs the user's
//! approval and why. Data only: nothing here talks to a client.
//!
//! ```toml
//! [approval]
//! require_approval = ["github__delete_*"]  # catalog names, the allowlist's globs
//! destructive = "ask"      # tools whose annotations say destructiveHint: true
//!                          # ("ask" | "allow" | "deny"; default "allow")
//! timeout = "120s"         # how long to wait for the user's answer
//! fallback = "deny"        # when the client cannot ask its user ("deny" | "allow")
//! max_questions = 10       # questions one execution may ask; past it: denied
//! ```
//!
//! `destructiveHint` is the upstream's own claim (MCP calls annotations hints, not to be
//! trusted): a tool that does not say so is not caught by `destructive`; name patterns are
//! the operator's firm control. Only an explicit `destructiveHint: true` counts (the
//! spec's default of `true` for unannotated tools would gate every tool).

use std::time::Duration;

use serde::Deserialize;

use super::{Error, Result};
use crate::proxy::AllowList;

/// Default [`ApprovalPolicy::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Default [`ApprovalPolicy::max_questions`].
pub const DEFAULT_MAX_QUESTIONS: u32 = 10;
/// The longest `timeout` accepted: a question left open longer helps nobody.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// What happens to a call of a tool annotated `destructiveHint: true`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DestructiveMode {
    /// Ask the user.
    Ask,
    /// Go ahead (unless a name pattern asks).
    #[default]
    Allow,
    /// Refuse without asking.
    Deny,
}

/// What happens when the client cannot ask its user (no elicitation capability).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    #[default]
    Deny,
    Allow,
}

impl Fallback {
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::Deny => "deny",
            Fallback::Allow => "allow",
        }
    }
}

/// `[approval]` as written; unknown keys are refused.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalSection {
    /// Catalog names (`server__tool`, `*` globs) whose calls need approval.
    #[serde(default)]
    pub require_approval: Vec<String>,
    /// What a call to a tool whose annotations say `destructiveHint: true` does: `ask`
    /// the user, `allow` it, or `deny` it (default `ask`).
    pub destructive: Option<DestructiveMode>,
    /// How long to wait for the user (`120s`, `2m`).
    pub timeout: Option<String>,
    /// What a call that needs approval does when the client cannot be asked (no
    /// elicitation support): `deny` or `allow` (default `deny`).
    pub fallback: Option<Fallback>,
    /// Questions one execution may ask (at least 1).
    pub max_questions: Option<u32>,
}

/// The checked policy every execution's gate shares.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalPolicy {
    patterns: AllowList,
    pub destructive: DestructiveMode,
    pub timeout: Duration,
    pub fallback: Fallback,
    pub max_questions: u32,
}

impl Default for ApprovalPolicy {
    fn default() -> Self {
        ApprovalPolicy {
            patterns: AllowList::none(),
            destructive: DestructiveMode::default(),
            timeout: DEFAULT_TIMEOUT,
            fallback: Fallback::default(),
            max_questions: DEFAULT_MAX_QUESTIONS,
        }
    }
}

/// Whether a call may go ahead, must be asked about, or is refused outright; the `rule`
/// says why, in words the user and the audit log read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    Nothing,
    Ask { rule: String },
    Deny { rule: String },
}

impl ApprovalPolicy {
    pub fn from_section(s: &ApprovalSection) -> Result<ApprovalPolicy> {
        let patterns = AllowList::new(&s.require_approval).map_err(|e| Error::Invalid {
            field: "require_approval",
            reason: e.to_string(),
        })?;
        let timeout = match &s.timeout {
            None => DEFAULT_TIMEOUT,
            Some(t) => {
                let d = crate::units::parse_duration(t).map_err(|reason| Error::Invalid {
                    field: "timeout",
                    reason,
                })?;
                if d.is_zero() || d > MAX_TIMEOUT {
                    return Err(Error::Invalid {
                        field: "timeout",
                        reason: format!(
                            "must be more than 0 and at most {} s",
                            MAX_TIMEOUT.as_secs()
                        ),
                    });
                }
                d
            }
        };
        let max_questions = match s.max_questions {
            Some(0) => {
                return Err(Error::Invalid {
                    field: "max_questions",
                    reason: "must be at least 1".into(),
                })
            }
            Some(n) => n,
            None => DEFAULT_MAX_QUESTIONS,
        };
        Ok(ApprovalPolicy {
            patterns,
            destructive: s.destructive.unwrap_or_default(),
            timeout,
            fallback: s.fallback.unwrap_or_default(),
            max_questions,
        })
    }

    /// Whether any tool call can need approval (else the proxy need not look).
    pub fn gates_tools(&self) -> bool {
        !self.patterns.is_empty() || self.destructive != DestructiveMode::Allow
    }

    /// The decision for a call of the catalog name `name`; `destructive` is whether the
    /// catalog lists it with `destructiveHint: true`, `None` when the catalog does not
    /// list it (its server is not ready yet: the call waits for the server, and the tool
    /// it reaches may well be destructive), which counts as destructive unless
    /// `destructive = "allow"`. A name pattern is checked first: it names the operator's
    /// rule.
    pub fn for_tool(&self, name: &str, destructive: Option<bool>) -> Need {
        if let Some(p) = self
            .patterns
            .patterns()
            .iter()
            .find(|p| crate::proxy::allowlist::glob_match(p, name))
        {
            return Need::Ask {
                rule: format!("require_approval rule \"{p}\""),
            };
        }
        if destructive.is_none() {
            let rule = "the tool is not listed yet (its server is not ready), so whether it \
                        is annotated destructiveHint: true is unknown";
            return match self.destructive {
                DestructiveMode::Allow => Need::Nothing,
                DestructiveMode::Ask => Need::Ask {
                    rule: format!("{rule} (approval destructive = \"ask\")"),
                },
                DestructiveMode::Deny => Need::Deny {
                    rule: format!(
                        "{rule} (approval destructive = \"deny\"); retry once the server is ready"
                    ),
                },
            };
        }
        if destructive == Some(true) {
            let rule = "the tool is annotated destructiveHint: true".to_string();
            return match self.destructive {
                DestructiveMode::Allow => Need::Nothing,
                DestructiveMode::Ask => Need::Ask {
                    rule: format!("{rule} (approval destructive = \"ask\")"),
                },
                DestructiveMode::Deny => Need::Deny {
                    rule: format!("{rule} (approval destructive = \"deny\")"),
                },
            };
        }
        Need::Nothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(text: &str) -> Result<ApprovalPolicy> {
        let s: ApprovalSection = toml::from_str(text).expect("parses");
        ApprovalPolicy::from_section(&s)
    }

    #[test]
    fn defaults_gate_nothing() {
        let p = policy("").unwrap();
        assert_eq!(p, ApprovalPolicy::default());
        assert!(!p.gates_tools());
        assert_eq!(p.for_tool("github__delete_repo", Some(true)), Need::Nothing);
        assert_eq!(p.timeout, Duration::from_secs(120));
        assert_eq!(p.fallback, Fallback::Deny);
        assert_eq!(p.max_questions, 10);
    }

    #[test]
    fn name_patterns_use_the_allowlist_globs_and_name_the_rule() {
        let p = policy(r#"require_approval = ["github__delete_*", "db__drop"]"#).unwrap();
        assert!(p.gates_tools());
        assert_eq!(
            p.for_tool("github__delete_repo", Some(false)),
            Need::Ask {
                rule: "require_approval rule \"github__delete_*\"".into()
            }
        );
        assert!(matches!(
            p.for_tool("db__drop", Some(false)),
            Need::Ask { .. }
        ));
        assert_eq!(p.for_tool("db__drop_all", Some(false)), Need::Nothing);
        assert_eq!(p.for_tool("github__list_repos", Some(false)), Need::Nothing);
        // A pattern wins over the annotation (it is the operator's own rule).
        assert!(matches!(
            p.for_tool("github__delete_repo", Some(true)),
            Need::Ask { rule } if rule.contains("require_approval")
        ));
    }

    #[test]
    fn destructive_hint_follows_the_setting() {
        let ask = policy(r#"destructive = "ask""#).unwrap();
        assert!(ask.gates_tools());
        assert!(matches!(
            ask.for_tool("db__drop_table", Some(true)),
            Need::Ask { rule } if rule.contains("destructiveHint")
        ));
        assert_eq!(ask.for_tool("db__read", Some(false)), Need::Nothing);
        let deny = policy(r#"destructive = "deny""#).unwrap();
        assert!(matches!(
            deny.for_tool("db__drop_table", Some(true)),
            Need::Deny { rule } if rule.contains("deny")
        ));
        let allow = policy(r#"destructive = "allow""#).unwrap();
        assert_eq!(allow.for_tool("db__drop_table", Some(true)), Need::Nothing);
    }

    /// A tool the catalog does not list yet (its server is still connecting) is called
    /// once its server is up, whatever its annotations: under `destructive = "ask"` or
    /// `"deny"` it cannot pass as harmless. It used to get `Need::Nothing`.
    #[test]
    fn an_unlisted_tool_is_not_taken_for_harmless() {
        let ask = policy(r#"destructive = "ask""#).unwrap();
        assert!(matches!(
            ask.for_tool("db__drop_table", None),
            Need::Ask { rule } if rule.contains("not listed yet")
        ));
        let deny = policy(r#"destructive = "deny""#).unwrap();
        assert!(matches!(
            deny.for_tool("db__drop_table", None),
            Need::Deny { rule } if rule.contains("retry once the server is ready")
        ));
        let allow = policy(r#"destructive = "allow""#).unwrap();
        assert_eq!(allow.for_tool("db__drop_table", None), Need::Nothing);
        // Nothing configured: nothing asked.
        assert_eq!(policy("").unwrap().for_tool("db__x", None), Need::Nothing);
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        let e = policy(r#"require_approval = ["github delete"]"#).unwrap_err();
        assert!(
            e.to_string().starts_with("approval.require_approval:"),
            "{e}"
        );
        let e = policy(r#"timeout = "0s""#).unwrap_err();
        assert!(e.to_string().contains("approval.timeout"), "{e}");
        let e = policy(r#"timeout = "2h""#).unwrap_err();
        assert!(e.to_string().contains("at most 3600"), "{e}");
        let e = policy("max_questions = 0").unwrap_err();
        assert!(e.to_string().contains("max_questions"), "{e}");
        let t = policy(r#"timeout = "2s""#).unwrap();
        assert_eq!(t.timeout, Duration::from_secs(2));
        let unknown = toml::from_str::<ApprovalSection>("require = [\"x\"]").unwrap_err();
        assert!(unknown.to_string().contains("require"), "{unknown}");
        let bad = toml::from_str::<ApprovalSection>("fallback = \"ask\"").unwrap_err();
        assert!(bad.to_string().contains("ask"), "{bad}");
    }
}
