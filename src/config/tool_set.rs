//! Which of codebox's own tools `tools/list` offers: the `tools` setting.
//!
//! - `full` (the default): every tool.
//! - `minimal`: only what a model needs to run code and find upstream tools —
//!   `execute_python`, `execute_typescript` and `search_tools` — for clients whose
//!   context is tight. Skills and health stay reachable from sandboxed code
//!   (`codebox.save_skill(...)`, `codebox.list_skills()`, `codebox.health()`, and the
//!   TypeScript `saveSkill`/`listSkills`/`health`, see `sandbox_methods`) and, with the
//!   caller's sessions, as resources (`codebox://skills/...`, `codebox://health`,
//!   `codebox://sessions`). The execute tools list fewer arguments
//!   ([`MINIMAL_HIDDEN_ARGUMENTS`]: still accepted, just not advertised) and say how to
//!   reach skills from code. A call to a hidden tool is refused with an error naming the
//!   setting.

use std::str::FromStr;

/// The `tools` setting.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ToolSet {
    /// Every tool.
    #[default]
    Full,
    /// The execute tools and `search_tools`.
    Minimal,
}

/// The tools `tools = "minimal"` offers.
pub const MINIMAL_TOOLS: [&str; 3] = ["execute_python", "execute_typescript", "search_tools"];

/// Why a setting's value is not a tool set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tools must be \"full\" or \"minimal\", not {0:?}")]
pub struct UnknownToolSet(String);

impl FromStr for ToolSet {
    type Err = UnknownToolSet;

    fn from_str(s: &str) -> Result<ToolSet, UnknownToolSet> {
        match s.trim() {
            "full" => Ok(ToolSet::Full),
            "minimal" => Ok(ToolSet::Minimal),
            other => Err(UnknownToolSet(other.to_string())),
        }
    }
}

impl std::fmt::Display for ToolSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ToolSet::Full => "full",
            ToolSet::Minimal => "minimal",
        })
    }
}

impl ToolSet {
    /// Whether `tools/list` offers the tool `name`.
    pub fn offers(self, name: &str) -> bool {
        self == ToolSet::Full || MINIMAL_TOOLS.contains(&name)
    }
}
