//! The spawner factory: a single-threaded process, forked by `serve` before the tokio
//! runtime exists, whose only job is to fork spawners — the first one at start-up and a
//! new one whenever the current spawner dies.
//!
//! # Why a factory, and not a re-exec
//!
//! A spawner must be a single-threaded copy of the supervisor's start-up state (the
//! verified rootfs, the discovered cgroups, the id mapping). Once tokio runs, the
//! supervisor cannot fork one itself (only async-signal-safe calls after a fork in a
//! threaded process). Two safe ways remain:
//!
//! - re-exec `/proc/self/exe` as a hidden `spawner` subcommand: it would redo rootfs
//!   verification and cgroup discovery in a new process, whose cgroup owner (the pid in
//!   `codebox-<pid>-…` names) and stale-cgroup clean-up would then differ from, or fight
//!   with, the supervisor's; every setting that shapes the host would travel on the
//!   command line; and the binary on disk may have been replaced meanwhile.
//! - keep a single-threaded process that already holds that state and can fork freely:
//!   this factory. A fork of it *is* the spawner we would have forked at start-up,
//!   identical by construction. It costs one idle process (a few MiB, shared pages).
//!
//! We take the second. The factory also owns the clean-up between two spawners: asked to
//! replace a dead one, it SIGKILLs and reaps it (only its own children), kills and removes
//! every sandbox cgroup of this supervisor (none can belong to a live spawner at that
//! moment: the next one is forked only afterwards), and then forks the new spawner. When
//! the supervisor goes away (end of file, also on SIGKILL), the factory waits for its
//! spawners to finish their own clean-up, removes whatever a killed one left, and exits.
//!
//! It forks the sandbox checkers too (`doctor::deferred`), for the same reason: each
//! must be a single-threaded copy of the start-up state. Their sandbox cgroups carry
//! generations from [`CHECKER_GENERATIONS`] up (spawners count from 1), so the clean-up
//! after a dead spawner spares a checker that runs meanwhile, and the clean-up after a
//! checker removes only its own.
//!
//! # When the factory itself dies
//!
//! It cannot be replaced: only a single-threaded copy of the start-up state can fork a
//! spawner, and once tokio runs the supervisor is no longer one (see above for why not a
//! re-exec); a spawner holds sandboxes and cannot become one either. The supervisor
//! watches it ([`watch`]): its death is logged once, shown in `health`
//! (`spawner.factory`), and the server goes on with the spawner it has — executions keep
//! working. What it can no longer do is replace that spawner or re-run the sandbox
//! checks: a spawner's death then ends the server with status 70 and a message naming
//! the factory's death (`restart.rs`), for a service manager to restart it, and checks
//! that did not finish stay reported as such. Exiting at once would kill every running
//! execution and session for a loss that may never matter.
//!
//! Protocol: [`Ask::Fork`] → [`Answer::Forked`] with the supervisor's end of the new
//! spawner's socket; [`Ask::Check`] → [`Answer::Checking`] with the read end of the
//! checker's report pipe; [`Ask::Reap`] → [`Answer::Reaped`]; any → [`Answer::Failed`].
//! JSON over `SOCK_SEQPACKET` (see `wire.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{ForkResult, Pid};
use serde::{Deserialize, Serialize};

use super::{server, wire, Error, Result};
use crate::doctor::deferred::PendingChecks;
use crate::execution::Host;
use crate::profile::Profile;

/// The first cgroup generation of a checker (see `sandbox::cgroup::start_sequence`);
/// spawners count from 1 and never reach it (the supervisor gives up after a few
/// replacements a minute).
pub const CHECKER_GENERATIONS: u32 = 1 << 31;

/// How long the factory waits for a checker that closed its report to exit before it
/// kills it.
const CHECKER_EXIT_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Ask {
    /// Fork a spawner; first reap `dead` (a previous spawner) and clean up after it.
    Fork { dead: Option<i32> },
    /// Fork a sandbox checker.
    Check,
    /// Reap checker `pid` (killing it first when `kill`), remove what its sandboxes left,
    /// say how it ended.
    Reap { pid: i32, kill: bool },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Answer {
    Forked {
        pid: i32,
        /// How the dead spawner ended, as reaped.
        dead: Option<String>,
        /// Sandbox cgroups of the dead spawner that were killed and removed.
        cleaned: usize,
    },
    /// A checker runs; its report's read end comes along.
    Checking {
        pid: i32,
    },
    Reaped {
        /// How it ended: "exited with status 0", "killed by SIGKILL".
        how: String,
    },
    Failed {
        error: String,
    },
}

/// A new spawner from the factory.
#[derive(Debug)]
pub struct Forked {
    pub pid: Pid,
    /// The supervisor's end of the spawner's socket.
    pub sock: OwnedFd,
    /// How the previous spawner ended (when one was replaced).
    pub dead: Option<String>,
    /// How many of its sandbox cgroups were removed.
    pub cleaned: usize,
}

/// The supervisor's handle on the factory process.
#[derive(Debug)]
pub struct Factory {
    pid: Pid,
    /// Blocking; one request at a time.
    sock: Mutex<OwnedFd>,
    /// Set once the factory was seen dead ([`watch`]).
    died: Mutex<Option<Died>>,
}

/// How and when the factory died.
#[derive(Debug, Clone, Serialize)]
pub struct Died {
    pub how: String,
    /// Seconds since the Unix epoch.
    pub at_unix: Option<u64>,
}

/// What `health` says about the factory (`spawner.factory`).
#[derive(Debug, Clone, Serialize)]
pub struct FactoryStatus {
    pub pid: i32,
    pub alive: bool,
    /// How it ended, when it did (the server then cannot replace its spawner nor re-run
    /// the sandbox checks: restart codebox).
    pub died: Option<Died>,
}

impl Factory {
    /// Forks the factory. `profile` is what its sandbox checkers check.
    ///
    /// # Safety
    /// The calling process must be single-threaded (no tokio runtime yet, no other thread).
    pub unsafe fn start(host: &Host, profile: &Profile) -> Result<Factory> {
        let start = |source: std::io::Error| Error::Start { source };
        let (ours, theirs) = seqpacket().map_err(start)?;
        // SAFETY: the caller guarantees a single-threaded process, so the child may run
        // ordinary code; it ends with _exit.
        match unsafe { nix::unistd::fork() }.map_err(|e| start(e.into()))? {
            ForkResult::Child => {
                drop(ours);
                super::detach_stdio();
                super::ignore_stop_signals();
                serve(theirs, host, profile);
                // SAFETY: ends the factory without running the supervisor's atexit handlers.
                unsafe { libc::_exit(0) }
            }
            ForkResult::Parent { child } => {
                drop(theirs);
                Ok(Factory {
                    pid: child,
                    sock: Mutex::new(ours),
                    died: Mutex::new(None),
                })
            }
        }
    }

    /// Its state for `health`.
    pub fn status(&self) -> FactoryStatus {
        let died = self.died();
        FactoryStatus {
            pid: self.pid.as_raw(),
            alive: died.is_none(),
            died,
        }
    }

    /// How it died, once [`watch`] saw it.
    pub fn died(&self) -> Option<Died> {
        self.died.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Starts a sandbox checker. Blocks (call it before tokio runs, or on the blocking
    /// pool).
    pub fn start_checks(&self) -> Result<PendingChecks> {
        match self.ask(&Ask::Check)? {
            (Answer::Checking { pid }, mut fds) => match fds.pop() {
                Some(report) if fds.is_empty() => {
                    Ok(PendingChecks::new(Pid::from_raw(pid), report))
                }
                _ => Err(Error::Protocol("the factory sent no report pipe")),
            },
            (Answer::Failed { error }, _) => Err(Error::Spawn { message: error }),
            _ => Err(Error::Protocol("the factory answered another question")),
        }
    }

    /// Has checker `pid` reaped (killed first with `kill`); how it ended. Blocks.
    pub fn reap_checker(&self, pid: Pid, kill: bool) -> Result<String> {
        let ask = Ask::Reap {
            pid: pid.as_raw(),
            kill,
        };
        match self.ask(&ask)? {
            (Answer::Reaped { how }, _) => Ok(how),
            (Answer::Failed { error }, _) => Err(Error::Spawn { message: error }),
            _ => Err(Error::Protocol("the factory answered another question")),
        }
    }

    /// One request and its answer.
    fn ask(&self, ask: &Ask) -> Result<(Answer, Vec<OwnedFd>)> {
        let sock = self.sock.lock().unwrap_or_else(|e| e.into_inner());
        let io = |doing| move |source| Error::Io { doing, source };
        wire::send(sock.as_fd(), ask, &[]).map_err(|e| match e.raw_os_error() {
            Some(libc::EPIPE | libc::ECONNRESET | libc::ENOTCONN) => Error::Gone,
            _ => io("asking the spawner factory")(e),
        })?;
        match wire::recv::<Answer>(sock.as_fd()).map_err(io("reading the spawner factory"))? {
            None => Err(Error::Gone),
            Some(answer) => Ok(answer),
        }
    }

    /// The factory's pid (the supervisor reaps it at exit).
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Asks for a new spawner, replacing `dead` if given. Blocks (call it before tokio
    /// runs, or on the blocking pool).
    pub fn fork_spawner(&self, dead: Option<Pid>) -> Result<Forked> {
        let ask = Ask::Fork {
            dead: dead.map(Pid::as_raw),
        };
        match self.ask(&ask)? {
            (Answer::Failed { error }, _) => Err(Error::Spawn { message: error }),
            (Answer::Forked { pid, dead, cleaned }, mut fds) => match fds.pop() {
                Some(sock) if fds.is_empty() => Ok(Forked {
                    pid: Pid::from_raw(pid),
                    sock,
                    dead,
                    cleaned,
                }),
                _ => Err(Error::Protocol("the factory sent no spawner socket")),
            },
            _ => Err(Error::Protocol("the factory answered another question")),
        }
    }
}

/// Watches the factory until it dies (a pidfd: it is our child), then reaps it, records
/// how in [`Factory::died`] and logs it once, unless `stopping` says the supervisor is
/// shutting down. Runs as a task on the supervisor's runtime.
pub async fn watch(
    factory: std::sync::Arc<Factory>,
    stopping: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open with a pid and no flags; the result is a new descriptor or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, factory.pid.as_raw(), 0) } as i32;
    if raw < 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!(%e, "cannot watch the spawner factory; its death would show only when a spawner dies");
        return;
    }
    // SAFETY: a descriptor pidfd_open just returned, owned by nothing else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: an OwnedFd's descriptor stays valid and unchanged for as long as the
    // AsyncFd that owns it lives.
    let Ok(pidfd) = (unsafe { tokio::io::unix::AsyncFd::register(pidfd) }) else {
        return;
    };
    // Readable once the process has ended.
    let _ = pidfd.readable().await;
    let how = match waitpid(factory.pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
        Ok(status) => describe(status),
        Err(e) => format!("could not be reaped ({e})"),
    };
    let at_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs());
    *factory.died.lock().unwrap_or_else(|e| e.into_inner()) = Some(Died {
        how: how.clone(),
        at_unix,
    });
    if stopping.load(std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    tracing::error!(
        factory = factory.pid.as_raw(),
        how,
        "the spawner factory died: executions go on with the current spawner, but if it dies the server exits (status 70), and sandbox checks that did not finish cannot be re-run; restart codebox to recover"
    );
}

/// A reaped child's end in words.
fn describe(status: WaitStatus) -> String {
    match status {
        WaitStatus::Exited(_, code) => format!("exited with status {code}"),
        WaitStatus::Signaled(_, sig, _) => format!("killed by {}", sig.as_str()),
        WaitStatus::StillAlive => "still running".into(),
        other => format!("ended: {other:?}"),
    }
}

fn seqpacket() -> std::io::Result<(OwnedFd, OwnedFd)> {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(std::io::Error::from)
}

/// The factory's loop: answers requests until the supervisor closes the socket.
fn serve(sock: OwnedFd, host: &Host, profile: &Profile) {
    let mut children: BTreeSet<i32> = BTreeSet::new();
    // Live checkers and their cgroup generations.
    let mut checkers: BTreeMap<i32, u32> = BTreeMap::new();
    let mut checks: u32 = 0;
    let mut generation: u32 = 0;
    loop {
        let ask = match wire::recv::<Ask>(sock.as_fd()) {
            Ok(Some((ask, _))) => ask,
            Ok(None) => break,
            Err(e) => {
                tracing::error!(?e, "bad request to the spawner factory");
                break;
            }
        };
        let dead = match ask {
            Ask::Fork { dead } => dead,
            Ask::Check => {
                checks = checks.wrapping_add(1);
                let generation = CHECKER_GENERATIONS | (checks & !CHECKER_GENERATIONS);
                match fork_checker(&sock, host, profile, generation) {
                    Ok((pid, report)) => {
                        checkers.insert(pid.as_raw(), generation);
                        let answer = Answer::Checking { pid: pid.as_raw() };
                        if let Err(e) = wire::send(sock.as_fd(), &answer, &[report.as_raw_fd()]) {
                            tracing::error!(?e, "cannot hand a checker's report to the supervisor");
                        }
                    }
                    Err(e) => {
                        let error = format!("cannot fork a sandbox checker: {e}");
                        let _ = wire::send(sock.as_fd(), &Answer::Failed { error }, &[]);
                    }
                }
                continue;
            }
            Ask::Reap { pid, kill } => {
                let answer = match checkers.remove(&pid) {
                    Some(generation) => {
                        let how = reap_checker(Pid::from_raw(pid), kill);
                        clean_generation(host, generation);
                        Answer::Reaped { how }
                    }
                    None => Answer::Failed {
                        error: format!("{pid} is not a checker of this factory"),
                    },
                };
                let _ = wire::send(sock.as_fd(), &answer, &[]);
                continue;
            }
        };
        let (dead, cleaned) = match dead.filter(|pid| children.remove(pid)) {
            Some(pid) => {
                let how = bury(Pid::from_raw(pid));
                // Every sandbox cgroup of this supervisor but a running checker's.
                let live: BTreeSet<u32> = checkers.values().copied().collect();
                (
                    Some(how),
                    clean_where(host, |seq| !live.contains(&((seq >> 32) as u32))),
                )
            }
            None => (None, 0),
        };
        generation = generation.wrapping_add(1);
        let answer = match fork_one(&sock, host, generation) {
            Ok((pid, theirs)) => {
                children.insert(pid.as_raw());
                let answer = Answer::Forked {
                    pid: pid.as_raw(),
                    dead,
                    cleaned,
                };
                let sent = wire::send(sock.as_fd(), &answer, &[theirs.as_raw_fd()]);
                if let Err(e) = sent {
                    tracing::error!(?e, "cannot hand a new spawner to the supervisor");
                }
                continue;
            }
            Err(e) => Answer::Failed {
                error: format!("cannot fork a spawner: {e}"),
            },
        };
        let _ = wire::send(sock.as_fd(), &answer, &[]);
    }
    // The supervisor is gone: each spawner sees that too, kills and reaps its sandboxes
    // and removes their cgroups; a checker still running is of no use now. Wait for them
    // all, then remove what a killed one left.
    for pid in checkers.keys() {
        let _ = nix::sys::signal::kill(Pid::from_raw(*pid), nix::sys::signal::Signal::SIGKILL);
    }
    while let Ok(_) | Err(nix::errno::Errno::EINTR) = waitpid(None, None) {}
    clean(host);
}

/// Forks one sandbox checker; returns its pid and the read end of its report.
fn fork_checker(
    factory_sock: &OwnedFd,
    host: &Host,
    profile: &Profile,
    generation: u32,
) -> std::io::Result<(Pid, OwnedFd)> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // SAFETY: the factory is single-threaded (see fork_one), so the child may run
    // ordinary code; it ends with _exit.
    match unsafe { nix::unistd::fork() }.map_err(std::io::Error::from)? {
        ForkResult::Child => {
            drop(read);
            // As a spawner: not a holder of the factory's socket.
            // SAFETY: closing a descriptor this (child) process owns; the OwnedFd copy in
            // the parent's frames is never dropped here (the child ends in _exit).
            unsafe { libc::close(factory_sock.as_raw_fd()) };
            crate::sandbox::cgroup::start_sequence(generation);
            // SAFETY: a freshly forked child of a single-threaded process.
            unsafe { crate::doctor::deferred::run_checker(host, profile, write) }
        }
        ForkResult::Parent { child } => {
            drop(write);
            Ok((child, read))
        }
    }
}

/// Reaps a checker: its report is closed, so it is exiting; one that takes longer than
/// [`CHECKER_EXIT_WAIT`] (or `kill`: the supervisor gave up on it) is killed.
fn reap_checker(pid: Pid, kill: bool) -> String {
    use nix::sys::signal::{kill as signal, Signal};
    use nix::sys::wait::WaitPidFlag;
    if kill {
        let _ = signal(pid, Signal::SIGKILL);
    }
    let until = Instant::now() + CHECKER_EXIT_WAIT;
    loop {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(WaitStatus::StillAlive) => {
                let _ = signal(pid, Signal::SIGKILL);
                return match waitpid(pid, None) {
                    Ok(status) => {
                        format!("{} (it did not exit after its report)", describe(status))
                    }
                    Err(e) => format!("could not be reaped ({e})"),
                };
            }
            Ok(status) => return describe(status),
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return format!("could not be reaped ({e})"),
        }
    }
}

/// Forks one spawner; returns its pid and the supervisor's end of its socket.
fn fork_one(
    factory_sock: &OwnedFd,
    host: &Host,
    generation: u32,
) -> std::io::Result<(Pid, OwnedFd)> {
    let (theirs, spawners) = seqpacket()?;
    // SAFETY: the factory is single-threaded (forked from a single-threaded supervisor,
    // it never starts a thread), so the child may run ordinary code; it ends with _exit.
    match unsafe { nix::unistd::fork() }.map_err(std::io::Error::from)? {
        ForkResult::Child => {
            drop(theirs);
            // The spawner must not keep the factory's socket: the supervisor's end of
            // it has to be the only thing keeping the factory's loop alive.
            // SAFETY: closing a descriptor this (child) process owns; the OwnedFd copy in
            // the parent's frames is never dropped here (the child ends in _exit).
            unsafe { libc::close(factory_sock.as_raw_fd()) };
            crate::sandbox::cgroup::start_sequence(generation);
            server::serve(spawners, host);
            // SAFETY: ends the spawner without running atexit handlers.
            unsafe { libc::_exit(0) }
        }
        ForkResult::Parent { child } => Ok((child, theirs)),
    }
}

/// Makes sure a dead spawner is dead, reaps it and says how it ended.
fn bury(pid: Pid) -> String {
    // A spawner whose socket closed but which still runs would hold sandboxes nobody
    // drives: end it.
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    loop {
        match waitpid(pid, None) {
            Ok(status @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) => {
                return describe(status)
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return format!("could not be reaped ({e})"),
        }
    }
}

/// Kills and removes every sandbox cgroup of this supervisor; how many there were.
fn clean(host: &Host) -> usize {
    clean_where(host, |_| true)
}

/// What a checker's sandboxes left (nothing, unless it was killed mid-check).
fn clean_generation(host: &Host, generation: u32) -> usize {
    clean_where(host, |seq| (seq >> 32) as u32 == generation)
}

/// Kills and removes the sandbox cgroups of this supervisor whose sequence number passes
/// `which`; how many there were.
fn clean_where(host: &Host, which: impl Fn(u64) -> bool) -> usize {
    let Some(cgroups) = &host.cgroups else {
        return 0;
    };
    match cgroups.remove_owned_if(which) {
        Ok(n) => n,
        Err(e) => {
            tracing::error!(?e, "removing sandbox cgroups left behind failed");
            0
        }
    }
}
