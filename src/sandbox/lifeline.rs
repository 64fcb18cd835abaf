//! What bounds a sandbox when its supervisor is gone or forgets it: the lifeline, the
//! control pipe and the init's own deadline.
//!
//! - **Lifeline**: one pipe per spawning process (the spawner, or the CLI). Only that
//!   process holds the write end; every init gets the read end in [`slot::LIFELINE`].
//!   When the spawning process dies, however it dies, the kernel closes the write end and
//!   every init sees `POLLHUP`. This is what a new pid namespace needs instead of the
//!   usual `getppid()` check (it reads 0 there), and it also covers the window before the
//!   init's `PR_SET_PDEATHSIG` is set (after its last credential change, which would clear
//!   it).
//! - **Control pipe**: one per sandbox; the write end stays in its [`Watch`](super::Watch).
//!   Each record is 8 bytes, a little-endian count of milliseconds: "you have this long
//!   from now". The supervisor arms a sandbox when it delivers the code (timeout plus
//!   [`DEADLINE_SLACK`]), so the clock of a pooled sandbox starts at delivery.
//! - **Deadline**: until armed, a sandbox may live [`IDLE_LIFETIME`]; once the deadline
//!   passes the init reports the program as killed and exits, and the kernel kills every
//!   process left in its pid namespace. The supervisor's own timer fires first; this one
//!   holds when the supervisor cannot.
//!
//! [`watch`] is the init's loop after it forked the program: `poll(2)` on a `signalfd`
//! for `SIGCHLD` (reaping the program and every orphan), the lifeline and the control
//! pipe, with the time left as the timeout. Single-threaded, no allocation.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::time::Duration;

use super::report::ProgramStatus;
use crate::sandbox::child::fds::{self, slot};

/// How long a sandbox that was never armed may live: a pooled sandbox waiting for code, a
/// session's interpreter between runs.
pub const IDLE_LIFETIME: Duration = Duration::from_secs(60 * 60);

/// How much later than the supervisor's timer the init's own deadline fires.
pub const DEADLINE_SLACK: Duration = Duration::from_secs(2);

/// Bytes of one control record.
pub const ARM_LEN: usize = 8;

/// The deadline the init enforces for a run of `timeout`.
pub fn run_deadline(timeout: Duration) -> Duration {
    timeout.saturating_add(DEADLINE_SLACK)
}

/// The control record "you have `left` from now" (whole milliseconds, at least 1).
pub fn arm_record(left: Duration) -> [u8; ARM_LEN] {
    let ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1);
    ms.to_le_bytes()
}

/// The last complete record in `buf`, if any.
fn last_record(buf: &[u8]) -> Option<u64> {
    let whole = buf.len() / ARM_LEN * ARM_LEN;
    let rec = buf.get(whole.checked_sub(ARM_LEN)?..whole)?;
    Some(u64::from_le_bytes(rec.try_into().ok()?))
}

/// This process's lifeline: (the pid that made it, read end, write end).
static LIFELINE: Mutex<Option<(u32, OwnedFd, OwnedFd)>> = Mutex::new(None);

/// The read end of this process's lifeline (created on first use; the write end is kept
/// open, close-on-exec, for the life of the process and never handed to anyone). A
/// process forked from one that had a lifeline drops its copy of that one and makes its
/// own: otherwise the parent's sandboxes would outlive the parent as long as the child
/// lives, and the child's would outlive the child as long as the parent lives.
pub fn read_end() -> io::Result<RawFd> {
    let mut lifeline = LIFELINE.lock().unwrap_or_else(|e| e.into_inner());
    let me = std::process::id();
    match &*lifeline {
        Some((pid, r, _)) if *pid == me => Ok(r.as_raw_fd()),
        _ => {
            // Dropping an inherited pair closes only this process's copies.
            *lifeline = None;
            let (r, w) = fds::pipe()?;
            let raw = r.as_raw_fd();
            *lifeline = Some((me, r, w));
            Ok(raw)
        }
    }
}

/// Whether the lifeline in `fd` has been cut (every write end closed).
pub(super) fn cut(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one pollfd this frame owns, no wait.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r == 1 && p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

fn now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec this frame owns.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Why [`watch`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// The program ended with this status.
    Program(ProgramStatus),
    /// The deadline passed.
    Deadline,
    /// The spawning process is gone.
    Orphaned,
}

/// The init's loop once the program (`child`) runs: reaps every child, follows the
/// control pipe, and returns when the program ends, the deadline passes or the lifeline
/// is cut.
pub(super) fn watch(child: libc::pid_t) -> End {
    // SIGCHLD through a descriptor: blocked here, after the fork, so the program's mask
    // is untouched; a SIGCHLD that came before is caught by the first reaping pass.
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it.
    let mut mask: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `mask` lives in this frame.
    unsafe {
        libc::sigemptyset(&mut mask);
        libc::sigaddset(&mut mask, libc::SIGCHLD);
    }
    // SAFETY: sigprocmask with a valid set and no old-set pointer.
    unsafe { libc::sigprocmask(libc::SIG_BLOCK, &mask, std::ptr::null_mut()) };
    // SAFETY: signalfd with -1 (new descriptor) and a valid mask.
    let sfd = unsafe { libc::signalfd(-1, &mask, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };

    let mut deadline = now().saturating_add(IDLE_LIFETIME);
    let mut control_open = true;
    loop {
        if let Some(status) = reap(child) {
            return End::Program(status);
        }
        let left = deadline.saturating_sub(now());
        if left.is_zero() {
            return End::Deadline;
        }
        let mut pfds = [
            libc::pollfd {
                fd: sfd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: slot::LIFELINE,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                // A negative descriptor is ignored by poll.
                fd: if control_open { slot::CONTROL } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // Without a signalfd (it cannot fail short of EMFILE/ENOMEM), reap every 100 ms.
        let cap = if sfd < 0 { 100 } else { i32::MAX as u128 };
        let timeout = left.as_millis().saturating_add(1).min(cap) as libc::c_int;
        // SAFETY: poll on an array this frame owns, with its length.
        let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout) };
        if r <= 0 {
            continue;
        }
        if pfds[0].revents != 0 {
            drain(sfd);
        }
        if pfds[1].revents != 0 {
            // Nothing is ever written to the lifeline: any event is its end.
            return End::Orphaned;
        }
        if pfds[2].revents != 0 {
            let mut buf = [0u8; 8 * ARM_LEN];
            // SAFETY: read into a buffer this frame owns, with its length.
            let n = unsafe { libc::read(slot::CONTROL, buf.as_mut_ptr().cast(), buf.len()) };
            match n {
                n if n > 0 => {
                    if let Some(ms) = last_record(&buf[..n as usize]) {
                        deadline = now().saturating_add(Duration::from_millis(ms));
                    }
                }
                // End of file: nobody can re-arm us; the deadline stands.
                0 => control_open = false,
                _ => {}
            }
        }
    }
}

/// Reaps every child that has ended; returns the program's status once it is among them.
fn reap(child: libc::pid_t) -> Option<ProgramStatus> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid with an int this frame owns.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid == 0 {
            return None;
        }
        if pid < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            // No child left at all: the program is gone without a status we could see.
            return Some(ProgramStatus::Signaled(libc::SIGKILL));
        }
        if pid == child {
            if libc::WIFEXITED(status) {
                return Some(ProgramStatus::Exited(libc::WEXITSTATUS(status)));
            }
            if libc::WIFSIGNALED(status) {
                return Some(ProgramStatus::Signaled(libc::WTERMSIG(status)));
            }
        }
    }
}

fn drain(sfd: RawFd) {
    let mut buf = [0u8; 128 * 4];
    // SAFETY: reads into a buffer this frame owns; the descriptor is non-blocking.
    while unsafe { libc::read(sfd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
}

/// The spawning side of one sandbox's control pipe.
#[derive(Debug)]
pub struct Control {
    write: OwnedFd,
}

impl Control {
    pub(super) fn new(write: OwnedFd) -> Control {
        Control { write }
    }

    /// Gives the sandbox `left` from now before its init ends it.
    pub fn arm(&self, left: Duration) -> io::Result<()> {
        let rec = arm_record(left);
        // SAFETY: write from a buffer this frame owns; 8 bytes on a pipe are atomic.
        let r = unsafe { libc::write(self.write.as_raw_fd(), rec.as_ptr().cast(), rec.len()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_the_last_one_wins() {
        let a = arm_record(Duration::from_millis(1500));
        let b = arm_record(Duration::from_secs(7));
        assert_eq!(last_record(&a), Some(1500));
        let both = [a, b].concat();
        assert_eq!(last_record(&both), Some(7000));
        // A torn tail is ignored (records are written whole, but be strict).
        assert_eq!(last_record(&both[..12]), Some(1500));
        assert_eq!(last_record(&both[..5]), None);
        assert_eq!(last_record(&arm_record(Duration::ZERO)), Some(1));
    }

    #[test]
    fn the_deadline_gives_the_supervisor_a_head_start() {
        let t = Duration::from_secs(5);
        assert!(run_deadline(t) > t);
        assert_eq!(run_deadline(Duration::MAX), Duration::MAX);
    }

    #[test]
    fn one_lifeline_per_process() {
        let a = read_end().unwrap();
        assert_eq!(read_end().unwrap(), a);
        assert!(!cut(a));
    }

    #[test]
    fn a_lifeline_is_cut_when_its_last_write_end_closes() {
        let (r, w) = fds::pipe().unwrap();
        assert!(!cut(r.as_raw_fd()));
        drop(w);
        assert!(cut(r.as_raw_fd()));
    }
}
