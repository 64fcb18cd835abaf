//! A fork the zygote was asked for, until its child is ready: first the child's init
//! sends its pidfd on the reply socket, then the errors pipe carries the landlock status
//! and reaches end of file when the program is ready (or carries a failure record).
//! [`PendingFork::advance`] takes one step each time [`PendingFork::poll_fd`] is readable,
//! so a single-threaded spawner serves other sandboxes while a child sets up;
//! [`PendingFork::wait`] does the same blocking.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::unistd::Pid;

use super::super::cgroup::SandboxCgroup;
use super::super::report::{self, FAILURE_LEN};
use super::super::spawn::setup_error;
use super::super::{lifeline, Reaper, Sandbox, SandboxIo, Watch};
use super::{Error, Result};
use crate::sandbox::child::fds;
use crate::stopwatch::Stopwatch;

/// The parent's ends of the child's descriptors, until the child's pidfd makes them a
/// [`Sandbox`].
pub(super) struct Parts {
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub channel: OwnedFd,
    pub status: OwnedFd,
    pub cgroup: Option<SandboxCgroup>,
    pub control: OwnedFd,
}

/// A fork in progress (see the module documentation).
pub struct PendingFork {
    pub(super) reply: OwnedFd,
    pub(super) errors: OwnedFd,
    pub(super) parts: Option<Parts>,
    /// Once the pidfd has come.
    pub(super) sandbox: Option<Sandbox>,
    pub(super) deadline: Instant,
    pub(super) sw: Stopwatch,
    /// (cgroup, send, pidfd) microseconds, for the "zygote fork steps" event.
    pub(super) steps_us: (u64, u64, u64),
}

/// Where a pending fork stands after a step.
pub enum Progress {
    Waiting,
    Ready(Sandbox),
    Failed(Error),
}

impl PendingFork {
    /// The descriptor whose readiness moves it on.
    pub fn poll_fd(&self) -> BorrowedFd<'_> {
        match self.sandbox {
            None => self.reply.as_fd(),
            Some(_) => self.errors.as_fd(),
        }
    }

    /// When it is given up ([`Progress::Failed`] from [`PendingFork::expire`]).
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Gives up a fork past its deadline: the child (if any) is killed and its cgroup
    /// removed as the parts drop.
    pub fn expire(&self) -> Error {
        tracing::error!("the zygote's child did not get ready in time");
        Error::Protocol("the zygote's child did not get ready in 10 s".into())
    }

    /// One step; call when [`PendingFork::poll_fd`] is readable (it does not block then).
    pub fn advance(&mut self) -> Progress {
        if self.sandbox.is_none() {
            return self.take_pidfd();
        }
        // A record (written whole, 12 bytes < PIPE_BUF) or the end of file is there.
        let mut record = [0u8; FAILURE_LEN];
        let got = match fds::read_full(self.errors.as_fd(), &mut record) {
            Ok(got) => got,
            Err(source) => {
                return Progress::Failed(
                    super::super::Error::Io {
                        doing: "waiting for the program to start",
                        source,
                    }
                    .into(),
                )
            }
        };
        let sandbox = self.sandbox.as_mut().expect("checked above");
        match (got, report::decode_info(&record)) {
            (0, _) => {
                let (cgroup_us, send_us, forked_us) = self.steps_us;
                tracing::debug!(
                    cgroup_us,
                    send_us,
                    forked_us,
                    child_setup_us = self.sw.lap_us(),
                    total_us = self.sw.total_us(),
                    pid = sandbox.watch.pid().as_raw(),
                    "zygote fork steps"
                );
                let sandbox = self.sandbox.take().expect("checked above");
                Progress::Ready(sandbox.started_now())
            }
            (FAILURE_LEN, Some(report::Info::Landlock(status))) => {
                sandbox.io.landlock = Some(status);
                Progress::Waiting
            }
            (FAILURE_LEN, None) => {
                let failure = report::decode_failure(&record, &[]);
                let sandbox = self.sandbox.take().expect("checked above");
                Progress::Failed(setup_error(sandbox, failure).into())
            }
            _ => {
                tracing::error!(got, ?record, "a zygote child's setup was cut off");
                Progress::Failed(super::super::Error::SetupCutOff.into())
            }
        }
    }

    /// The first step: the child's init sends its pidfd, or the end of file says the
    /// child failed before (its record is on the errors pipe).
    fn take_pidfd(&mut self) -> Progress {
        let pidfd = match crate::sandbox::child::netns::receive_fd(self.reply.as_fd()) {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Progress::Waiting,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                return Progress::Failed(self.early_failure())
            }
            Err(source) => {
                tracing::error!(?source, "no pidfd from the zygote's child");
                return Progress::Failed(Error::Io {
                    doing: "receiving the child's pidfd",
                    source,
                });
            }
        };
        self.steps_us.2 = self.sw.lap_us();
        let parts = self.parts.take().expect("parts until the pidfd comes");
        let pid = pid_of(&pidfd).unwrap_or(Pid::from_raw(0));
        self.sandbox = Some(Sandbox {
            io: SandboxIo {
                stdout: parts.stdout,
                stderr: parts.stderr,
                channel: parts.channel,
                landlock: None,
                egress: None,
            },
            watch: Watch {
                pid,
                pidfd,
                status: parts.status,
                cgroup: parts.cgroup,
                control: lifeline::Control::new(parts.control),
                reaped: false,
                reaper: Reaper::Zygote,
            },
            started: Instant::now(),
        });
        Progress::Waiting
    }

    /// Why the child ended before sending its pidfd.
    fn early_failure(&mut self) -> Error {
        let mut record = [0u8; FAILURE_LEN];
        let got = fds::read_full(self.errors.as_fd(), &mut record).unwrap_or(0);
        let failure = (got == FAILURE_LEN)
            .then(|| report::decode_failure(&record, &[]))
            .flatten();
        // Its cgroup goes with the parts.
        self.parts = None;
        match failure {
            Some(failure) => {
                let source = std::io::Error::from_raw_os_error(failure.errno);
                tracing::error!(%failure, ?source, "zygote child setup failed");
                super::super::Error::Setup { failure, source }.into()
            }
            None => super::super::Error::SetupCutOff.into(),
        }
    }

    /// Blocks until the child is ready or has failed.
    pub fn wait(mut self) -> Result<Sandbox> {
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.expire());
            }
            let mut pfd = [PollFd::new(self.poll_fd(), PollFlags::POLLIN)];
            let timeout = PollTimeout::try_from(left.max(Duration::from_millis(1)))
                .unwrap_or(PollTimeout::MAX);
            match poll(&mut pfd, timeout) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(e) => {
                    return Err(Error::Io {
                        doing: "waiting for the zygote's child",
                        source: e.into(),
                    })
                }
            }
            match self.advance() {
                Progress::Waiting => {}
                Progress::Ready(sandbox) => return Ok(sandbox),
                Progress::Failed(e) => return Err(e),
            }
        }
    }
}

/// The pid (in this process's pid namespace) of the process `pidfd` refers to.
fn pid_of(pidfd: &OwnedFd) -> Option<Pid> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    let line = info.lines().find_map(|l| l.strip_prefix("Pid:"))?;
    line.trim()
        .parse()
        .ok()
        .filter(|p: &i32| *p > 0)
        .map(Pid::from_raw)
}
