//! Everything between fork and exec: namespaces, id maps, mounts and `pivot_root`,
//! rlimits, capabilities, and the supervision of a running sandbox.
//!
//! - [`spec`]: what to run and the limits (plain data)
//! - [`idmap`], [`plan`]: the id maps and the mount plan, decided up front, unit-tested
//! - [`landlock`], [`seccomp`]: the program's last two policy layers
//! - [`spawn`]: the parent's side of `clone3`
//! - [`child`]: the child's side (init, mounts, program), each a linear procedure
//! - [`supervise`]: output capture, timeout, exit status
//!
//! This module is the only place with fork/clone code.

pub mod cgroup;
mod child;
pub mod clone;
mod error;
pub mod idmap;
pub mod idmapped;
pub mod landlock;
pub mod lifeline;
pub mod plan;
pub mod report;
pub mod seccomp;
mod spawn;
pub mod spec;
pub mod supervise;
pub mod zygote;

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Instant;

use nix::sys::wait::waitpid;
use nix::unistd::Pid;

pub use cgroup::{CgroupManager, CgroupStats};
pub use child::fds::slot::INHERITED as FIRST_INHERITED_FD;
pub use child::fds::{set_nonblocking, PROGRAM_CHANNEL_FD};
pub use error::{Error, Result};
pub use idmap::IdMapping;
pub use landlock::{LandlockMode, LandlockStatus};
pub use report::ProgramStatus;
pub use spawn::{cgroup_limits, spawn, spawn_with_devices};
pub use spec::{Limits, NetworkAccess, Program, SandboxSpec, SecurityPolicy};
pub use supervise::{Captured, Discard, Outcome, OutputSink};

/// The program's I/O, as the supervisor uses it.
#[derive(Debug)]
pub struct SandboxIo {
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// The supervisor's end of the program's fd 3.
    pub channel: OwnedFd,
    /// What landlock enforced, as the program process reported before its exec.
    pub landlock: Option<LandlockStatus>,
    /// Proxy mode: the egress listener, bound on 127.0.0.1 inside the sandbox's network
    /// namespace by its init, which kept no copy. Whoever holds it serves the program's
    /// only way out (`egress::Egress::start`).
    pub egress: Option<OwnedFd>,
}

/// How a sandbox ended, as seen by whoever reaps it.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Ending {
    /// The program's status from the init; `None` when the sandbox was killed first.
    pub status: Option<ProgramStatus>,
    /// Figures from the sandbox's cgroup.
    pub cgroup: Option<CgroupStats>,
}

/// The life of a sandbox: its init (which only the cloning process can reap), the
/// init's status pipe and the cgroup. Dropping it kills and reaps the whole sandbox.
#[derive(Debug)]
pub struct Watch {
    pid: Pid,
    pidfd: OwnedFd,
    status: OwnedFd,
    cgroup: Option<cgroup::SandboxCgroup>,
    /// Deadlines for the init (see `lifeline.rs`).
    control: lifeline::Control,
    reaped: bool,
    /// Who reaps the init: this process (it cloned it), or the zygote that forked it
    /// (then this process only waits for its pidfd to become readable).
    reaper: Reaper,
}

/// Who reaps a sandbox's init.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaper {
    /// This process: it cloned the init.
    Us,
    /// The zygote the sandbox was forked from (`zygote/`).
    Zygote,
}

/// A running sandbox: its I/O and its watch.
#[derive(Debug)]
pub struct Sandbox {
    pub io: SandboxIo,
    pub watch: Watch,
    /// When the program was exec'd.
    started: Instant,
}

impl Sandbox {
    /// Splits the sandbox: the I/O goes to whoever talks to the program, the watch stays
    /// with the process that cloned it.
    pub fn into_parts(self) -> (SandboxIo, Watch) {
        (self.io, self.watch)
    }

    /// Marks the program's start as now (after its exec).
    fn started_now(mut self) -> Self {
        self.started = Instant::now();
        self
    }
}

impl Watch {
    /// The host pid of the sandbox init.
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Whether the sandbox was forked from a zygote (rather than cloned by this process).
    pub fn from_zygote(&self) -> bool {
        self.reaper == Reaper::Zygote
    }

    /// The host directories of the sandbox's cgroup (one per hierarchy).
    pub fn cgroup_paths(&self) -> Vec<std::path::PathBuf> {
        self.cgroup
            .as_ref()
            .map(|cg| cg.paths().into_iter().map(|p| p.to_path_buf()).collect())
            .unwrap_or_default()
    }

    /// A second reader of the init's status pipe, for the process that drives the
    /// program's I/O: it learns the program's status the moment the init reports it.
    /// Whichever reader takes the record first has it; the other sees end of file.
    pub fn status_reader(&self) -> std::io::Result<OwnedFd> {
        self.status.try_clone()
    }

    /// Gives the sandbox `left` from now; then its init ends it, whether or not this
    /// process is still there to (see `lifeline.rs`). Until first armed a sandbox may
    /// live [`lifeline::IDLE_LIFETIME`].
    pub fn arm(&self, left: std::time::Duration) -> Result<()> {
        self.control.arm(left).map_err(|source| Error::Io {
            doing: "arming the sandbox's deadline",
            source,
        })
    }

    /// The init's pidfd: readable once the sandbox has ended.
    pub fn pidfd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.pidfd)
    }

    /// Kills every process of the sandbox: the cgroup kill catches anything in the cgroup,
    /// and SIGKILL to the init ends its pid namespace.
    pub fn kill(&self) -> Result<()> {
        if let Some(cg) = &self.cgroup {
            if let Err(e) = cg.kill_all() {
                tracing::error!(?e, cgroup = cg.name(), "cgroup kill failed");
            }
        }
        // SAFETY: pidfd_send_signal with a valid pidfd, a signal number and no siginfo.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r == -1 {
            let e = std::io::Error::last_os_error();
            // ESRCH: already gone, which is what we wanted.
            if e.raw_os_error() != Some(libc::ESRCH) {
                return Err(Error::Kill { source: e });
            }
        }
        Ok(())
    }

    /// Waits for the init to end and reaps it, reads the program status it reported,
    /// collects the cgroup's figures and removes the cgroup.
    pub fn finish(mut self) -> Result<Ending> {
        let mut sw = crate::stopwatch::Stopwatch::start();
        let status = self.reap()?;
        let reap_us = sw.lap_us();
        let (cgroup, stats_us) = match self.cgroup.take() {
            Some(cg) => {
                let stats = cg.stats();
                let stats_us = sw.lap_us();
                // Nothing of the sandbox may outlive the run: kill stragglers, rmdir.
                cg.remove()?;
                (Some(stats?), stats_us)
            }
            None => (None, 0),
        };
        tracing::debug!(
            reap_us,
            cgroup_stats_us = stats_us,
            cgroup_remove_us = sw.lap_us(),
            total_us = sw.total_us(),
            "finish steps"
        );
        Ok(Ending { status, cgroup })
    }

    fn reap(&mut self) -> Result<Option<ProgramStatus>> {
        self.wait_ended(None)?;
        self.reaped = true;
        let mut record = [0u8; report::STATUS_LEN];
        let got = child::fds::read_full(std::os::fd::AsFd::as_fd(&self.status), &mut record)
            .map_err(|source| Error::Io {
                doing: "reading the program status",
                source,
            })?;
        Ok(if got == record.len() {
            report::decode_status(&record)
        } else {
            None
        })
    }
}

impl Watch {
    /// Waits until the init has ended (`limit`: at most that long): reaps it when this
    /// process is its parent, else waits for its pidfd (readable once it has exited,
    /// which for a pid namespace's init means every process of the namespace is gone).
    fn wait_ended(&self, limit: Option<std::time::Duration>) -> Result<()> {
        if self.reaper == Reaper::Us {
            loop {
                match waitpid(self.pid, None) {
                    Ok(_) => return Ok(()),
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => return Err(Error::Wait { source: e.into() }),
                }
            }
        }
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let timeout = match limit {
            Some(d) => PollTimeout::try_from(d).unwrap_or(PollTimeout::MAX),
            None => PollTimeout::NONE,
        };
        loop {
            let mut pfd = [PollFd::new(self.pidfd(), PollFlags::POLLIN)];
            match poll(&mut pfd, timeout) {
                Ok(_) => return Ok(()),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(Error::Wait { source: e.into() }),
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if !self.reaped {
            if let Err(e) = self.kill() {
                tracing::error!(?e, pid = self.pid.as_raw(), "killing the sandbox failed");
            }
            // A zygote's child is reaped by the zygote; a killed one ends at once, and its
            // cgroup (removed by the caller when it has one) catches any straggler.
            let _ = self.wait_ended(Some(std::time::Duration::from_secs(2)));
        }
    }
}
