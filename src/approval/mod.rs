//! Approval gates: the proxy (and the egress proxy) pause a sandboxed call and ask the
//! user, through the MCP client, before it goes ahead.
//!
//! - [`policy`]: `[approval]` of `codebox.toml` as data, and which call needs approval and
//!   why ([`ApprovalPolicy::for_tool`]): a `require_approval` name pattern (the
//!   allowlist's glob syntax over catalog names `server__tool`), or the upstream tool's
//!   `destructiveHint` annotation (`destructive = "ask" | "allow" | "deny"`). Egress hosts
//!   that need approval are the `[network] approve` rules (`crate::egress`).
//! - [`message`]: the form-mode elicitation (the message naming the server and tool or
//!   the host, the rule, a bounded and escaped argument summary; a one-boolean schema)
//!   and how an answer is read (only `accept` with `approve: true` approves).
//! - [`ask`]: how an execution reaches its client's user ([`Asker`]: [`PeerAsker`] for a
//!   2025-11-25 connection that declared elicitation, [`NoAsker`] otherwise).
//! - [`gate`]: one execution's gate: one question at a time, at most `max_questions`,
//!   a declined question not asked again, every decision reported for the audit log.
//!
//! Timing: the wait for the user does not count against the call's own timeout (the
//! per-call timeout starts once the call is approved); the execution's wall-clock
//! timeout still applies: the sandbox is killed at its deadline whatever is pending, the
//! channel closes, and a pending question is abandoned (so is one of a cancelled
//! execution). An admission slot is therefore never held past the execution's deadline.

pub mod ask;
pub mod gate;
pub mod message;
pub mod policy;

pub use ask::{AskError, Asker, NoAsker, PeerAsker};
pub use gate::{Decided, Decision, Gate, Subject};
pub use policy::{ApprovalPolicy, ApprovalSection, DestructiveMode, Fallback, Need};

/// What can go wrong reading `[approval]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("approval.{field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

pub type Result<T> = std::result::Result<T, Error>;
