//! The seccomp layer against the real kernel.
//!
//! Each probe forks a child that sets `no_new_privs`, installs a filter compiled in the
//! parent *before* the fork, makes raw syscalls and reports the result over a pipe (or dies
//! of the signal the filter sends). Probes use argument values for which the unfiltered
//! kernel answers something else (EBADF, EFAULT, success ...), so the expected errno can
//! only come from the filter. This binary has its own harness (libtest-mimic) pinned to one
//! thread, so forking is safe; the children still keep to async-signal-safe calls, and a
//! child that panics exits 101.
//!
//! The runtime tests run the rootfs's CPython and Deno on the host under the filter.
//! Without the rootfs they print why and pass, unless `CODEBOX_TEST_STRICT=1`.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use codebox::sandbox::seccomp::{CompiledFilter, SeccompProfile, SECCOMP_KILL_SIGNAL};
use libtest_mimic::{Arguments, Completion, Failed, Trial};

// ---------------------------------------------------------------------------------------
// Counting allocator: proves `install` does not allocate.

struct CountingAllocator;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call unchanged to the system allocator, which upholds the
// GlobalAlloc contract; the counter is an atomic.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from System.alloc/realloc with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `ptr` came from System with `layout`; new_size is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

// ---------------------------------------------------------------------------------------
// Forked probes.

/// How a probe child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// The probe returned: the syscall's result, or `-errno`.
    Returned(i64),
    /// The child died of this signal.
    Signaled(i32),
    /// The child exited early with this code (setup failure; 101 = panic).
    Exited(i32),
}

const EXIT_NO_NEW_PRIVS: i32 = 2;
const EXIT_INSTALL: i32 = 3;
const EXIT_ALLOCATED: i32 = 4;

/// `-errno` of the last failed call.
fn neg_errno() -> i64 {
    -(std::io::Error::last_os_error().raw_os_error().unwrap_or(0) as i64)
}

/// A raw syscall's return value, or `-errno`.
fn ret(r: libc::c_long) -> i64 {
    if r == -1 {
        neg_errno()
    } else {
        r
    }
}

fn write_all(fd: libc::c_int, bytes: &[u8]) {
    // SAFETY: write(2) from a live slice; a short write of 8 bytes to a pipe does not
    // happen (PIPE_BUF), and the parent treats a missing report as a failure anyway.
    unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
}

/// The child's side: no_new_privs, install (checking it allocates nothing), probe, report.
fn child(filter: Option<&CompiledFilter>, probe: fn() -> i64, report: libc::c_int) -> i32 {
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes integers only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return EXIT_NO_NEW_PRIVS;
    }
    if let Some(filter) = filter {
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        let installed = filter.install();
        if ALLOCATIONS.load(Ordering::Relaxed) != before {
            return EXIT_ALLOCATED;
        }
        if let Err(e) = installed {
            write_all(
                report,
                &(-(e.raw_os_error().unwrap_or(0) as i64)).to_ne_bytes(),
            );
            return EXIT_INSTALL;
        }
    }
    write_all(report, &probe().to_ne_bytes());
    0
}

/// Forks, runs `probe` under `filter` in the child, and says how it went.
fn in_child(filter: Option<&CompiledFilter>, probe: fn() -> i64) -> Outcome {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two fds into the array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let [read_end, write_end] = fds;
    // SAFETY: this harness runs tests on its one thread, and the child only makes raw
    // syscalls and atomic loads before _exit (a panic would allocate, but with no other
    // thread no lock can be held).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = std::panic::catch_unwind(|| child(filter, probe, write_end)).unwrap_or(101);
        // SAFETY: _exit ends the child without running the parent's atexit handlers.
        unsafe { libc::_exit(code) };
    }
    // SAFETY: our own write end, not used again.
    unsafe { libc::close(write_end) };
    let mut buf = [0u8; 8];
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: read(2) into the unfilled tail of a live buffer.
        let n = unsafe { libc::read(read_end, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        if n <= 0 {
            break;
        }
        got += n as usize;
    }
    // SAFETY: our own read end, not used again.
    unsafe { libc::close(read_end) };
    let mut status = 0;
    // SAFETY: waits for our own child; status is a valid out-pointer.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    if libc::WIFSIGNALED(status) {
        Outcome::Signaled(libc::WTERMSIG(status))
    } else if libc::WEXITSTATUS(status) != 0 {
        let code = libc::WEXITSTATUS(status);
        let detail = (got == 8).then(|| i64::from_ne_bytes(buf));
        if code == EXIT_INSTALL || code == EXIT_NO_NEW_PRIVS || code == EXIT_ALLOCATED {
            panic!("probe child setup failed: exit {code}, detail {detail:?}");
        }
        Outcome::Exited(code)
    } else if got == 8 {
        Outcome::Returned(i64::from_ne_bytes(buf))
    } else {
        panic!("probe child exited 0 without a report");
    }
}

#[derive(Debug, Clone, Copy)]
enum Expect {
    /// The call goes through (returns >= 0).
    Ok,
    /// The call fails with this errno.
    Errno(i32),
    /// The process dies with SIGSYS.
    Killed,
}

struct Probe {
    name: &'static str,
    profile: SeccompProfile,
    call: fn() -> i64,
    expect: Expect,
    /// What the kernel answers without the filter (checked too, so the probe really
    /// discriminates); `None` where that depends on the host.
    unfiltered: Option<Expect>,
}

fn matches(outcome: Outcome, expect: Expect) -> bool {
    match (outcome, expect) {
        (Outcome::Returned(r), Expect::Ok) => r >= 0,
        (Outcome::Returned(r), Expect::Errno(e)) => r == -(e as i64),
        (Outcome::Signaled(s), Expect::Killed) => s == SECCOMP_KILL_SIGNAL,
        _ => false,
    }
}

fn run_probe(p: &Probe) -> Result<(), Failed> {
    let filter = CompiledFilter::for_profile(p.profile).map_err(|e| format!("{e:#}"))?;
    let got = in_child(Some(&filter), p.call);
    if !matches(got, p.expect) {
        return Err(format!("{}: expected {:?}, got {got:?}", p.name, p.expect).into());
    }
    if let Some(unfiltered) = p.unfiltered {
        let got = in_child(None, p.call);
        if !matches(got, unfiltered) {
            return Err(format!(
                "{}: without the filter expected {unfiltered:?}, got {got:?}: the probe does \
                 not tell the filter's answer from the kernel's",
                p.name
            )
            .into());
        }
    }
    Ok(())
}

// The probes. Each is one or two raw syscalls.

fn getpid() -> i64 {
    // SAFETY: getpid takes no arguments.
    ret(unsafe { libc::syscall(libc::SYS_getpid) })
}

fn keyctl() -> i64 {
    // SAFETY: keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, create=1): integers.
    ret(unsafe { libc::syscall(libc::SYS_keyctl, 0, -3, 1) })
}

fn add_key() -> i64 {
    // SAFETY: add_key with NULL type/description: the kernel faults on them (EFAULT) or the
    // filter refuses first; no memory of ours is touched.
    ret(unsafe { libc::syscall(libc::SYS_add_key, 0, 0, 0, 0, -2) })
}

fn unshare_user() -> i64 {
    // SAFETY: unshare takes flags only.
    ret(unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER) })
}

/// Raw clone with `flags` and no new stack (fork-like); a child that appears exits at once.
fn raw_clone(flags: u64) -> i64 {
    // SAFETY: clone without CLONE_VM and without a stack gives the child a copy-on-write
    // copy of this process, like fork; the child only calls _exit.
    let r = unsafe { libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0) };
    reap_clone(r)
}

fn reap_clone(r: libc::c_long) -> i64 {
    if r == 0 {
        // SAFETY: in the clone child: leave at once.
        unsafe { libc::_exit(0) };
    }
    if r > 0 {
        // SAFETY: reaps our own child; a null status pointer is allowed.
        unsafe { libc::waitpid(r as libc::pid_t, std::ptr::null_mut(), 0) };
    }
    ret(r)
}

fn clone_newuser() -> i64 {
    raw_clone((libc::CLONE_NEWUSER | libc::SIGCHLD) as u64)
}

fn clone_newnet_high_bits() -> i64 {
    raw_clone(0xdead_0000_0000_0000 | (libc::CLONE_NEWNET | libc::SIGCHLD) as u64)
}

fn clone_plain() -> i64 {
    raw_clone(libc::SIGCHLD as u64)
}

fn clone3_plain() -> i64 {
    // clone_args is 64 bytes in its first version (CLONE_ARGS_SIZE_VER0).
    let mut args = [0u64; 8];
    args[4] = libc::SIGCHLD as u64; // exit_signal
                                    // SAFETY: clone3 reads `args` (live for the call); without CLONE_VM the child is a
                                    // copy-on-write copy that only calls _exit.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            args.as_mut_ptr(),
            std::mem::size_of_val(&args),
        )
    };
    reap_clone(r)
}

fn socket(domain: libc::c_int, protocol: libc::c_int) -> i64 {
    // SAFETY: socket takes integers only.
    let r = unsafe { libc::syscall(libc::SYS_socket, domain, libc::SOCK_STREAM, protocol) };
    if r >= 0 {
        // SAFETY: the socket we just created.
        unsafe { libc::close(r as libc::c_int) };
    }
    ret(r)
}

fn socket_inet() -> i64 {
    socket(libc::AF_INET, 0)
}
fn socket_inet6() -> i64 {
    socket(libc::AF_INET6, 0)
}
fn socket_unix() -> i64 {
    socket(libc::AF_UNIX, 0)
}
fn socket_netlink() -> i64 {
    // SAFETY: socket takes integers only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_socket,
            libc::AF_NETLINK,
            libc::SOCK_RAW,
            libc::NETLINK_ROUTE,
        )
    };
    if r >= 0 {
        // SAFETY: the socket we just created.
        unsafe { libc::close(r as libc::c_int) };
    }
    ret(r)
}
fn socket_vsock() -> i64 {
    socket(libc::AF_VSOCK, 0)
}
fn socket_mptcp() -> i64 {
    socket(libc::AF_INET, libc::IPPROTO_MPTCP)
}

fn socket_typed(domain: libc::c_int, ty: libc::c_int, protocol: libc::c_int) -> i64 {
    // SAFETY: socket takes integers only.
    let r = unsafe { libc::syscall(libc::SYS_socket, domain, ty, protocol) };
    if r >= 0 {
        // SAFETY: the socket we just created.
        unsafe { libc::close(r as libc::c_int) };
    }
    ret(r)
}
fn socket_udp() -> i64 {
    socket_typed(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0)
}
fn socket_udp6() -> i64 {
    socket_typed(libc::AF_INET6, libc::SOCK_DGRAM, 0)
}
fn socket_ping() -> i64 {
    socket_typed(libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_ICMP)
}
fn socket_raw() -> i64 {
    socket_typed(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_TCP)
}
fn socket_sctp_stream() -> i64 {
    socket_typed(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_SCTP)
}
fn socket_tcp_nonblock_cloexec() -> i64 {
    socket_typed(
        libc::AF_INET6,
        libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        libc::IPPROTO_TCP,
    )
}
/// A TCP Fast Open send: connect and send in one call, outside connect(2). To the host's
/// discard port on loopback; whatever the kernel answers unfiltered, the filter's EPERM
/// comes before it.
fn sendto_fastopen() -> i64 {
    // SAFETY: socket takes integers only.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    if fd < 0 {
        return ret(fd as i64);
    }
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 9u16.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: a one-byte buffer and a sockaddr_in on this stack frame, with their sizes.
    let r = unsafe {
        libc::sendto(
            fd,
            b"x".as_ptr().cast(),
            1,
            libc::MSG_FASTOPEN | libc::MSG_DONTWAIT,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    let r = ret(r as i64);
    // SAFETY: the socket we created above.
    unsafe { libc::close(fd) };
    r
}

/// An ioctl request as the 64-bit register value (`Ioctl` is `c_ulong` on glibc and
/// `c_int` on musl).
#[allow(clippy::unnecessary_cast)]
fn ioctl_cmd(cmd: libc::Ioctl) -> u64 {
    cmd as u64
}

/// ioctl on fd -1: the kernel answers EBADF to anything the filter lets through.
fn ioctl_bad_fd(cmd: u64) -> i64 {
    let mut c = 0u8;
    // SAFETY: ioctl on an invalid fd; the argument points at a live byte.
    ret(unsafe { libc::syscall(libc::SYS_ioctl, -1, cmd, &mut c as *mut u8) })
}
fn ioctl_tiocsti() -> i64 {
    ioctl_bad_fd(ioctl_cmd(libc::TIOCSTI))
}
fn ioctl_tiocsti_high_bits() -> i64 {
    ioctl_bad_fd(ioctl_cmd(libc::TIOCSTI) | 1 << 32)
}
fn ioctl_tioclinux() -> i64 {
    ioctl_bad_fd(ioctl_cmd(libc::TIOCLINUX))
}
fn ioctl_fionread() -> i64 {
    ioctl_bad_fd(ioctl_cmd(libc::FIONREAD))
}

fn personality_query() -> i64 {
    // SAFETY: personality takes an integer.
    ret(unsafe { libc::syscall(libc::SYS_personality, 0xffff_ffffu64) })
}
fn personality_no_aslr() -> i64 {
    // SAFETY: personality takes an integer.
    ret(unsafe { libc::syscall(libc::SYS_personality, libc::ADDR_NO_RANDOMIZE) })
}

fn mount_tmpfs() -> i64 {
    // SAFETY: mount with valid C strings onto a path that does not exist (ENOENT if the
    // filter let it through).
    ret(unsafe {
        libc::syscall(
            libc::SYS_mount,
            c"none".as_ptr(),
            c"/nonexistent-codebox-seccomp-probe".as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            0,
        )
    })
}

fn io_uring_setup() -> i64 {
    // SAFETY: NULL params: EFAULT from the kernel if the filter let it through.
    ret(unsafe { libc::syscall(libc::SYS_io_uring_setup, 1, 0) })
}

fn bpf() -> i64 {
    // SAFETY: an invalid command with no attribute memory.
    ret(unsafe { libc::syscall(libc::SYS_bpf, -1, 0, 0) })
}

fn ptrace_peek() -> i64 {
    // SAFETY: PTRACE_PEEKUSER on a pid that does not exist (ESRCH if let through).
    ret(unsafe { libc::syscall(libc::SYS_ptrace, libc::PTRACE_PEEKUSER, 0x3fff_fff0, 0, 0) })
}

fn open_by_handle_at() -> i64 {
    // SAFETY: bad fd and NULL handle: EBADF if let through.
    ret(unsafe { libc::syscall(libc::SYS_open_by_handle_at, -1, 0, 0) })
}

fn setns() -> i64 {
    // SAFETY: setns on fd -1: EBADF if let through.
    ret(unsafe { libc::syscall(libc::SYS_setns, -1, 0) })
}

fn clock_settime() -> i64 {
    // SAFETY: NULL timespec: EFAULT if let through.
    ret(unsafe { libc::syscall(libc::SYS_clock_settime, libc::CLOCK_REALTIME, 0) })
}

/// The first syscall number after the reviewed range (setxattrat, Linux 6.13).
fn after_reviewed_range() -> i64 {
    let nr = codebox::sandbox::seccomp::LAST_REVIEWED_SYSCALL as libc::c_long + 1;
    // SAFETY: setxattrat with a bad fd and NULL pointers: EBADF/EFAULT, or ENOSYS on
    // kernels before 6.13.
    ret(unsafe { libc::syscall(nr, -1, 0, 0, 0, 0, 0) })
}

#[cfg(target_arch = "x86_64")]
fn x32_getpid() -> i64 {
    // SAFETY: getpid through the x32 ABI: no arguments.
    ret(unsafe { libc::syscall(0x4000_0000 | libc::SYS_getpid) })
}

/// i386 getpid (20) through `int 0x80`.
#[cfg(target_arch = "x86_64")]
fn int80_getpid() -> i64 {
    let r: i64;
    // SAFETY: int 0x80 with eax = 20 (i386 getpid): no arguments, no memory; the compat
    // entry returns in eax and may clobber r8-r11.
    unsafe {
        std::arch::asm!(
            "int 0x80",
            inlateout("rax") 20i64 => r,
            out("r8") _, out("r9") _, out("r10") _, out("r11") _,
            options(nostack),
        )
    };
    r
}

/// The probe table: name, profile, call, expected under the filter, expected without it
/// (`-` where the host decides, e.g. root may create user namespaces, others may not).
#[rustfmt::skip]
fn probes() -> Vec<Probe> {
    use Expect::*;
    use SeccompProfile::{Default as D, Egress as E, Network as N};
    const EPERM: Expect = Errno(libc::EPERM);
    const ENOSYS: Expect = Errno(libc::ENOSYS);
    const EBADF: Expect = Errno(libc::EBADF);
    let p = |name, profile, call, expect, unfiltered| Probe { name, profile, call, expect, unfiltered };
    let mut v = vec![
        p("getpid_still_works",                  D, getpid as fn() -> i64,    Ok,     Some(Ok)),
        p("keyctl_refused",                      D, keyctl,                   EPERM,  None),
        p("add_key_refused",                     D, add_key,                  EPERM,  Some(Errno(libc::EFAULT))),
        p("unshare_newuser_refused",             D, unshare_user,             EPERM,  None),
        p("clone_newuser_refused",               D, clone_newuser,            EPERM,  None),
        p("clone_newnet_with_high_bits_refused", N, clone_newnet_high_bits,   EPERM,  None),
        p("clone_without_namespaces_allowed",    D, clone_plain,              Ok,     Some(Ok)),
        p("clone3_enosys",                       D, clone3_plain,             ENOSYS, Some(Ok)),
        p("socket_inet_refused_by_default",      D, socket_inet,              EPERM,  None),
        p("socket_inet6_refused_by_default",     D, socket_inet6,             EPERM,  None),
        p("socket_inet_allowed_by_network",      N, socket_inet,              Ok,     None),
        p("socket_inet6_allowed_by_network",     N, socket_inet6,             Ok,     None),
        p("socket_unix_allowed",                 D, socket_unix,              Ok,     Some(Ok)),
        p("socket_unix_allowed_by_network",      N, socket_unix,              Ok,     Some(Ok)),
        p("socket_netlink_refused",              N, socket_netlink,           EPERM,  Some(Ok)),
        p("socket_vsock_refused",                N, socket_vsock,             EPERM,  None),
        p("socket_mptcp_refused",                N, socket_mptcp,             EPERM,  None),
        p("socket_tcp_allowed_by_egress",        E, socket_inet,              Ok,     None),
        p("socket_tcp6_flags_allowed_by_egress", E, socket_tcp_nonblock_cloexec, Ok,  None),
        p("socket_udp_refused_by_egress",        E, socket_udp,               EPERM,  None),
        p("socket_udp6_refused_by_egress",       E, socket_udp6,              EPERM,  None),
        p("socket_ping_refused_by_egress",       E, socket_ping,              EPERM,  None),
        p("socket_raw_refused_by_egress",        E, socket_raw,               EPERM,  None),
        p("socket_sctp_refused_by_egress",       E, socket_sctp_stream,       EPERM,  None),
        p("socket_netlink_refused_by_egress",    E, socket_netlink,           EPERM,  Some(Ok)),
        p("socket_udp_allowed_by_network",       N, socket_udp,               Ok,     None),
        p("sendto_fastopen_refused_by_egress",   E, sendto_fastopen,          EPERM,  None),
        p("ioctl_tiocsti_refused",               D, ioctl_tiocsti,            EPERM,  Some(EBADF)),
        p("ioctl_tiocsti_high_bits_refused",     D, ioctl_tiocsti_high_bits,  EPERM,  Some(EBADF)),
        p("ioctl_tioclinux_refused",             N, ioctl_tioclinux,          EPERM,  Some(EBADF)),
        p("ioctl_fionread_allowed",              D, ioctl_fionread,           EBADF,  Some(EBADF)),
        p("personality_query_allowed",           D, personality_query,        Ok,     Some(Ok)),
        p("personality_change_refused",          D, personality_no_aslr,      EPERM,  Some(Ok)),
        p("mount_refused",                       D, mount_tmpfs,              EPERM,  None),
        p("io_uring_setup_enosys",               D, io_uring_setup,           ENOSYS, None),
        p("bpf_refused",                         D, bpf,                      EPERM,  None),
        p("ptrace_refused",                      D, ptrace_peek,              EPERM,  Some(Errno(libc::ESRCH))),
        p("open_by_handle_at_refused",           D, open_by_handle_at,        EPERM,  None),
        p("setns_refused",                       D, setns,                    EPERM,  Some(EBADF)),
        p("clock_settime_refused",               D, clock_settime,            EPERM,  None),
        p("syscall_after_reviewed_range_enosys", D, after_reviewed_range,     ENOSYS, None),
    ];
    #[cfg(target_arch = "x86_64")]
    v.push(p("x32_getpid_killed",                D, x32_getpid,               Killed, None));
    v
}

// ---------------------------------------------------------------------------------------
// int 0x80: needs the host's IA32 emulation.

#[cfg(target_arch = "x86_64")]
fn int80_killed() -> Result<Completion, Failed> {
    // Without IA32 emulation `int 0x80` faults (SIGSEGV) before seccomp ever sees it: the
    // path this test guards does not exist, so this skip is not a failure even in strict
    // mode.
    match in_child(None, int80_getpid) {
        Outcome::Returned(r) if r > 0 => {}
        other => {
            let reason =
                format!("int 0x80 does not work on this host ({other:?}): no IA32 emulation");
            eprintln!("SKIP: {reason}");
            return Ok(Completion::ignored_with(reason));
        }
    }
    for profile in SeccompProfile::ALL {
        let filter = CompiledFilter::for_profile(profile).map_err(|e| format!("{e:#}"))?;
        let got = in_child(Some(&filter), int80_getpid);
        if got != Outcome::Signaled(SECCOMP_KILL_SIGNAL) {
            return Err(format!("{profile}: int 0x80 getpid: expected SIGSYS, got {got:?}").into());
        }
    }
    Ok(Completion::Completed)
}

fn skip(reason: &str) -> Result<Completion, Failed> {
    if common::strict() {
        return Err(format!("required feature missing: {reason}").into());
    }
    eprintln!("SKIP: {reason}");
    Ok(Completion::ignored_with(reason))
}

// ---------------------------------------------------------------------------------------
// CPython and Deno from the rootfs, on the host, under the filter.

fn rootfs_bin(name: &str) -> Option<PathBuf> {
    let p = common::rootfs_dir().join("usr/bin").join(name);
    p.exists().then_some(p)
}

/// Runs `cmd` with the profile's filter installed between fork and exec.
fn run_filtered(mut cmd: Command, profile: SeccompProfile) -> Result<String, Failed> {
    let filter = CompiledFilter::for_profile(profile).map_err(|e| format!("{e:#}"))?;
    // SAFETY: the closure runs in the forked child before exec and only makes two raw
    // syscalls (prctl, seccomp); neither allocates nor takes a lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            filter.install()
        })
    };
    let out = cmd.output().map_err(|e| format!("spawn: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("  [{profile}] {}", stdout.trim().replace('\n', " | "));
    if !out.status.success() {
        return Err(format!(
            "{profile}: exit {:?} signal {:?}\nstdout:\n{stdout}\nstderr:\n{}",
            out.status.code(),
            out.status.signal(),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(stdout)
}

const PYTHON_SCRIPT: &str = r#"
import ssl, sqlite3, asyncio, subprocess, multiprocessing, threading, socket, sys

t = threading.Thread(target=print, args=("thread ok",)); t.start(); t.join()
child = subprocess.run([sys.executable, "-c", """
import socket
try:
    socket.socket(); print('child inet allowed')
except PermissionError:
    print('child inet refused')
"""], capture_output=True, text=True, check=True)
print(child.stdout.strip())
with multiprocessing.Pool(2) as pool:
    print("pool", pool.map(abs, [-1, -2]))
async def main():
    r, w = await asyncio.open_connection(sock=socket.socketpair()[0]), None
    await asyncio.sleep(0)
    return "asyncio ok"
print(asyncio.run(main()))
print("sqlite", sqlite3.connect(":memory:").execute("select 41 + 1").fetchone()[0])
ssl.create_default_context(); print("ssl ok")
socket.socket(socket.AF_UNIX).close(); print("unix ok")
try:
    socket.socket().close(); print("inet allowed")
except PermissionError as e:
    print("inet refused", e.errno)
"#;

fn python_under(profile: SeccompProfile) -> Result<Completion, Failed> {
    let Some(python) = rootfs_bin("python3") else {
        return skip("no python3 in the rootfs (run `cargo xtask rootfs`)");
    };
    let mut cmd = Command::new(python);
    cmd.args(["-I", "-S", "-B", "-c", PYTHON_SCRIPT]);
    let out = run_filtered(cmd, profile)?;
    let inet = match profile {
        SeccompProfile::Default => "inet refused 1",
        SeccompProfile::Network | SeccompProfile::Egress => "inet allowed",
    };
    let child_inet = match profile {
        SeccompProfile::Default => "child inet refused",
        SeccompProfile::Network | SeccompProfile::Egress => "child inet allowed",
    };
    for want in [
        "thread ok",
        child_inet,
        "pool [1, 2]",
        "asyncio ok",
        "sqlite 42",
        "ssl ok",
        "unix ok",
        inet,
    ] {
        if !out.lines().any(|l| l == want) {
            return Err(format!("{profile}: python printed no {want:?}:\n{out}").into());
        }
    }
    Ok(Completion::Completed)
}

const DENO_SCRIPT: &str = r#"
const dir = Deno.args[0];
await Deno.writeTextFile(`${dir}/x`, "1");
console.log("write", await Deno.readTextFile(`${dir}/x`));
const w = new Worker("data:text/javascript,postMessage(42)", { type: "module" });
console.log("worker", await new Promise((r) => { w.onmessage = (e) => { w.terminate(); r(e.data); }; }));
const out = await new Deno.Command(Deno.execPath(), { args: ["eval", "console.log(7)"] }).output();
console.log("child", new TextDecoder().decode(out.stdout).trim());
try {
  Deno.listen({ hostname: "127.0.0.1", port: 0 }).close();
  console.log("inet allowed");
} catch (e) {
  console.log("inet refused", e.name);
}
"#;

fn deno_under(profile: SeccompProfile) -> Result<Completion, Failed> {
    let Some(deno) = rootfs_bin("deno") else {
        return skip("no deno in the rootfs (run `cargo xtask rootfs`)");
    };
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let script = dir.path().join("probe.ts");
    std::fs::write(&script, DENO_SCRIPT).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(deno);
    cmd.args([
        "run",
        "--allow-all",
        "--no-prompt",
        "--no-config",
        "--no-lock",
    ])
    .arg(&script)
    .arg(dir.path())
    .env("DENO_DIR", dir.path().join("deno-dir"))
    .env("DENO_NO_UPDATE_CHECK", "1")
    .env("NO_COLOR", "1");
    let out = run_filtered(cmd, profile)?;
    let inet = match profile {
        SeccompProfile::Default => "inet refused PermissionDenied",
        SeccompProfile::Network | SeccompProfile::Egress => "inet allowed",
    };
    for want in ["write 1", "worker 42", "child 7", inet] {
        if !out.lines().any(|l| l == want) {
            return Err(format!("{profile}: deno printed no {want:?}:\n{out}").into());
        }
    }
    Ok(Completion::Completed)
}

// ---------------------------------------------------------------------------------------

fn main() {
    let mut args = Arguments::from_args();
    // Forking tests need a single-threaded process: run everything on the main thread.
    args.test_threads = Some(1);

    // Compile once up front (as the supervisor would), and say what it costs.
    for profile in SeccompProfile::ALL {
        let start = Instant::now();
        let f = CompiledFilter::for_profile(profile).expect("built-in policies compile");
        eprintln!(
            "seccomp profile {profile}: {} BPF instructions, compiled in {:?}",
            f.instructions(),
            start.elapsed()
        );
    }

    let mut trials: Vec<Trial> = probes()
        .into_iter()
        .map(|p| Trial::test(p.name, move || run_probe(&p)))
        .collect();
    #[cfg(target_arch = "x86_64")]
    trials.push(Trial::ignorable_test(
        "int80_i386_getpid_killed",
        int80_killed,
    ));
    for profile in SeccompProfile::ALL {
        trials.push(Trial::ignorable_test(
            format!("python_runs_under_{profile}"),
            move || python_under(profile),
        ));
        trials.push(Trial::ignorable_test(
            format!("deno_runs_under_{profile}"),
            move || deno_under(profile),
        ));
    }
    libtest_mimic::run(&args, trials).exit();
}
