//! What one audit record says: an execution, a proxied tool call, the calls of one
//! execution past its per-execution cap of call records, a skill, an egress connection,
//! or an approval decision.
//!
//! Only metadata: who asked (client, session), what ran (language, the code's digest and
//! size), what it could and did call, how it ended and what it cost. The code text is
//! logged only when the operator opts in (`include_code`); error texts are never logged,
//! only a category ([`ToolCallRecord::error_kind`]), because they may carry PII.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::rootfs::manifest::hex;

/// One logged event. On its line, the fields sit next to `seq`, `time` and `prev`, with
/// `"event": "execution"`, `"event": "tool_call"`, `"event": "tool_calls_omitted"` or
/// `"event": "skill"`, `"event": "egress"` or `"event": "approval"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[allow(
    clippy::large_enum_variant,
    reason = "one event per execution, built once and moved into the log: boxing buys nothing"
)]
pub enum AuditEvent {
    Execution(ExecutionRecord),
    ToolCall(ToolCallRecord),
    Skill(SkillRecord),
    ToolCallsOmitted(ToolCallsOmittedRecord),
    Egress(EgressRecord),
    Approval(ApprovalRecord),
}

/// One execution, written when it ends (or is refused).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionRecord {
    /// The MCP client (its `clientInfo` name, or the HTTP principal).
    pub client: String,
    pub session: Option<String>,
    /// `python` or `typescript`.
    pub language: String,
    /// [`code_digest`] of the code: identifies it without revealing it.
    pub code_sha256: String,
    pub code_bytes: u64,
    /// The code itself, only with `include_code` (the log drops it otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The allowlist the execution ran with.
    pub allowed_tools: Vec<String>,
    /// The calls of the execution, up to the proxy's cap of records per execution.
    pub tools_called: Vec<ToolCalled>,
    /// Calls past that cap: counted in a [`ToolCallsOmittedRecord`], not listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tools_called_omitted: u64,
    /// Proxy mode: connections through the egress proxy, allowed and denied (each has an
    /// [`EgressRecord`] up to the cap), and those past the cap.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub egress_allowed: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub egress_denied: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub egress_omitted: u64,
    pub exit_code: Option<i32>,
    /// The signal that killed the program.
    pub signal: Option<i32>,
    /// Limits the execution ran into: `timeout`, `memory`, `pids`, `output`,
    /// `workspace_quota`.
    pub limits_hit: Vec<String>,
    pub duration_ms: f64,
    pub cpu_ms: Option<f64>,
    pub peak_memory_bytes: Option<u64>,
    pub output_bytes: u64,
    /// The sandbox profile's name.
    pub profile: String,
    /// Identifies the exact rootfs the code ran on.
    pub rootfs_manifest_sha256: Option<String>,
    /// `ok`, `failed`, `refused` or `error`.
    pub outcome: String,
}

/// One tool call as part of an [`ExecutionRecord`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCalled {
    pub name: String,
    pub ok: bool,
    pub duration_ms: f64,
}

/// One proxied call from sandboxed code to an upstream tool, written when it returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    pub client: String,
    pub session: Option<String>,
    /// The upstream tool (`server__tool`).
    pub name: String,
    pub ok: bool,
    pub duration_ms: f64,
    /// Size of the arguments sent and of the result returned.
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// A category such as `denied`, `upstream` or `timeout`; never the error text, which
    /// may hold PII.
    pub error_kind: Option<String>,
}

/// One connection of sandboxed code through the egress proxy (proxy mode), allowed or
/// denied; written when the execution ends. At most the proxy's cap of records per
/// execution (100); the rest are counted on the execution's line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EgressRecord {
    pub client: String,
    pub session: Option<String>,
    pub host: String,
    pub port: u16,
    /// `connect` (a tunnel), `intercept` (TLS terminated to add a credential), `http`,
    /// or `invalid` (a request the proxy refused unread).
    pub kind: String,
    pub allowed: bool,
    /// Why it was denied or how it ended (names hosts and rules, never a secret).
    pub reason: Option<String>,
    pub rule: Option<String>,
    /// The address connected to.
    pub address: Option<String>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration_ms: f64,
    pub credential_added: bool,
}

/// One approval decision (`crate::approval`): a gated tool call or egress host, the rule
/// that gated it, and how it was decided. Never an argument value: only names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    pub client: String,
    pub session: Option<String>,
    /// `tool` or `egress`.
    pub kind: String,
    /// The catalog name called (`server__tool`) or the `host:port` connected to.
    pub name: String,
    /// Why approval was needed (the `require_approval` pattern, `destructiveHint`, the
    /// `[network] approve` rule).
    pub rule: String,
    /// `accepted`, `declined`, `cancelled`, `timed_out`, `fallback_denied`,
    /// `fallback_allowed`, `already_declined`, `too_many_questions`, `policy_denied`,
    /// `failed` or `abandoned`.
    pub decision: String,
    /// How long the user was asked (0 when nobody was).
    pub wait_ms: f64,
}

/// A skill saved or deleted (or a refused attempt). The content is never logged, only
/// its digest and size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkillRecord {
    pub client: String,
    /// `save` or `delete`.
    pub action: String,
    pub name: String,
    /// `python` or `typescript` (for a delete: of the skill deleted, when known).
    pub language: Option<String>,
    /// Size and [`code_digest`] of the code saved (saves only).
    pub code_bytes: Option<u64>,
    pub code_sha256: Option<String>,
    /// `ok`, `invalid` (bad name, size, syntax), `read_only` (a shared skill),
    /// `not_found` or `error`.
    pub outcome: String,
}

/// The proxied calls of one execution that got no [`ToolCallRecord`] of their own: one
/// execution writes at most the proxy's cap of call records (`max_tool_call_records`),
/// then this one line when it ends, so it can never flush earlier history out of the
/// rotated files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallsOmittedRecord {
    pub client: String,
    pub session: Option<String>,
    /// Calls not logged one by one.
    pub count: u64,
    /// Their outcomes: `ok` or an error category, with how many of each.
    pub by_outcome: BTreeMap<String, u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Lower-case hex SHA-256 of the code, as logged in [`ExecutionRecord::code_sha256`].
pub fn code_digest(code: &str) -> String {
    hex(&Sha256::digest(code.as_bytes()))
}

impl AuditEvent {
    /// Drops what the log must not hold unless the operator opted in.
    pub(super) fn redact(&mut self, include_code: bool) {
        if let AuditEvent::Execution(e) = self {
            if !include_code {
                e.code = None;
            }
        }
    }
}
