//! The sandbox checks off `serve`'s start-up path.
//!
//! Running a real sandbox per runtime takes about 100 ms (Deno's start), too long to hold
//! up a client's `initialize`. `serve` forks a checker while it is still single-threaded
//! (a sandbox is cloned only from a single-threaded process); the checker runs
//! [`super::sandbox_layers`], writes the checks as JSON on a pipe and exits. The server
//! reads them on its blocking pool once it is serving; a layer that turns out missing is
//! reported in `health` and refuses executions then.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;

use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use super::{sandbox_layers, Check, Status};
use crate::execution::Host;
use crate::profile::Profile;

/// The most a checker may write: a few checks.
const MAX_REPORT_BYTES: u64 = 1 << 20;

/// A checker under way.
#[derive(Debug)]
pub struct PendingChecks {
    pid: Pid,
    report: File,
}

/// Forks the checker.
///
/// # Safety
/// The calling process must be single-threaded: the child allocates and clones sandboxes.
pub unsafe fn start(host: &Host, profile: &Profile) -> std::io::Result<PendingChecks> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // SAFETY: the caller guarantees a single thread, so the child may do anything the
    // parent could (no lock can be held by a thread that does not exist in it).
    match unsafe { fork() }? {
        ForkResult::Child => {
            drop(read);
            // SAFETY: the child's exit path: never returns to the parent's code.
            unsafe { checker(host, profile, write) }
        }
        ForkResult::Parent { child } => {
            drop(write);
            Ok(PendingChecks {
                pid: child,
                report: File::from(read),
            })
        }
    }
}

/// The child: run the checks, write them, `_exit`.
///
/// # Safety
/// Only in the child of [`start`]'s fork.
unsafe fn checker(host: &Host, profile: &Profile, report: OwnedFd) -> ! {
    become_checker();
    let checks = sandbox_layers(host, profile);
    let mut out = File::from(report);
    let ok = serde_json::to_vec(&checks)
        .ok()
        .is_some_and(|json| out.write_all(&json).is_ok());
    // SAFETY: `_exit` ends the process without running the parent's exit handlers or
    // destructors, which belong to the parent.
    unsafe { libc::_exit(if ok { 0 } else { 1 }) }
}

/// The checker's process settings, first thing after the fork.
fn become_checker() {
    // Dies with the server; the sandboxes it starts die with it (their lifeline).
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    // Not a holder of the MCP client's pipes: the server's stdout must reach EOF when the
    // server exits, whatever the checker does.
    crate::spawner::detach_stdio();
    // Stopping is the server's to do (as for the spawner and the factory): a Ctrl-C to
    // the process group must not end the checks and read as a missing layer. It still
    // dies with the server (above); the sandbox init restores the dispositions.
    crate::spawner::ignore_stop_signals();
}

impl PendingChecks {
    /// Blocks until the checker is done; a checker that failed is reported as a missing
    /// layer. Run it on a blocking thread.
    pub fn wait(mut self) -> Vec<Check> {
        let mut json = Vec::new();
        let read = (&mut self.report)
            .take(MAX_REPORT_BYTES)
            .read_to_end(&mut json);
        let status = waitpid(self.pid, None);
        let failed = |why: String| {
            tracing::error!(
                checker = self.pid.as_raw(),
                why,
                "the sandbox checks failed"
            );
            vec![Check::new("sandbox checks", Status::Missing, why, true)
                .fix("run `codebox doctor` for the layer that fails")]
        };
        match (read, status) {
            (Ok(_), Ok(WaitStatus::Exited(_, 0))) => match serde_json::from_slice(&json) {
                Ok(checks) => checks,
                Err(e) => failed(format!("the checker's report is unreadable: {e}")),
            },
            (Err(e), _) => failed(format!("reading the checker's report: {e}")),
            (_, Ok(status)) => failed(format!("the checker ended: {status:?}")),
            (_, Err(e)) => failed(format!("waiting for the checker: {e}")),
        }
    }
}

/// For tests: a report as the checker writes it.
#[cfg(test)]
fn from_fd(fd: OwnedFd, pid: i32) -> PendingChecks {
    PendingChecks {
        pid: Pid::from_raw(pid),
        report: File::from(fd),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checker_that_died_is_a_missing_layer() {
        let (read, write) = nix::unistd::pipe().unwrap();
        // SAFETY: the child only calls `_exit`.
        let pid = match unsafe { fork() }.unwrap() {
            // SAFETY: `_exit` is async-signal-safe and ends the child at once.
            ForkResult::Child => unsafe { libc::_exit(3) },
            ForkResult::Parent { child } => child,
        };
        drop(write);
        let checks = from_fd(read, pid.as_raw()).wait();
        assert_eq!(checks.len(), 1);
        assert!(checks[0].blocks(), "{checks:?}");
        assert!(checks[0].detail.contains("Exited"), "{checks:?}");
    }

    /// A Ctrl-C reaches the whole foreground process group, and a service manager may
    /// signal every process of the service: the server drains and stops, and the checker
    /// must not die of it first (its death reads as a host that cannot run sandboxes:
    /// two ERROR lines and "executions are refused" during an ordinary shutdown).
    #[test]
    fn the_checker_outlives_stop_signals() {
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: the child makes syscalls only (no allocation: the short path is
            // converted on the stack) and `_exit`s.
            let pid = match unsafe { fork() }.unwrap() {
                ForkResult::Child => {
                    become_checker();
                    // SAFETY: raise and _exit are async-signal-safe.
                    unsafe {
                        libc::raise(signal);
                        libc::_exit(0)
                    }
                }
                ForkResult::Parent { child } => child,
            };
            assert_eq!(
                waitpid(pid, None).unwrap(),
                WaitStatus::Exited(pid, 0),
                "signal {signal}"
            );
        }
    }

    #[test]
    fn checks_come_back_as_written() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let written = vec![Check::new(
            "python in sandbox",
            Status::Ok,
            "Python 3",
            true,
        )];
        let json = serde_json::to_vec(&written).unwrap();
        // SAFETY: the child writes and `_exit`s.
        let pid = match unsafe { fork() }.unwrap() {
            ForkResult::Child => {
                let mut f = File::from(write);
                let _ = f.write_all(&json);
                // SAFETY: `_exit` is async-signal-safe and ends the child at once.
                unsafe { libc::_exit(0) }
            }
            ForkResult::Parent { child } => child,
        };
        drop(write);
        let checks = from_fd(read, pid.as_raw()).wait();
        assert_eq!(checks.len(), 1);
        assert_eq!(checks[0].layer, "python in sandbox");
        assert!(!checks[0].blocks());
    }
}
