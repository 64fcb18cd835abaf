//! `codebox exec`: any program of the rootfs in a fresh sandbox, under exactly the layers
//! and limits of `codebox run` (namespaces, cgroup limits, mounts, capabilities dropped,
//! `no_new_privs`, landlock, seccomp) — for comparing start-up with other sandboxes
//! program for program (`codebox exec -- /usr/bin/python3 -S -c pass` against
//! `bwrap --unshare-all … python3 -S -c pass`).
//!
//! Stdin is empty (`/dev/null`), stdout and stderr pass through, and the exit status is
//! the program's (128 + signal, 124 on timeout, 125 when codebox itself failed).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::Args;

use codebox::execution;
use codebox::runtime::Language;
use codebox::sandbox::idmap::DEFAULT_ROOT_HOST_ID;
use codebox::sandbox::report::Stage;
use codebox::sandbox::{self, Limits, Outcome, Program};

use super::passthrough::{exit_status, Passthrough};
use super::prepare::{prepare, Prepared};

/// The working directory inside the sandbox, as for `run`.
const CWD: &str = "/workspace";

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Sandbox profile: a shipped one (default, network) or a path to a .toml file.
    #[arg(long, default_value = "default", value_name = "NAME|PATH")]
    profile: String,
    /// The rootfs [default: $CODEBOX_ROOTFS, else ../share/codebox/rootfs from the
    /// binary's directory, else a checkout's target/rootfs].
    #[arg(long, value_name = "DIR")]
    rootfs: Option<PathBuf>,
    /// When run as root: the unprivileged host uid/gid the sandbox user maps to.
    #[arg(long, default_value_t = DEFAULT_ROOT_HOST_ID)]
    root_host_id: u32,
    /// The program, as an absolute path inside the rootfs (no PATH search), and its
    /// arguments; put `--` before it.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM [ARGS]..."
    )]
    command: Vec<String>,
}

pub fn run(args: ExecArgs) -> anyhow::Result<ExitCode> {
    let program = program(&args.command)?;
    let Prepared { profile, host } =
        prepare(&args.profile, args.rootfs.as_deref(), args.root_host_id)?;
    let path = &args.command[0];
    let outcome = match execution::execute_program(
        &host,
        program,
        &profile.limits,
        &profile.policy,
        &mut Passthrough,
    ) {
        Ok(outcome) => outcome,
        Err(execution::Error::Sandbox(sandbox::Error::Setup { failure, source }))
            if failure.stage == Stage::Exec =>
        {
            bail!("cannot execute {path} in the sandbox: {source}")
        }
        Err(e) => return Err(e.into()),
    };
    execution::log_landlock(outcome.landlock, profile.policy.landlock.is_some());
    notes(&outcome, &profile.limits);
    Ok(ExitCode::from(exit_status(
        outcome.timed_out,
        outcome.exit_code(),
        outcome.signal(),
    )))
}

/// The program image: `command[0]` must be absolute (it is resolved inside the sandbox,
/// after `pivot_root`, and there is no PATH search); argv[0] is the path as given; the
/// environment is the fixed one of `run`'s Python.
fn program(command: &[String]) -> anyhow::Result<Program> {
    let Some(path) = command.first() else {
        bail!("give the program to run: codebox exec -- /usr/bin/python3 -c 'print(1)'");
    };
    if !path.starts_with('/') {
        bail!(
            "PROGRAM must be an absolute path inside the rootfs (e.g. /usr/bin/python3), \
             not {path:?}: codebox exec does no PATH search"
        );
    }
    let argv: Vec<&str> = command.iter().map(String::as_str).collect();
    Ok(Program::new(path, &argv, &Language::Python.env(), CWD)?)
}

/// What the sandbox did to the program, on stderr (as `run` reports it).
fn notes(outcome: &Outcome, limits: &Limits) {
    for (name, captured) in [("stdout", &outcome.stdout), ("stderr", &outcome.stderr)] {
        if captured.truncated {
            eprintln!(
                "codebox: {name} truncated: passed {} of {} bytes",
                captured.bytes.len(),
                captured.total_bytes
            );
        }
    }
    if outcome.timed_out {
        eprintln!(
            "codebox: timed out after {:?}; the sandbox was killed",
            limits.timeout
        );
    }
    let cgroup = outcome.cgroup.as_ref();
    if cgroup.is_some_and(|c| c.oom_killed) {
        eprintln!("codebox: out of memory: the sandbox hit its memory limit");
    }
    if cgroup.is_some_and(|c| c.pids_limited) {
        eprintln!("codebox: the sandbox hit its process/thread limit");
    }
    if outcome.signal() == Some(sandbox::seccomp::SECCOMP_KILL_SIGNAL) {
        eprintln!("codebox: killed by the seccomp policy (a system call from a foreign ABI)");
    }
}
