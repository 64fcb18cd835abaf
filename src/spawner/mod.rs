//! The spawner: a single-threaded process, forked before the supervisor starts any
//! thread, that creates every sandbox the (multi-threaded, tokio) supervisor asks for.
//!
//! Why a process: cloning a sandbox from a multi-threaded process would leave the child
//! with locks held by threads that do not exist in it; the sandbox init allocates and
//! logs. The spawner is a copy of the supervisor taken while it was still
//! single-threaded (after the rootfs was verified and the cgroups discovered), so it
//! shares that state without sharing any thread.
//!
//! - [`wire`]: the protocol (JSON over `SOCK_SEQPACKET`, fds as `SCM_RIGHTS`)
//! - [`server`]: the spawner's loop; it keeps each sandbox's `Watch` and reports exits
//! - [`client`]: the supervisor's async side and [`RemoteSandbox`]; it replaces a dead
//!   spawner with a new one from the [`factory`] (`serve`)
//! - [`factory`]: the single-threaded process that forks spawners, and why; `restart.rs`:
//!   the client's task that replaces a dead spawner through it
//! - [`live`]: a keep-alive sandbox that runs one program after another ([`LiveSandbox`])

pub mod client;
pub mod factory;
pub mod live;
mod restart;
pub mod server;
pub mod wire;
pub mod zygotes;

use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use nix::unistd::{ForkResult, Pid};

pub use client::{ChannelServer, RemoteSandbox, SpawnerClient, Stream};
pub use live::{LiveRun, LiveSandbox, RunEnd};
pub use wire::SpawnSpec;

use crate::execution::Host;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot start the spawner process")]
    Start {
        #[source]
        source: std::io::Error,
    },
    #[error("the spawner process is gone")]
    Gone,
    #[error("the sandbox was lost: the spawner process died (a new one is started; run it again)")]
    Lost,
    #[error("the sandbox could not be created: {message}")]
    Spawn { message: String },
    #[error("spawner protocol error: {0}")]
    Protocol(&'static str),
    #[error("i/o with the spawner or the sandbox failed while {doing}")]
    Io {
        doing: &'static str,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// The signals that ask a process to stop, which the spawner and the factory ignore.
pub(crate) const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The spawner and the factory ignore [`STOP_SIGNALS`]: a Ctrl-C reaches the whole
/// foreground process group, and a service manager may signal every process of the
/// service; either would end them before the supervisor drained (and a dead spawner is
/// then "replaced" during a shutdown). They end when the supervisor's socket closes. The
/// sandbox init restores the default dispositions (`sandbox/init.rs`, step 1b). The
/// sandbox checker (`doctor::deferred`) ignores them too.
pub(crate) fn ignore_stop_signals() {
    for sig in STOP_SIGNALS {
        // SAFETY: signal(2) with SIG_IGN installs no handler code.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
}

/// stdin/stdout belong to the supervisor's MCP transport: a process forked from it holds
/// no copy of them (a client waiting for the server's stdout to close would wait for it).
pub(crate) fn detach_stdio() {
    if let Ok(null) = nix::fcntl::open(
        "/dev/null",
        nix::fcntl::OFlag::O_RDWR,
        nix::sys::stat::Mode::empty(),
    ) {
        for fd in [0, 1] {
            // SAFETY: dup2 between two descriptor numbers this process owns.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

/// Forks the spawner. Returns its pid and the supervisor's end of its socket.
///
/// # Safety
/// The calling process must be single-threaded (no tokio runtime yet, no other thread).
pub unsafe fn start(host: &Host) -> Result<(Pid, OwnedFd)> {
    let start = |source: std::io::Error| Error::Start { source };
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| start(e.into()))?;
    // SAFETY: the caller guarantees a single-threaded process, so the child may run
    // ordinary code; it ends with _exit.
    match unsafe { nix::unistd::fork() }.map_err(|e| start(e.into()))? {
        ForkResult::Child => {
            drop(ours);
            // No PR_SET_PDEATHSIG: when the supervisor dies, however it dies, its end of
            // the socket closes and `serve` kills, reaps and removes every sandbox before
            // exiting. A death signal would end the spawner first and leave the sandboxes'
            // cgroups behind. (Only the supervisor holds `ours`: it was dropped here
            // before any sandbox was forked.)
            detach_stdio();
            ignore_stop_signals();
            server::serve(theirs, host);
            // SAFETY: ends the spawner without running the supervisor's atexit handlers.
            unsafe { libc::_exit(0) }
        }
        ForkResult::Parent { child } => {
            drop(theirs);
            Ok((child, ours))
        }
    }
}
