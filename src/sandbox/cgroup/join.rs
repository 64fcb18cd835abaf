//! Putting the sandbox init into its v1 cgroups without the kernel's global lock.
//!
//! Moving a process by writing its pid to `cgroup.procs` (or any pid to `tasks`) makes
//! the kernel take `cgroup_threadgroup_rwsem` for writing (`cgroup_procs_write_start`).
//! That is a per-cpu rwsem: its writer waits for an RCU grace period, which costs
//! 0.1–30 ms depending on what the other CPUs are doing — the "join spike" of the cold
//! path. The kernel skips the lock for exactly one case: a thread moving *itself* alone,
//! i.e. `0` written to a v1 `tasks` file (`pid == 0 && !threadgroup`), because `current`
//! cannot exit or exec under the write.
//!
//! So the parent opens the `tasks` file of every v1 hierarchy of the new cgroup before
//! `clone3` ([`SandboxCgroup::open_v1_tasks`]; v1 checks the permission against the
//! opener's credentials, `f_cred`), the child inherits the descriptors, and the init —
//! single-threaded, before anything else — writes `0` to each ([`TasksFds::join_self`])
//! and closes them. v2 needs none of this: `CLONE_INTO_CGROUP` places the child at birth;
//! [`SandboxCgroup::add_process_v2`] is the fallback when that was not possible.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::error::{Error, Result};
use super::files;
use super::handle::SandboxCgroup;

/// More v1 hierarchies than codebox has v1 controllers (5) cannot occur; the fixed size
/// keeps [`TasksFds`] `Copy` and allocation-free for the child.
pub const MAX_V1_HIERARCHIES: usize = 8;

impl SandboxCgroup {
    /// Opens `tasks` (`O_WRONLY | O_CLOEXEC`) in every v1 hierarchy of the cgroup, in
    /// [`SandboxCgroup::paths`] order. Empty when the cgroup has no v1 directory.
    pub fn open_v1_tasks(&self) -> Result<Vec<OwnedFd>> {
        if self.v1.len() > MAX_V1_HIERARCHIES {
            tracing::error!(
                hierarchies = self.v1.len(),
                "too many v1 hierarchies to join"
            );
            return Err(Error::TooManyHierarchies {
                count: self.v1.len(),
                max: MAX_V1_HIERARCHIES,
            });
        }
        self.v1
            .iter()
            .map(|d| open_for_joining(d.path.join("tasks")))
            .collect()
    }

    /// What a process forked elsewhere (a zygote's child) writes `0` to, itself, to join
    /// this cgroup: every v1 `tasks` file, then the v2 directory's `cgroup.procs`, all
    /// opened here, so the kernel checks this process's rights at the write (it takes
    /// the opener's credentials, and for v2 the opener's cgroup namespace).
    pub fn open_join_fds(&self) -> Result<Vec<OwnedFd>> {
        let mut fds = self.open_v1_tasks()?;
        if let Some(d) = &self.v2 {
            fds.push(open_for_joining(d.path.join("cgroup.procs"))?);
        }
        Ok(fds)
    }

    /// v2 only: moves `pid` into the v2 directory through `cgroup.procs`, unless
    /// `/proc/<pid>/cgroup` shows it there already. For a child cloned without
    /// `CLONE_INTO_CGROUP`; v1 hierarchies are joined by the child itself.
    pub fn add_process_v2(&self, pid: i32) -> Result<()> {
        let Some(d) = &self.v2 else {
            return Ok(());
        };
        if self.in_v2_already(pid, &d.cgroup_path) {
            return Ok(());
        }
        files::write(&d.path.join("cgroup.procs"), &pid.to_string()).inspect_err(|e| {
            tracing::error!(?e, pid, cgroup = %d.path.display(), "moving into the v2 cgroup failed");
        })
    }

    /// The host path of the `index`th v1 directory (for a failed [`TasksFds::join_self`]).
    pub fn v1_path(&self, index: usize) -> Option<&std::path::Path> {
        self.v1.get(index).map(|d| d.path.as_path())
    }
}

/// Opens a cgroup's `tasks` or `cgroup.procs` for writing (`O_WRONLY | O_CLOEXEC`).
fn open_for_joining(path: std::path::PathBuf) -> Result<OwnedFd> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .map(OwnedFd::from)
        .map_err(|source| {
            tracing::error!(?source, path = %path.display(), "opening a cgroup's join file failed");
            Error::OpenTasks { path, source }
        })
}

/// The raw `tasks` descriptors as the child inherits them: plain integers, `Copy`.
#[derive(Debug, Clone, Copy)]
pub struct TasksFds {
    fds: [RawFd; MAX_V1_HIERARCHIES],
    len: usize,
}

impl TasksFds {
    /// No v1 hierarchy to join.
    pub const NONE: TasksFds = TasksFds {
        fds: [-1; MAX_V1_HIERARCHIES],
        len: 0,
    };

    /// The raw numbers of `owned` (from [`SandboxCgroup::open_v1_tasks`], so at most
    /// [`MAX_V1_HIERARCHIES`]; any beyond are ignored).
    pub fn of(owned: &[OwnedFd]) -> TasksFds {
        let mut out = TasksFds::NONE;
        for (slot, fd) in out.fds.iter_mut().zip(owned) {
            *slot = fd.as_raw_fd();
            out.len += 1;
        }
        out
    }

    /// The descriptors, in hierarchy order.
    pub fn as_slice(&self) -> &[RawFd] {
        &self.fds[..self.len]
    }

    /// In the child, single-threaded: writes `0` to every `tasks` descriptor (this thread
    /// moves itself: no global lock), then closes them all. On the first failed write
    /// returns its hierarchy index and error (the rest are still closed). Only `write`
    /// and `close`: async-signal-safe, no allocation.
    pub fn join_self(&self) -> std::result::Result<(), (u32, io::Error)> {
        let mut result = Ok(());
        for (i, &fd) in self.as_slice().iter().enumerate() {
            if result.is_ok() {
                if let Err(e) = write_zero(fd) {
                    result = Err((i as u32, e));
                }
            }
            // SAFETY: closing a descriptor this process inherited and no longer needs.
            unsafe { libc::close(fd) };
        }
        result
    }
}

/// One `write(fd, "0")`, retried on EINTR; a short write cannot happen for one byte.
fn write_zero(fd: RawFd) -> io::Result<()> {
    loop {
        // SAFETY: a valid one-byte buffer; `fd` is a descriptor number (EBADF if closed).
        let n = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
        if n == 1 {
            return Ok(());
        }
        if n >= 0 {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
