//! One execution, from the tool call to its result.
//!
//! 1. Arguments: code size, files, timeout, allowed_tools, PII mode, session options;
//!    anything out of range is a tool error the model can read.
//! 2. The audit log, when it is down and configured to refuse, refuses.
//! 3. The client's rate limits, then the session (new, or the client's own), whose runs
//!    take turns, then a slot of the server-wide admission.
//! 4. A sandbox: a fresh one, or the session's live interpreter (`keep_alive`).
//! 5. A session run gets a fresh copy of the session's workspace mount (a size- and
//!    inode-limited tmpfs: the kernel refuses writes past the quota); after the run, a
//!    full workspace is reported as `workspace_quota_exceeded`.
//! 6. The result, with personal data tokenized, and an audit record.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolResult, LoggingLevel};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::json;

use crate::egress::{EgressReport, Narrowing};
use crate::execution::{self, ExecutionResult, SandboxStart};
use crate::metrics::labels::{Outcome as Ended, Refusal};
use crate::pii::PiiMode;
use crate::proxy::{AllowList, ProxySession, ToolBackend};
use crate::runtime::{self, Language};
use crate::sandbox::Outcome;
use crate::server::wiring;
use crate::server::wiring::progress::progress_forwarder;
use crate::server::{tool_error, CodeboxServer, ExecuteParams};
use crate::session::disk;
use crate::spawner::{ChannelServer, SpawnSpec, Stream};

/// What a call asked for, checked.
pub(in crate::server) struct Checked {
    pub(in crate::server) files: runtime::Files,
    pub(in crate::server) limits: crate::sandbox::Limits,
    pub(in crate::server) allow: AllowList,
    pub(in crate::server) pii: PiiMode,
    /// The hosts the call narrowed the egress allowlist to (`network`).
    pub(in crate::server) narrowing: Narrowing,
    /// The packages the call asks for (`packages`, TypeScript's npm:/jsr: imports).
    pub(in crate::server) packages: Option<crate::packages::PackageSet>,
    /// Characters of stdout and stderr the result carries.
    pub(in crate::server) output_chars: usize,
    /// Workspace files returned besides `/workspace/out`'s (`outputs`).
    pub(in crate::server) outputs: Vec<String>,
    /// The execution's approval gate, for its proxy and its egress run (set in `execute`).
    pub(in crate::server) approval: Option<Arc<crate::approval::Gate>>,
}

/// What running a program gave, before it becomes a result.
pub(in crate::server) struct Ran {
    pub(in crate::server) outcome: Outcome,
    pub(in crate::server) tools: crate::proxy::ProxyReport,
    /// The egress proxy's report (proxy mode).
    pub(in crate::server) network: Option<EgressReport>,
    /// Where the sandbox came from (not for a session's live interpreter).
    pub(in crate::server) start: Option<SandboxStart>,
    /// A live interpreter: `new`, `kept` or `ended`; `none` otherwise.
    pub(in crate::server) interpreter: &'static str,
    /// Forked from the Python zygote.
    pub(in crate::server) zygote: bool,
    /// Where it ran.
    pub(in crate::server) backend: crate::microvm::Backend,
}

impl CodeboxServer {
    /// The files, limits, allowlist and PII mode of a call, or why they are refused.
    fn checked(&self, language: Language, params: &ExecuteParams) -> Result<Checked, String> {
        let s = &self.state;
        if params.code.len() > runtime::MAX_CODE_BYTES {
            return Err(format!(
                "code is {} bytes; the limit is {} bytes",
                params.code.len(),
                runtime::MAX_CODE_BYTES
            ));
        }
        let files = runtime::decode_files(params.files.clone().unwrap_or_default())
            .map_err(|e| e.to_string())?;
        runtime::validate_files(&files, s.settings.max_files_bytes).map_err(|e| e.to_string())?;
        let mut limits = s.settings.profile.limits.clone();
        if let Some(ms) = params.timeout_ms {
            let max = s.settings.max_timeout;
            if ms == 0 || Duration::from_millis(ms) > max {
                return Err(format!(
                    "timeout_ms must be between 1 and {}",
                    max.as_millis()
                ));
            }
            limits.timeout = Duration::from_millis(ms);
        }
        let allow = match params.allowed_tools.as_deref() {
            None => s.settings.allowed_tools.clone(),
            Some(asked) => s
                .settings
                .allowed_tools
                .clone()
                .narrowed_by(&AllowList::new(asked).map_err(|e| e.to_string())?),
        };
        // A call may make PII handling stricter than the server's, never weaker.
        let pii = match params.pii.as_deref() {
            None => s.settings.pii_mode,
            Some(asked) => {
                let asked: PiiMode = asked
                    .parse()
                    .map_err(|e: crate::pii::Error| e.to_string())?;
                if asked < s.settings.pii_mode {
                    return Err(format!(
                        "pii \"{asked}\" is weaker than this server's \"{}\"; a call may only ask for stricter handling",
                        s.settings.pii_mode
                    ));
                }
                asked
            }
        };
        if params.keep_alive == Some(true) && params.session.is_none() {
            return Err("keep_alive needs a session: pass session \"new\" to start one".into());
        }
        if s.settings.microvm.is_some() && params.session.is_some() {
            return Err(crate::microvm::serve::CALL_REFUSAL_SESSIONS.into());
        }
        let narrowing = self.narrowing(params.network.as_deref())?;
        let packages = self.package_set(language, params.packages.as_deref(), &params.code)?;
        let output_chars = s.settings.output_budget.for_call(params.output_budget)?;
        let outputs = checked_outputs(params.outputs.as_deref().unwrap_or_default())?;
        Ok(Checked {
            output_chars,
            outputs,
            files,
            limits,
            allow,
            pii,
            narrowing,
            packages,
            approval: None,
        })
    }

    pub(in crate::server) async fn execute(
        &self,
        language: Language,
        params: ExecuteParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        self.execute_with(language, params, ctx, None).await
    }

    /// [`Self::execute`], with the output so far also going to `tail` (an execution
    /// running as a task shows it in the task's status).
    pub(in crate::server) async fn execute_with(
        &self,
        language: Language,
        params: ExecuteParams,
        ctx: RequestContext<RoleServer>,
        tail: Option<Arc<crate::tasks::OutputTail>>,
    ) -> Result<CallToolResult, McpError> {
        let s = &self.state;
        let _unanswered = InFlight::enter(&s.in_flight);
        let entered = Instant::now();
        let client = self.client_of(&ctx);
        // Arguments that parse but are out of range are tool execution errors, not
        // protocol errors (MCP 2025-11-25, "Error Handling"): the model reads them and
        // can correct the call.
        let mut c = match self.checked(language, &params) {
            Ok(c) => c,
            Err(why) => {
                tracing::info!(%why, "tool call refused: invalid arguments");
                crate::metrics::global().execution_refused(language, Refusal::InvalidArguments);
                self.audit_refused(&client, None, language, &params.code, "invalid");
                return Ok(tool_error(format!("invalid arguments: {why}")));
            }
        };
        if let Some(why) = self.audit_refusal() {
            crate::metrics::global().execution_refused(language, Refusal::AuditUnavailable);
            return Ok(tool_error(why));
        }
        if let Some(why) = s.layers.refusal() {
            crate::metrics::global().execution_refused(language, Refusal::HostNotReady);
            self.audit_refused(&client, None, language, &params.code, "host_not_ready");
            return Ok(tool_error(why));
        }
        let _client_permit = match s.rate.admit(&client) {
            Ok(p) => p,
            Err(limited) => {
                crate::metrics::global().execution_refused(language, Refusal::from(&limited));
                self.audit_refused(&client, None, language, &params.code, "rate_limited");
                let mut r = tool_error(limited.to_string());
                r.structured_content = Some(json!({
                    "error": "rate_limited",
                    "retry_after_ms": limited.retry_after().map(|d| d.as_millis() as u64),
                }));
                return Ok(r);
            }
        };
        let session = match params.session.as_deref() {
            None => None,
            Some("new") => match s.sessions.create(&client, self.new_vault()) {
                Ok(session) => Some(session),
                Err(e) => {
                    let reason = match e {
                        crate::session::Error::Keeper(_) => Refusal::Workspace,
                        _ => Refusal::Session,
                    };
                    crate::metrics::global().execution_refused(language, reason);
                    if matches!(e, crate::session::Error::Keeper(_)) {
                        tracing::error!(
                            err = format!("{:#}", anyhow::Error::new(e)),
                            "cannot create a session's workspace"
                        );
                        return Ok(tool_error(
                            "the session's workspace cannot be created (the server log says why); runs without a session still work".into(),
                        ));
                    }
                    return Ok(tool_error(e.to_string()));
                }
            },
            Some(id) => match s
                .sessions
                .get_or_resume(id, &client, || self.new_vault())
                .await
            {
                Ok(session) => Some(session),
                Err(e) => {
                    crate::metrics::global().execution_refused(language, Refusal::Session);
                    return Ok(tool_error(e.to_string()));
                }
            },
        };
        // Paused while this call waited for its turn: the resumed one is the session now.
        let session = match session {
            Some(first)
                if {
                    // Its turn: a pause in progress ends before this.
                    drop(first.slots.lock().await);
                    first.is_gone()
                } =>
            {
                match s
                    .sessions
                    .get_or_resume(first.id(), &client, || self.new_vault())
                    .await
                {
                    Ok(session) => Some(session),
                    Err(e) => {
                        crate::metrics::global().execution_refused(language, Refusal::Session);
                        return Ok(tool_error(e.to_string()));
                    }
                }
            }
            other => other,
        };
        // Runs of one session take turns; the lock also holds its live interpreters.
        let mut slots = match &session {
            Some(session) => Some(session.slots.lock().await),
            None => None,
        };
        if session.as_ref().is_some_and(|s| s.is_gone()) {
            crate::metrics::global().execution_refused(language, Refusal::Session);
            return Ok(tool_error(
                "the session was paused again while this call waited for its turn; call again to resume it".into(),
            ));
        }
        let admitted = match s.admission.enter().await {
            Ok(slot) => slot,
            Err(busy) => {
                crate::metrics::global().execution_refused(language, Refusal::from(&busy));
                return Ok(tool_error(busy.to_string()));
            }
        };
        // In `codebox_executions_in_flight` from here until the call is answered.
        let _running = crate::metrics::global().running();
        // Packages: the call's set, installed now if new (the admission slot covers the
        // install), or the session's kept layer.
        let layer = match (&c.packages, &mut slots) {
            (Some(set), slots) => match self.package_layer(set).await {
                Ok(layer) => {
                    if let Some(slots) = slots {
                        slots.set_layer(language, layer.clone());
                    }
                    Some(layer)
                }
                Err(why) => {
                    crate::metrics::global().execution_refused(language, Refusal::Packages);
                    self.audit_refused(&client, None, language, &params.code, "packages");
                    return Ok(tool_error(why));
                }
            },
            (None, Some(slots)) => slots.layer(language),
            (None, None) => None,
        };
        let vault = match &session {
            Some(session) => session.vault.clone(),
            None => self.vault().clone(),
        };
        let redact = (c.pii != PiiMode::Off).then_some(vault);

        // Stream output as progress notifications when the request asks for them.
        let secrets = s
            .settings
            .egress
            .as_ref()
            .map(|e| e.secrets().clone())
            .filter(|x| !x.is_empty());
        let (forwarder, tx) = progress_forwarder(&ctx, redact.clone(), secrets, tail);
        let on_output = |stream: Stream, chunk: &[u8]| {
            if let Some(tx) = &tx {
                let _ = tx.send((stream, chunk.to_vec()));
            }
        };

        // A session's workspace: a fresh copy of its mount for this run, and what it
        // held before.
        let (workspace_mount, start_usage) = match &session {
            Some(session) => match s.sessions.mount_for_run(session) {
                Ok(fd) => (
                    Some(crate::spawner::wire::MountFd(Arc::new(fd))),
                    disk::usage(session.workspace()).ok(),
                ),
                Err(e) => {
                    crate::metrics::global().execution_refused(language, Refusal::Workspace);
                    let answer = match &e {
                        crate::session::Error::Lost { .. } => e.to_string(),
                        _ => "the session's workspace cannot be attached (the server log says why); start a new session".into(),
                    };
                    tracing::error!(
                        session = crate::session::short(session.id()),
                        err = format!("{:#}", anyhow::Error::new(e)),
                        "cannot attach a session's workspace"
                    );
                    return Ok(tool_error(answer));
                }
            },
            None => (None, None),
        };
        // The execution ends early on the client's cancel or when the server stops (the
        // drain bound); the latter is answered "the server is stopping".
        let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cancel = {
            let ct = ctx.ct.clone();
            let stopping = s.stopping.clone();
            let stopped = stopped.clone();
            async move {
                tokio::select! {
                    _ = ct.cancelled() => {}
                    _ = stopping.cancelled() => stopped.store(true, Ordering::SeqCst),
                }
            }
        };

        // Right after start-up a server may still be making its first connection: its
        // tools, and so the typed wrappers at /servers, are not known yet. Wait for it
        // (bounded by upstream_wait from its first attempt; at once otherwise).
        s.backend.first_attempts(None).await;
        let wrappers = self.wrapper_dir();
        let skills = match self.skills_dir_for(&client, session.is_some()).await {
            Ok(dir) => dir,
            Err(why) => {
                crate::metrics::global().execution_refused(language, Refusal::Skills);
                return Ok(tool_error(why));
            }
        };
        let spec = SpawnSpec {
            language,
            profile: s.settings.profile.source.clone(),
            limits: c.limits.clone(),
            workspace: None,
            workspace_mount,
            network: Some(s.settings.network.clone()),
            packages: layer.as_ref().map(|l| l.path.clone()),
            servers: wrappers.as_ref().map(|w| w.path().to_path_buf()),
            skills,
            pooled: false,
        };
        let keep_alive = match &mut slots {
            Some(slots) => {
                if let Some(on) = params.keep_alive {
                    slots.set_keep_alive(language, on);
                }
                slots.keep_alive(language)
            }
            None => false,
        };
        let session_id = session.as_ref().map(|s| s.id().to_string());
        // The one place an execution gets its way to ask the user (`approval_glue`); its
        // open question is abandoned when this call ends, however it ends.
        let gate = self.approval_gate(&ctx, &client, session_id.as_deref(), redact.clone());
        let _abandon = gate.abandon_on_drop();
        c.approval = Some(gate);
        let hooks = |proxy: &ProxySession| {
            if let Some(gate) = &c.approval {
                proxy.set_approval(gate.clone());
            }
            if let Some(v) = &redact {
                proxy.set_redactor(v.clone(), c.pii == PiiMode::Strict);
            }
            if let Some(observer) = self.call_observer(&client, session_id.as_deref()) {
                proxy.set_observer(observer);
            }
            proxy.set_own_methods(crate::server::tools::sandbox_methods::FromSandbox::new(
                self, &client,
            ));
        };
        let prepared = entered.elapsed();
        let ran = if keep_alive {
            // A session's live interpreter outlives the run; the slot covers the run.
            let _admitted = admitted;
            let slot = slots
                .as_mut()
                .expect("keep_alive has a session")
                .slot(language);
            self.run_live(
                slot,
                spec,
                &params.code,
                &c,
                (wrappers, layer.clone()),
                &hooks,
                cancel,
                on_output,
            )
            .await
        } else {
            // What the sandbox binds lives until it is gone.
            let held = (admitted, layer.clone());
            self.run_once(spec, &params.code, &c, held, &hooks, cancel, on_output)
                .await
        };
        drop(tx);
        if let Some(f) = forwarder {
            let _ = f.await;
        }
        let ran_at = entered.elapsed();
        // An execution that ended without a result: counted, audited, answered.
        let unfinished = |category: &str, why: String| {
            s.counters.failed.fetch_add(1, Ordering::Relaxed);
            let outcome = match category {
                "stopping" => Ended::Stopped,
                _ => Ended::SandboxError,
            };
            crate::metrics::global().execution_unfinished(language, outcome);
            self.audit_refused(
                &client,
                session_id.as_deref(),
                language,
                &params.code,
                category,
            );
            Ok(tool_error(why))
        };
        if stopped.load(Ordering::SeqCst) {
            return unfinished(
                "stopping",
                "the server is stopping: the execution was killed before it finished".into(),
            );
        }
        let ran = match ran {
            Ok(ran) => ran,
            Err(why) => return unfinished("error", why),
        };
        let interpreter = ran.interpreter;
        let mut result = execution::result_from(language, None, true, ran.outcome);
        result.tool_calls = ran.tools.tool_calls;
        result.tool_calls_dropped = ran.tools.tool_calls_dropped;
        result.start = ran.start;
        result.zygote = ran.zygote;
        result.backend = ran.backend;
        result.tool_channel_error = ran.tools.channel_error;
        result.value = ran.tools.value;
        result.runtime = ran.tools.runtime;
        let out_files = ran.tools.out_files;
        result.network = ran.network;
        if let Some(layer) = &layer {
            result.packages = Some(json!({
                // This call's own request (the layer's metadata names the request that
                // first installed it, maybe another client's).
                "requested": c.packages.as_ref().map(|p| p.texts()).unwrap_or_default(),
                "installed": layer.meta.installed,
                "layer_bytes": layer.meta.bytes,
            }));
        }
        if let Some(egress) = &s.settings.egress {
            result.redact_secrets(egress.secrets());
        }
        if let Some(session) = &session {
            self.settle_workspace(session, start_usage, &mut result);
            let mut about = json!({
                "id": session.id(),
                "keep_alive": keep_alive,
                "interpreter": interpreter,
                "idle_ttl_s": s.sessions.limits().idle_ttl.as_secs(),
            });
            // The first run after a resume: what of the session came back.
            if session.take_resumed() {
                about["resumed"] = json!(true);
                about["state"] = json!(crate::session::persist::backend_state().as_str());
            }
            result.session = Some(about);
            session.touch();
        }
        if let Some(v) = &redact {
            tokenize_result(v, &mut result);
        }
        // From the whole (tokenized) stderr, before the output budget cuts it.
        result.hints = self.hints_for(language, &c.limits, keep_alive, &result);
        // One id for what the store keeps of this execution: cut streams and files.
        // A replica's ids carry its name, so a balancer routes their reads (`Mcp-Name`).
        let kept_id = match self.replica() {
            Some(replica) => replica.qualify(&crate::output::kept::new_id()),
            None => crate::output::kept::new_id(),
        };
        let file_blocks =
            self.present_out_files(&client, &kept_id, out_files, redact.as_deref(), &mut result);
        self.fit_output(&client, &kept_id, &mut result, c.output_chars);
        s.counters.run.fetch_add(1, Ordering::Relaxed);
        if result.failed() {
            s.counters.failed.fetch_add(1, Ordering::Relaxed);
        }
        crate::metrics::global().execution_ended(&result, entered.elapsed());
        self.audit_execution(
            &client,
            session_id.as_deref(),
            &params.code,
            &c.allow,
            &result,
        );
        let level = if result.failed() {
            LoggingLevel::Notice
        } else {
            LoggingLevel::Info
        };
        self.log(
            &ctx,
            level,
            json!({
                "event": "execution",
                "language": language,
                "exit_code": result.exit_code,
                "signal": result.signal,
                "timed_out": result.timed_out,
                "duration_ms": result.duration_ms,
            }),
        )
        .await;
        let rendered = crate::server::tools::render::render_with(&result, file_blocks);
        tracing::debug!(
            %language,
            prepared_us = prepared.as_micros() as u64,
            ran_us = ran_at.as_micros() as u64,
            done_us = entered.elapsed().as_micros() as u64,
            "execution steps (from the call's arrival)"
        );
        Ok(rendered)
    }

    /// A sandbox for one program: a warm one from the pool when the pool has one for this
    /// call, else one started now.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::server) async fn run_once(
        &self,
        spec: SpawnSpec,
        code: &str,
        c: &Checked,
        admitted: impl std::any::Any + Send,
        hooks: &(dyn Fn(&ProxySession) + Sync),
        cancel: impl std::future::Future<Output = ()>,
        on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<Ran, String> {
        let s = &self.state;
        let backend: Arc<dyn ToolBackend> = s.backend.clone();
        let proxy = ProxySession::new(backend, c.allow.clone(), s.settings.proxy_limits.clone());
        hooks(&proxy);
        // A model reads the last expression's value like a REPL's.
        let mut frame = runtime::with_value(runtime::boot_frame_with_files(code, &c.files));
        frame = runtime::with_outputs(frame, &s.settings.proxy_limits.out_files, &c.outputs);
        // No host directory is bound: nothing of the sandbox outlives it, so the run may
        // end at the runtime's `codebox/exit` (a run that writes a session's workspace
        // ends only with its sandbox, which it could otherwise outlive).
        let ephemeral = spec.workspace.is_none() && spec.workspace_mount.is_none();
        if ephemeral {
            frame = runtime::ephemeral(frame);
        }
        if let Some(vms) = &s.settings.microvm {
            return self
                .run_in_microvm(vms, &spec, frame, c, admitted, proxy, cancel, on_output)
                .await;
        }
        let asked = Instant::now();
        let warm = match &s.pool {
            Some(pool) => pool.take(&spec).await,
            None => None,
        };
        tracing::debug!(
            take_us = asked.elapsed().as_micros() as u64,
            warm = warm.is_some(),
            "warm pool asked"
        );
        let (mut sandbox, start) = match warm {
            Some(warm) => {
                let (mut sandbox, guard) = warm.into_parts();
                // What the pooled sandbox binds lives, and the refill waits, until the
                // sandbox is gone.
                sandbox.hold_until_gone(guard);
                (sandbox, SandboxStart::Warm)
            }
            None => {
                let sandbox = s.spawner.spawn(spec).await.map_err(|e| {
                    log_spawn_failure(&e);
                    format!("the sandbox could not be created: {e}")
                })?;
                (sandbox, SandboxStart::Cold)
            }
        };
        let zygote = sandbox.from_zygote();
        // The admission limit bounds the sandboxes that exist, not only the results
        // being computed: the slot is free again once the spawner has removed this one.
        sandbox.hold_until_gone(admitted);
        let egress = wiring::egress::serve(
            s.settings.egress.as_deref(),
            sandbox.take_egress_listener(),
            c,
        );
        let serve_proxy = proxy.clone();
        let exit_notice = ephemeral.then(|| {
            let (exit_tx, exit_rx) = tokio::sync::oneshot::channel();
            proxy.set_exit_notice(exit_tx);
            exit_rx
        });
        let outcome = sandbox
            .run_with_channel(
                frame,
                Some(ChannelServer {
                    service: Box::new(move |stream| Box::pin(serve_proxy.serve(stream))),
                    exit_notice,
                }),
                (c.limits.stdout_cap, c.limits.stderr_cap),
                c.limits.timeout,
                cancel,
                on_output,
            )
            .await;
        let network = wiring::egress::finish(egress).await;
        let outcome = outcome.map_err(|e| format!("the sandbox failed: {e}"))?;
        Ok(Ran {
            outcome,
            tools: proxy.take_report(),
            network,
            start: Some(start),
            interpreter: "none",
            zygote,
            backend: crate::microvm::Backend::Namespace,
        })
    }
}

/// The `outputs` of a call, checked like file paths: at most [`runtime::boot::MAX_FILES`],
/// each named once.
impl CodeboxServer {
    /// The result's hints ([`crate::hints`]) with this server's knobs.
    fn hints_for(
        &self,
        language: Language,
        limits: &crate::sandbox::Limits,
        kept_interpreter: bool,
        result: &ExecutionResult,
    ) -> Vec<String> {
        let settings = &self.state.settings;
        let cx = crate::hints::Context {
            surface: crate::hints::Surface::Mcp,
            language,
            profile: &settings.profile.name,
            timeout: limits.timeout,
            max_timeout: Some(settings.max_timeout),
            memory_bytes: limits.memory_bytes,
            pids: limits.pids,
            network: settings.network.mode(),
            packages: match settings.packages {
                Some(_) => crate::hints::Packages::OnRequest,
                None => crate::hints::Packages::Off,
            },
            kept_interpreter,
            sessions: settings.microvm.is_none(),
        };
        crate::hints::for_result(result, &cx)
    }
}

fn checked_outputs(asked: &[String]) -> Result<Vec<String>, String> {
    if asked.len() > runtime::boot::MAX_FILES {
        return Err(format!(
            "outputs names {} files; at most {} are allowed",
            asked.len(),
            runtime::boot::MAX_FILES
        ));
    }
    let mut out: Vec<String> = Vec::with_capacity(asked.len());
    for path in asked {
        runtime::validate_path(path).map_err(|e| format!("outputs: {e}"))?;
        if !out.contains(path) {
            out.push(path.clone());
        }
    }
    Ok(out)
}

/// Everything of a result that reaches the model, with personal data tokenized.
fn tokenize_result(vault: &crate::pii::Vault, r: &mut ExecutionResult) {
    r.stdout = vault.tokenize(&r.stdout);
    r.stderr = vault.tokenize(&r.stderr);
    if let Some(v) = &mut r.value {
        *v = vault.tokenize(v);
    }
    for call in &mut r.tool_calls {
        if let Some(e) = &call.error {
            call.error = Some(vault.tokenize(e));
        }
    }
    if let Some(entries) = &mut r.workspace_files {
        for e in entries {
            e.path = vault.tokenize(&e.path);
            if let Some(l) = &e.link {
                e.link = Some(vault.tokenize(l));
            }
        }
    }
    if let Some(e) = &r.tool_channel_error {
        r.tool_channel_error = Some(vault.tokenize(e));
    }
}

/// Counts an execute call from its arrival until its answer is returned.
struct InFlight(Arc<std::sync::atomic::AtomicUsize>);

impl InFlight {
    fn enter(count: &Arc<std::sync::atomic::AtomicUsize>) -> InFlight {
        count.fetch_add(1, Ordering::SeqCst);
        InFlight(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A spawn lost with its spawner is part of that event, which the spawner client logs
/// once; any other spawn failure is an error of its own.
pub(super) fn log_spawn_failure(e: &crate::spawner::Error) {
    if matches!(e, crate::spawner::Error::Lost) {
        tracing::debug!(error = %e, "a spawn was lost with its spawner");
    } else {
        tracing::error!(?e, "spawning a sandbox failed");
    }
}
