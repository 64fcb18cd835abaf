//! The sandbox checks off `serve`'s start-up path, and what a checker's end means.
//!
//! Running a real sandbox per runtime takes about 100 ms (Deno's start), too long to hold
//! up a client's `initialize`. A checker process runs [`super::sandbox_layers`], writes
//! the checks as JSON on a pipe and exits; the server reads them on its blocking pool
//! once it is serving. A checker must be single-threaded (it clones sandboxes), so the
//! spawner factory forks it (`spawner/factory.rs`): the first one while `serve` is still
//! starting, and again whenever a checker did not finish.
//!
//! Only a checker that finished says anything about the host. A report that is
//! incomplete or unreadable — the checker was killed, crashed, or did not finish within
//! [`REPORT_BOUND`] — is [`Report::Unfinished`]: the checks are retried
//! (`server/sandbox_checks.rs`), never taken for a missing layer. A layer that a finished
//! checker found missing is reported in `health` and refuses executions.
//!
//! For tests: `CODEBOX_TEST_CHECKER_DELAY_MS=N` makes every checker wait N ms (at most a
//! minute) before it starts its checks, so a test can find it by its pid in `health` and
//! kill it before it finishes. It only delays the checks (executions are not held for
//! them), so it grants nothing to whoever sets it.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::unistd::Pid;

use super::{sandbox_layers, Check};
use crate::execution::Host;
use crate::profile::Profile;

/// The most a checker may write: a few checks.
const MAX_REPORT_BYTES: usize = 1 << 20;

/// How long a checker may take before it counts as unfinished (and is killed). Its
/// sandboxes take ~100 ms; a loaded host may take seconds, never minutes.
pub const REPORT_BOUND: Duration = Duration::from_secs(120);

/// The test hook's variable (see the module's documentation).
pub const DELAY_VARIABLE: &str = "CODEBOX_TEST_CHECKER_DELAY_MS";

/// A checker under way: its pid (for `health`, and for its parent to reap) and the read
/// end of its report.
#[derive(Debug)]
pub struct PendingChecks {
    pid: Pid,
    report: File,
}

/// What a checker's report says.
#[derive(Debug)]
pub enum Report {
    /// It finished and wrote its checks: a verdict on the host.
    Checks(Vec<Check>),
    /// It did not finish: why, in words (the checker's own end is its parent's to tell).
    Unfinished(String),
    /// It did not finish within the bound (it still runs: its parent must end it).
    TimedOut,
}

impl PendingChecks {
    /// A checker forked by the spawner factory, with the read end of its report pipe.
    pub fn new(pid: Pid, report: OwnedFd) -> PendingChecks {
        PendingChecks {
            pid,
            report: File::from(report),
        }
    }

    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Reads the report to its end, at most `bound`. Blocks: run it on a blocking thread.
    pub fn read(mut self, bound: Duration) -> Report {
        let deadline = Instant::now() + bound;
        let mut json = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Report::TimedOut;
            }
            let mut pfd = [PollFd::new(self.report.as_fd(), PollFlags::POLLIN)];
            let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
            match poll(&mut pfd, timeout) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(e) => return Report::Unfinished(format!("waiting for its report: {e}")),
            }
            match self.report.read(&mut buf) {
                Ok(0) => break,
                Ok(n) if json.len() + n > MAX_REPORT_BYTES => {
                    return Report::Unfinished("its report is over 1 MiB".into())
                }
                Ok(n) => json.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Report::Unfinished(format!("reading its report: {e}")),
            }
        }
        interpret(&json)
    }
}

/// A report read to its end: complete checks, or why not.
fn interpret(json: &[u8]) -> Report {
    if json.is_empty() {
        return Report::Unfinished("it wrote no report".into());
    }
    match serde_json::from_slice::<Vec<Check>>(json) {
        Ok(checks) if !checks.is_empty() => Report::Checks(checks),
        Ok(_) => Report::Unfinished("its report holds no check".into()),
        Err(e) => Report::Unfinished(format!("its report is incomplete or unreadable ({e})")),
    }
}

/// The checker: its settings, the checks, the report, `_exit`. Called in the child of a
/// fork of a single-threaded process (the spawner factory).
///
/// # Safety
/// Only in a freshly forked child of a single-threaded process: it allocates and clones
/// sandboxes; it never returns into the parent's frames.
pub(crate) unsafe fn run_checker(host: &Host, profile: &Profile, report: OwnedFd) -> ! {
    become_checker();
    if let Some(ms) = std::env::var(DELAY_VARIABLE)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(Duration::from_millis(ms.min(60_000)));
    }
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
    // Dies with its parent (the factory, which dies with the server); the sandboxes it
    // starts die with it (their lifeline).
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    // A name an operator can tell apart in `ps` (the others are all `codebox`).
    // SAFETY: prctl with a NUL-terminated name of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"codebox-checks".as_ptr()) };
    // Not a holder of the MCP client's pipes: the server's stdout must reach EOF when the
    // server exits, whatever the checker does.
    crate::spawner::detach_stdio();
    // Stopping is the server's to do (as for the spawner and the factory): a Ctrl-C to
    // the process group must not end the checks. It still dies with the server (above);
    // the sandbox init restores the dispositions.
    crate::spawner::ignore_stop_signals();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, ForkResult};

    /// Forks a child that writes `bytes` to the pipe (then, with `hang`, sleeps) and
    /// `_exit`s; its pending checks.
    fn writer(bytes: &[u8], hang: bool) -> PendingChecks {
        let (read, write) = nix::unistd::pipe().unwrap();
        // SAFETY: the child writes, sleeps and `_exit`s (async-signal-safe calls only).
        let pid = match unsafe { fork() }.unwrap() {
            // SAFETY: write, sleep and _exit are async-signal-safe; the buffer is live.
            ForkResult::Child => unsafe {
                libc::write(
                    std::os::fd::AsRawFd::as_raw_fd(&write),
                    bytes.as_ptr().cast(),
                    bytes.len(),
                );
                if hang {
                    libc::sleep(30);
                }
                libc::_exit(0)
            },
            ForkResult::Parent { child } => child,
        };
        drop(write);
        PendingChecks::new(pid, read)
    }

    fn reap(pid: Pid) {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = waitpid(pid, None);
    }

    #[test]
    fn a_checker_that_wrote_nothing_or_half_did_not_finish() {
        let json = serde_json::to_vec(&vec![Check::new(
            "python in sandbox",
            Status::Missing,
            "d",
            true,
        )])
        .unwrap();
        for (bytes, want) in [
            (&b""[..], "no report"),
            (&json[..json.len() / 2], "incomplete or unreadable"),
            (&b"[]"[..], "no check"),
            (&b"\xff\xfe garbage"[..], "incomplete or unreadable"),
        ] {
            let pending = writer(bytes, false);
            let pid = pending.pid();
            match pending.read(Duration::from_secs(30)) {
                Report::Unfinished(why) => assert!(why.contains(want), "{why}"),
                other => panic!("{other:?} for {bytes:?}"),
            }
            reap(pid);
        }
    }

    #[test]
    fn a_checker_that_does_not_finish_in_time_is_timed_out() {
        let pending = writer(b"[", true);
        let pid = pending.pid();
        assert!(matches!(
            pending.read(Duration::from_millis(200)),
            Report::TimedOut
        ));
        reap(pid);
    }

    /// A Ctrl-C reaches the whole foreground process group, and a service manager may
    /// signal every process of the service: the server drains and stops, and the checker
    /// must not die of it first.
    #[test]
    fn the_checker_outlives_stop_signals() {
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: the child makes syscalls only and `_exit`s.
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
        let written = vec![Check::new(
            "python in sandbox",
            Status::Ok,
            "Python 3",
            true,
        )];
        let pending = writer(&serde_json::to_vec(&written).unwrap(), false);
        let pid = pending.pid();
        let Report::Checks(checks) = pending.read(Duration::from_secs(30)) else {
            panic!("no checks")
        };
        assert_eq!(checks.len(), 1);
        assert_eq!(checks[0].layer, "python in sandbox");
        assert!(!checks[0].blocks());
        reap(pid);
    }
}
