//! The sandbox's network namespace in proxy mode: the init brings `lo` up, binds the
//! egress listener on `127.0.0.1:<port>` and hands it to the spawning process.
//!
//! Why the init and not the supervisor: a socket belongs to the network namespace it was
//! created in, so the listener must be made inside the sandbox's. The supervisor could
//! `setns` into it only with `CAP_SYS_ADMIN` in its own user namespace, which a rootless
//! supervisor does not have; the init holds every capability in the sandbox's user
//! namespace (which owns the network namespace) until the program's fork. So the init
//! makes the socket, passes it over a unix socketpair (`SCM_RIGHTS`) and closes its own
//! copy before the program exists: the program can connect to the port (landlock allows
//! exactly that port), never accept on it, and finds nothing else to reach — the
//! namespace has no interface but `lo` and no route.
//!
//! Every function here is a few raw system calls on stack memory, called by the init (a
//! single-threaded clone) between clone and exec, and by the parent after the exec.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The loopback interface's name.
const LOOPBACK: &[u8] = b"lo";

/// Sets `IFF_UP` on `lo` (the kernel then gives it 127.0.0.1/8 and ::1). Needs
/// `CAP_NET_ADMIN` over the namespace: the init has it in the sandbox's user namespace.
pub fn loopback_up() -> io::Result<()> {
    let sock = socket(libc::AF_INET, libc::SOCK_DGRAM)?;
    // SAFETY: ifreq is a plain C struct (name array + union of integers and structs), for
    // which all-zero bytes are a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(LOOPBACK) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the interface named in `req` and writes its flags into
    // `req`, which lives on this stack frame for the whole call.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: after SIOCGIFFLAGS the union holds the flags (a short).
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads `req` (name and flags) from this stack frame.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A TCP socket bound to `127.0.0.1:port` and listening, close-on-exec.
pub fn listen_on_loopback(port: u16) -> io::Result<OwnedFd> {
    let sock = socket(libc::AF_INET, libc::SOCK_STREAM)?;
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `addr` is a valid sockaddr_in on this stack frame and the length passed is
    // its size.
    let r = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: listen(2) on a descriptor this function owns; integers only.
    if unsafe { libc::listen(sock.as_raw_fd(), 128) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock)
}

/// Sends `fd` over the unix socket `over` as one byte with `SCM_RIGHTS`.
pub fn send_fd(over: RawFd, fd: RawFd) -> io::Result<()> {
    // Control buffer for one descriptor, aligned for cmsghdr.
    #[repr(C)]
    union Control {
        header: libc::cmsghdr,
        bytes: [u8; 64],
    }
    let mut control = Control { bytes: [0; 64] };
    let mut byte = [b'L'];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    debug_assert!(space <= 64);
    // SAFETY: msghdr is a plain C struct; all-zero is valid (no name, no flags).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    // SAFETY: taking the address of a union field does not read it.
    msg.msg_control = unsafe { control.bytes.as_mut_ptr() }.cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points at `space` bytes of `control`, aligned for cmsghdr, so
    // CMSG_FIRSTHDR returns a pointer into it (not null: the buffer holds one header), and
    // CMSG_DATA a pointer past that header with room for one descriptor.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
    }
    loop {
        // SAFETY: `msg` and everything it points at live on this stack frame.
        let r = unsafe { libc::sendmsg(over, &msg, libc::MSG_NOSIGNAL) };
        if r == 1 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if r == -1 && e.kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return Err(if r == -1 {
            e
        } else {
            io::Error::new(
                io::ErrorKind::WriteZero,
                "short send of the egress listener",
            )
        });
    }
}

/// Takes the descriptor [`send_fd`] sent, without waiting: the init sends it before it
/// forks the program, so it is there once the program has exec'd.
pub fn receive_fd(from: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut byte = [0u8; 1];
    let mut cmsg = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [io::IoSliceMut::new(&mut byte)];
    let msg = recvmsg::<()>(
        from.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut received = None;
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for fd in fds {
                // SAFETY: the kernel installed this descriptor in this process for this
                // message; nothing else owns it.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                if received.is_none() {
                    received = Some(owned);
                }
            }
        }
    }
    received.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "the sandbox init sent no egress listener",
        )
    })
}

fn socket(domain: libc::c_int, ty: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes integers; a non-negative result is a new descriptor we own.
    let fd = unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, 0) };
    if fd == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_listener_travels_and_keeps_listening() {
        let (a, b) = crate::sandbox::child::fds::socketpair().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        send_fd(a.as_raw_fd(), listener.as_raw_fd()).unwrap();
        drop(listener);
        let got = receive_fd(b.as_fd()).unwrap();
        let got = std::net::TcpListener::from(got);
        let _client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        got.accept().unwrap();
        // Nothing more was sent: no waiting, an error.
        assert_eq!(
            receive_fd(b.as_fd()).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
    }

    #[test]
    fn a_message_without_a_descriptor_is_an_error() {
        let (a, b) = crate::sandbox::child::fds::socketpair().unwrap();
        nix::unistd::write(&a, b"L").unwrap();
        let err = receive_fd(b.as_fd()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
