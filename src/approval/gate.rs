//! One execution's approval gate: the proxy asks it before a tool call goes upstream, the
//! egress proxy before it connects to a host that needs approval.
//!
//! What a hostile program can do to the user through it is bounded:
//! - **one question at a time**: questions of one execution take turns (a lock held
//!   while the user is asked), so a flood of gated calls is one dialog after another,
//!   never a wall of them;
//! - **at most `max_questions` per execution**; past them a gated call is denied without
//!   asking, saying so;
//! - **a declined (or cancelled) question is not asked again**: the same tool with the
//!   same arguments (SHA-256 of the name and the canonical JSON), or the same host, is
//!   declined at once for the rest of the execution;
//! - **the approval is for exactly that call**: the arguments shown are the ones the
//!   caller then sends (it holds them, moves them to the upstream only after the answer);
//! - **a cancelled or ended execution abandons its question** ([`Gate::abandon`], also
//!   when the execution's future is dropped: the question's future is dropped with it).
//!
//! Every decision is reported to the observer (the audit log), at most
//! [`MAX_RECORDS`] per execution; a host approved once is approved for the rest of the
//! execution (HTTP clients open many connections) and not reported again.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use rmcp::model::ElicitRequestParams;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::ask::{AskError, Asker};
use super::message::{self, Answer};
use super::policy::{ApprovalPolicy, Fallback, Need};

/// Decisions reported per execution; the rest are only logged.
pub const MAX_RECORDS: usize = 100;

/// What is being approved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A tool call, by the catalog name the proxy calls.
    Tool(String),
    /// An egress connection, `host:port`.
    Host(String),
}

impl Subject {
    pub fn kind(&self) -> &'static str {
        match self {
            Subject::Tool(_) => "tool",
            Subject::Host(_) => "egress",
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Subject::Tool(n) | Subject::Host(n) => n,
        }
    }

    /// As the user and the code read it: escaped and bounded.
    fn shown(&self) -> String {
        let name = message::clip(&message::escape(self.name()), message::MAX_NAME_BYTES);
        match self {
            Subject::Tool(_) => name,
            Subject::Host(_) => format!("egress to {name}"),
        }
    }
}

/// How one gated call was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The user approved.
    Accepted,
    /// The user declined (or accepted without ticking `approve`).
    Declined,
    /// The user cancelled the dialog.
    Cancelled,
    /// No answer within the timeout.
    TimedOut,
    /// The client cannot ask; `fallback = "deny"`.
    FallbackDenied,
    /// The client cannot ask; `fallback = "allow"`.
    FallbackAllowed,
    /// The same question was declined earlier in this execution: not asked again.
    AlreadyDeclined,
    /// The execution asked `max_questions` already: denied without asking.
    TooManyQuestions,
    /// `destructive = "deny"`: refused without asking.
    PolicyDenied,
    /// Asking failed (the connection ended, the client answered with an error).
    Failed,
    /// The execution ended (deadline, cancel) while the question was open.
    Abandoned,
}

impl Decision {
    /// As written in the audit log.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Accepted => "accepted",
            Decision::Declined => "declined",
            Decision::Cancelled => "cancelled",
            Decision::TimedOut => "timed_out",
            Decision::FallbackDenied => "fallback_denied",
            Decision::FallbackAllowed => "fallback_allowed",
            Decision::AlreadyDeclined => "already_declined",
            Decision::TooManyQuestions => "too_many_questions",
            Decision::PolicyDenied => "policy_denied",
            Decision::Failed => "failed",
            Decision::Abandoned => "abandoned",
        }
    }

    pub fn allows(self) -> bool {
        matches!(self, Decision::Accepted | Decision::FallbackAllowed)
    }
}

/// One decision, for the audit log: names, the rule, the outcome, the wait; never an
/// argument value.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    pub subject: Subject,
    pub rule: String,
    pub decision: Decision,
    /// How long the user was asked (zero when nobody was).
    pub waited: Duration,
}

/// Called with every decision (the first [`MAX_RECORDS`] of an execution).
pub type DecisionObserver = Arc<dyn Fn(&Decided) + Send + Sync>;

/// Makes the argument summary's JSON text from the arguments (PII tokenized, secrets
/// redacted: the glue knows the execution's vault and the configured secrets).
pub type Summarize = Box<dyn Fn(&mut Value) -> String + Send + Sync>;

/// What an execution remembers between questions.
#[derive(Default)]
struct Memory {
    asked: u32,
    declined: HashSet<[u8; 32]>,
    approved_hosts: HashSet<String>,
}

/// One execution's gate.
pub struct Gate {
    policy: Arc<ApprovalPolicy>,
    asker: Arc<dyn Asker>,
    summarize: Summarize,
    observer: Option<DecisionObserver>,
    cancel: CancellationToken,
    /// Held while a question is open: questions take turns.
    memory: tokio::sync::Mutex<Memory>,
    reported: AtomicUsize,
}

impl Gate {
    pub fn new(
        policy: Arc<ApprovalPolicy>,
        asker: Arc<dyn Asker>,
        summarize: Summarize,
        observer: Option<DecisionObserver>,
    ) -> Arc<Gate> {
        Arc::new(Gate {
            policy,
            asker,
            summarize,
            observer,
            cancel: CancellationToken::new(),
            memory: tokio::sync::Mutex::new(Memory::default()),
            reported: AtomicUsize::new(0),
        })
    }

    pub fn policy(&self) -> &ApprovalPolicy {
        &self.policy
    }

    /// Ends the open question, and every later one, as abandoned (the execution ended).
    pub fn abandon(&self) {
        self.cancel.cancel();
    }

    /// Abandons the gate's questions when dropped (held by the execution for its run).
    pub fn abandon_on_drop(&self) -> tokio_util::sync::DropGuard {
        self.cancel.clone().drop_guard()
    }

    /// Whether the call of `name` may go ahead: `Ok` at once when nothing gates it, else
    /// after the user's approval (or the fallback); `Err` says why not, for the code.
    /// `upstream` is the tool's server and own name when the catalog lists it,
    /// `destructive` its `destructiveHint: true` (`None`: the catalog does not list it,
    /// see [`ApprovalPolicy::for_tool`]).
    pub async fn tool(
        &self,
        name: &str,
        upstream: Option<(&str, &str)>,
        destructive: Option<bool>,
        arguments: Option<&Map<String, Value>>,
    ) -> Result<(), String> {
        let subject = Subject::Tool(name.to_string());
        let rule = match self.policy.for_tool(name, destructive) {
            Need::Nothing => return Ok(()),
            Need::Deny { rule } => {
                let why = format!("{} is refused: {rule}", subject.shown());
                self.report(subject, rule, Decision::PolicyDenied, Duration::ZERO);
                return Err(why);
            }
            Need::Ask { rule } => rule,
        };
        let key = tool_key(name, arguments);
        let question = || {
            let summary = message::summary(arguments, &*self.summarize);
            message::tool_question(name, upstream, &rule, &summary)
        };
        self.decide(subject, &rule, key, question).await
    }

    /// Whether the egress proxy may connect to `target` (`host:port`), which the
    /// `[network] approve` rule `rule` gates. Approved once, approved for the execution.
    pub async fn host(&self, target: &str, rule: &str) -> Result<(), String> {
        let subject = Subject::Host(target.to_string());
        let key: [u8; 32] = Sha256::new()
            .chain_update(b"host\0")
            .chain_update(target.as_bytes())
            .finalize()
            .into();
        let rule = format!("[network] approve rule \"{rule}\"");
        self.decide(subject, &rule, key, || {
            message::host_question(target, &rule)
        })
        .await
    }

    async fn decide(
        &self,
        subject: Subject,
        rule: &str,
        key: [u8; 32],
        question: impl FnOnce() -> ElicitRequestParams,
    ) -> Result<(), String> {
        let shown = subject.shown();
        let abandoned = || format!("approval for {shown} abandoned: the execution ended");
        let mut memory = tokio::select! {
            m = self.memory.lock() => m,
            _ = self.cancel.cancelled() => {
                self.report(subject, rule.into(), Decision::Abandoned, Duration::ZERO);
                return Err(abandoned());
            }
        };
        if let Subject::Host(target) = &subject {
            if memory.approved_hosts.contains(target) {
                return Ok(());
            }
        }
        if memory.declined.contains(&key) {
            self.report(
                subject,
                rule.into(),
                Decision::AlreadyDeclined,
                Duration::ZERO,
            );
            return Err(format!(
                "approval declined by the user for {shown} earlier in this execution (same request); not asked again"
            ));
        }
        let max = self.policy.max_questions;
        if memory.asked >= max {
            self.report(
                subject,
                rule.into(),
                Decision::TooManyQuestions,
                Duration::ZERO,
            );
            return Err(format!(
                "{shown} needs approval ({rule}), but this execution already asked the user {max} questions (approval max_questions); denied without asking"
            ));
        }
        let wait = self.policy.timeout;
        let asked_at = Instant::now();
        // Reports the question abandoned if this future is dropped before the answer (the
        // proxy aborts its calls when the sandbox is gone) or the gate is abandoned.
        let mut open = Open {
            gate: self,
            subject: Some(subject),
            rule,
            asked_at,
        };
        let answer = tokio::select! {
            // The asker bounds its wait; this only guards against one that does not.
            a = tokio::time::timeout(wait + Duration::from_secs(1), self.asker.ask(question(), wait)) => {
                a.unwrap_or(Err(AskError::TimedOut(wait)))
            }
            _ = self.cancel.cancelled() => return Err(abandoned()),
        };
        let subject = open.subject.take().expect("taken once");
        let waited = asked_at.elapsed();
        let (decision, why) = match answer {
            Ok(result) => {
                memory.asked += 1;
                match message::read_answer(&result) {
                    Answer::Approved => (Decision::Accepted, String::new()),
                    Answer::Declined => (
                        Decision::Declined,
                        format!("approval declined by the user for {shown}"),
                    ),
                    Answer::AcceptedWithoutApproval => (
                        Decision::Declined,
                        format!("approval declined by the user for {shown} (the answer did not set approve: true)"),
                    ),
                    Answer::Cancelled => (
                        Decision::Cancelled,
                        format!("approval cancelled by the user for {shown}"),
                    ),
                }
            }
            Err(AskError::TimedOut(_)) => {
                memory.asked += 1;
                (
                    Decision::TimedOut,
                    format!(
                        "approval for {shown} timed out after {} s",
                        wait.as_secs_f64().round() as u64
                    ),
                )
            }
            Err(AskError::NoElicitation(why)) => match self.policy.fallback {
                Fallback::Allow => (Decision::FallbackAllowed, String::new()),
                Fallback::Deny => (
                    Decision::FallbackDenied,
                    format!(
                        "{shown} needs approval ({rule}), but the client cannot ask the user ({why}); approval fallback is deny"
                    ),
                ),
            },
            Err(AskError::Failed(e)) => {
                memory.asked += 1;
                (
                    Decision::Failed,
                    format!("approval for {shown} could not be asked ({e}); denied"),
                )
            }
        };
        match decision {
            Decision::Declined | Decision::Cancelled => {
                memory.declined.insert(key);
            }
            Decision::Accepted | Decision::FallbackAllowed => {
                if let Subject::Host(target) = &subject {
                    memory.approved_hosts.insert(target.clone());
                }
            }
            _ => {}
        }
        drop(memory);
        tracing::info!(
            kind = subject.kind(),
            name = %message::clip(subject.name(), message::MAX_NAME_BYTES),
            decision = decision.as_str(),
            waited_ms = waited.as_millis() as u64,
            "approval decided"
        );
        self.report(subject, rule.into(), decision, waited);
        if decision.allows() {
            Ok(())
        } else {
            Err(why)
        }
    }

    fn report(&self, subject: Subject, rule: String, decision: Decision, waited: Duration) {
        if self.reported.fetch_add(1, Ordering::Relaxed) >= MAX_RECORDS {
            tracing::debug!(
                decision = decision.as_str(),
                "approval decision not reported: this execution's records are full"
            );
            return;
        }
        if let Some(observe) = &self.observer {
            observe(&Decided {
                subject,
                rule,
                decision,
                waited,
            });
        }
    }
}

/// An open question; dropped before its answer, it is reported abandoned.
struct Open<'a> {
    gate: &'a Gate,
    subject: Option<Subject>,
    rule: &'a str,
    asked_at: Instant,
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        if let Some(subject) = self.subject.take() {
            tracing::info!(
                kind = subject.kind(),
                "approval question abandoned: the execution ended"
            );
            self.gate.report(
                subject,
                self.rule.into(),
                Decision::Abandoned,
                self.asked_at.elapsed(),
            );
        }
    }
}

/// SHA-256 of the name and the canonical (sorted-key) JSON of the arguments.
fn tool_key(name: &str, arguments: Option<&Map<String, Value>>) -> [u8; 32] {
    let args = serde_json::to_vec(&arguments).unwrap_or_default();
    Sha256::new()
        .chain_update(b"tool\0")
        .chain_update(name.as_bytes())
        .chain_update(b"\0")
        .chain_update(&args)
        .finalize()
        .into()
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
