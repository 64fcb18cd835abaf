//! The keeper process: what runs in the child [`super::Keeper`] forks. It may be forked
//! from the threaded supervisor, so everything here is async-signal-safe: raw system
//! calls on stack buffers, no allocation, no lock.

use std::os::fd::RawFd;

use super::{OP_CLONE, OP_CREATE, REQUEST_LEN};

/// The keeper's socket, once moved out of the way of everything else.
const SOCK: RawFd = 3;
/// A replacement's namespaces to join, moved next to it (closed once joined).
const JOIN_USER: RawFd = 4;
const JOIN_MNT: RawFd = 5;

/// # Safety
/// Runs in a freshly forked child of a possibly threaded process: only raw system calls
/// on stack memory. Never returns.
pub(super) unsafe fn child_main(
    sock: RawFd,
    owner: (u32, u32),
    rootless: bool,
    join: Option<(RawFd, RawFd)>,
) -> ! {
    // SAFETY: raw system calls with integer arguments or pointers to live stack buffers.
    unsafe {
        // Keep nothing of the supervisor: not its MCP transport, not its other sockets.
        // First every descriptor we keep above the slots (F_DUPFD takes the lowest free
        // number ≥ 16, so no copy lands on another), then each into its slot.
        let high = |fd: RawFd| {
            if fd < 0 {
                -1
            } else {
                libc::fcntl(fd, libc::F_DUPFD, 16)
            }
        };
        let (sock_h, user_h, mnt_h) = match join {
            Some((user, mnt)) => (high(sock), high(user), high(mnt)),
            None => (high(sock), -1, -1),
        };
        libc::dup2(sock_h, SOCK);
        if user_h >= 0 {
            libc::dup2(user_h, JOIN_USER);
        }
        if mnt_h >= 0 {
            libc::dup2(mnt_h, JOIN_MNT);
        }
        let keep_up_to = if join.is_some() { JOIN_MNT } else { SOCK };
        libc::syscall(
            libc::SYS_close_range,
            (keep_up_to + 1) as u32,
            u32::MAX,
            0u32,
        );
        if join.is_some() && user_h < 0 {
            libc::close(JOIN_USER);
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            libc::close(null);
        }
        // A name an operator can tell apart in `ps` (it would carry the forking thread's,
        // such as `tokio-runtime-w`).
        libc::prctl(libc::PR_SET_NAME, c"codebox-keeper".as_ptr());
        let setup = match join {
            Some(_) => join_namespaces(rootless && user_h >= 0),
            None => setup_namespaces(owner, rootless),
        };
        send_hello(setup, rootless);
        if setup != 0 {
            libc::_exit(1)
        }
        serve();
        libc::_exit(0)
    }
}

/// Joins the namespaces at [`JOIN_USER`] (when `user`) and [`JOIN_MNT`], then closes
/// them. Returns 0 or the errno.
unsafe fn join_namespaces(user: bool) -> i32 {
    // SAFETY: see child_main.
    unsafe {
        if user && libc::setns(JOIN_USER, libc::CLONE_NEWUSER) != 0 {
            return errno();
        }
        if libc::setns(JOIN_MNT, libc::CLONE_NEWNS) != 0 {
            return errno();
        }
        libc::close(JOIN_USER);
        libc::close(JOIN_MNT);
        0
    }
}

/// The first message: the setup's errno (0: fine) and, when fine, descriptors of the
/// namespaces (rootless: user then mount; as root: mount). A namespace that cannot be
/// opened (no `/proc`) is left out, and the supervisor then keeps none.
unsafe fn send_hello(setup: i32, rootless: bool) {
    // SAFETY: see child_main.
    unsafe {
        let open =
            |path: &std::ffi::CStr| libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        let mut fds = [-1; 2];
        let mut n = 0;
        if setup == 0 {
            let wanted: &[&std::ffi::CStr] = if rootless {
                &[c"/proc/self/ns/user", c"/proc/self/ns/mnt"]
            } else {
                &[c"/proc/self/ns/mnt"]
            };
            for path in wanted {
                let fd = open(path);
                if fd < 0 {
                    n = 0;
                    break;
                }
                fds[n] = fd;
                n += 1;
            }
        }
        send_answer(setup, &fds[..n]);
        for fd in fds {
            if fd >= 0 {
                libc::close(fd);
            }
        }
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

unsafe fn serve() {
    loop {
        let mut req = [0u8; REQUEST_LEN];
        let mut passed: RawFd = -1;
        // SAFETY: see child_main.
        let n = unsafe { recv_request(&mut req, &mut passed) };
        if n <= 0 {
            // End of file (the supervisor is gone) or a broken socket: stop.
            return;
        }
        let (errno, fd) = if n as usize != REQUEST_LEN {
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
            let one = [fd];
            send_answer(errno, if fd >= 0 { &one } else { &[] });
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

unsafe fn send_answer(status: i32, fds: &[RawFd]) {
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
    // At most two descriptors (the hello's namespaces): the control buffer holds them.
    let fds = &fds[..fds.len().min(2)];
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        let bytes = std::mem::size_of_val(fds) as u32;
        // SAFETY: CMSG_SPACE/CMSG_LEN are arithmetic; the header is written inside the
        // control buffer, which is large enough for two descriptors.
        unsafe {
            msg.msg_controllen = libc::CMSG_SPACE(bytes) as usize;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes) as usize;
            let data = libc::CMSG_DATA(c) as *mut RawFd;
            for (i, fd) in fds.iter().enumerate() {
                data.add(i).write_unaligned(*fd);
            }
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
