//! The Python zygote: one pre-initialised interpreter per kind of sandbox that forks a
//! fresh sandbox per execution, so a Python sandbox costs a few forks and syscalls instead
//! of an interpreter start (and, with the data set preloaded, a second of CPU).
//!
//! The zygote is itself an ordinary sandbox (own user, mount, pid, net, ipc, uts and
//! cgroup namespaces, its own cgroup, capabilities dropped, `no_new_privs`), running
//! `runtime/python/zygote.py` with two differences: no landlock, and the profile's seccomp
//! filter without its rules on `unshare` and `mount` (`plan::zygote_spec`). It runs no
//! program and never holds a program's data. Each child, before any program code runs,
//! joins a cgroup of its own, unshares every namespace again under a nested user
//! namespace, mounts a fresh `/proc`, `/tmp`, `/dev/shm` and `/workspace`, drops every
//! capability and applies the profile's full landlock ruleset and seccomp filter — the
//! same layers a cold sandbox gets, decided here as data (`plan.rs`). `docs/src/backends/zygote.md`
//! argues what a child shares with the zygote and its siblings and what it does not;
//! `tests/zygote.rs` checks each claim.
//!
//! The protocol (fd 3 of the zygote, `SOCK_SEQPACKET`, JSON):
//! 1. [`Zygote::launch`] spawns the zygote sandbox and sends its [`plan::ZygoteConfig`].
//! 2. The zygote loads the boot file and the preloaded modules, then says `{"ready":true}`.
//! 3. [`Zygote::fork`] creates the child's cgroup and pipes and sends a
//!    [`plan::ForkRequest`] (binary: the zygote's native loop reads it, see
//!    `runtime/zygote/fork.c`) with the descriptors; the child sends back the pidfd of its
//!    init (pid 1 of its pid namespace, `runtime/zygote/init.c`) on a socket of its own;
//!    the errors pipe reaches end of file when the program is ready, as it does at a cold
//!    sandbox's `execve`. The result is an ordinary [`Sandbox`] whose [`Watch`] waits on
//!    that pidfd instead of reaping (the zygote, a subreaper, reaps its children).

mod pending;
mod plan;

use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recv, sendmsg, ControlMessage, MsgFlags};

pub use pending::{PendingFork, Progress};
pub use plan::{key, ZYGOTE_PROGRAM};

use pending::Parts;

use super::cgroup::CgroupManager;
use super::spawn::{cgroup_limits, spawn_with};
use super::spec::SandboxSpec;
use super::{Sandbox, SandboxIo, Watch};
use crate::sandbox::child::fds::{self, ChannelKind};
use crate::stopwatch::Stopwatch;

/// How long a fork may take until the child's init has reported its pidfd.
const FORK_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest a zygote lives: retired (forking no more) well before, it must outlive its
/// last child, which may run for the longest `max_timeout` (24 h).
const ZYGOTE_LIFETIME: Duration = Duration::from_secs(25 * 60 * 60);

/// Errors of the zygote.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no zygote for this sandbox: {0}")]
    Spec(String),
    #[error("starting the zygote failed")]
    Start(#[source] super::Error),
    #[error("the zygote is not ready yet")]
    NotReady,
    #[error("the zygote ended")]
    Gone,
    #[error("the zygote broke the protocol: {0}")]
    Protocol(String),
    #[error("i/o with the zygote failed while {doing}")]
    Io {
        doing: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Sandbox(#[from] super::Error),
    #[error(transparent)]
    Cgroup(#[from] super::cgroup::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

/// A running zygote.
#[derive(Debug)]
pub struct Zygote {
    key: String,
    io: SandboxIo,
    /// `None` once shut down.
    watch: Option<Watch>,
    ready: bool,
    started: Instant,
}

impl Zygote {
    /// Starts the zygote for sandboxes like `child` and sends its configuration; it is
    /// ready once [`Zygote::on_readable`] or [`Zygote::wait_ready`] says so. Must be
    /// called from a single-threaded process (it clones, see `clone.rs`).
    pub fn launch(child: &SandboxSpec, cgroups: Option<&CgroupManager>) -> Result<Zygote> {
        let key = plan::key(child).ok_or_else(|| {
            Error::Spec("only a Python sandbox with a private workspace and no egress proxy".into())
        })?;
        let spec = plan::zygote_spec(child)?;
        let config = plan::config(child, super::landlock::kernel_abi())?;
        let sandbox = spawn_with(&spec, cgroups, ChannelKind::Seqpacket).map_err(Error::Start)?;
        let (io, watch) = sandbox.into_parts();
        // Its init would end it after an hour unarmed (`lifeline::IDLE_LIFETIME`), and its
        // pid namespace with every child: the spawner retires a zygote after 50 minutes
        // and lets it end with its last child, which may run as long as `max_timeout`.
        watch.arm(ZYGOTE_LIFETIME).map_err(Error::Start)?;
        for fd in [io.stdout.as_fd(), io.stderr.as_fd()] {
            fds::set_nonblocking(fd, true).map_err(|source| Error::Io {
                doing: "setting up the zygote's output",
                source,
            })?;
        }
        let message = serde_json::to_vec(&config).expect("the config serializes");
        send(io.channel.as_fd(), &message, &[]).map_err(|source| Error::Io {
            doing: "sending the zygote its configuration",
            source,
        })?;
        tracing::debug!(pid = watch.pid().as_raw(), "zygote launched");
        Ok(Zygote {
            key,
            io,
            watch: Some(watch),
            ready: false,
            started: Instant::now(),
        })
    }

    /// Which sandboxes it serves ([`key`]).
    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// The descriptors to poll: the control socket (messages, or its end), and the
    /// zygote's stdout and stderr (whatever it prints is logged by
    /// [`Zygote::drain_output`]).
    pub fn poll_fds(&self) -> [BorrowedFd<'_>; 3] {
        [
            self.io.channel.as_fd(),
            self.io.stdout.as_fd(),
            self.io.stderr.as_fd(),
        ]
    }

    /// Reads what the control socket has: the ready message. `Err(Gone)` when the zygote
    /// ended (its socket closed).
    pub fn on_readable(&mut self) -> Result<()> {
        let mut buf = [0u8; 256];
        let n = match recv(
            self.io.channel.as_raw_fd(),
            &mut buf,
            MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(n) => n,
            Err(nix::errno::Errno::EAGAIN) => return Ok(()),
            Err(e) => {
                return Err(Error::Io {
                    doing: "reading from the zygote",
                    source: e.into(),
                })
            }
        };
        if n == 0 {
            return Err(Error::Gone);
        }
        if &buf[..n] == br#"{"ready":true}"# && !self.ready {
            self.ready = true;
            tracing::debug!(
                ms = self.started.elapsed().as_millis() as u64,
                "zygote ready"
            );
            return Ok(());
        }
        tracing::error!(message = %String::from_utf8_lossy(&buf[..n]), "unexpected message from the zygote");
        Err(Error::Protocol("an unexpected message".into()))
    }

    /// Blocks until the zygote is ready, at most `limit`.
    pub fn wait_ready(&mut self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        while !self.ready {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::NotReady);
            }
            let mut pfd = [PollFd::new(self.io.channel.as_fd(), PollFlags::POLLIN)];
            let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
            match poll(&mut pfd, timeout) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => {
                    return Err(Error::Io {
                        doing: "waiting for the zygote",
                        source: e.into(),
                    })
                }
            }
            let readable = pfd[0].revents().is_some_and(|r| !r.is_empty());
            self.drain_output();
            if readable {
                self.on_readable()?;
            }
        }
        Ok(())
    }

    /// Logs what the zygote printed (it prints nothing unless something is wrong).
    pub fn drain_output(&self) {
        for (stream, fd) in [("stdout", &self.io.stdout), ("stderr", &self.io.stderr)] {
            let mut buf = [0u8; 4096];
            // Non-blocking (set at launch): ends at EAGAIN or end of file.
            while let Ok(n) = nix::unistd::read(fd, &mut buf) {
                if n == 0 {
                    break;
                }
                tracing::warn!(stream, text = %String::from_utf8_lossy(&buf[..n]), "the zygote printed");
            }
        }
    }

    /// Forks a sandbox for `child` (which must have this zygote's [`key`]): returns once
    /// its program is ready, as [`super::spawn`] does after `execve`.
    pub fn fork(&self, child: &SandboxSpec, cgroups: Option<&CgroupManager>) -> Result<Sandbox> {
        self.start_fork(child, cgroups, false)?.wait()
    }

    /// Sends the fork request for `child`; the [`PendingFork`] completes as its
    /// descriptor becomes readable (a single-threaded caller serves others meanwhile).
    /// `warm_up`: the child runs boot.py's program path once before it says ready (a
    /// pooled sandbox: see `zygote.py`'s `_warm_up`).
    pub fn start_fork(
        &self,
        child: &SandboxSpec,
        cgroups: Option<&CgroupManager>,
        warm_up: bool,
    ) -> Result<PendingFork> {
        if !self.ready {
            return Err(Error::NotReady);
        }
        if plan::key(child).as_deref() != Some(self.key.as_str()) {
            return Err(Error::Spec("the sandbox differs from the zygote's".into()));
        }
        child.validate()?;
        let mut sw = Stopwatch::start();
        // The cgroup exists, with its limits, before the child does (as for a cold one).
        let cgroup = match (cgroups, cgroup_limits(&child.limits)) {
            (Some(manager), limits) => {
                let mut cg = manager.create("sandbox", &limits)?;
                cg.drop_v2_without_controllers()?;
                Some(cg)
            }
            (None, limits) if limits.controllers().is_empty() => None,
            (None, _) => return Err(super::Error::NoCgroups.into()),
        };
        let joins: Vec<OwnedFd> = match &cgroup {
            Some(cg) => cg.open_join_fds()?,
            None => Vec::new(),
        };
        let cgroup_us = sw.lap_us();

        let fd_err = |what| move |source| super::Error::CreateFd { what, source };
        let (errors_r, errors_w) = fds::pipe().map_err(fd_err("errors pipe"))?;
        let (status_r, status_w) = fds::pipe().map_err(fd_err("status pipe"))?;
        let (stdout_r, stdout_w) = fds::pipe().map_err(fd_err("stdout pipe"))?;
        let (stderr_r, stderr_w) = fds::pipe().map_err(fd_err("stderr pipe"))?;
        let (channel, channel_child) = fds::socketpair().map_err(fd_err("fd-3 socketpair"))?;
        let (control_r, control_w) = fds::pipe().map_err(fd_err("control pipe"))?;
        fds::set_nonblocking(control_w.as_fd(), true).map_err(fd_err("control pipe"))?;
        let (reply, reply_child) =
            fds::socketpair_of(ChannelKind::Seqpacket).map_err(fd_err("reply socketpair"))?;

        let request = plan::fork_request(child, joins.len(), warm_up);
        if request.mounts.len() > plan::MAX_MOUNTS || joins.len() > plan::MAX_JOINS {
            return Err(Error::Spec(format!(
                "{} mounts and {} cgroup joins: the zygote takes at most {} and {}",
                request.mounts.len(),
                joins.len(),
                plan::MAX_MOUNTS,
                plan::MAX_JOINS
            )));
        }
        let message = request.to_bytes();
        let mut passed: Vec<RawFd> = [
            &stdout_w,
            &stderr_w,
            &channel_child,
            &errors_w,
            &status_w,
            &control_r,
            &reply_child,
        ]
        .iter()
        .map(|fd| fd.as_raw_fd())
        .collect();
        passed.extend(joins.iter().map(AsRawFd::as_raw_fd));
        send(self.io.channel.as_fd(), &message, &passed).map_err(|source| {
            tracing::error!(?source, "sending a fork request to the zygote failed");
            Error::Io {
                doing: "sending a fork request",
                source,
            }
        })?;
        // The zygote and its child hold their own copies now.
        drop((
            stdout_w,
            stderr_w,
            channel_child,
            errors_w,
            status_w,
            control_r,
            reply_child,
            joins,
        ));
        let send_us = sw.lap_us();

        Ok(PendingFork {
            reply,
            errors: errors_r,
            parts: Some(Parts {
                stdout: stdout_r,
                stderr: stderr_r,
                channel,
                status: status_r,
                cgroup,
                control: control_w,
            }),
            sandbox: None,
            deadline: Instant::now() + FORK_TIMEOUT,
            sw,
            steps_us: (cgroup_us, send_us, 0),
        })
    }

    /// The zygote's pidfd: readable once it has ended.
    pub fn pidfd(&self) -> Option<BorrowedFd<'_>> {
        self.watch.as_ref().map(|w| w.pidfd())
    }

    /// Its init's host pid.
    pub fn pid(&self) -> Option<i32> {
        self.watch.as_ref().map(|w| w.pid().as_raw())
    }

    /// Kills the zygote (and with its pid namespace every child it still has), reaps it
    /// and removes its cgroup. Says how its interpreter ended (for one that died first).
    pub fn shutdown(&mut self) -> Option<String> {
        let watch = self.watch.take()?;
        let _ = watch.kill();
        match watch.finish() {
            Ok(ending) => Some(match ending.status {
                Some(crate::sandbox::report::ProgramStatus::Exited(c)) => {
                    format!("its interpreter exited with status {c}")
                }
                Some(crate::sandbox::report::ProgramStatus::Signaled(s)) => {
                    match nix::sys::signal::Signal::try_from(s) {
                        Ok(sig) => format!("its interpreter was killed by {}", sig.as_str()),
                        Err(_) => format!("its interpreter was killed by signal {s}"),
                    }
                }
                None => "its sandbox was killed".into(),
            }),
            Err(e) => {
                tracing::warn!(?e, "finishing the zygote failed");
                None
            }
        }
    }
}

impl Drop for Zygote {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Sends one message with `fds` attached, never blocking: a zygote that reads nothing
/// more is a broken one (`EAGAIN`), not a reason to stall the spawner.
fn send(sock: BorrowedFd<'_>, message: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let iov = [IoSlice::new(message)];
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
    loop {
        let flags = MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT;
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, flags, None) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}
