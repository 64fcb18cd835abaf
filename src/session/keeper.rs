//! The workspace keeper: a tiny process that creates each session's workspace
//! filesystem and hands out copies of its mount.
//!
//! A session's `/workspace` is a tmpfs of its own with `size=` and `nr_inodes=`, so the
//! kernel enforces the quota on allocated pages and inodes (whatever the names, the depth,
//! `fallocate`, unlinked-but-open files or writes between runs). It is made with the new
//! mount API as a *detached* mount (`fsopen` → `fsconfig` → `fsmount`): it is attached
//! nowhere on the host, and the supervisor reaches it only through the descriptor.
//!
//! `fsopen` needs `CAP_SYS_ADMIN` over the caller's mount namespace, which an unprivileged
//! supervisor does not have; and the kernel lets a detached mount be cloned
//! (`open_tree(OPEN_TREE_CLONE)`) only from the mount namespace it was made in. So both
//! happen here, in a process that (rootless) owns a user and mount namespace of its own:
//!
//! - `create(size, inodes)` → the session's mount, root owned by the sandbox user's host
//!   ids, mode 0700, nosuid/nodev/noexec. The supervisor keeps it for the session's life
//!   and does all host-side access relative to it.
//! - `clone(mount)` → a fresh detached copy of the same filesystem, which one run's
//!   sandbox init attaches at `/workspace` with `move_mount`.
//!
//! The keeper keeps no state: closing a session's descriptors (and ending its sandboxes)
//! frees the filesystem. Its loop uses only raw system calls on stack buffers, with no
//! allocation, so it may be forked from the threaded supervisor; it exits when the
//! supervisor's end of its socket closes.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot start the workspace keeper")]
    Start(#[source] io::Error),
    #[error("the workspace keeper cannot {doing}")]
    Keeper {
        doing: &'static str,
        #[source]
        source: io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

const OP_CREATE: u8 = 1;
const OP_CLONE: u8 = 2;
/// op, size (u64), inodes (u64), uid (u32), gid (u32).
const REQUEST_LEN: usize = 25;
/// How long the supervisor waits for an answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The supervisor's handle on the keeper process.
#[derive(Debug)]
pub struct Keeper {
    sock: Mutex<Option<OwnedFd>>,
    pid: libc::pid_t,
    /// Set once the keeper was reaped: its pid may name another process then.
    reaped: std::sync::atomic::AtomicBool,
    owner: (u32, u32),
}

impl Keeper {
    /// Forks the keeper. `owner` are the host uid and gid of the sandbox user, which own
    /// every workspace's root. Safe to call from a threaded process: the child runs only
    /// async-signal-safe code.
    pub fn start(owner: (u32, u32)) -> Result<Keeper> {
        let rootless = !nix::unistd::geteuid().is_root();
        let (ours, theirs) = nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::SeqPacket,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| Error::Start(e.into()))?;
        let theirs_raw = theirs.as_raw_fd();
        // SAFETY: the child runs `child_main` only, which uses raw system calls on stack
        // buffers (async-signal-safe) and ends in _exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(Error::Start(io::Error::last_os_error()));
        }
        if pid == 0 {
            // SAFETY: in the forked child; see above.
            unsafe { child_main(theirs_raw, owner, rootless) }
        }
        drop(theirs);
        let timeout = nix::sys::time::TimeVal::new(ANSWER_TIMEOUT.as_secs() as i64, 0);
        nix::sys::socket::setsockopt(&ours, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| Error::Start(e.into()))?;
        Ok(Keeper {
            sock: Mutex::new(Some(ours)),
            pid,
            reaped: std::sync::atomic::AtomicBool::new(false),
            owner,
        })
    }

    /// A new workspace filesystem of `size` bytes and `inodes` inodes (its root
    /// directory included); returns its detached mount.
    pub fn create(&self, size: u64, inodes: u64) -> Result<OwnedFd> {
        // tmpfs reads 0 as "unlimited": never ask for that.
        let (size, inodes) = (size.max(1), inodes.max(1));
        let mut req = [0u8; REQUEST_LEN];
        req[0] = OP_CREATE;
        req[1..9].copy_from_slice(&size.to_le_bytes());
        req[9..17].copy_from_slice(&inodes.to_le_bytes());
        req[17..21].copy_from_slice(&self.owner.0.to_le_bytes());
        req[21..25].copy_from_slice(&self.owner.1.to_le_bytes());
        self.ask(&req, None, "create a workspace filesystem")
    }

    /// A fresh detached copy of `mount` (a mount [`Keeper::create`] returned), for one
    /// sandbox to attach.
    pub fn clone_mount(&self, mount: BorrowedFd<'_>) -> Result<OwnedFd> {
        let mut req = [0u8; REQUEST_LEN];
        req[0] = OP_CLONE;
        self.ask(&req, Some(mount.as_raw_fd()), "copy a workspace mount")
    }

    /// The keeper's pid.
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.pid)
    }

    /// Whether the keeper may still answer: its socket is open and it has not exited.
    pub fn alive(&self) -> bool {
        use std::sync::atomic::Ordering;
        let open = self.sock.lock().map(|s| s.is_some()).unwrap_or(false);
        if !open || self.reaped.load(Ordering::Acquire) {
            return false;
        }
        // SAFETY: a non-blocking waitpid on our own child, not reaped yet (checked above;
        // callers hold the sessions' keeper lock, so no other call races this one).
        match unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), libc::WNOHANG) } {
            0 => true,
            _ => {
                self.reaped.store(true, Ordering::Release);
                false
            }
        }
    }

    fn ask(&self, req: &[u8], fd: Option<RawFd>, doing: &'static str) -> Result<OwnedFd> {
        let mut guard = self.sock.lock().unwrap_or_else(|p| p.into_inner());
        let Some(sock) = guard.as_ref() else {
            return Err(Error::Keeper {
                doing,
                source: io::Error::other("the keeper is gone"),
            });
        };
        match exchange(sock, req, fd) {
            Ok(fd) => Ok(fd),
            Err(Failure::Refused(source)) => Err(Error::Keeper { doing, source }),
            Err(Failure::Transport(source)) => {
                // No answer, or a late one the next request would read: the keeper is no
                // longer usable. Closing our end makes it exit.
                guard.take();
                tracing::error!(%source, "the workspace keeper stopped answering");
                Err(Error::Keeper { doing, source })
            }
        }
    }
}

/// Why a request to the keeper failed.
enum Failure {
    /// The keeper answered with the kernel's refusal.
    Refused(io::Error),
    /// The socket failed or the answer was malformed.
    Transport(io::Error),
}

fn exchange(
    sock: &OwnedFd,
    req: &[u8],
    fd: Option<RawFd>,
) -> std::result::Result<OwnedFd, Failure> {
    use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
    use std::io::{IoSlice, IoSliceMut};
    let transport = |e: nix::Error| Failure::Transport(e.into());
    let fds = fd.map(|f| [f]);
    let cmsg = fds.as_ref().map(|f| ControlMessage::ScmRights(f));
    let cmsgs: &[ControlMessage] = match &cmsg {
        Some(c) => std::slice::from_ref(c),
        None => &[],
    };
    let iov = [IoSlice::new(req)];
    sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)
        .map_err(transport)?;
    let mut answer = [0u8; 4];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(&mut answer)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(transport)?;
    let mut got = None;
    for c in msg.cmsgs().map_err(transport)? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for r in raw {
                // SAFETY: the kernel installed this descriptor for this message.
                let owned = unsafe { OwnedFd::from_raw_fd(r) };
                got.get_or_insert(owned);
            }
        }
    }
    if msg.bytes != 4 {
        return Err(Failure::Transport(io::Error::other("the keeper is gone")));
    }
    match (i32::from_le_bytes(answer), got) {
        (0, Some(fd)) => Ok(fd),
        (0, None) => Err(Failure::Transport(io::Error::other(
            "no descriptor in the keeper's answer",
        ))),
        (e, _) => Err(Failure::Refused(io::Error::from_raw_os_error(e))),
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        // Closing our end ends the keeper's loop; reap it so no zombie stays.
        drop(self.sock.get_mut().map(Option::take));
        if !*self.reaped.get_mut() {
            // SAFETY: waitpid on our own child, not reaped yet; no memory but a null status.
            unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), 0) };
        }
    }
}

// ---- the keeper process: async-signal-safe code only below ----

/// The keeper's socket, once moved out of the way of everything else.
const SOCK: RawFd = 3;

/// # Safety
/// Runs in a freshly forked child of a possibly threaded process: only raw system calls
/// on stack memory. Never returns.
unsafe fn child_main(sock: RawFd, owner: (u32, u32), rootless: bool) -> ! {
    // SAFETY: raw system calls with integer arguments or pointers to live stack buffers.
    unsafe {
        // Keep nothing of the supervisor: not its MCP transport, not its other sockets.
        if sock != SOCK {
            libc::dup2(sock, SOCK);
        }
        libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32);
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            libc::close(null);
        }
        let setup = setup_namespaces(owner, rootless);
        serve(setup);
        libc::_exit(0)
    }
}

/// Rootless: a user namespace mapping the owner's ids to themselves (so `uid=` names the
/// same ids inside and out) and a mount namespace it owns. As root: a mount namespace.
/// Returns 0 or the errno every request is then answered with.
unsafe fn setup_namespaces(owner: (u32, u32), rootless: bool) -> i32 {
    // SAFETY: see child_main.
    unsafe {
        let flags = if rootless {
            libc::CLONE_NEWUSER | libc::CLONE_NEWNS
        } else {
            libc::CLONE_NEWNS
        };
        if libc::unshare(flags) != 0 {
            return errno();
        }
        if rootless {
            let mut line = [0u8; 48];
            if write_file(c"/proc/self/setgroups", b"deny") != 0 {
                return errno();
            }
            let n = id_line(&mut line, owner.0);
            if write_file(c"/proc/self/uid_map", &line[..n]) != 0 {
                return errno();
            }
            let n = id_line(&mut line, owner.1);
            if write_file(c"/proc/self/gid_map", &line[..n]) != 0 {
                return errno();
            }
        }
        0
    }
}

unsafe fn serve(setup: i32) {
    loop {
        let mut req = [0u8; REQUEST_LEN];
        let mut passed: RawFd = -1;
        // SAFETY: see child_main.
        let n = unsafe { recv_request(&mut req, &mut passed) };
        if n <= 0 {
            // End of file (the supervisor is gone) or a broken socket: stop.
            return;
        }
        let (errno, fd) = if setup != 0 {
            (setup, -1)
        } else if n as usize != REQUEST_LEN {
            (libc::EINVAL, -1)
        } else {
            match req[0] {
                // SAFETY: raw system calls on stack buffers (see child_main).
                OP_CREATE => unsafe { create(&req) },
                // SAFETY: as above; `passed` is a descriptor the kernel gave us.
                OP_CLONE if passed >= 0 => unsafe { clone_tree(passed) },
                _ => (libc::EINVAL, -1),
            }
        };
        // SAFETY: see child_main.
        unsafe {
            if passed >= 0 {
                libc::close(passed);
            }
            send_answer(errno, fd);
            if fd >= 0 {
                libc::close(fd);
            }
        }
    }
}

unsafe fn create(req: &[u8; REQUEST_LEN]) -> (i32, RawFd) {
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&req[i..i + 8]);
        u64::from_le_bytes(b)
    };
    let u32_at = |i: usize| {
        let mut b = [0u8; 4];
        b.copy_from_slice(&req[i..i + 4]);
        u32::from_le_bytes(b) as u64
    };
    // SAFETY: see child_main.
    unsafe {
        let fs = libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), libc::FSOPEN_CLOEXEC) as i32;
        if fs < 0 {
            return (errno(), -1);
        }
        let mut bufs = [[0u8; 24]; 4];
        let values = [u64_at(1), u64_at(9), u32_at(17), u32_at(21)];
        let keys = [c"size", c"nr_inodes", c"uid", c"gid"];
        for i in 0..4 {
            decimal(&mut bufs[i], values[i]);
        }
        let mut failed = 0;
        for i in 0..4 {
            if set_string(fs, keys[i].as_ptr(), bufs[i].as_ptr().cast()) != 0 {
                failed = errno();
                break;
            }
        }
        if failed == 0 && set_string(fs, c"mode".as_ptr(), c"0700".as_ptr()) != 0 {
            failed = errno();
        }
        if failed == 0
            && libc::syscall(
                libc::SYS_fsconfig,
                fs,
                libc::FSCONFIG_CMD_CREATE,
                std::ptr::null::<libc::c_char>(),
                std::ptr::null::<libc::c_void>(),
                0,
            ) != 0
        {
            failed = errno();
        }
        let mnt = if failed == 0 {
            libc::syscall(
                libc::SYS_fsmount,
                fs,
                libc::FSMOUNT_CLOEXEC,
                libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_NOEXEC,
            ) as i32
        } else {
            -1
        };
        if failed == 0 && mnt < 0 {
            failed = errno();
        }
        libc::close(fs);
        (failed, mnt)
    }
}

unsafe fn clone_tree(mount: RawFd) -> (i32, RawFd) {
    // SAFETY: see child_main.
    unsafe {
        let fd = libc::syscall(
            libc::SYS_open_tree,
            mount,
            c"".as_ptr(),
            (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint
                | libc::AT_EMPTY_PATH as libc::c_uint,
        ) as i32;
        if fd < 0 {
            (errno(), -1)
        } else {
            (0, fd)
        }
    }
}

unsafe fn set_string(fs: RawFd, key: *const libc::c_char, value: *const libc::c_char) -> i64 {
    // SAFETY: key and value are NUL-terminated buffers that outlive the call.
    unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs,
            libc::FSCONFIG_SET_STRING,
            key,
            value,
            0,
        )
    }
}

/// Cmsg space for one descriptor, in u64 units so the buffer is aligned.
const CMSG_WORDS: usize = 4;

unsafe fn recv_request(req: &mut [u8; REQUEST_LEN], passed: &mut RawFd) -> isize {
    let mut control = [0u64; CMSG_WORDS];
    let mut iov = libc::iovec {
        iov_base: req.as_mut_ptr().cast(),
        iov_len: REQUEST_LEN,
    };
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    loop {
        // SAFETY: msg points at live stack buffers.
        let n = unsafe { libc::recvmsg(SOCK, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        if n >= 0 {
            // SAFETY: the CMSG macros walk the control buffer the kernel filled.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                if !c.is_null()
                    && (*c).cmsg_level == libc::SOL_SOCKET
                    && (*c).cmsg_type == libc::SCM_RIGHTS
                {
                    let fds = libc::CMSG_DATA(c) as *const RawFd;
                    let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                        / std::mem::size_of::<RawFd>();
                    for i in 0..count {
                        let fd = fds.add(i).read_unaligned();
                        if i == 0 {
                            *passed = fd;
                        } else {
                            libc::close(fd);
                        }
                    }
                }
            }
        }
        return n;
    }
}

unsafe fn send_answer(status: i32, fd: RawFd) {
    let mut answer = status.to_le_bytes();
    let mut iov = libc::iovec {
        iov_base: answer.as_mut_ptr().cast(),
        iov_len: answer.len(),
    };
    let mut control = [0u64; CMSG_WORDS];
    // SAFETY: see recv_request.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if fd >= 0 {
        msg.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE/CMSG_LEN are arithmetic; the header is written inside the
        // control buffer, which is large enough for one descriptor.
        unsafe {
            msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
            (libc::CMSG_DATA(c) as *mut RawFd).write_unaligned(fd);
        }
    }
    loop {
        // SAFETY: msg points at live stack buffers.
        let n = unsafe { libc::sendmsg(SOCK, &msg, libc::MSG_NOSIGNAL) };
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        return;
    }
}

unsafe fn write_file(path: &std::ffi::CStr, data: &[u8]) -> i32 {
    // SAFETY: path is NUL-terminated; data is a live slice.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return -1;
        }
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        let e = errno();
        libc::close(fd);
        if n != data.len() as isize {
            *libc::__errno_location() = if e == 0 { libc::EIO } else { e };
            return -1;
        }
        0
    }
}

fn errno() -> i32 {
    // SAFETY: reading this thread's errno.
    unsafe { *libc::__errno_location() }
}

/// Writes `v` in decimal, NUL-terminated, into `buf`; returns the digits' length.
fn decimal(buf: &mut [u8; 24], mut v: u64) -> usize {
    let mut digits = [0u8; 20];
    let mut n = 0;
    loop {
        digits[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for i in 0..n {
        buf[i] = digits[n - 1 - i];
    }
    buf[n] = 0;
    n
}

/// `"<id> <id> 1\n"` into `line`; returns its length.
fn id_line(line: &mut [u8; 48], id: u32) -> usize {
    let mut num = [0u8; 24];
    let d = decimal(&mut num, id as u64);
    let mut n = 0;
    for part in [&num[..d], b" ", &num[..d], b" 1\n"] {
        line[n..n + part.len()].copy_from_slice(part);
        n += part.len();
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_never_means_unlimited() {
        use std::os::fd::AsFd;
        let ids = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        let k = Keeper::start(ids).unwrap();
        let fs = k.create(0, 0).unwrap();
        let st = nix::sys::statvfs::fstatvfs(fs.as_fd()).unwrap();
        assert!(st.blocks() <= 1 && st.files() <= 1, "{st:?}");
        let copy = k.clone_mount(fs.as_fd()).unwrap();
        let st = nix::sys::statvfs::fstatvfs(copy.as_fd()).unwrap();
        assert!(st.blocks() <= 1, "a copy is the same filesystem");
    }

    #[test]
    fn numbers_are_written_without_allocation() {
        let mut b = [0u8; 24];
        assert_eq!(decimal(&mut b, 0), 1);
        assert_eq!(&b[..2], b"0\0");
        let n = decimal(&mut b, u64::MAX);
        assert_eq!(&b[..n], u64::MAX.to_string().as_bytes());
        let mut l = [0u8; 48];
        let n = id_line(&mut l, 1001);
        assert_eq!(&l[..n], b"1001 1001 1\n");
    }
}
