//! `clone3(2)` into fresh namespaces, fork-style (the child continues on a copy of the
//! caller's stack), returning a pidfd for the child.
//!
//! Only called from a single-threaded process (the CLI, or the spawner forked before any
//! thread exists), so the child may allocate: no other thread can hold a lock.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::unistd::Pid;

/// Every namespace a sandbox gets.
pub const NAMESPACES: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u64;

/// `CLONE_INTO_CGROUP` (Linux 5.7), not in every libc version.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` from `<linux/sched.h>` (CLONE_ARGS_SIZE_VER2).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Which side of the clone the caller is on.
pub enum Forked {
    Parent { pid: Pid, pidfd: OwnedFd },
    Child,
}

/// Clones the calling process into new namespaces (`flags`), with `SIGCHLD` on exit,
/// directly into the cgroup `cgroup` (a v2 directory fd) when given.
///
/// # Safety
/// The caller must be single-threaded, and the child must end with `_exit` or `execve`
/// and never return into code that assumes it is the parent.
pub unsafe fn clone_into_namespaces(
    flags: u64,
    cgroup: Option<BorrowedFd<'_>>,
) -> io::Result<Forked> {
    let mut pidfd: libc::c_int = -1;
    let mut args = CloneArgs {
        flags: flags | libc::CLONE_PIDFD as u64,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..Default::default()
    };
    // Born inside its cgroup: no cgroup.procs write, no window outside the limits.
    if let Some(fd) = cgroup {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = fd.as_raw_fd() as u64;
    }
    // SAFETY: `args` is a valid clone_args of the size passed; with stack == 0 the child
    // runs on a copy-on-write copy of this stack like fork(2); the caller guarantees the
    // process is single-threaded so the child inherits no lock held by another thread.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match ret {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent {
            pid: Pid::from_raw(pid as i32),
            // SAFETY: with CLONE_PIDFD the kernel stored a new, owned pidfd in `pidfd`.
            pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) },
        }),
    }
}
