//! Isolation: each test fails if the layer it checks is missing.

mod common;

use common::pooled::python_ok_cold_and_warm;
use common::*;

#[test]
fn host_files_are_invisible() {
    if !sandbox_available("host_files_are_invisible") {
        return;
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let project = env!("CARGO_MANIFEST_DIR");
    let code = format!(
        r#"
import os
for p in ["/etc/shadow", {home:?}, {project:?}, "/home", "/root", "/var", "/sys/kernel", "/boot"]:
    print(p, os.path.exists(p))
print("passwd-has-sandbox", "sandbox:x:1000" in open("/etc/passwd").read())
print("root-entries", sorted(os.listdir("/")))
"#
    );
    let out = python_ok_cold_and_warm(&code);
    for line in out.lines().filter(|l| l.starts_with('/')) {
        assert!(
            line.ends_with("False"),
            "visible inside the sandbox: {line}"
        );
    }
    assert!(out.contains("passwd-has-sandbox True"), "{out}");
}

#[test]
fn rootfs_is_read_only() {
    if !sandbox_available("rootfs_is_read_only") {
        return;
    }
    let out = python_ok_cold_and_warm(
        r#"
import errno
for p in ["/usr/bin/python3", "/etc/passwd", "/new-file", "/usr/lib/x"]:
    try:
        open(p, "a").close()
        print(p, "WRITABLE")
    except OSError as e:
        print(p, errno.errorcode[e.errno])
import os
print("mount-ro", any(l.split()[4] == "/" and " ro," in l or l.split()[4] == "/" and " ro " in l
                      for l in open("/proc/self/mountinfo")))
"#,
    );
    assert!(!out.contains("WRITABLE"), "{out}");
    assert!(out.contains("mount-ro True"), "{out}");
}

#[test]
fn root_mount_is_nosuid_nodev_and_tmp_is_noexec() {
    if !sandbox_available("root_mount_is_nosuid_nodev_and_tmp_is_noexec") {
        return;
    }
    let out = python_ok_cold_and_warm(
        r#"
for l in open("/proc/self/mountinfo"):
    f = l.split()
    if f[4] in ("/", "/tmp", "/dev/shm", "/workspace", "/proc"):
        print(f[4], f[5])
"#,
    );
    let opts = |mp: &str| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(mp))
            .unwrap_or_else(|| panic!("{mp} not mounted: {out}"))
            .to_string()
    };
    for flag in ["ro", "nosuid", "nodev"] {
        assert!(opts("/").contains(flag), "/ lacks {flag}: {out}");
    }
    for mp in ["/tmp", "/dev/shm", "/workspace"] {
        for flag in ["rw", "nosuid", "nodev", "noexec"] {
            assert!(opts(mp).contains(flag), "{mp} lacks {flag}: {out}");
        }
    }
}

#[test]
fn only_loopback_and_no_way_out() {
    if !sandbox_available("only_loopback_and_no_way_out") {
        return;
    }
    // A listener on the host's loopback: the sandbox's 127.0.0.1 is a different one.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let probe = format!(
        r#"
import socket
print("interfaces", [l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]])
for host in ["127.0.0.1", "10.0.2.2"]:
    try:
        s = socket.socket()
        s.settimeout(1)
        s.connect((host, {port}))
        print(host, "CONNECTED")
    except OSError as e:
        print(host, "refused", e.errno)
"#
    );
    // Default profile: no AF_INET socket at all (seccomp: EPERM).
    let out = python_ok_cold_and_warm(&probe);
    assert!(out.contains("interfaces ['lo']"), "{out}");
    assert!(out.contains("127.0.0.1 refused 1"), "{out}");
    // Network profile: sockets exist, but the namespace has only a loopback that is down.
    let v = run_json("python", &probe, &["--profile", "network"]);
    let out = v["stdout"].as_str().unwrap();
    assert!(out.contains("interfaces ['lo']"), "{v:#}");
    assert!(!out.contains("CONNECTED"), "{v:#}");
    assert!(out.contains("10.0.2.2 refused"), "{v:#}");
    assert!(
        listener.accept().is_err(),
        "the host listener saw a connection"
    );
}

#[test]
fn own_pid_namespace_and_hostname() {
    if !sandbox_available("own_pid_namespace_and_hostname") {
        return;
    }
    let out = python_ok_cold_and_warm(
        r#"
import os, socket
print("pid", os.getpid())
print("procs", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
print("host", socket.gethostname())
"#,
    );
    assert!(out.contains("pid 2"), "{out}");
    assert!(out.contains("procs [1, 2]"), "{out}");
    let host = nix::unistd::gethostname().unwrap();
    assert!(out.contains("host codebox"), "{out}");
    assert_ne!(host.to_string_lossy(), "codebox");
}

#[test]
fn uid_maps_to_an_unprivileged_host_id() {
    if !sandbox_available("uid_maps_to_an_unprivileged_host_id") {
        return;
    }
    let out = python_ok_cold_and_warm(
        r#"
import os
print("ids", os.getuid(), os.geteuid(), os.getgid(), os.getgroups())
print("uidmap", open("/proc/self/uid_map").read().split())
print("gidmap", open("/proc/self/gid_map").read().split())
"#,
    );
    let me = nix::unistd::geteuid().as_raw();
    // A zygote's child maps its uid onto the zygote's sandbox user (a nested user
    // namespace), which is the host id a cold sandbox shows; tests/zygote.rs checks the
    // host side.
    let expected_host = if zygote_run() {
        1000
    } else if me == 0 {
        65534
    } else {
        me
    };
    assert!(out.contains("ids 1000 1000 1000"), "{out}");
    assert!(
        out.contains(&format!("uidmap ['1000', '{expected_host}', '1']")),
        "{out}"
    );
    assert!(
        !out.contains("uidmap ['1000', '0',"),
        "host root mapped: {out}"
    );
    if me == 0 {
        // Root's supplementary groups must not follow it into the sandbox.
        assert!(out.contains("[]\n") || out.contains("[1000]"), "{out}");
    }
}

#[test]
fn no_capabilities_and_no_new_privs() {
    if !sandbox_available("no_capabilities_and_no_new_privs") {
        return;
    }
    for (lang, code) in [
        ("python", "print(open('/proc/self/status').read())"),
        (
            "typescript",
            "console.log(Deno.readTextFileSync('/proc/self/status'))",
        ),
    ] {
        let v = run_json(lang, code, &[]);
        let status = v["stdout"].as_str().unwrap();
        for field in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            let line = status
                .lines()
                .find(|l| l.starts_with(field))
                .unwrap_or_else(|| panic!("{lang}: no {field}: {v:#}"));
            assert!(line.ends_with("0000000000000000"), "{lang}: {line}");
        }
        assert!(status.contains("NoNewPrivs:\t1"), "{lang}: {status}");
    }
}

#[test]
fn only_fds_0_to_3_are_open() {
    if !sandbox_available("only_fds_0_to_3_are_open") {
        return;
    }
    let out = python_ok_cold_and_warm(
        r#"
import os, stat
open_fds = []
for fd in range(0, 1024):
    try:
        os.fstat(fd)
        open_fds.append(fd)
    except OSError:
        pass
print("open", open_fds)
print("fd3-socket", stat.S_ISSOCK(os.fstat(3).st_mode))
print("stdin", os.readlink("/proc/self/fd/0"))
"#,
    );
    assert!(out.contains("open [0, 1, 2, 3]"), "{out}");
    assert!(out.contains("fd3-socket True"), "{out}");
    assert!(out.contains("stdin /dev/null"), "{out}");
}

/// Nothing the spawning process has open reaches the sandbox init either: `codebox run`
/// inherits a pipe at fd 11, a number the init's slots use only with a workspace mount.
/// (In a spawner that number held the init's own sync write end, so the init could wait
/// forever for a release that never comes.)
#[test]
fn no_descriptor_of_the_spawning_process_reaches_the_init() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let test = "no_descriptor_of_the_spawning_process_reaches_the_init";
    if !sandbox_available(test) {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        // The init is not dumpable, so its /proc/<pid>/fd belongs to root: only root can
        // list it (the root pass of `cargo xtask test` runs this).
        eprintln!("SKIP {test}: listing the non-dumpable init's descriptors needs root");
        return;
    }
    let mark = marker("init-fds");
    let (head, tail) = mark.split_at(mark.len() / 2);
    let (_r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let ino = nix::sys::stat::fstat(&w).unwrap().st_ino;
    let wfd = w.as_raw_fd();
    // The marker is only whole in the argv of the program's exec, not in codebox's.
    let code = format!(
        "import os, sys\nos.execv(sys.executable, [sys.executable, '-c', \
         'import time; time.sleep(6)', '{head}' + '{tail}'])"
    );
    let mut cmd = std::process::Command::new(codebox_bin());
    cmd.args(["run", "--json", "python", "-c", &code])
        .env("CODEBOX_ROOTFS", rootfs_dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: dup2 is async-signal-safe; it clears close-on-exec on fd 11 only.
    unsafe {
        cmd.pre_exec(move || match libc::dup2(wfd, 11) {
            -1 => Err(std::io::Error::last_os_error()),
            _ => Ok(()),
        });
    }
    let child = cmd.spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let program = loop {
        if let Some(&pid) = processes_with_marker(&mark).first() {
            break pid;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the program never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let status = std::fs::read_to_string(format!("/proc/{program}/status")).unwrap();
    let init: i32 = status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|p| p.trim().parse().ok())
        .unwrap();
    let mut held = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{init}/fd"))
        .unwrap()
        .flatten()
    {
        let fd: i32 = e.file_name().to_string_lossy().parse().unwrap();
        let link = std::fs::read_link(e.path()).map(|l| l.display().to_string());
        held.push((fd, link.unwrap_or_default()));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let leaked = format!("pipe:[{ino}]");
    assert!(
        held.iter().all(|(fd, link)| *fd < 11 && *link != leaked),
        "the init holds {held:?} (the spawning process's fd 11 is {leaked})"
    );
}

/// A session's `/workspace` is a filesystem the workspace keeper made and each run
/// attaches a copy of: its flags are not locked the way the mounts copied from the host
/// are, so they must come out of the keeper right and the program must have no way to
/// change them (remount, `mount_setattr`, the new mount API, a user namespace of its
/// own). Hostile code in a real session tries each; a second session sees none of it.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_session_workspace_keeps_its_flags_and_stays_its_own() {
    use serde_json::json;
    if !sandbox_available("a_session_workspace_keeps_its_flags_and_stays_its_own") {
        return;
    }
    let hostile = r##"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def res(r):
    return "ok" if r == 0 else "refused"
for l in open("/proc/self/mountinfo"):
    if l.split()[4] == "/workspace":
        print("opts", l.split()[5], l.split(" - ")[1].split()[2])
# MS_REMOUNT | MS_BIND without MS_NOEXEC/MS_NOSUID/MS_NODEV: drop them.
print("remount", res(libc.mount(None, b"/workspace", None, 0x20 | 0x1000, None)))
class Attr(ctypes.Structure):
    _fields_ = [("set", ctypes.c_uint64), ("clr", ctypes.c_uint64),
                ("prop", ctypes.c_uint64), ("userns", ctypes.c_uint64)]
a = Attr(0, 0x2 | 0x4 | 0x8, 0, 0)  # clear NOSUID | NODEV | NOEXEC
print("mount_setattr", res(libc.syscall(442, -100, b"/workspace", 0, ctypes.byref(a), 32)))
print("open_tree", res(0 if libc.syscall(428, -100, b"/workspace", 1) >= 0 else -1))
print("fsopen", res(0 if libc.syscall(430, b"tmpfs", 0) >= 0 else -1))
print("unshare", res(libc.unshare(0x10000000 | 0x00020000)))
with open("/workspace/run.sh", "w") as f:
    f.write("#!/bin/sh\necho ran\n")
os.chmod("/workspace/run.sh", 0o755)  # set-id modes are refused by seccomp
try:
    os.execv("/workspace/run.sh", ["run.sh"])
except OSError as e:
    print("exec refused", e.errno)
"##;
    let mut server = pooled::Server::start();
    let call = |server: &mut pooled::Server, args: serde_json::Value| {
        let r = server.request(
            "tools/call",
            json!({"name": "execute_python", "arguments": args}),
        );
        r["result"]["structuredContent"].clone()
    };
    let first = call(&mut server, json!({"code": hostile, "session": "new"}));
    let out = first["stdout"].as_str().unwrap_or_default().to_string();
    assert_eq!(first["exit_code"], 0, "{first:#}");
    let opts = out
        .lines()
        .find(|l| l.starts_with("opts "))
        .expect("/workspace mounted");
    for flag in ["rw", "nosuid", "nodev", "noexec", "size=", "nr_inodes="] {
        assert!(opts.contains(flag), "/workspace lacks {flag}: {out}");
    }
    for attempt in ["remount", "mount_setattr", "open_tree", "fsopen", "unshare"] {
        assert!(
            out.contains(&format!("{attempt} refused")),
            "{attempt} was not refused: {out}"
        );
    }
    assert!(out.contains("exec refused 13"), "{out}");
    // The flags are the same on the next run's copy; another session sees nothing.
    let id = first["session"]["id"]
        .as_str()
        .expect("a session id")
        .to_string();
    let again = call(&mut server, json!({"code": hostile, "session": id}));
    let out = again["stdout"].as_str().unwrap_or_default();
    assert!(
        out.contains("noexec") && out.contains("exec refused 13"),
        "{out}"
    );
    // Nothing but the empty out/ every run starts with (boot.py's make_out_dir).
    let other = call(
        &mut server,
        json!({"code": "import os; print(sorted(os.listdir('/workspace')), os.listdir('/workspace/out'))", "session": "new"}),
    );
    assert_eq!(other["stdout"], "['out'] []\n", "{other:#}");
    server.kill();
}

#[test]
fn environment_is_small_and_fixed() {
    if !sandbox_available("environment_is_small_and_fixed") {
        return;
    }
    let out = python_ok_cold_and_warm("import os; print(sorted(os.environ))");
    assert_eq!(
        out.trim(),
        "['HOME', 'LANG', 'MPLBACKEND', 'MPLCONFIGDIR', 'OMP_NUM_THREADS', \
         'OPENBLAS_NUM_THREADS', 'PATH', 'PYTHONDONTWRITEBYTECODE', 'TMPDIR']"
    );
}

#[test]
fn no_controlling_terminal_and_own_session() {
    if !sandbox_available("no_controlling_terminal_and_own_session") {
        return;
    }
    let out = python_ok_cold_and_warm(
        r#"
import os
print("sid", os.getsid(0) == os.getpid())
try:
    os.open("/dev/tty", os.O_RDWR)
    print("tty OPEN")
except OSError as e:
    print("tty", e.errno)
"#,
    );
    assert!(out.contains("sid True"), "{out}");
    assert!(!out.contains("tty OPEN"), "{out}");
}
