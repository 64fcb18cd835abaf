//! The escape and limits suite: each case is a real attempt from inside the sandbox that
//! must fail in the expected way, and the supervisor must stay healthy afterwards.
//!
//! System calls are made raw through ctypes (Python) so the policy, not a library
//! wrapper, is what answers. The expected answers follow policies/seccomp/*.json:
//! EPERM for refused calls, ENOSYS for clone3/io_uring, SIGSYS (kill) for foreign ABIs.

mod common;

use common::*;
use serde_json::Value;

/// Python prelude: `probe(nr, *args)` prints `RESULT <ret> <errno name>`.
const PRELUDE: &str = r#"
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def probe(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    e = ctypes.get_errno()
    print("RESULT", r, errno.errorcode.get(e, e) if r == -1 else "OK", flush=True)
"#;

fn python(code: &str, extra: &[&str]) -> Value {
    run_json("python", &format!("{PRELUDE}\n{code}"), extra)
}

/// Asserts the probe got exactly `-1` and `errno`.
fn refused_with(case: &str, code: &str, errno: &str) {
    let v = python(code, &[]);
    let out = v["stdout"].as_str().unwrap_or("");
    assert!(
        out.contains(&format!("RESULT -1 {errno}")),
        "{case}: expected {errno}, got {v:#}"
    );
    supervisor_still_healthy(case);
}

/// After every attempt: a new sandbox still runs normally.
fn supervisor_still_healthy(case: &str) {
    let v = run_json("python", "print('healthy')", &[]);
    assert_eq!(v["stdout"], "healthy\n", "after {case}: {v:#}");
}

macro_rules! refused {
    ($name:ident, $errno:literal, $code:expr) => {
        #[test]
        fn $name() {
            if !sandbox_available(stringify!($name)) {
                return;
            }
            refused_with(stringify!($name), $code, $errno);
        }
    };
}

// Keyring.
refused!(keyctl_is_refused, "EPERM", "probe(250, 0, 0)");
refused!(add_key_is_refused, "EPERM", "probe(248, 0, 0, 0, 0, 0)");
refused!(request_key_is_refused, "EPERM", "probe(249, 0, 0, 0, 0)");
// Kernel attack surface.
refused!(bpf_is_refused, "EPERM", "probe(321, 0, 0, 0)");
refused!(
    perf_event_open_is_refused,
    "EPERM",
    "probe(298, 0, 0, -1, -1, 0)"
);
refused!(userfaultfd_is_refused, "EPERM", "probe(323, 0)");
refused!(io_uring_setup_is_refused, "ENOSYS", "probe(425, 8, 0)");
refused!(
    io_uring_enter_is_refused,
    "ENOSYS",
    "probe(426, 0, 1, 0, 0, 0, 0)"
);
refused!(
    io_uring_register_is_refused,
    "ENOSYS",
    "probe(427, 0, 0, 0, 0)"
);
// Other processes.
refused!(
    ptrace_of_pid_1_is_refused,
    "EPERM",
    "probe(101, 16, 1, 0, 0)"
);
refused!(
    process_vm_readv_is_refused,
    "EPERM",
    "probe(310, 1, 0, 0, 0, 0, 0)"
);
refused!(
    process_vm_writev_is_refused,
    "EPERM",
    "probe(311, 1, 0, 0, 0, 0, 0)"
);
refused!(kcmp_is_refused, "EPERM", "probe(312, 1, 2, 0, 0, 0)");
// Mounts and namespaces.
refused!(mount_is_refused, "EPERM", "probe(165, 0, 0, 0, 0, 0)");
refused!(umount2_is_refused, "EPERM", "probe(166, 0, 0)");
refused!(pivot_root_is_refused, "EPERM", "probe(155, 0, 0)");
refused!(setns_is_refused, "EPERM", "probe(308, 0, 0)");
refused!(
    nested_user_namespace_is_refused,
    "EPERM",
    "probe(272, 0x10000000)"
);
refused!(
    clone_with_newuser_is_refused,
    "EPERM",
    "probe(56, 0x10000000 | 17, 0, 0, 0, 0)"
);
refused!(clone3_is_refused, "ENOSYS", "probe(435, 0, 0)");
// File handles (escape by inode number).
refused!(
    open_by_handle_at_is_refused,
    "EPERM",
    "probe(304, -100, 0, 0)"
);
refused!(
    name_to_handle_at_is_refused,
    "EPERM",
    "probe(303, -100, 0, 0, 0, 0)"
);
// System administration.
refused!(kexec_load_is_refused, "EPERM", "probe(246, 0, 0, 0, 0)");
refused!(init_module_is_refused, "EPERM", "probe(175, 0, 0, 0)");
refused!(finit_module_is_refused, "EPERM", "probe(313, 0, 0, 0)");
refused!(delete_module_is_refused, "EPERM", "probe(176, 0, 0)");
refused!(
    reboot_is_refused,
    "EPERM",
    "probe(169, 0xfee1dead, 672274793, 0x4321fedc, 0)"
);
refused!(swapon_is_refused, "EPERM", "probe(167, 0, 0)");
refused!(swapoff_is_refused, "EPERM", "probe(168, 0)");
refused!(acct_is_refused, "EPERM", "probe(163, 0)");
refused!(quotactl_is_refused, "EPERM", "probe(179, 0, 0, 0, 0)");
refused!(settimeofday_is_refused, "EPERM", "probe(164, 0, 0)");
refused!(clock_settime_is_refused, "EPERM", "probe(227, 0, 0)");
refused!(adjtimex_is_refused, "EPERM", "probe(159, 0)");
refused!(personality_change_is_refused, "EPERM", "probe(135, 0x0008)");
// Terminal injection, with and without high bits in the command word.
refused!(tiocsti_is_refused, "EPERM", "probe(16, 0, 0x5412, 0)");
refused!(
    tiocsti_with_high_bits_is_refused,
    "EPERM",
    "probe(16, 0, 0x5412 | (1 << 32), 0)"
);
refused!(tioclinux_is_refused, "EPERM", "probe(16, 0, 0x541C, 0)");
// Sockets: no network families in the default profile, never vsock or MPTCP.
refused!(af_inet_socket_is_refused, "EPERM", "probe(41, 2, 1, 0)");
refused!(af_inet6_socket_is_refused, "EPERM", "probe(41, 10, 1, 0)");
refused!(af_vsock_socket_is_refused, "EPERM", "probe(41, 40, 1, 0)");
refused!(af_netlink_socket_is_refused, "EPERM", "probe(41, 16, 3, 0)");

// Set-user-id and set-group-id modes: never made, on any file (a bound host directory would
// keep them). `F` is an existing file, `N` a new name, both in /tmp; AT_FDCWD is -100.
macro_rules! setid_refused {
    ($name:ident, $errno:literal, $call:literal) => {
        refused!(
            $name,
            $errno,
            concat!(
                "F = ctypes.create_string_buffer(b'/tmp/f'); open('/tmp/f', 'w').close()\n",
                "N = ctypes.create_string_buffer(b'/tmp/n')\n",
                "f, n = ctypes.addressof(F), ctypes.addressof(N)\n",
                $call
            )
        );
    };
}
setid_refused!(chmod_setuid_is_refused, "EPERM", "probe(90, f, 0o4755)");
setid_refused!(
    fchmod_setgid_is_refused,
    "EPERM",
    "probe(91, os.open('/tmp/f', os.O_RDONLY), 0o2755)"
);
setid_refused!(
    fchmodat_setuid_is_refused,
    "EPERM",
    "probe(268, -100, f, 0o6755, 0)"
);
setid_refused!(
    fchmodat2_setgid_is_refused,
    "EPERM",
    "probe(452, -100, f, 0o2700, 0)"
);
setid_refused!(
    open_creating_setuid_is_refused,
    "EPERM",
    "probe(2, n, 0o101, 0o4755)"
);
setid_refused!(
    openat_creating_setgid_is_refused,
    "EPERM",
    "probe(257, -100, n, 0o101, 0o2755)"
);
setid_refused!(creat_setuid_is_refused, "EPERM", "probe(85, n, 0o4700)");
setid_refused!(
    mknodat_setuid_file_is_refused,
    "EPERM",
    "probe(259, -100, n, 0o104755, 0)"
);
setid_refused!(openat2_is_enosys, "ENOSYS", "probe(437, -100, f, 0, 0)");

#[test]
fn files_without_set_id_bits_are_made_and_changed_as_usual() {
    let name = "files_without_set_id_bits_are_made_and_changed_as_usual";
    if !sandbox_available(name) {
        return;
    }
    let v = python(
        "F = ctypes.create_string_buffer(b'/tmp/f'); open('/tmp/f', 'w').close()\n\
         N = ctypes.create_string_buffer(b'/tmp/n')\n\
         probe(90, ctypes.addressof(F), 0o1777)\n\
         probe(257, -100, ctypes.addressof(N), 0o101, 0o755)\n\
         print(oct(os.stat('/tmp/f').st_mode), oct(os.stat('/tmp/n').st_mode))",
        &[],
    );
    let out = v["stdout"].as_str().unwrap_or("");
    assert!(!out.contains("RESULT -1"), "{name}: {v:#}");
    assert!(out.contains("0o101777 0o100755"), "{name}: {v:#}");
}

#[test]
fn unix_sockets_and_normal_calls_still_work() {
    if !sandbox_available("unix_sockets_and_normal_calls_still_work") {
        return;
    }
    let v = python(
        "probe(41, 1, 1, 0)\nprobe(39)\nimport threading; t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()",
        &[],
    );
    let out = v["stdout"].as_str().unwrap();
    assert!(!out.contains("RESULT -1"), "{v:#}");
    assert!(out.contains("thread"), "{v:#}");
}

#[test]
fn vsock_and_mptcp_are_refused_even_with_network() {
    if !sandbox_available("vsock_and_mptcp_are_refused_even_with_network") {
        return;
    }
    let v = python(
        "probe(41, 40, 1, 0)\nprobe(41, 2, 1, 262)\nprobe(41, 2, 1, 0)",
        &["--profile", "network"],
    );
    let lines: Vec<&str> = v["stdout"].as_str().unwrap().lines().collect();
    assert!(lines[0].starts_with("RESULT -1 EPERM"), "vsock: {v:#}");
    assert!(lines[1].starts_with("RESULT -1 EPERM"), "mptcp: {v:#}");
    assert!(
        !lines[2].starts_with("RESULT -1"),
        "plain TCP socket: {v:#}"
    );
}

#[test]
fn x32_syscall_is_killed() {
    if !sandbox_available("x32_syscall_is_killed") {
        return;
    }
    let v = python("probe(0x40000000 | 39)\nprint('SURVIVED')", &[]);
    assert_eq!(v["signal"], 31, "{v:#}");
    assert_eq!(v["seccomp_violation"], true, "{v:#}");
    assert!(!v["stdout"].as_str().unwrap().contains("SURVIVED"));
    supervisor_still_healthy("x32");
}

#[test]
fn int_0x80_syscall_is_killed() {
    if !sandbox_available("int_0x80_syscall_is_killed") {
        return;
    }
    // mov eax, 20 (i386 getpid); int 0x80; ret — in anonymous executable memory.
    let code = r#"
import mmap
code = bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3])
buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(code)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
fn = ctypes.CFUNCTYPE(ctypes.c_int)(addr)
print("RET", fn(), flush=True)
print('SURVIVED')
"#;
    let v = python(code, &[]);
    // On kernels without IA32 emulation int 0x80 faults (SIGSEGV) before reaching seccomp.
    let sig = v["signal"].as_i64();
    assert!(sig == Some(31) || sig == Some(11), "{v:#}");
    assert!(!v["stdout"].as_str().unwrap().contains("SURVIVED"), "{v:#}");
    supervisor_still_healthy("int 0x80");
}

#[test]
fn writing_the_rootfs_fails_read_only() {
    if !sandbox_available("writing_the_rootfs_fails_read_only") {
        return;
    }
    let v = python(
        "for p in ['/usr/bin/python3', '/etc/passwd', '/opt/codebox/python/boot.py']:\n    try:\n        open(p, 'r+b').write(b'x'); print('WROTE', p)\n    except OSError as e:\n        print(p, errno.errorcode[e.errno])",
        &[],
    );
    let out = v["stdout"].as_str().unwrap();
    assert!(!out.contains("WROTE"), "{v:#}");
    assert_eq!(
        out.matches("EROFS").count() + out.matches("EACCES").count(),
        3,
        "{v:#}"
    );
}

#[test]
fn proc_self_exe_cannot_be_overwritten() {
    if !sandbox_available("proc_self_exe_cannot_be_overwritten") {
        return;
    }
    let v = python(
        "try:\n    open('/proc/self/exe', 'wb').write(b'x'); print('WROTE')\nexcept OSError as e:\n    print('refused', errno.errorcode[e.errno])",
        &[],
    );
    let out = v["stdout"].as_str().unwrap();
    assert!(out.starts_with("refused"), "{v:#}");
}

#[test]
fn landlock_refuses_writes_outside_scratch_space_even_where_modes_allow() {
    if !sandbox_available("landlock_refuses_writes_outside_scratch_space_even_where_modes_allow") {
        return;
    }
    // /proc/self/attr and /proc/self/comm are writable by mode for the process itself;
    // landlock gives the program write access only below /tmp, /dev/shm and /workspace.
    let v = python(
        "for p in ['/proc/self/comm', '/proc/self/oom_score_adj']:\n    try:\n        open(p, 'w').write('1'); print('WROTE', p)\n    except OSError as e:\n        print(p, errno.errorcode[e.errno])\nopen('/tmp/ok', 'w').write('1'); print('tmp ok')",
        &[],
    );
    let out = v["stdout"].as_str().unwrap();
    assert_eq!(v["landlock"], "fully_enforced", "{v:#}");
    assert!(!out.contains("WROTE"), "{v:#}");
    assert!(out.contains("tmp ok"), "{v:#}");
}

#[test]
fn signals_cannot_reach_the_init_or_the_host() {
    if !sandbox_available("signals_cannot_reach_the_init_or_the_host") {
        return;
    }
    let v = python(
        "for pid in [1, -1]:\n    try:\n        os.kill(pid, 9); print('SENT', pid)\n    except OSError as e:\n        print(pid, errno.errorcode[e.errno])\nprint('alive')",
        &[],
    );
    let out = v["stdout"].as_str().unwrap();
    assert!(out.contains("1 EPERM"), "{v:#}");
    assert!(out.contains("alive"), "{v:#}");
    supervisor_still_healthy("kill");
}

#[test]
fn tmp_fill_hits_enospc() {
    if !sandbox_available("tmp_fill_hits_enospc") {
        return;
    }
    let v = python(
        "f = open('/tmp/fill', 'wb')\ntry:\n    while True: f.write(b'x' * (1 << 20)); f.flush()\nexcept OSError as e:\n    print('stopped', errno.errorcode[e.errno])",
        &[],
    );
    assert!(
        v["stdout"].as_str().unwrap().contains("stopped ENOSPC"),
        "{v:#}"
    );
    supervisor_still_healthy("tmp fill");
}

#[test]
fn one_gib_file_hits_efbig() {
    if !sandbox_available("one_gib_file_hits_efbig") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534)).unwrap();
    }
    // Sparse: seek to 1 GiB and write one byte, so no disk space is used.
    let v = python(
        "f = open('/workspace/big', 'wb')\nf.seek(1 << 30)\ntry:\n    f.write(b'x'); f.flush(); print('WROTE')\nexcept OSError as e:\n    print('stopped', errno.errorcode[e.errno])",
        &["--workspace", dir.path().to_str().unwrap()],
    );
    assert!(
        v["stdout"].as_str().unwrap().contains("stopped EFBIG"),
        "{v:#}"
    );
}

#[test]
fn cpu_spin_is_killed_at_timeout_in_both_languages() {
    if !sandbox_available("cpu_spin_is_killed_at_timeout_in_both_languages") {
        return;
    }
    for (lang, code) in [
        ("python", "while True: pass"),
        ("typescript", "while (true) {}"),
    ] {
        let v = run_json(lang, code, &["--timeout", "500ms"]);
        assert_eq!(v["timed_out"], true, "{lang}: {v:#}");
    }
    supervisor_still_healthy("spin");
}

#[test]
fn typescript_cannot_open_network_or_write_the_rootfs() {
    if !sandbox_available("typescript_cannot_open_network_or_write_the_rootfs") {
        return;
    }
    let v = run_json(
        "typescript",
        r#"
for (const attempt of [
  () => Deno.listen({ port: 8080 }),
  () => Deno.writeTextFileSync("/usr/bin/x", "1"),
  () => new Deno.Command("/usr/bin/python3", { args: ["-c", "import socket; socket.socket()"] }).outputSync().success || (() => { throw new Error("child refused"); })(),
]) {
  try { attempt(); console.log("ALLOWED"); } catch (e) { console.log("refused", (e as Error).name); }
}
"#,
        &[],
    );
    let out = v["stdout"].as_str().unwrap();
    assert_eq!(out.matches("refused").count(), 3, "{v:#}");
    assert!(!out.contains("ALLOWED"), "{v:#}");
}

#[test]
fn memory_bomb_is_reported_as_oom() {
    if !sandbox_available("memory_bomb_is_reported_as_oom") {
        return;
    }
    for (lang, code) in [
        ("python", "chunks = []\nwhile True: chunks.append(bytearray(16 << 20))"),
        (
            "typescript",
            "const keep: Uint8Array[] = [];\nwhile (true) { const a = new Uint8Array(16 << 20); a.fill(1); keep.push(a); }",
        ),
    ] {
        let v = run_json(lang, code, &["--memory", "128M"]);
        assert_eq!(v["oom_killed"], true, "{lang}: {v:#}");
        assert_ne!(v["exit_code"], 0, "{lang}: {v:#}");
        let peak = v["peak_memory_bytes"].as_u64().unwrap_or(0);
        assert!(peak <= 128 << 20, "{lang}: peak {peak} over the limit");
    }
    supervisor_still_healthy("memory bomb");
}

#[test]
fn fork_bomb_hits_the_pids_limit() {
    if !sandbox_available("fork_bomb_hits_the_pids_limit") {
        return;
    }
    let marker = marker("forkbomb");
    let v = python(
        &format!("kids = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(30) # {marker}'])\n        kids += 1\nexcept OSError as e:\n    print('stopped after', kids, errno.errorcode[e.errno])"),
        &["--pids", "32"],
    );
    let out = v["stdout"].as_str().unwrap();
    assert!(out.contains("EAGAIN"), "{v:#}");
    assert_eq!(v["pids_limited"], true, "{v:#}");
    assert_eq!(processes_with_marker(&marker), Vec::<i32>::new());
    supervisor_still_healthy("fork bomb");
}

#[test]
fn no_cgroup_outlives_its_run() {
    if !sandbox_available("no_cgroup_outlives_its_run") {
        return;
    }
    let v = run_json("python", "print(open('/proc/self/cgroup').read())", &[]);
    let inside = v["stdout"].as_str().unwrap();
    // The sandbox's cgroup namespace is rooted at its own cgroup.
    for line in inside.lines().filter(|l| !l.is_empty()) {
        assert!(line.ends_with(":/"), "cgroup path visible inside: {line}");
    }
    let _ = run_json("python", "while True: pass", &["--timeout", "300ms"]);
    assert_eq!(codebox_cgroups(), Vec::<String>::new());
}

#[test]
fn a_killed_server_leaves_no_sandbox_behind() {
    if !sandbox_available("a_killed_server_leaves_no_sandbox_behind") {
        return;
    }
    let mut server = common::pooled::Server::start();
    server.until_pool_ready(2);
    let pid = server.pid() as i32;
    let pooled = sandbox_cgroups(|p| p == pid);
    assert!(!pooled.is_empty(), "the pool's sandboxes have no cgroup");
    // SIGKILL: no shutdown code of the server runs. Its spawner sees the socket close
    // and must kill, reap and remove every sandbox itself.
    server.kill();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !sandbox_cgroups(|p| p == pid).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(sandbox_cgroups(|p| p == pid), Vec::<String>::new());
}

/// `codebox-*` cgroups of dead supervisors below this process's own cgroups (a `codebox`
/// process that exited must have removed all of its own).
fn codebox_cgroups() -> Vec<String> {
    sandbox_cgroups(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
}

#[test]
fn workspace_symlinks_to_the_host_are_not_followed_by_the_supervisor() {
    if !sandbox_available("workspace_symlinks_to_the_host_are_not_followed_by_the_supervisor") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534)).unwrap();
    }
    let v = python(
        "os.symlink('/etc', '/workspace/etc-link')\nos.symlink('/etc/shadow', '/workspace/shadow')\nos.symlink('/', '/workspace/root')\nopen('/workspace/real.txt', 'w').write('ok')\nprint('planted')",
        &["--workspace", dir.path().to_str().unwrap()],
    );
    assert_eq!(v["stdout"], "planted\n", "{v:#}");
    let files = v["workspace_files"].as_array().expect("workspace listed");
    let paths: Vec<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
    // Nothing below the symlinked directories: the supervisor did not descend into the
    // host's /etc or /.
    assert_eq!(paths, ["etc-link", "real.txt", "root", "shadow"], "{v:#}");
    for f in files.iter().filter(|f| f["path"] != "real.txt") {
        assert_eq!(f["kind"], "symlink", "{f}");
        assert!(f["size"].is_null(), "the host target was stat'ed: {f}");
    }
    assert_eq!(files[1]["size"], 2);
}
