//! One execution end to end: language and code in, a result out.
//!
//! Builds the sandbox spec from the runtime's program and the caller's limits, spawns the
//! sandbox, hands the code over fd 3, and turns the outcome into an [`ExecutionResult`].

use std::path::PathBuf;

use serde::Serialize;

use crate::rootfs::Rootfs;
use crate::runtime::{self, Language};
use crate::sandbox::{
    self, CgroupManager, IdMapping, LandlockStatus, Limits, OutputSink, Program, SandboxSpec,
    SecurityPolicy,
};
use crate::stopwatch::Stopwatch;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the program is {size} bytes; the limit is {max} bytes")]
    CodeTooLarge { size: usize, max: usize },
    #[error(transparent)]
    Files(#[from] runtime::FileError),
    #[error(transparent)]
    Sandbox(#[from] sandbox::Error),
    #[error(transparent)]
    Workspace(#[from] sandbox::idmapped::Error),
    #[error("proxy mode: {0}")]
    Egress(String),
    #[error("zygote: {0}")]
    Zygote(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// What to run.
#[derive(Debug, Clone)]
pub struct ExecutionRequest {
    pub language: Language,
    pub code: String,
    /// Files written under `/workspace` before the program starts (relative path →
    /// content), delivered in the boot frame.
    pub files: runtime::Files,
    /// Host directory bound at `/workspace`; a private tmpfs when `None`.
    pub workspace: Option<PathBuf>,
    pub limits: Limits,
    pub policy: SecurityPolicy,
    /// Proxy mode (`policy.network` is `Proxy`): the egress proxy that serves the
    /// sandbox's listener, from a thread of this process, for the run.
    pub egress: Option<EgressForRun>,
    /// Fork the sandbox from a zygote started for this run (`codebox run --zygote`).
    pub zygote: bool,
}

/// What a proxy-mode run of [`execute`] needs: the proxy, the request's narrowing and the
/// trust bundle's directory (bound at `/etc/codebox`).
#[derive(Clone)]
pub struct EgressForRun {
    pub egress: std::sync::Arc<crate::egress::Egress>,
    pub narrowing: crate::egress::Narrowing,
    pub trust: Option<PathBuf>,
}

impl std::fmt::Debug for EgressForRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressForRun")
            .field("trust", &self.trust)
            .finish_non_exhaustive()
    }
}

/// How it went, in the shape the CLI's `--json` prints and the MCP tools return.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct ExecutionResult {
    pub language: Language,
    /// Which backend ran it: `namespace` (fresh namespaces on the host kernel) or
    /// `microvm` (the same sandbox inside a QEMU microVM).
    pub backend: crate::microvm::Backend,
    pub stdout: String,
    pub stderr: String,
    /// The repr of the program's last expression, as a REPL shows it (`codebox serve`;
    /// absent when the program did not end with an expression or its value was `None` /
    /// `undefined`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub stdout_total_bytes: u64,
    pub stderr_total_bytes: u64,
    pub duration_ms: f64,
    /// What landlock enforced (`null` when not reported).
    pub landlock: Option<LandlockStatus>,
    /// The program was killed by the seccomp policy (signal 31, SIGSYS): it made a
    /// system call from a foreign ABI (i386 `int 0x80`, x32).
    pub seccomp_violation: bool,
    /// The kernel's OOM killer ended a process: the memory limit was hit.
    pub oom_killed: bool,
    /// A fork or thread creation failed on the pids limit.
    pub pids_limited: bool,
    /// Highest memory use of the sandbox, in bytes.
    pub peak_memory_bytes: Option<u64>,
    /// CPU time of all the sandbox's processes, in milliseconds.
    pub cpu_ms: Option<f64>,
    /// What is in the bound host workspace after the run (symlinks listed, not followed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workspace_files: Option<Vec<crate::workspace::Entry>>,
    /// The workspace listing stopped at its cap.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub workspace_files_truncated: bool,
    /// Every upstream tool call the program made through the proxy, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<crate::proxy::ToolCallRecord>,
    /// Calls past the records a result keeps (`max_tool_call_records`): how many, and
    /// their outcomes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls_dropped: Option<crate::proxy::DroppedCalls>,
    /// Packages on request: what was asked for and what the bound layer holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub packages: Option<serde_json::Value>,
    /// Proxy mode: every connection the program made through the egress proxy (host,
    /// port, allowed or denied and why, bytes each way, duration), and the totals.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::egress::EgressReport>,
    /// Why the proxy closed the tool channel early (a malformed or oversized message), or
    /// held it back (the program left the answers to its tool requests unread).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_channel_error: Option<String>,
    /// How the sandbox started: `warm` (from the pool, already waiting for the code) or
    /// `cold` (created for this call); absent for a session's kept interpreter and the CLI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<SandboxStart>,
    /// The sandbox was forked from the Python zygote (fresh namespaces, cgroup and
    /// filesystems, the interpreter a copy of the zygote's) rather than started anew.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub zygote: bool,
    /// What the runtime reported at the end of a one-shot run from a running server: the
    /// optional layers the run loaded (`layers`: Deno's Node compatibility layer —
    /// `node:timers`, `node:buffer`, `node:process` — or matplotlib's backend; none on the
    /// fast path) and, for TypeScript, when it saw the program end (`end`: `settled`,
    /// `unload` or `exit`); absent when the runtime did not report (the CLI, sessions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<crate::runtime::RunReport>,
    /// The session the run belonged to: id, keep_alive, interpreter (new, kept, ended).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<serde_json::Value>,
    /// The session's workspace after the run: bytes, entries and their limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workspace_usage: Option<serde_json::Value>,
    /// The run grew the session's workspace past its quota; it was stopped and what it
    /// created was removed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub workspace_quota_exceeded: bool,
    /// What the output budget left out of stdout and stderr (bytes, lines) and the
    /// resources holding them whole; absent when nothing was cut.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<serde_json::Value>,
    /// Output files returned (`/workspace/out`, `outputs`): how each is shown and where
    /// it can be read.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<crate::output::files::FileRecord>,
    /// Output files not returned, and why (a symlink, too large, ...).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files_skipped: Vec<crate::output::files::Skipped>,
    /// Output files past the count returned.
    #[serde(skip_serializing_if = "crate::execution::is_zero")]
    pub files_omitted: u64,
    /// What the result says besides how the run ended: the limit it met with its value and
    /// knob, the likely cause of a common error ([`crate::hints`]); one line each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hints: Vec<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ExecutionResult {
    /// A result with nothing in it: no output, no status, nothing hit (for tests and for
    /// building one field by field).
    pub fn blank(language: Language) -> ExecutionResult {
        ExecutionResult {
            language,
            backend: crate::microvm::Backend::Namespace,
            stdout: String::new(),
            stderr: String::new(),
            value: None,
            exit_code: None,
            signal: None,
            timed_out: false,
            stdout_truncated: false,
            stderr_truncated: false,
            stdout_total_bytes: 0,
            stderr_total_bytes: 0,
            duration_ms: 0.0,
            landlock: None,
            seccomp_violation: false,
            oom_killed: false,
            pids_limited: false,
            peak_memory_bytes: None,
            cpu_ms: None,
            workspace_files: None,
            workspace_files_truncated: false,
            tool_calls: Vec::new(),
            tool_calls_dropped: None,
            packages: None,
            network: None,
            tool_channel_error: None,
            start: None,
            zygote: false,
            runtime: None,
            session: None,
            workspace_usage: None,
            workspace_quota_exceeded: false,
            output: None,
            files: Vec::new(),
            files_skipped: Vec::new(),
            files_omitted: 0,
            hints: Vec::new(),
        }
    }

    /// How the run ended, in words: `exit 0`, `killed by signal 9 (SIGKILL)`, ...; never
    /// a made-up status when there is none.
    pub fn ending(&self) -> String {
        if self.timed_out {
            "timed out (killed)".to_string()
        } else if self.oom_killed {
            "killed: out of memory".to_string()
        } else if self.seccomp_violation {
            "killed by the seccomp policy".to_string()
        } else if let Some(code) = self.exit_code {
            format!("exit {code}")
        } else if let Some(signal) = self.signal {
            match nix::sys::signal::Signal::try_from(signal) {
                Ok(name) => format!("killed by signal {signal} ({})", name.as_str()),
                Err(_) => format!("killed by signal {signal}"),
            }
        } else {
            // Cancelled before the sandbox reported a status, or the sandbox was lost.
            "ended without an exit status".to_string()
        }
    }

    /// Every configured egress secret replaced in what the result carries back: output,
    /// the connection records' reasons, tool call errors and the channel error. A secret
    /// never enters the sandbox; one that comes back out got there by a way the proxy did
    /// not see (a value written into the code, an API that reflects it transformed).
    pub fn redact_secrets(&mut self, secrets: &crate::egress::Secrets) {
        if secrets.is_empty() {
            return;
        }
        let redact = |text: &mut String| {
            let out = secrets.redact_all(text.as_bytes());
            if out != text.as_bytes() {
                *text = String::from_utf8_lossy(&out).into_owned();
            }
        };
        redact(&mut self.stdout);
        redact(&mut self.stderr);
        if let Some(v) = &mut self.value {
            redact(v);
        }
        for call in &mut self.tool_calls {
            if let Some(e) = &mut call.error {
                redact(e);
            }
        }
        if let Some(e) = &mut self.tool_channel_error {
            redact(e);
        }
        if let Some(network) = &mut self.network {
            for c in &mut network.connections {
                if let Some(reason) = &mut c.reason {
                    redact(reason);
                }
            }
        }
    }

    /// The program failed: non-zero exit, a signal, a timeout, or the workspace quota.
    pub fn failed(&self) -> bool {
        self.timed_out
            || self.signal.is_some()
            || self.exit_code != Some(0)
            || self.workspace_quota_exceeded
    }
}

/// Where an execution's sandbox came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SandboxStart {
    /// Taken from the warm pool: started before the call, waiting for its code.
    Warm,
    /// Created for this call.
    Cold,
}

/// What this process needs to create sandboxes: the verified rootfs, the id mapping and
/// the cgroup hierarchies, found once.
#[derive(Debug)]
pub struct Host {
    pub rootfs: Rootfs,
    pub id_mapping: IdMapping,
    /// `None` when no cgroup hierarchy is writable; sandboxes with limits then fail.
    pub cgroups: Option<CgroupManager>,
    /// `[python] preload` of a server's `codebox.toml`: replaces the profiles' own lists
    /// for every Python sandbox this host's spawners start.
    pub python_preload: Option<Vec<String>>,
    /// Spawners fork Python sandboxes from a zygote (`sandbox::zygote`) where one can
    /// serve them (`[python] zygote`).
    pub zygote: bool,
}

impl Host {
    /// Finds the cgroup hierarchies (enabling delegated v2 controllers, removing stale
    /// cgroups of crashed supervisors). Call before any thread or sandbox exists.
    pub fn new(rootfs: Rootfs, id_mapping: IdMapping) -> Host {
        let mut sw = Stopwatch::start();
        let (mut discover_us, mut enable_v2_us, mut stale_us) = (0, 0, 0);
        let cgroups = match CgroupManager::discover_host() {
            Ok(mut m) => {
                discover_us = sw.lap_us();
                if let Err(e) = m.enable_v2_controllers() {
                    tracing::debug!(?e, "v2 controllers stay disabled");
                }
                enable_v2_us = sw.lap_us();
                match m.cleanup_stale() {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(removed = n, "removed stale sandbox cgroups"),
                    Err(e) => tracing::warn!(?e, "cannot clean up stale cgroups"),
                }
                stale_us = sw.lap_us();
                Some(m)
            }
            Err(e) => {
                tracing::warn!(?e, "no usable cgroup hierarchy");
                None
            }
        };
        tracing::debug!(
            discover_us,
            enable_v2_us,
            stale_us,
            total_us = sw.total_us(),
            "host cgroup steps"
        );
        Host {
            rootfs,
            id_mapping,
            cgroups,
            python_preload: None,
            zygote: false,
        }
    }

    /// The sandbox spec of one run on this host: the verified rootfs, this host's id
    /// mapping, hostname `codebox`, no `/servers` or `/skills`.
    pub fn spec(
        &self,
        program: Program,
        workspace: Option<PathBuf>,
        limits: &Limits,
        policy: &SecurityPolicy,
    ) -> SandboxSpec {
        SandboxSpec {
            rootfs: self.rootfs.path.clone(),
            workspace,
            workspace_mount: None,
            servers: None,
            skills: None,
            trust: None,
            packages: None,
            program,
            limits: limits.clone(),
            id_mapping: self.id_mapping,
            hostname: "codebox".into(),
            policy: policy.clone(),
        }
    }
}

/// Runs `request` in a fresh sandbox on `host`.
///
/// Must be called from a single-threaded process (the sandbox is cloned from it).
pub fn execute(
    host: &Host,
    request: &ExecutionRequest,
    sink: &mut dyn OutputSink,
) -> Result<ExecutionResult> {
    if request.code.len() > runtime::MAX_CODE_BYTES {
        return Err(Error::CodeTooLarge {
            size: request.code.len(),
            max: runtime::MAX_CODE_BYTES,
        });
    }
    runtime::validate_files(&request.files, runtime::MAX_FILES_BYTES)?;
    let mut program = request.language.program()?;
    if request.language == Language::Python {
        program.set_env(&runtime::thread_env(request.limits.cpu_millicores))?;
    }
    let trust = request.egress.as_ref().and_then(|e| e.trust.clone());
    match (request.policy.network, &request.egress) {
        (sandbox::NetworkAccess::Proxy { port }, Some(_)) => {
            program.set_env(&runtime::egress_env(port, trust.is_some()))?
        }
        (sandbox::NetworkAccess::Proxy { .. }, None) => {
            return Err(Error::Egress(
                "the policy is in proxy mode but no proxy serves it".into(),
            ))
        }
        (_, Some(_)) => {
            return Err(Error::Egress(
                "a proxy was given but the policy is not in proxy mode".into(),
            ))
        }
        _ => {}
    }
    let mut spec = host.spec(
        program,
        request.workspace.clone(),
        &request.limits,
        &request.policy,
    );
    spec.trust = trust;
    // As root the sandbox user is an unprivileged host id: the directory is attached
    // through an idmapped mount on which its owner is that id, so the program can write.
    let idmapped = match (&request.workspace, host.id_mapping.privileged) {
        (Some(dir), true) => sandbox::idmapped::workspace_mount(dir, host.id_mapping.host_uid)?,
        _ => None,
    };
    if let Some(fd) = &idmapped {
        spec.workspace = None;
        spec.workspace_mount = Some(std::os::fd::AsRawFd::as_raw_fd(fd));
    }
    let mut frame = runtime::boot_frame_with_files(&request.code, &request.files);
    if request.workspace.is_none() {
        // No host directory is bound: nothing of the sandbox outlives it.
        frame = runtime::ephemeral(frame);
    }
    let (outcome, network, zygote) = match &request.egress {
        None if request.zygote => (run_from_zygote(&spec, host, &frame, sink)?, None, true),
        None => (run_spec(&spec, host, &frame, sink)?, None, false),
        Some(_) if request.zygote => {
            return Err(Error::Zygote(
                "a sandbox with the egress proxy cannot be forked from the zygote".into(),
            ))
        }
        Some(egress) => {
            let (outcome, report) = run_spec_with_egress(&spec, host, &frame, sink, egress)?;
            (outcome, Some(report), false)
        }
    };
    drop(idmapped);
    let mut result = result_from(
        request.language,
        request.workspace.as_deref(),
        request.policy.landlock.is_some(),
        outcome,
    );
    result.network = network;
    result.zygote = zygote;
    Ok(result)
}

/// [`run_spec`] with a zygote started for this one run (`codebox run --zygote`: the path
/// `serve` takes for every Python sandbox a zygote can serve, for tests and comparisons).
fn run_from_zygote(
    spec: &SandboxSpec,
    host: &Host,
    input: &[u8],
    sink: &mut dyn OutputSink,
) -> Result<sandbox::Outcome> {
    use sandbox::zygote::Zygote;
    let zygote_error =
        |e: sandbox::zygote::Error| Error::Zygote(format!("{:#}", anyhow::Error::new(e)));
    let mut zygote = Zygote::launch(spec, host.cgroups.as_ref()).map_err(zygote_error)?;
    zygote
        .wait_ready(std::time::Duration::from_secs(60))
        .map_err(zygote_error)?;
    let sandbox = zygote
        .fork(spec, host.cgroups.as_ref())
        .map_err(zygote_error)?;
    // The zygote lives until the run has ended: its pid namespace holds the child's.
    let outcome = sandbox.run_to_completion(input, &spec.limits, sink);
    zygote.shutdown();
    Ok(outcome?)
}

/// [`run_spec`] in proxy mode: once the sandbox exists (cloned while this process is
/// still single-threaded), a thread with its own async runtime serves the egress
/// listener until the program has ended; its report comes back with the outcome.
fn run_spec_with_egress(
    spec: &SandboxSpec,
    host: &Host,
    input: &[u8],
    sink: &mut dyn OutputSink,
    egress: &EgressForRun,
) -> Result<(sandbox::Outcome, crate::egress::EgressReport)> {
    let mut sandbox = sandbox::spawn(spec, host.cgroups.as_ref())?;
    let listener = sandbox
        .io
        .egress
        .take()
        .ok_or_else(|| Error::Egress("the sandbox came without its egress listener".into()))?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = {
        let egress = egress.clone();
        std::thread::Builder::new()
            .name("codebox-egress".into())
            .spawn(move || -> std::io::Result<crate::egress::EgressReport> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                Ok(rt.block_on(async move {
                    let run = egress
                        .egress
                        .start(std::net::TcpListener::from(listener), egress.narrowing);
                    let _ = stopped.await;
                    run.finish().await
                }))
            })
            .map_err(|e| Error::Egress(format!("cannot start the proxy's thread: {e}")))?
    };
    let outcome = sandbox.run_to_completion(input, &spec.limits, sink);
    let _ = stop.send(());
    let report = match serving.join() {
        Ok(Ok(report)) => report,
        Ok(Err(e)) => return Err(Error::Egress(format!("the proxy's runtime failed: {e}"))),
        Err(_) => return Err(Error::Egress("the proxy's thread panicked".into())),
    };
    Ok((outcome?, report))
}

/// Runs `program` (a path inside the rootfs, with its argv, environment and working
/// directory) in a fresh sandbox on `host` with exactly the layers and limits of `run`:
/// namespaces, cgroup limits, mounts (a private tmpfs at `/workspace`), capabilities
/// dropped, `no_new_privs`, landlock, seccomp. Nothing is written to its fd 3 and its
/// stdin is `/dev/null`. Single-threaded callers only, like [`execute`].
pub fn execute_program(
    host: &Host,
    program: Program,
    limits: &Limits,
    policy: &SecurityPolicy,
    sink: &mut dyn OutputSink,
) -> Result<sandbox::Outcome> {
    let spec = host.spec(program, None, limits, policy);
    run_spec(&spec, host, &[], sink)
}

/// Spawn, feed `input` to fd 3, supervise, finish; timed as one "execute steps" event.
fn run_spec(
    spec: &SandboxSpec,
    host: &Host,
    input: &[u8],
    sink: &mut dyn OutputSink,
) -> Result<sandbox::Outcome> {
    let mut sw = Stopwatch::start();
    let sandbox = sandbox::spawn(spec, host.cgroups.as_ref())?;
    let spawn_us = sw.lap_us();
    let outcome = sandbox.run_to_completion(input, &spec.limits, sink)?;
    tracing::debug!(spawn_us, run_and_finish_us = sw.lap_us(), "execute steps");
    Ok(outcome)
}

/// Logs what landlock enforced: a warning unless fully enforced (or not asked for). A
/// kernel's ABI does not change while a server runs, so a partial enforcement is warned
/// of once per process (the microVM guest's 6.1 kernel gives every run ABI 3), then
/// logged at debug level; each result still says its status.
pub fn log_landlock(status: Option<LandlockStatus>, requested: bool) {
    static WARNED_PARTIAL: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);
    match status {
        Some(LandlockStatus::FullyEnforced) => {
            tracing::debug!(landlock = "fully_enforced", "landlock status")
        }
        Some(status @ LandlockStatus::PartiallyEnforced)
            if WARNED_PARTIAL.swap(true, std::sync::atomic::Ordering::Relaxed) =>
        {
            tracing::debug!(landlock = ?status, "landlock is not fully enforced on this kernel")
        }
        Some(status) => {
            tracing::warn!(landlock = ?status, "landlock is not fully enforced on this kernel")
        }
        None if requested => {
            tracing::warn!("landlock status was not reported")
        }
        None => {}
    }
}

/// Turns a sandbox outcome into the result callers see.
pub fn result_from(
    language: Language,
    request_workspace: Option<&std::path::Path>,
    request_landlock: bool,
    outcome: sandbox::Outcome,
) -> ExecutionResult {
    log_landlock(outcome.landlock, request_landlock);
    let (workspace_files, workspace_files_truncated) = match request_workspace {
        Some(dir) => match crate::workspace::list(dir) {
            Ok((entries, cut)) => (Some(entries), cut),
            Err(e) => {
                tracing::warn!(?e, "cannot list the workspace");
                (None, false)
            }
        },
        None => (None, false),
    };
    ExecutionResult {
        start: None,
        zygote: false,
        runtime: None,
        backend: crate::microvm::Backend::Namespace,
        language,
        stdout: outcome.stdout.text("stdout"),
        stderr: outcome.stderr.text("stderr"),
        value: None,
        files: Vec::new(),
        files_skipped: Vec::new(),
        files_omitted: 0,
        hints: Vec::new(),
        exit_code: outcome.exit_code(),
        signal: outcome.signal(),
        timed_out: outcome.timed_out,
        stdout_truncated: outcome.stdout.truncated,
        stderr_truncated: outcome.stderr.truncated,
        stdout_total_bytes: outcome.stdout.total_bytes,
        stderr_total_bytes: outcome.stderr.total_bytes,
        duration_ms: outcome.duration.as_secs_f64() * 1000.0,
        landlock: outcome.landlock,
        seccomp_violation: outcome.signal() == Some(sandbox::seccomp::SECCOMP_KILL_SIGNAL),
        oom_killed: outcome.cgroup.as_ref().is_some_and(|c| c.oom_killed),
        pids_limited: outcome.cgroup.as_ref().is_some_and(|c| c.pids_limited),
        peak_memory_bytes: outcome.cgroup.as_ref().and_then(|c| c.peak_memory_bytes),
        cpu_ms: outcome
            .cgroup
            .as_ref()
            .and_then(|c| c.cpu_usec)
            .map(|us| us as f64 / 1000.0),
        workspace_files,
        workspace_files_truncated,
        output: None,
        tool_calls: Vec::new(),
        tool_calls_dropped: None,
        tool_channel_error: None,
        network: None,
        packages: None,
        session: None,
        workspace_usage: None,
        workspace_quota_exceeded: false,
    }
}
