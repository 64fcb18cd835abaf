//! File-descriptor plumbing shared by the supervisor and the sandbox processes.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::fcntl::{fcntl, FcntlArg, OFlag};

/// Where the sandbox init keeps the descriptors it received, so later steps can name them
/// without sharing any state with the parent.
pub mod slot {
    use std::os::fd::RawFd;
    pub const SYNC: RawFd = 3;
    pub const ERRORS: RawFd = 4;
    pub const STATUS: RawFd = 5;
    pub const STDOUT: RawFd = 6;
    pub const STDERR: RawFd = 7;
    pub const CHANNEL: RawFd = 8;
    /// The read end of the spawning process's lifeline (init only).
    pub const LIFELINE: RawFd = 9;
    /// The read end of the sandbox's control pipe (init only).
    pub const CONTROL: RawFd = 10;
    /// A session's workspace mount (detached), when the sandbox has one; attached at
    /// `/workspace` by the mount plan and closed there.
    pub const WORKSPACE: RawFd = 11;
    /// The init's end of the socketpair the egress listener is handed over on (proxy
    /// mode only, see `netns.rs`); closed once it is sent.
    pub const EGRESS: RawFd = 12;
    /// The first descriptor number above the slots.
    pub const END: RawFd = 13;
    /// Where a program's inherited descriptors (`Program::inherit`) are, in the init and
    /// in the program: `INHERITED`, `INHERITED + 1`, ...
    pub const INHERITED: RawFd = END;
}

/// The descriptor number the program finds the proxy channel on.
pub const PROGRAM_CHANNEL_FD: RawFd = 3;

/// A `pipe2(O_CLOEXEC)`: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)
}

/// A connected `AF_UNIX` stream socketpair, both ends close-on-exec.
pub fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    socketpair_of(ChannelKind::Stream)
}

/// The kind of a socketpair: a byte stream, or messages that may carry descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelKind {
    Stream,
    Seqpacket,
}

/// A connected `AF_UNIX` socketpair of `kind`, both ends close-on-exec.
pub fn socketpair_of(kind: ChannelKind) -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let ty = match kind {
        ChannelKind::Stream => SockType::Stream,
        ChannelKind::Seqpacket => SockType::SeqPacket,
    };
    socketpair(AddressFamily::Unix, ty, None, SockFlag::SOCK_CLOEXEC).map_err(io::Error::from)
}

/// Sets or clears `O_NONBLOCK`.
pub fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    let flags = if on {
        flags | OFlag::O_NONBLOCK
    } else {
        flags & !OFlag::O_NONBLOCK
    };
    fcntl(fd, FcntlArg::F_SETFL(flags))?;
    Ok(())
}

/// Sets `FD_CLOEXEC` on a raw descriptor.
pub fn set_cloexec_raw(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl(F_SETFD) on a number touches no memory; a closed fd yields EBADF.
    let r = unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Moves each `(fd, target)` pair into place: every source is first duplicated above all
/// targets so no `dup2` can clobber a source that is still needed, then `dup2`ed onto its
/// target (which clears `FD_CLOEXEC` there). Raw calls only: used between fork and exec.
pub fn arrange(pairs: &[(RawFd, RawFd)], scratch_base: RawFd) -> io::Result<()> {
    let mut moved = [0 as RawFd; 16];
    assert!(pairs.len() <= moved.len());
    for (i, (fd, _)) in pairs.iter().enumerate() {
        // SAFETY: F_DUPFD_CLOEXEC duplicates an open descriptor to the lowest free number
        // >= scratch_base; no memory is passed.
        let r = unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, scratch_base) };
        if r == -1 {
            return Err(io::Error::last_os_error());
        }
        moved[i] = r;
    }
    for (i, (_, target)) in pairs.iter().enumerate() {
        // SAFETY: dup2 between two descriptor numbers; no memory is passed.
        if unsafe { libc::dup2(moved[i], *target) } == -1 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: closing the scratch duplicate this function created.
        unsafe { libc::close(moved[i]) };
    }
    Ok(())
}

/// Closes every descriptor from `first` upwards.
pub fn close_from(first: RawFd) -> io::Result<()> {
    close_range(first, libc::c_uint::MAX)
}

/// Closes every descriptor from `first` to `last` (inclusive); nothing when `last < first`.
pub fn close_range(first: RawFd, last: libc::c_uint) -> io::Result<()> {
    if (last as u64) < first as u64 {
        return Ok(());
    }
    // SAFETY: close_range takes plain integers; closing descriptors this process owns.
    let r = unsafe { libc::syscall(libc::SYS_close_range, first as libc::c_uint, last, 0) };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes all of `buf` to a raw descriptor, retrying on EINTR.
pub fn write_all_raw(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is a valid readable slice of `buf.len()` bytes.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// Reads until `buf` is full or end of file; returns the bytes read.
pub fn read_full(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: the destination is the unfilled tail of `buf`, valid for writes.
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                buf[got..].as_mut_ptr().cast(),
                buf.len() - got,
            )
        };
        match n {
            0 => break,
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            n => got += n as usize,
        }
    }
    Ok(got)
}
