//! Approval gates in an execution (`crate::approval` holds the policy, the question, the
//! gate): which [`Asker`] a request gets, and the execution's [`Gate`] with its argument
//! summary (PII tokenized with the execution's vault when PII handling is on; configured
//! egress secrets redacted) and its audit records.
//!
//! `execute.rs` makes one gate per execution ([`CodeboxServer::approval_gate`]) and puts it
//! in the call's `Checked`; from there the proxy session (`ProxySession::set_approval`)
//! and the egress run (`wiring::egress::serve`) take it. Nothing reaches them through
//! globals.

use std::sync::Arc;

use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde_json::Value;

use crate::approval::{Asker, Decided, Gate, NoAsker, PeerAsker};
use crate::audit::{ApprovalRecord, AuditEvent};
use crate::server::transport::input_route::{InputAsker, InputRoute};
use crate::server::wiring::audit::{append, session_name};
use crate::server::CodeboxServer;

/// How this request's user can be asked.
///
/// - 2025-11-25 (and older) stateful connections: the client's own `elicitation`
///   capability decides: form mode declared (or the bare capability, which means form)
///   → [`PeerAsker`]; otherwise [`NoAsker`].
/// - 2026-07-28 and later (stateless, per-request `_meta`): no server→client request can
///   reach the client; answers come back through `input_required` results and the Tasks
///   extension's `input_required` status: an execution running as a task, or a call
///   running in input rounds, carries its [`InputRoute`] and gets an [`InputAsker`] when
///   the request declared elicitation; any other 2026-07-28 call gets [`NoAsker`] (the
///   fallback applies).
pub(in crate::server) fn asker_for(ctx: &RequestContext<RoleServer>) -> Arc<dyn Asker> {
    // A task, or a stateless call in input rounds: the question travels in an answer.
    if let Some(route) = ctx.extensions.get::<InputRoute>() {
        let elicitation = ctx.client_capabilities().and_then(|c| c.elicitation);
        return match elicitation {
            Some(e) if e.form.is_some() || e.url.is_none() => {
                Arc::new(InputAsker::new(route.clone()))
            }
            _ => Arc::new(NoAsker::new("no elicitation capability")),
        };
    }
    match ctx.protocol_version() {
        Some(v) if v.has_initialize() => {
            let form = ctx
                .client_capabilities()
                .and_then(|c| c.elicitation)
                .is_some_and(|e| e.form.is_some() || e.url.is_none());
            if form {
                Arc::new(PeerAsker::new(ctx.peer.clone()))
            } else {
                Arc::new(NoAsker::new("no elicitation capability"))
            }
        }
        Some(v) => Arc::new(NoAsker::new(format!(
            "a {v} request cannot carry a question to the user yet"
        ))),
        None => Arc::new(NoAsker::new("no protocol version negotiated")),
    }
}

impl CodeboxServer {
    /// The approval gate of one execution of `client`: asks through [`asker_for`],
    /// summarises arguments with `vault` (PII on) and without configured secrets, and
    /// writes every decision to the audit log.
    pub(in crate::server) fn approval_gate(
        &self,
        ctx: &RequestContext<RoleServer>,
        client: &str,
        session: Option<&str>,
        vault: Option<Arc<crate::pii::Vault>>,
    ) -> Arc<Gate> {
        let s = &self.state.settings;
        let secrets = s
            .egress
            .as_ref()
            .map(|e| e.secrets().clone())
            .filter(|x| !x.is_empty());
        let summarize = Box::new(move |value: &mut Value| {
            if let Some(v) = &vault {
                v.tokenize_json(value);
            }
            let text = value.to_string();
            match &secrets {
                Some(x) => String::from_utf8_lossy(&x.redact_all(text.as_bytes())).into_owned(),
                None => text,
            }
        });
        let observer = s.audit.clone().map(|log| {
            let client = client.to_string();
            let session = session_name(session);
            let observe = move |d: &Decided| {
                let record = ApprovalRecord {
                    client: client.clone(),
                    session: session.clone(),
                    kind: d.subject.kind().to_string(),
                    name: crate::proxy::clip(d.subject.name(), crate::proxy::MAX_NAME_ECHO)
                        .into_owned(),
                    rule: d.rule.clone(),
                    decision: d.decision.as_str().to_string(),
                    wait_ms: d.waited.as_secs_f64() * 1000.0,
                };
                append(&log, AuditEvent::Approval(record));
            };
            Arc::new(observe) as crate::approval::gate::DecisionObserver
        });
        Gate::new(s.approval.clone(), asker_for(ctx), summarize, observer)
    }
}
