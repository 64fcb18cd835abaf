//! The audit log: every execution and its proxied tool calls, one JSON line each,
//! hash-chained so that tampering shows. One execution writes at most
//! `max_tool_call_records` tool-call lines (the proxy's cap), then one
//! `tool_calls_omitted` line counting the rest, so its volume is bounded.
//!
//! ```text
//! {"seq":1,"time":"2025-01-31T09:15:02.481Z","prev":"0000…0000","event":"execution","client":"claude-code",…}
//! {"seq":2,"time":"2025-01-31T09:15:03.002Z","prev":"<sha256 of line 1>","event":"tool_call",…}
//! ```
//!
//! - [`record`]: what a line says ([`AuditEvent`]): metadata only, no PII, no code text
//!   unless `include_code` is set.
//! - [`chain`]: the `seq`/`prev` links and [`verify`] (`codebox audit verify FILE`).
//! - [`log`]: the writer ([`AuditLog`]): one `write(2)` per line on an `O_APPEND` file,
//!   fsync per [`FsyncPolicy`], rotation by size with the chain going on across files.
//!
//! A full disk or an unwritable log never crashes the server: [`AuditLog::append`]
//! returns the error and [`AuditLog::status`] reports it; the server then refuses
//! executions or carries on, per [`OnFailure`].
//!
//! ```toml
//! [audit]
//! path = "/var/log/codebox/audit.jsonl"
//! include_code = false   # log the code text too (default: only its sha256 and size)
//! max_bytes = "64M"      # rotate before the file would exceed this (bytes or 512K/64M/1G)
//! keep = 5               # rotated files kept: audit.jsonl.1 (newest) .. audit.jsonl.5
//! fsync = "rotate"       # "always" (every record), "rotate" (when a file is closed), "never"
//! on_failure = "continue" # or "refuse": no executions while the log cannot be written
//! ```

pub mod chain;
pub mod log;
pub mod record;
#[cfg(test)]
mod tests;

use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize};

pub use chain::{line_hash, verify, VerifyError, VerifySummary, GENESIS};
pub use log::AuditLog;
pub use record::{
    code_digest, ApprovalRecord, AuditEvent, EgressRecord, ExecutionRecord, SkillRecord,
    ToolCallRecord, ToolCalled, ToolCallsOmittedRecord,
};

/// When records reach the disk.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum FsyncPolicy {
    /// `fdatasync` after every record: nothing acknowledged is lost, at the price of a
    /// disk flush per execution and per tool call.
    Always,
    /// `fsync` only when a file is rotated or closed (the default). A crash of codebox
    /// loses nothing (the kernel holds the data); a crash of the host may lose the
    /// records of the last few seconds, and the chain then ends early but stays valid.
    #[default]
    Rotate,
    /// Never; the kernel writes back when it likes.
    Never,
}

/// What the server does while the log cannot be written.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum OnFailure {
    /// Refuse executions: nothing runs unaudited.
    Refuse,
    /// Run anyway and report the failure in health (the default).
    #[default]
    Continue,
}

/// The `[audit]` settings.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    /// The log file; created with mode 0600, missing parent directories with 0700.
    pub path: PathBuf,
    /// Log the code text too, not only its digest and size.
    #[serde(default)]
    pub include_code: bool,
    /// Rotate before a record would take the file past this many bytes (a number, or a
    /// size such as `64M`). A record larger than this still gets a file of its own.
    #[serde(default = "default_max_bytes", deserialize_with = "size")]
    pub max_bytes: u64,
    /// Rotated files kept: `FILE.1` (newest) .. `FILE.<keep>`; 0 keeps none.
    #[serde(default = "default_keep")]
    pub keep: usize,
    /// When records reach the disk: `always` (fdatasync after each record), `rotate`
    /// (the default: when a file is rotated or closed; a host crash may lose the last
    /// seconds) or `never`.
    #[serde(default)]
    pub fsync: FsyncPolicy,
    /// What happens to executions while a record cannot be written: `refuse` them
    /// (nothing runs unaudited) or `continue` (the default; the failure is in `health`).
    #[serde(default)]
    pub on_failure: OnFailure,
}

/// 64 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;
pub const DEFAULT_KEEP: usize = 5;

fn default_max_bytes() -> u64 {
    DEFAULT_MAX_BYTES
}

fn default_keep() -> usize {
    DEFAULT_KEEP
}

/// `max_bytes` as a number or as a size string (`512K`, `64M`, `1G`).
fn size<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Bytes(u64),
        Text(String),
    }
    match Size::deserialize(d)? {
        Size::Bytes(n) => Ok(n),
        Size::Text(s) => crate::units::parse_size(&s).map_err(serde::de::Error::custom),
    }
}

impl AuditConfig {
    /// The defaults, writing to `path`.
    pub fn new(path: impl Into<PathBuf>) -> AuditConfig {
        AuditConfig {
            path: path.into(),
            include_code: false,
            max_bytes: DEFAULT_MAX_BYTES,
            keep: DEFAULT_KEEP,
            fsync: FsyncPolicy::default(),
            on_failure: OnFailure::default(),
        }
    }
}

/// The log's health, for the server's health report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditStatus {
    pub path: PathBuf,
    /// The last append succeeded (true before the first one).
    pub healthy: bool,
    /// Records appended since the log was opened.
    pub records_written: u64,
    /// The most recent failure (kept after the log recovers; see `healthy`).
    pub last_error: Option<String>,
    /// Appends that failed since the log was opened.
    pub failures: u64,
    /// `seq` of the last record in the chain (0 before the first ever).
    pub last_seq: u64,
    /// [`line_hash`] of the last record in the chain ([`GENESIS`] before the first ever):
    /// an anchor for [`VerifySummary::last_hash`].
    pub last_hash: String,
}

/// Why the log could not be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create audit log directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot open audit log {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read audit log {path} to resume its chain")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot resume the chain of audit log {path}: {reason}; check it with `codebox audit verify` and move it aside")]
    Resume { path: PathBuf, reason: String },
    #[error("cannot serialise an audit record")]
    Serialize(#[source] serde_json::Error),
    #[error("cannot write to audit log {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("short write to audit log {path}: {written} of {len} bytes (is the disk full?)")]
    ShortWrite {
        path: PathBuf,
        written: usize,
        len: usize,
    },
    #[error("cannot remove the partial record at the end of audit log {path}")]
    Repair {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot fsync audit log {path}")]
    Sync {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot rotate audit log {from} to {to}")]
    Rotate {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;
