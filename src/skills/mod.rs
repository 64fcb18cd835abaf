//! Skills: reusable code the agent saves once and imports in later executions.
//!
//! # Layout on the host
//!
//! A [`SkillStore`] is one directory of skills:
//!
//! ```text
//! <dir>/
//!   foo/                 one directory per skill, named after it (0755)
//!     SKILL.md           front matter (name, description, language) + usage markdown (0644)
//!     skill.py           the code: skill.py for Python, skill.ts for TypeScript (0644)
//!     __init__.py        Python only: `from .skill import *` (0644)
//!   .tmp-3f9c…/          a save or delete in progress (removed by the next `open`)
//! ```
//!
//! [`ClientSkills`] keeps one store per client below the skills root, the operator's
//! read-only shared store, and per client the view its sandboxes bind read-only at
//! `/skills` (see `clients` for the layout and the rules). Python imports a skill as
//! `from skills import foo` (a rootfs symlink makes `/skills` the package `skills`; the
//! `__init__.py` re-exports the module, so `from skills.foo import bar` works too) and
//! TypeScript as `import * as foo from "/skills/foo/skill.ts"`. Before a save the code is
//! compiled in a sandbox (`check`).
//!
//! # Guarantees
//!
//! - Names match `^[a-z][a-z0-9_]{0,63}$` and are neither Python nor JavaScript keywords,
//!   so a name is never a path trick (`..`, `/`, NUL, dot files) and always a valid import
//!   ([`name`]).
//! - Saves are atomic: the whole skill directory is built and fsynced under a `.tmp-*`
//!   name, then swapped in with `renameat2(RENAME_EXCHANGE)` (or renamed, when new). A
//!   reader sees the old skill or the new one, never a mix; deletes rename the directory
//!   away before removing it.
//! - Saves and deletes are serialised by a mutex in the store and, between processes
//!   sharing a root, by an `flock` on the root directory.
//! - Reads never follow a symlink below the root: entries are opened with `O_NOFOLLOW`
//!   relative to the root's descriptor and must be plain directories and regular files;
//!   anything else makes the skill [`Error::Corrupt`]. The root may be writable by the
//!   user on the host, while sandboxes only ever see it read-only.
//!
//! # Files
//!
//! - [`name`]: the name rules
//! - `clients`: [`ClientSkills`], per-client stores, the shared set, the views
//! - [`check`]: the syntax-check programs and their verdicts
//! - `frontmatter`: reading and writing `SKILL.md`
//! - `usage`: the default usage text of a skill saved without one
//! - `store`: [`SkillStore`], the directory on disk

use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub mod check;
mod clients;
mod frontmatter;
pub mod name;
mod store;
mod usage;

#[cfg(test)]
mod clients_tests;
#[cfg(test)]
mod tests;

pub use clients::{owner_of, ClientSkills, ListedSkill, Origin};
pub use store::SkillStore;

/// Largest accepted code, in bytes.
pub const MAX_CODE_BYTES: usize = 256 * 1024;
/// Largest accepted description, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 1024;
/// Largest accepted usage text, in bytes.
pub const MAX_USAGE_BYTES: usize = 16 * 1024;
/// At most this many skills exist in one store.
pub const MAX_SKILLS: usize = 1000;

/// The language a skill is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SkillLanguage {
    #[serde(alias = "py")]
    Python,
    #[serde(alias = "ts")]
    Typescript,
}

impl SkillLanguage {
    /// The lower-case name used in `SKILL.md` and in the tools: `python` or `typescript`.
    pub fn as_str(self) -> &'static str {
        match self {
            SkillLanguage::Python => "python",
            SkillLanguage::Typescript => "typescript",
        }
    }

    /// The file holding the code: `skill.py` or `skill.ts`.
    pub fn code_file(self) -> &'static str {
        match self {
            SkillLanguage::Python => "skill.py",
            SkillLanguage::Typescript => "skill.ts",
        }
    }

    /// The relative paths of a skill's files in this language, as exposed to clients.
    pub fn files(self) -> &'static [&'static str] {
        match self {
            SkillLanguage::Python => &["SKILL.md", "skill.py"],
            SkillLanguage::Typescript => &["SKILL.md", "skill.ts"],
        }
    }

    /// How code in a sandbox imports the skill `name`.
    pub fn import_line(self, name: &str) -> String {
        match self {
            SkillLanguage::Python => format!("from skills import {name}"),
            SkillLanguage::Typescript => {
                format!("import * as {name} from \"/skills/{name}/skill.ts\"")
            }
        }
    }
}

impl std::fmt::Display for SkillLanguage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SkillLanguage {
    type Err = Error;

    /// Accepts `python`, `typescript`, `py` and `ts`, in any case.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "python" | "py" => Ok(SkillLanguage::Python),
            "typescript" | "ts" => Ok(SkillLanguage::Typescript),
            _ => Err(Error::Invalid {
                field: "language",
                why: format!("{s:?} is not a skill language: use \"python\" or \"typescript\""),
            }),
        }
    }
}

/// A skill to save (create or replace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSkill {
    /// See [`name::validate`].
    pub name: String,
    /// One line, at most [`MAX_DESCRIPTION_BYTES`]; surrounding whitespace is trimmed.
    pub description: String,
    pub language: SkillLanguage,
    /// At most [`MAX_CODE_BYTES`], no NUL.
    pub code: String,
    /// Markdown telling how to use the skill, at most [`MAX_USAGE_BYTES`]; when absent or
    /// blank, a short text with the import line and the description is generated.
    pub usage: Option<String>,
}

/// A skill as listed: no code, no usage.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SkillSummary {
    pub name: String,
    pub description: String,
    pub language: SkillLanguage,
}

/// A saved skill in full.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Skill {
    pub name: String,
    pub description: String,
    pub language: SkillLanguage,
    /// The markdown body of `SKILL.md`.
    pub usage: String,
    pub code: String,
    /// How to import it, e.g. `from skills import foo` or
    /// `import * as foo from "/skills/foo/skill.ts"`.
    pub import: String,
}

/// Errors of the skills store. The messages are written for the model that called the
/// tool: each says what was wrong and what to do instead.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("skill name {name:?} is invalid: {why}")]
    BadName { name: String, why: String },
    #[error("skill {field} is invalid: {why}")]
    Invalid { field: &'static str, why: String },
    #[error("skill {field} is {size} bytes, over the limit of {max} bytes")]
    TooLarge {
        field: &'static str,
        size: usize,
        max: usize,
    },
    #[error(
        "there are already {max} skills, the limit: delete unused ones with delete_skill \
         before saving a new one"
    )]
    TooMany { max: usize },
    #[error("no skill named {name:?}: list_skills shows the saved skills")]
    NotFound { name: String },
    #[error("skill {name:?} has no file {file:?}: its files are {}", files.join(", "))]
    NoSuchFile {
        name: String,
        file: String,
        files: Vec<String>,
    },
    #[error("skill {name:?} is corrupt: {why}; save it again or delete it with delete_skill")]
    Corrupt { name: String, why: String },
    #[error(
        "skill {name:?} is shared by the operator and read-only: cannot {doing} it; save \
         your own under another name"
    )]
    ReadOnly { name: String, doing: &'static str },
    #[error("the {language} code of skill {name:?} does not compile:\n{message}")]
    Syntax {
        name: String,
        language: SkillLanguage,
        message: String,
    },
    #[error("cannot {doing} {}", path.display())]
    Io {
        doing: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// True for a missing skill or a missing file of a skill ([`Error::NotFound`],
    /// [`Error::NoSuchFile`]).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. } | Error::NoSuchFile { .. })
    }
}

/// Result of the skills store.
pub type Result<T, E = Error> = std::result::Result<T, E>;
