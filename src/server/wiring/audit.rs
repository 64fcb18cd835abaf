//! What the server writes to the audit log: one record per execution (also refused ones)
//! and one per proxied tool call, up to the proxy's cap of call records per execution
//! (`max_tool_call_records`); the calls past it are counted in one `tool_calls_omitted`
//! record written before the execution's. Appends run on the blocking pool (the log may
//! fsync).
//!
//! Records hold no code text (unless the operator opted in), no output and no error
//! texts, so no personal data; a session is named by the first characters of its id
//! (the full id is a capability).

use std::sync::Arc;

use crate::audit::{self, AuditEvent, AuditLog, OnFailure};
use crate::execution::ExecutionResult;
use crate::proxy::{AllowList, CallObserver};
use crate::runtime::Language;
use crate::server::CodeboxServer;

pub(in crate::server) fn append(log: &Arc<AuditLog>, event: AuditEvent) {
    let log = log.clone();
    tokio::task::spawn_blocking(move || {
        if let Err(e) = log.append(event) {
            tracing::error!(error = %e, "cannot append to the audit log");
        }
    });
}

pub(in crate::server) fn session_name(session: Option<&str>) -> Option<String> {
    session.map(|id| crate::session::short(id).to_string())
}

impl CodeboxServer {
    /// Why no execution may run now: the audit log is failing and the operator chose to
    /// refuse what cannot be recorded. A probe record is tried first, so the server
    /// recovers as soon as the log is writable again.
    pub(in crate::server) fn audit_refusal(&self) -> Option<String> {
        let log = self.state.settings.audit.as_ref()?;
        if log.on_failure() != OnFailure::Refuse || log.status().healthy {
            return None;
        }
        match log.append(AuditEvent::Execution(self.execution_record(
            "codebox",
            None,
            "none",
            "",
            &AllowList::none(),
            None,
            "probe",
        ))) {
            Ok(()) => None,
            Err(e) => Some(format!(
                "the audit log is unavailable ({e}) and this server refuses executions it cannot record; retry later"
            )),
        }
    }

    /// Records an execution that did not run (invalid, rate limited, failed to start).
    pub(in crate::server) fn audit_refused(
        &self,
        client: &str,
        session: Option<&str>,
        language: Language,
        code: &str,
        outcome: &str,
    ) {
        if let Some(log) = &self.state.settings.audit {
            let record = self.execution_record(
                client,
                session,
                language.name(),
                code,
                &AllowList::none(),
                None,
                outcome,
            );
            append(log, AuditEvent::Execution(record));
        }
    }

    pub(in crate::server) fn audit_execution(
        &self,
        client: &str,
        session: Option<&str>,
        code: &str,
        allow: &AllowList,
        result: &ExecutionResult,
    ) {
        if let Some(log) = &self.state.settings.audit {
            if let Some(dropped) = &result.tool_calls_dropped {
                let record = audit::ToolCallsOmittedRecord {
                    client: client.to_string(),
                    session: session_name(session),
                    count: dropped.count,
                    by_outcome: dropped.by_outcome.clone(),
                };
                append(log, AuditEvent::ToolCallsOmitted(record));
            }
            if let Some(network) = &result.network {
                for c in &network.connections {
                    let record = audit::EgressRecord {
                        client: client.to_string(),
                        session: session_name(session),
                        host: c.host.clone(),
                        port: c.port,
                        kind: serde_json::to_value(c.kind)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_string))
                            .unwrap_or_default(),
                        allowed: c.allowed,
                        reason: c.reason.clone(),
                        rule: c.rule.clone(),
                        address: c.address.clone(),
                        bytes_up: c.bytes_up,
                        bytes_down: c.bytes_down,
                        duration_ms: c.duration_ms,
                        credential_added: c.credential_added,
                    };
                    append(log, AuditEvent::Egress(record));
                }
            }
            let outcome = if result.failed() { "failed" } else { "ok" };
            let record = self.execution_record(
                client,
                session,
                result.language.name(),
                code,
                allow,
                Some(result),
                outcome,
            );
            append(log, AuditEvent::Execution(record));
        }
    }

    /// Writes every proxied call of an execution the proxy keeps a record of (the first
    /// `max_tool_call_records`) as it returns.
    pub(in crate::server) fn call_observer(
        &self,
        client: &str,
        session: Option<&str>,
    ) -> Option<CallObserver> {
        let log = self.state.settings.audit.clone()?;
        let client = client.to_string();
        let session = session_name(session);
        Some(Arc::new(move |call: &crate::proxy::ToolCallRecord| {
            let record = audit::ToolCallRecord {
                client: client.clone(),
                session: session.clone(),
                name: call.name.clone(),
                ok: call.ok,
                duration_ms: call.duration_ms,
                bytes_in: call.bytes_in,
                bytes_out: call.bytes_out,
                error_kind: call.error_kind.map(str::to_string),
            };
            append(&log, AuditEvent::ToolCall(record));
        }))
    }

    #[allow(clippy::too_many_arguments)]
    fn execution_record(
        &self,
        client: &str,
        session: Option<&str>,
        language: &str,
        code: &str,
        allow: &AllowList,
        result: Option<&ExecutionResult>,
        outcome: &str,
    ) -> audit::ExecutionRecord {
        let network = result.and_then(|r| r.network.as_ref());
        let mut limits_hit = Vec::new();
        if let Some(r) = result {
            for (hit, name) in [
                (r.timed_out, "timeout"),
                (r.oom_killed, "memory"),
                (r.pids_limited, "pids"),
                (r.stdout_truncated || r.stderr_truncated, "output"),
                (r.workspace_quota_exceeded, "workspace_quota"),
                (r.seccomp_violation, "seccomp"),
                (
                    r.network
                        .as_ref()
                        .is_some_and(|n| n.limit_reached.is_some()),
                    "egress",
                ),
            ] {
                if hit {
                    limits_hit.push(name.to_string());
                }
            }
        }
        audit::ExecutionRecord {
            client: client.to_string(),
            session: session_name(session),
            language: language.to_string(),
            code_sha256: audit::code_digest(code),
            code_bytes: code.len() as u64,
            // The log drops it unless `include_code` is set.
            code: Some(code.to_string()),
            allowed_tools: allow.patterns().to_vec(),
            tools_called: result
                .map(|r| {
                    r.tool_calls
                        .iter()
                        .map(|c| audit::ToolCalled {
                            name: c.name.clone(),
                            ok: c.ok,
                            duration_ms: c.duration_ms,
                        })
                        .collect()
                })
                .unwrap_or_default(),
            tools_called_omitted: result
                .and_then(|r| r.tool_calls_dropped.as_ref())
                .map_or(0, |d| d.count),
            egress_allowed: network.map_or(0, |n| u64::from(n.allowed)),
            egress_denied: network.map_or(0, |n| u64::from(n.denied)),
            egress_omitted: network.map_or(0, |n| n.dropped),
            exit_code: result.and_then(|r| r.exit_code),
            signal: result.and_then(|r| r.signal),
            limits_hit,
            duration_ms: result.map_or(0.0, |r| r.duration_ms),
            cpu_ms: result.and_then(|r| r.cpu_ms),
            peak_memory_bytes: result.and_then(|r| r.peak_memory_bytes),
            output_bytes: result.map_or(0, |r| r.stdout_total_bytes + r.stderr_total_bytes),
            profile: self.state.settings.profile.name.clone(),
            rootfs_manifest_sha256: self.state.settings.rootfs_manifest_sha256.clone(),
            outcome: outcome.to_string(),
        }
    }

    /// Records a skill save or delete (or a refused one): who, which, the code's size
    /// and digest, never the code.
    pub(in crate::server) fn audit_skill(
        &self,
        client: &str,
        action: &str,
        name: &str,
        language: Option<&str>,
        code: Option<&str>,
        outcome: &str,
    ) {
        if let Some(log) = &self.state.settings.audit {
            let record = audit::SkillRecord {
                client: client.to_string(),
                action: action.to_string(),
                name: name.to_string(),
                language: language.map(str::to_string),
                code_bytes: code.map(|c| c.len() as u64),
                code_sha256: code.map(audit::code_digest),
                outcome: outcome.to_string(),
            };
            append(log, AuditEvent::Skill(record));
        }
    }
}
