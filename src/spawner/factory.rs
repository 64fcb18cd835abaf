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
//! Protocol: [`Ask::Fork`] → [`Answer::Forked`] with the supervisor's end of the new
//! spawner's socket, or [`Answer::Failed`]; JSON over `SOCK_SEQPACKET` (see `wire.rs`).

use std::collections::BTreeSet;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Mutex;

use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{ForkResult, Pid};
use serde::{Deserialize, Serialize};

use super::{server, wire, Error, Result};
use crate::execution::Host;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Ask {
    /// Fork a spawner; first reap `dead` (a previous spawner) and clean up after it.
    Fork { dead: Option<i32> },
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
}

impl Factory {
    /// Forks the factory.
    ///
    /// # Safety
    /// The calling process must be single-threaded (no tokio runtime yet, no other thread).
    pub unsafe fn start(host: &Host) -> Result<Factory> {
        let start = |source: std::io::Error| Error::Start { source };
        let (ours, theirs) = seqpacket().map_err(start)?;
        // SAFETY: the caller guarantees a single-threaded process, so the child may run
        // ordinary code; it ends with _exit.
        match unsafe { nix::unistd::fork() }.map_err(|e| start(e.into()))? {
            ForkResult::Child => {
                drop(ours);
                super::detach_stdio();
                super::ignore_stop_signals();
                serve(theirs, host);
                // SAFETY: ends the factory without running the supervisor's atexit handlers.
                unsafe { libc::_exit(0) }
            }
            ForkResult::Parent { child } => {
                drop(theirs);
                Ok(Factory {
                    pid: child,
                    sock: Mutex::new(ours),
                })
            }
        }
    }

    /// The factory's pid (the supervisor reaps it at exit).
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Asks for a new spawner, replacing `dead` if given. Blocks (call it before tokio
    /// runs, or on the blocking pool).
    pub fn fork_spawner(&self, dead: Option<Pid>) -> Result<Forked> {
        let sock = self.sock.lock().unwrap_or_else(|e| e.into_inner());
        let io = |doing| move |source| Error::Io { doing, source };
        let ask = Ask::Fork {
            dead: dead.map(Pid::as_raw),
        };
        wire::send(sock.as_fd(), &ask, &[]).map_err(io("asking the spawner factory"))?;
        match wire::recv::<Answer>(sock.as_fd()).map_err(io("reading the spawner factory"))? {
            None => Err(Error::Gone),
            Some((Answer::Failed { error }, _)) => Err(Error::Spawn { message: error }),
            Some((Answer::Forked { pid, dead, cleaned }, mut fds)) => match fds.pop() {
                Some(sock) if fds.is_empty() => Ok(Forked {
                    pid: Pid::from_raw(pid),
                    sock,
                    dead,
                    cleaned,
                }),
                _ => Err(Error::Protocol("the factory sent no spawner socket")),
            },
        }
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

/// The factory's loop: answers fork requests until the supervisor closes the socket.
fn serve(sock: OwnedFd, host: &Host) {
    let mut children: BTreeSet<i32> = BTreeSet::new();
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
        let Ask::Fork { dead } = ask;
        let (dead, cleaned) = match dead.filter(|pid| children.remove(pid)) {
            Some(pid) => (Some(bury(Pid::from_raw(pid))), clean(host)),
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
    // and removes their cgroups. Wait for them, then remove what a killed one left.
    while let Ok(_) | Err(nix::errno::Errno::EINTR) = waitpid(None, None) {}
    clean(host);
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
            Ok(WaitStatus::Exited(_, code)) => return format!("exited with status {code}"),
            Ok(WaitStatus::Signaled(_, sig, _)) => return format!("killed by {}", sig.as_str()),
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return format!("could not be reaped ({e})"),
        }
    }
}

/// Kills and removes every sandbox cgroup of this supervisor; how many there were.
fn clean(host: &Host) -> usize {
    let Some(cgroups) = &host.cgroups else {
        return 0;
    };
    match cgroups.remove_owned() {
        Ok(n) => n,
        Err(e) => {
            tracing::error!(?e, "removing a dead spawner's cgroups failed");
            0
        }
    }
}
