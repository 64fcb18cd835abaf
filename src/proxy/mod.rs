//! The tool proxy: the supervisor's end of a sandbox's fd-3 channel.
//!
//! The sandbox has no network; fd 3, a socketpair to the supervisor, is its only way out.
//! After the boot frame (`runtime::boot`), the channel carries **newline-delimited
//! JSON-RPC 2.0**: one message per line (JSON escapes every newline inside strings, so a
//! message never contains one). The sandbox sends requests; the proxy answers each with a
//! response of the same id, in completion order, so calls can run concurrently.
//!
//! Methods:
//! - `tools/call {name, arguments?}` → the upstream's `CallToolResult` (content,
//!   structuredContent, isError), unchanged;
//! - `tools/search {query, detail?: "name"|"summary"|"full", server?, limit?, cursor?}` →
//!   `{tools, next_cursor, total}` (BM25 over the catalog, `crate::catalog`), over the
//!   tools this execution may call;
//! - `tools/get {name}` → one tool's full definition with signatures and an example;
//! - codebox's own capabilities ([`OwnMethod`], served by the server through
//!   [`OwnMethods`]): `codebox/save_skill {name, code, description, language, usage?}` →
//!   `{name, language, import}`, `codebox/list_skills {query?}` → `{skills}`,
//!   `codebox/health {}` → what the `health` tool shows. They act for the client whose
//!   execution this is; `allowed_tools` does not govern them (they are not upstream
//!   tools), but every one counts against [`ProxyLimits::max_calls`] like any request.
//!
//! In a keep-alive session the sandbox also sends the notification `codebox/done` after
//! each run, and the supervisor sends `codebox/run` (see `runtime::boot`); the proxy hands
//! the former to its control channel and writes the latter with [`ProxySession::send_line`].
//!
//! Every `tools/call` is checked against the execution's [`AllowList`] (nothing is sent
//! upstream for a denied call), then, when the execution has an approval gate
//! ([`ProxySession::set_approval`], `crate::approval`), approved by the user if a rule
//! asks for it (the per-call timeout starts after the approval; the arguments approved
//! are the ones sent), size-checked against [`ProxyLimits`], timed, and
//! recorded as a [`ToolCallRecord`] in the run's result. Errors are JSON-RPC errors
//! with the codes below. A frame that is not JSON, or larger than
//! [`ProxyLimits::max_request_bytes`], gets a `-32700` error and closes the channel; the
//! run's result says why ([`ProxyReport::channel_error`]). The supervisor is unaffected.
//!
//! # What one execution can make the supervisor hold
//!
//! The sandbox is hostile; what it sends must cost the supervisor bounded memory and
//! bounded records, whether or not it reads the answers:
//! - **every message that gets an answer counts** against [`ProxyLimits::max_calls`]:
//!   `tools/call`, `tools/search`, `tools/get` (no separate sub-limit: they share the one
//!   budget), unknown methods, invalid requests, denied and unknown tools. Past the limit
//!   each gets a `LIMIT` error, decided from a zero-copy look at the line (its params are
//!   never parsed). Notifications get no answer and do not count; of them only
//!   `codebox/done` is passed on, and only while the supervisor waits for one;
//! - **requests in flight and answers queued are bounded**: the reader takes a permit
//!   ([`ProxyLimits::max_in_flight`], and the estimated parsed size of the params out of
//!   [`ProxyLimits::max_in_flight_bytes`]) *before* it reads the next line (the size
//!   once it has), given back once the answer is
//!   queued; a queued answer holds its size of [`ProxyLimits::max_queued_reply_bytes`]
//!   until it is written to the socket. A sandbox that writes requests and never reads
//!   the answers fills the socket buffer, then that budget; then the handlers wait with
//!   their permits, the reader stops reading fd 3, and the sandbox's own `write` blocks:
//!   kernel backpressure, with at most that many bytes of answers held by the supervisor;
//! - **records are bounded**: a result keeps the first [`ProxyLimits::max_call_records`]
//!   call records (the audit log gets the same ones) and counts the rest in
//!   [`DroppedCalls`]; any name, method or message echoed back, into a record or into a
//!   log is cut to a few hundred bytes with a visible marker ([`clip`]).

pub mod allowlist;
mod methods;
mod session;
mod upstream_backend;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use std::borrow::Cow;
use std::collections::BTreeMap;

use rmcp::model::CallToolResult;
use serde::Serialize;

use crate::upstream::catalog::Catalog;

pub use allowlist::AllowList;
pub use methods::{search_query, MAX_QUERY_BYTES};
/// What parsing a JSON text into a `serde_json::Value` may take (the server's message
/// checks bound it too).
pub(crate) use session::parse_cost;
pub use session::{ProxySession, MAX_ID_BYTES};
pub use upstream_backend::IndexedUpstreams;

/// JSON-RPC error codes on the channel.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    /// The tool is not in this execution's `allowed_tools`.
    pub const DENIED: i64 = -32001;
    /// No tool of that name in the catalog.
    pub const UNKNOWN_TOOL: i64 = -32002;
    /// The upstream failed, is down, or its call could not be made.
    pub const UPSTREAM: i64 = -32003;
    /// A per-execution limit (calls, bytes, result size) was reached.
    pub const LIMIT: i64 = -32004;
    /// The call took longer than the per-call timeout.
    pub const TIMEOUT: i64 = -32005;
    /// One of codebox's own methods refused or failed (a skill not saved, skills
    /// unavailable); the message says why.
    pub const CODEBOX: i64 = -32006;
    /// The call needed the user's approval and did not get it (declined, cancelled,
    /// timed out, the client cannot ask); the message says which.
    pub const APPROVAL: i64 = -32007;
}

/// codebox's own capabilities that sandboxed code reaches over fd 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnMethod {
    SaveSkill,
    ListSkills,
    Health,
}

impl OwnMethod {
    /// Every method, as spelled on the channel.
    pub const ALL: [OwnMethod; 3] = [
        OwnMethod::SaveSkill,
        OwnMethod::ListSkills,
        OwnMethod::Health,
    ];

    /// The method's name on the channel.
    pub const fn wire(self) -> &'static str {
        match self {
            OwnMethod::SaveSkill => "codebox/save_skill",
            OwnMethod::ListSkills => "codebox/list_skills",
            OwnMethod::Health => "codebox/health",
        }
    }

    pub fn from_wire(method: &str) -> Option<OwnMethod> {
        OwnMethod::ALL.into_iter().find(|m| m.wire() == method)
    }
}

/// Serves [`OwnMethod`]s for one execution (the server implements it, for the client
/// the execution belongs to). The params have their PII tokens restored already; the
/// answer is a JSON result or the message of a [`code::CODEBOX`] error.
pub trait OwnMethods: Send + Sync + 'static {
    fn call(
        &self,
        method: OwnMethod,
        params: serde_json::Value,
    ) -> Pin<Box<dyn Future<Output = Result<serde_json::Value, String>> + Send + 'static>>;
}

/// Where tool calls go: the upstream servers (or, in tests, anything that can answer).
pub trait ToolBackend: Send + Sync + 'static {
    /// The current catalog.
    fn catalog(&self) -> Arc<Catalog>;
    /// The search index of the current catalog.
    fn index(&self) -> Arc<crate::catalog::SearchIndex>;
    /// Calls the tool `name` (a catalog name) within `timeout`.
    fn call(
        &self,
        name: String,
        arguments: Option<serde_json::Map<String, serde_json::Value>>,
        timeout: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<CallToolResult, CallError>> + Send + 'static>>;
    /// Done when no server (of `server`, else every one) is still making its first
    /// connection, within the backend's own bound: a search or a lookup then sees the
    /// tools of a server that came up meanwhile. At once by default.
    fn first_attempts(
        &self,
        server: Option<String>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        let _ = server;
        Box::pin(std::future::ready(()))
    }
}

/// A call that got no result; the message goes back to the sandboxed code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    Failed(String),
    /// The name has a configured server's prefix, but the server (connected now) does not
    /// list it. The proxy says what the server lists, of what this execution may call.
    #[error("server {server:?} does not list this tool")]
    NotListed { server: String },
}

/// Per-execution limits of the channel.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyLimits {
    /// Requests per execution, of every kind (`tools/call`, `tools/search`, `tools/get`,
    /// unknown methods, invalid requests): the `max_tool_calls` setting.
    pub max_calls: u32,
    /// Bytes of arguments sent plus results received, per execution.
    pub max_bytes: u64,
    /// Wall-clock limit of one call.
    pub call_timeout: Duration,
    /// Largest message the sandbox may send.
    pub max_request_bytes: usize,
    /// Largest single result passed back to the sandbox.
    pub max_result_bytes: usize,
    /// Requests being handled at once (at least 1); the proxy stops reading fd 3 while
    /// this many have no answer queued.
    pub max_in_flight: usize,
    /// Memory the requests being handled at once may take: their params' text plus what
    /// parsing it may take (see `session::parse_cost`). A request estimated above this
    /// on its own is refused with `INVALID_PARAMS`.
    pub max_in_flight_bytes: usize,
    /// Bytes of answers queued and not yet written to the socket (a sandbox that does
    /// not read them); handlers wait, and so the reader, while this is spent.
    pub max_queued_reply_bytes: usize,
    /// `tool_calls` records a result keeps (and the audit log writes one by one); the
    /// rest are counted in [`ProxyReport::tool_calls_dropped`].
    pub max_call_records: usize,
    /// Output files the runtime may send at the end of a run (`codebox/file`).
    pub out_files: crate::output::OutFilesLimits,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        ProxyLimits {
            max_calls: 1000,
            max_bytes: 512 * 1024 * 1024,
            call_timeout: Duration::from_secs(60),
            max_request_bytes: 16 * 1024 * 1024,
            max_result_bytes: 64 * 1024 * 1024,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_in_flight_bytes: 64 * 1024 * 1024,
            max_queued_reply_bytes: 16 * 1024 * 1024,
            max_call_records: DEFAULT_MAX_CALL_RECORDS,
            out_files: crate::output::OutFilesLimits::default(),
        }
    }
}

/// Default of [`ProxyLimits::max_in_flight`].
pub const DEFAULT_MAX_IN_FLIGHT: usize = 16;
/// Default of [`ProxyLimits::max_call_records`].
pub const DEFAULT_MAX_CALL_RECORDS: usize = 100;
/// Longest name or method echoed back, recorded or logged.
pub const MAX_NAME_ECHO: usize = 256;
/// Longest message echoed back or recorded.
pub const MAX_MESSAGE_ECHO: usize = 1024;

/// `text` cut to at most `max` bytes (at a character boundary) followed by a marker
/// saying how long it was: `…[truncated, 1048576 bytes]`; `text` itself when it fits.
pub fn clip(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!(
        "{}…[truncated, {} bytes]",
        &text[..end],
        text.len()
    ))
}

/// The `tools/call` records a result did not keep (past [`ProxyLimits::max_call_records`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, schemars::JsonSchema)]
pub struct DroppedCalls {
    /// Calls not listed in `tool_calls`.
    pub count: u64,
    /// Their outcomes: `ok` or the error category (`denied`, `unknown_tool`, `limit`,
    /// `timeout`, `upstream`, `approval`, `invalid`, `tool_error`), with how many of each.
    pub by_outcome: BTreeMap<String, u64>,
}

/// One `tools/call` of an execution, as its result reports it.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ToolCallRecord {
    /// The name called (cut to [`MAX_NAME_ECHO`] bytes with a marker).
    pub name: String,
    /// The upstream answered and did not report `isError`.
    pub ok: bool,
    pub duration_ms: f64,
    /// Bytes of the arguments (JSON).
    pub bytes_in: u64,
    /// Bytes of the result (JSON) passed back to the sandbox.
    pub bytes_out: u64,
    /// Why it failed: denied, unknown, limit, timeout, upstream error, or the tool's own
    /// error text (cut to [`MAX_MESSAGE_ECHO`] bytes with a marker).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The failure's category (`denied`, `unknown_tool`, `limit`, `timeout`, `upstream`,
    /// `invalid`, `tool_error`): what the audit log keeps instead of the text.
    #[serde(skip)]
    pub error_kind: Option<&'static str>,
}

/// Personal data handling on the channel (`crate::pii` implements it): tokens in the
/// arguments the sandbox sends are restored before the call goes upstream; with
/// `strict`, results are tokenized before they enter the sandbox. Records of calls,
/// which reach the model, are always tokenized.
pub trait Redactor: Send + Sync + 'static {
    fn tokenize(&self, text: &str) -> String;
    fn tokenize_json(&self, value: &mut serde_json::Value);
    fn restore_json(&self, value: &mut serde_json::Value);
}

/// Called once per finished `tools/call` that the result keeps a record of (the audit
/// log): at most [`ProxyLimits::max_call_records`] times per execution.
pub type CallObserver = Arc<dyn Fn(&ToolCallRecord) + Send + Sync>;

/// What the channel saw during one execution.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProxyReport {
    /// The first [`ProxyLimits::max_call_records`] calls.
    pub tool_calls: Vec<ToolCallRecord>,
    /// The calls past those.
    pub tool_calls_dropped: Option<DroppedCalls>,
    /// Messages answered, of every kind (what counts against `max_calls`).
    pub requests: u64,
    /// Why the proxy closed the channel early (a malformed or oversized frame), or held
    /// it back (the program left its answers unread).
    pub channel_error: Option<String>,
    /// The repr of the program's last expression (`codebox/value`; the last one sent
    /// wins, cut to [`MAX_VALUE_BYTES`]). The program could send the line itself: it is
    /// output of the program like its stdout, never trusted for anything else.
    pub value: Option<String>,
    /// The output files the runtime sent (`codebox/file`, `codebox/files`).
    pub out_files: crate::output::OutFiles,
    /// What a one-shot runtime said at its end besides the status (`codebox/exit`): the
    /// optional layers the run loaded, when it saw the end. Like `value`, the program's
    /// own word.
    pub runtime: Option<crate::runtime::RunReport>,
}

/// The most bytes of a `codebox/value` repr kept (the runtimes send at most 200,000
/// characters; the result's output budget cuts it further).
pub const MAX_VALUE_BYTES: usize = 1 << 20;

#[cfg(test)]
mod tests;
