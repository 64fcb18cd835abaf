//! A session's runs: one program in the session's live interpreter (`keep_alive`), and
//! what a session run's workspace came to (the quota verdict and its figures).

use std::sync::Arc;

use serde_json::json;

use super::execute::{log_spawn_failure, Checked, Ran};
use crate::execution::ExecutionResult;
use crate::proxy::{ProxySession, ToolBackend};
use crate::runtime;
use crate::sandbox::{Outcome, ProgramStatus};
use crate::server::{wiring, CodeboxServer};
use crate::session::{disk, LiveEntry, Session};
use crate::spawner::{LiveSandbox, RunEnd, SpawnSpec, Stream};

impl CodeboxServer {
    /// One program in the session's live interpreter of its language (started first if
    /// there is none). Returns what `interpreter` the result reports: `new`, `kept` or
    /// `ended` (it is gone after this run).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_live(
        &self,
        slot: &mut Option<LiveEntry>,
        spec: SpawnSpec,
        code: &str,
        c: &Checked,
        (wrappers, layer): (
            Option<Arc<crate::codegen::wrapper_dir::WrapperDir>>,
            Option<Arc<crate::packages::Layer>>,
        ),
        hooks: &(dyn Fn(&ProxySession) + Sync),
        cancel: impl std::future::Future<Output = ()>,
        on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<Ran, String> {
        let s = &self.state;
        if slot.as_ref().is_some_and(|l| l.sandbox.has_ended()) {
            *slot = None;
        }
        // An interpreter's /packages is bound when it starts.
        if let Some(entry) = slot.as_ref() {
            let bound = entry.layer.as_ref().map(|l| &l.path);
            if bound != layer.as_ref().map(|l| &l.path) {
                return Err("this session's interpreter was started with other packages: ask for the same ones, or end it with keep_alive: false".into());
            }
        }
        let (message, mut interpreter) = match slot {
            Some(_) => (
                Some(runtime::session_run_message(code, &c.files, &c.outputs)),
                "kept",
            ),
            None => {
                let backend: Arc<dyn ToolBackend> = s.backend.clone();
                let proxy =
                    ProxySession::new(backend, c.allow.clone(), s.settings.proxy_limits.clone());
                let mut sandbox = s.spawner.spawn(spec).await.map_err(|e| {
                    log_spawn_failure(&e);
                    format!("the sandbox could not be created: {e}")
                })?;
                let egress_listener = sandbox.take_egress_listener();
                let frame = runtime::with_value(runtime::session_boot_frame(code, &c.files));
                let frame =
                    runtime::with_outputs(frame, &s.settings.proxy_limits.out_files, &c.outputs);
                let live = LiveSandbox::start(sandbox, frame, proxy)
                    .map_err(|e| format!("the sandbox failed: {e}"))?;
                *slot = Some(LiveEntry {
                    sandbox: live,
                    egress_listener,
                    layer,
                    _servers: wrappers,
                });
                (None, "new")
            }
        };
        let entry = slot.as_mut().expect("filled above");
        let proxy = entry.sandbox.proxy().clone();
        proxy.set_allow(c.allow.clone());
        hooks(&proxy);
        let _ = proxy.take_report();
        let landlock = entry.sandbox.landlock();
        let egress = wiring::egress::serve_again(
            s.settings.egress.as_deref(),
            entry.egress_listener.as_ref(),
            c,
        )?;
        let run = entry
            .sandbox
            .run(
                message,
                (c.limits.stdout_cap, c.limits.stderr_cap),
                c.limits.timeout,
                cancel,
                on_output,
            )
            .await
            .map_err(|e| format!("the session's interpreter failed: {e}"));
        let network = wiring::egress::finish(egress).await;
        let report = proxy.take_report();
        let run = match run {
            Ok(run) => run,
            Err(why) => {
                *slot = None;
                return Err(why);
            }
        };
        let ended = !matches!(run.end, RunEnd::Done { .. });
        let (status, timed_out, cgroup) = match run.end {
            RunEnd::Done { ok } => (
                Some(ProgramStatus::Exited(if ok { 0 } else { 1 })),
                false,
                None,
            ),
            RunEnd::Exited(e) | RunEnd::Cancelled(e) => (e.status, false, e.cgroup),
            RunEnd::TimedOut(e) => (e.status, true, e.cgroup),
        };
        if ended {
            // The interpreter is gone: the next keep-alive run starts a new one.
            *slot = None;
            interpreter = "ended";
        }
        let outcome = Outcome {
            status,
            timed_out,
            stdout: run.stdout,
            stderr: run.stderr,
            duration: run.duration,
            landlock,
            cgroup,
        };
        Ok(Ran {
            outcome,
            tools: report,
            network,
            start: None,
            interpreter,
            zygote: false,
            backend: crate::microvm::Backend::Namespace,
        })
    }

    /// After a session run: the quota verdict and the workspace figures. The kernel
    /// enforced the quota (a write past it failed with `ENOSPC` in the sandbox); a run
    /// that left the workspace full is reported as having hit it, unless it was full
    /// already and the run changed nothing visible (same blocks, inodes and root
    /// directory time): a run that only reads is not failed for what an earlier one did.
    pub(super) fn settle_workspace(
        &self,
        session: &Session,
        before: Option<disk::Usage>,
        result: &mut ExecutionResult,
    ) {
        let limits = self.state.sessions.limits();
        let (entries, cut) = crate::workspace::list_at(session.workspace());
        result.workspace_files = Some(entries);
        result.workspace_files_truncated = cut;
        let usage = match disk::usage(session.workspace()) {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(session = crate::session::short(session.id()), %e, "cannot measure a session's workspace");
                return;
            }
        };
        let untouched_full = before.is_some_and(|b| b.full && b == usage);
        let shrunk = before.is_some_and(|b| usage.bytes < b.bytes && usage.entries <= b.entries);
        if usage.full && !shrunk && !untouched_full {
            tracing::info!(
                session = crate::session::short(session.id()),
                bytes = usage.bytes,
                entries = usage.entries,
                "a run filled the session's workspace"
            );
            result.workspace_quota_exceeded = true;
            result.stderr.push_str(&format!(
                "\n[codebox: the workspace is full ({} bytes in {} entries; the quota is {} bytes and {} entries): writes past it failed with \"no space left on device\"; delete files to make room]\n",
                usage.bytes, usage.entries, limits.quota_bytes, limits.max_entries
            ));
            if result.exit_code == Some(0) {
                result.exit_code = Some(1);
            }
        }
        result.workspace_usage = Some(json!({
            "bytes": usage.bytes,
            "entries": usage.entries,
            "quota_bytes": limits.quota_bytes,
            "max_entries": limits.max_entries,
        }));
    }
}
