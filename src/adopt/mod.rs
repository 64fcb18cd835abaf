//! Adopting codebox in an MCP client: `codebox install claude-code` moves Claude Code's
//! MCP servers into codebox's own upstream configuration and puts the one codebox entry in
//! their place; `codebox uninstall claude-code` puts them back.
//!
//! Data first, then one procedure:
//!
//! 1. [`execute::read`] reads the files involved as bytes (a [`plan::Snapshot`]);
//! 2. [`plan::plan`] (pure) parses them ([`jsonc`]: comments are read, not kept; [`doc`]:
//!    every value it does not change keeps its text, key order kept) and returns a
//!    [`plan::Plan`]: which servers move from which file to which, which codebox entries
//!    are added, updated or removed, and every changed file's new text;
//! 3. [`execute::execute`] carries the plan out: it checks that no file changed since it
//!    was read, backs every changed file up next to itself, then writes each one
//!    atomically (or only prints, on a dry run).
//!
//! [`claude_code`] knows Claude Code's files: where each scope's servers live, where
//! their codebox files go, and what the codebox entry looks like.

pub mod claude_code;
pub mod doc;
pub mod execute;
pub mod jsonc;
pub mod plan;

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} is not valid JSON at line {line}, column {column}: {message}; nothing was changed"
    )]
    Json {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{place}: {message}; nothing was changed")]
    Shape { place: String, message: String },
    #[error("server {server:?} is in {first} and, with a different definition, in {second}; make them the same or rename one, then run again (nothing was changed)")]
    Conflict {
        server: String,
        first: String,
        second: String,
    },
    #[error("server {server:?} would be in both {project} and {local}: Claude Code lets a local-scope server shadow a project-scope one of the same name, codebox serves one set of names; rename or remove one of them, then run again (nothing was changed)")]
    SameNameInTwoScopes {
        server: String,
        /// Where the project-scope one is: the scope and its codebox file.
        project: String,
        local: String,
    },
    #[error("path {path} is not UTF-8, which a JSON config cannot name")]
    NotUtf8 { path: PathBuf },
    #[error("{path} is a symlink to {target}, which {problem}; refusing to write through it (nothing was changed)")]
    Symlink {
        path: PathBuf,
        target: PathBuf,
        problem: &'static str,
    },
    #[error("{path} is not a regular file; refusing to replace it (nothing was changed)")]
    NotAFile { path: PathBuf },
    #[error("{path} changed while codebox was planning (is Claude Code running?); run again (nothing was changed)")]
    Changed { path: PathBuf },
    #[error("{path} changed while codebox was writing the files before it (is Claude Code running?); the backups are kept, run again to finish")]
    ChangedWhileWriting { path: PathBuf },
    #[error("cannot back up {path} to {backup}")]
    Backup {
        path: PathBuf,
        backup: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path} (the backups made so far are kept)")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;
