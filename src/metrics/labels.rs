//! Every label value `/metrics` can carry, as enums: a series exists only for a value
//! listed here, so no request can add series (no client names, session ids, code, host
//! names). The one free-text label, an upstream server's name, is bounded by the
//! configuration and again by [`super::MAX_UPSTREAM_SERVERS`].

use std::fmt::Write;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

use crate::execution::{ExecutionResult, SandboxStart};
use crate::runtime::Language;

/// Label values written as their `as_str` (lower case, as the rest of codebox names them).
macro_rules! label_value {
    ($t:ty) => {
        impl EncodeLabelValue for $t {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
                encoder.write_str(self.as_str())
            }
        }
    };
}

impl EncodeLabelValue for Language {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.name())
    }
}

/// How an execute call ended.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Outcome {
    /// Exit status 0.
    Ok,
    /// A non-zero exit status (an exception, `sys.exit(1)`), or a full session workspace.
    Error,
    /// The call's timeout killed it.
    Timeout,
    /// The kernel's OOM killer ended a process: the memory limit was hit.
    Oom,
    /// Ended by a signal (the seccomp policy's included).
    Killed,
    /// Ended without an exit status: the client cancelled it.
    Cancelled,
    /// The server's drain bound killed it (SIGTERM).
    Stopped,
    /// The sandbox could not be created, or failed or was lost while running.
    SandboxError,
    /// Refused before running (see [`Refusal`]).
    Refused,
}

impl Outcome {
    pub const ALL: [Outcome; 9] = [
        Outcome::Ok,
        Outcome::Error,
        Outcome::Timeout,
        Outcome::Oom,
        Outcome::Killed,
        Outcome::Cancelled,
        Outcome::Stopped,
        Outcome::SandboxError,
        Outcome::Refused,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Timeout => "timeout",
            Outcome::Oom => "oom",
            Outcome::Killed => "killed",
            Outcome::Cancelled => "cancelled",
            Outcome::Stopped => "stopped",
            Outcome::SandboxError => "sandbox_error",
            Outcome::Refused => "refused",
        }
    }

    /// The outcome of a program that ran, in the order `ExecutionResult::ending` tells it.
    pub fn of(result: &ExecutionResult) -> Outcome {
        if result.timed_out {
            Outcome::Timeout
        } else if result.oom_killed {
            Outcome::Oom
        } else if result.seccomp_violation || result.signal.is_some() {
            Outcome::Killed
        } else if result.exit_code.is_none() {
            Outcome::Cancelled
        } else if result.failed() {
            Outcome::Error
        } else {
            Outcome::Ok
        }
    }
}
label_value!(Outcome);

/// Where an execution's sandbox came from.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Start {
    /// Taken from the warm pool.
    Warm,
    /// Started for the call.
    Cold,
    /// A session's live interpreter (`keep_alive`), new or kept.
    Session,
    /// No sandbox: refused, or failed before one existed.
    None,
}

impl Start {
    pub fn as_str(&self) -> &'static str {
        match self {
            Start::Warm => "warm",
            Start::Cold => "cold",
            Start::Session => "session",
            Start::None => "none",
        }
    }
}
label_value!(Start);

impl From<Option<SandboxStart>> for Start {
    /// An execution without a pool/cold start ran in a session's live interpreter.
    fn from(start: Option<SandboxStart>) -> Start {
        match start {
            Some(SandboxStart::Warm) => Start::Warm,
            Some(SandboxStart::Cold) => Start::Cold,
            None => Start::Session,
        }
    }
}

/// Why an execution (or a sandbox it asked for) was refused before it ran.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Refusal {
    /// Arguments out of range (code size, files, timeout, allowlist, PII, outputs…).
    InvalidArguments,
    /// The audit log is down and configured to refuse.
    AuditUnavailable,
    /// A required isolation layer is missing (or the sandbox checks have not passed).
    HostNotReady,
    /// The client's executions per minute (`rate_per_minute`).
    RateLimited,
    /// The client's executions at once (`rate_concurrent`).
    ClientConcurrency,
    /// Every slot busy and the queue full: "busy, retry".
    QueueFull,
    /// The server is draining (SIGTERM) and takes no new executions.
    Draining,
    /// No slot for a skill's syntax check asked by running code within its wait.
    NoNestedSlot,
    /// The session is unknown, another client's, or one too many.
    Session,
    /// The session's workspace could not be made or attached.
    Workspace,
    /// The packages asked for could not be installed.
    Packages,
    /// The skills directory to bind could not be prepared.
    Skills,
    /// The client holds `tasks.max_per_client` tasks.
    TooManyTasks,
}

impl Refusal {
    pub const ALL: [Refusal; 13] = [
        Refusal::InvalidArguments,
        Refusal::AuditUnavailable,
        Refusal::HostNotReady,
        Refusal::RateLimited,
        Refusal::ClientConcurrency,
        Refusal::QueueFull,
        Refusal::Draining,
        Refusal::NoNestedSlot,
        Refusal::Session,
        Refusal::Workspace,
        Refusal::Packages,
        Refusal::Skills,
        Refusal::TooManyTasks,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Refusal::InvalidArguments => "invalid_arguments",
            Refusal::AuditUnavailable => "audit_unavailable",
            Refusal::HostNotReady => "host_not_ready",
            Refusal::RateLimited => "rate_limited",
            Refusal::ClientConcurrency => "client_concurrency",
            Refusal::QueueFull => "queue_full",
            Refusal::Draining => "draining",
            Refusal::NoNestedSlot => "no_nested_slot",
            Refusal::Session => "session",
            Refusal::Workspace => "workspace",
            Refusal::Packages => "packages",
            Refusal::Skills => "skills",
            Refusal::TooManyTasks => "too_many_tasks",
        }
    }
}
label_value!(Refusal);

impl From<&crate::ratelimit::Limited> for Refusal {
    fn from(limited: &crate::ratelimit::Limited) -> Refusal {
        match limited {
            crate::ratelimit::Limited::Rate { .. } => Refusal::RateLimited,
            crate::ratelimit::Limited::Concurrent { .. } => Refusal::ClientConcurrency,
        }
    }
}

/// What the egress proxy decided for one connection (or, for plain HTTP, one upstream
/// host of a client connection): each attempt is counted once, at its decision.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum EgressDecision {
    /// An allow rule matched and a checked address was connected.
    Allowed,
    /// As allowed, after the user approved the host (a `[network] approve` rule).
    Approved,
    /// A deny rule matched, no allow rule did, or the call's narrowing left it out.
    Denied,
    /// An approve rule asked and the user declined (or nobody could be asked).
    NotApproved,
    /// Every address the name resolved to is non-public and no `allow_private` rule
    /// allows it.
    AddressRefused,
    /// A per-execution or process-wide connection limit.
    Limit,
    /// Allowed, but it could not be resolved or connected to in time.
    Unreachable,
    /// Not a request the proxy serves (no host decided).
    Invalid,
}

impl EgressDecision {
    pub const ALL: [EgressDecision; 8] = [
        EgressDecision::Allowed,
        EgressDecision::Approved,
        EgressDecision::Denied,
        EgressDecision::NotApproved,
        EgressDecision::AddressRefused,
        EgressDecision::Limit,
        EgressDecision::Unreachable,
        EgressDecision::Invalid,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            EgressDecision::Allowed => "allowed",
            EgressDecision::Approved => "approved",
            EgressDecision::Denied => "denied",
            EgressDecision::NotApproved => "not_approved",
            EgressDecision::AddressRefused => "address_refused",
            EgressDecision::Limit => "limit",
            EgressDecision::Unreachable => "unreachable",
            EgressDecision::Invalid => "invalid",
        }
    }
}
label_value!(EgressDecision);

/// How a call to an upstream server's tool went.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum UpstreamOutcome {
    /// A result came back (`isError: false`).
    Ok,
    /// A result with `isError: true`: the tool failed.
    ToolError,
    /// A JSON-RPC error answer.
    RpcError,
    /// No answer within the call's timeout.
    Timeout,
    /// The server was not ready within the wait.
    Unavailable,
    /// The connection was lost during the call.
    ConnectionLost,
    /// The server does not list the tool.
    NotListed,
    /// An answer codebox does not take (too large, not JSON-RPC, a task, input…), or a
    /// transport failure.
    BadAnswer,
}

impl UpstreamOutcome {
    pub fn as_str(&self) -> &'static str {
        match self {
            UpstreamOutcome::Ok => "ok",
            UpstreamOutcome::ToolError => "tool_error",
            UpstreamOutcome::RpcError => "rpc_error",
            UpstreamOutcome::Timeout => "timeout",
            UpstreamOutcome::Unavailable => "unavailable",
            UpstreamOutcome::ConnectionLost => "connection_lost",
            UpstreamOutcome::NotListed => "not_listed",
            UpstreamOutcome::BadAnswer => "bad_answer",
        }
    }

    /// The outcome of [`crate::upstream::Upstreams::call`]'s answer.
    pub fn of(
        answer: &Result<rmcp::model::CallToolResult, crate::upstream::UpstreamError>,
    ) -> UpstreamOutcome {
        use crate::upstream::UpstreamError as E;
        match answer {
            Ok(r) if r.is_error == Some(true) => UpstreamOutcome::ToolError,
            Ok(_) => UpstreamOutcome::Ok,
            Err(E::Rpc { .. }) => UpstreamOutcome::RpcError,
            Err(E::Timeout { .. }) => UpstreamOutcome::Timeout,
            Err(E::Unavailable { .. } | E::ShutDown) => UpstreamOutcome::Unavailable,
            Err(E::ConnectionLost { .. }) => UpstreamOutcome::ConnectionLost,
            Err(E::NotListed { .. } | E::UnknownTool { .. }) => UpstreamOutcome::NotListed,
            Err(_) => UpstreamOutcome::BadAnswer,
        }
    }
}
label_value!(UpstreamOutcome);

/// An upstream server's state as `codebox_upstream_state` names it.
pub fn upstream_state(state: crate::upstream::ServerState) -> &'static str {
    use crate::upstream::ServerState as S;
    match state {
        S::Connecting => "connecting",
        S::Ready => "ready",
        S::Failed => "failed",
        S::Reconnecting => "reconnecting",
    }
}

/// Every state, each a series of `codebox_upstream_state` (1 for the current one).
pub const UPSTREAM_STATES: [crate::upstream::ServerState; 4] = [
    crate::upstream::ServerState::Connecting,
    crate::upstream::ServerState::Ready,
    crate::upstream::ServerState::Failed,
    crate::upstream::ServerState::Reconnecting,
];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExecutionLabels {
    pub language: Language,
    pub outcome: Outcome,
    pub start: Start,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DurationLabels {
    pub language: Language,
    pub start: Start,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LanguageLabels {
    pub language: Language,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    pub reason: Refusal,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EgressLabels {
    pub decision: EgressDecision,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamCallLabels {
    pub server: String,
    pub outcome: UpstreamOutcome,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamStateLabels {
    pub server: String,
    pub state: &'static str,
}
