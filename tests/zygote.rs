//! Sandboxes forked from the Python zygote (`sandbox::zygote`): what docs/src/backends/zygote.md
//! claims a child cannot see or reach, tried from inside children of one server's
//! zygote. (`cargo xtask test` also runs the whole escape and isolation suites on
//! zygote-born sandboxes, as root and rootless: `CODEBOX_TEST_ZYGOTE=1`.)

mod common;

use common::pooled::run_warm;
use common::*;
use serde_json::Value;

/// This binary's server forks its Python sandboxes from the zygote.
fn zygote_on(case: &str) -> bool {
    std::env::set_var("CODEBOX_TEST_ZYGOTE", "1");
    sandbox_available(case)
}

/// A pooled Python run forked from the zygote: its structuredContent.
fn forked(code: &str) -> Value {
    let v = run_warm("python", code);
    assert_eq!(v["zygote"], true, "{v:#}");
    assert_eq!(v["exit_code"], 0, "{v:#}");
    v
}

#[test]
fn a_forked_sandbox_sees_and_reaches_nothing_but_itself() {
    if !zygote_on("a_forked_sandbox_sees_and_reaches_nothing_but_itself") {
        return;
    }
    let v = forked(
        r#"
import os, errno, socket
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print("pids", pids, "ppid", os.getppid())
# No other process exists for it: every other pid is unknown (the zygote, its other
# children and the host are in ancestor pid namespaces).
reachable = []
for pid in range(3, 1 << 15):
    try:
        os.kill(pid, 0)
        reachable.append(pid)
    except ProcessLookupError:
        pass
    except PermissionError:
        reachable.append(pid)
print("reachable", reachable)
print("scratch", os.listdir("/tmp"), os.listdir("/dev/shm"), os.listdir("/workspace"))
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
print("caps", status["CapEff"].strip(), status["CapBnd"].strip(), status["CapPrm"].strip())
print("nnp", status["NoNewPrivs"].strip(), "seccomp", status["Seccomp"].strip())
print("host", socket.gethostname())
print("cgroup", sorted(set(l.split(":", 2)[2] for l in open("/proc/self/cgroup").read().split())))
"#,
    );
    let out = v["stdout"].as_str().unwrap();
    assert!(out.contains("pids [1, 2] ppid 1\n"), "{out}");
    assert!(out.contains("reachable []\n"), "{out}");
    assert!(
        out.contains("scratch [] [] []\n"),
        "the zygote's own scratch (matplotlib's cache in its /tmp) must not show: {out}"
    );
    assert!(
        out.contains("caps 0000000000000000 0000000000000000 0000000000000000\n"),
        "{out}"
    );
    assert!(out.contains("nnp 1 seccomp 2\n"), "{out}");
    assert!(out.contains("host codebox\n"), "{out}");
    // The root of its own cgroup namespace in every hierarchy: its own cgroup.
    assert!(out.contains("cgroup ['/']\n"), "{out}");
    assert_ne!(v["landlock"], "not_enforced", "{v:#}");
}

#[test]
fn nothing_carries_over_from_one_forked_sandbox_to_the_next() {
    if !zygote_on("nothing_carries_over_from_one_forked_sandbox_to_the_next") {
        return;
    }
    // One run leaves what a program could leave behind: files in every writable place, a
    // System V shared memory segment, an abstract unix socket, and draws from the random
    // generators the zygote seeded at import.
    let leave = r#"
import ctypes, os, random, socket
for d in ("/tmp", "/dev/shm", "/workspace"):
    open(d + "/left-behind", "w").write("secret")
libc = ctypes.CDLL(None, use_errno=True)
shmid = libc.shmget(0x5eed, 4096, 0o1666)
print("shm", shmid >= 0)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("\0codebox-zygote-test")
s.listen()
import numpy
print("draws", random.getrandbits(64), numpy.random.randint(0, 1 << 62))
"#;
    let first = forked(leave);
    let out1 = first["stdout"].as_str().unwrap().to_string();
    assert!(out1.contains("shm True"), "{out1}");
    let look = r#"
import ctypes, os, random, socket
print("files", [d for d in ("/tmp", "/dev/shm", "/workspace") if os.path.exists(d + "/left-behind")])
libc = ctypes.CDLL(None, use_errno=True)
print("shm", libc.shmget(0x5eed, 4096, 0o666))
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect("\0codebox-zygote-test")
    print("abstract reached")
except OSError as e:
    print("abstract", type(e).__name__)
import numpy
print("draws", random.getrandbits(64), numpy.random.randint(0, 1 << 62))
"#;
    let second = forked(look);
    let out2 = second["stdout"].as_str().unwrap();
    assert!(out2.contains("files []\n"), "{out2}");
    assert!(out2.contains("shm -1\n"), "a fresh IPC namespace: {out2}");
    assert!(!out2.contains("abstract reached"), "{out2}");
    let draws = |out: &str| {
        out.lines()
            .find(|l| l.starts_with("draws"))
            .map(str::to_string)
            .unwrap()
    };
    assert_ne!(
        draws(&out1),
        draws(out2),
        "both children drew the same numbers"
    );
}

#[test]
fn a_child_killing_everything_it_can_leaves_the_zygote_serving() {
    if !zygote_on("a_child_killing_everything_it_can_leaves_the_zygote_serving") {
        return;
    }
    let v = run_warm(
        "python",
        "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('alive')",
    );
    assert_eq!(v["zygote"], true, "{v:#}");
    // kill(-1) reaches every process the program may signal: itself and its own init.
    assert!(
        v["exit_code"] != 0 || v["signal"].is_number(),
        "the program should have died: {v:#}"
    );
    let after = forked("print('next')");
    assert_eq!(after["stdout"], "next\n", "{after:#}");
}

#[test]
fn the_zygote_maps_no_shared_writable_memory() {
    if !zygote_on("the_zygote_maps_no_shared_writable_memory") {
        return;
    }
    // A run forked from the zygote makes sure one exists.
    forked("print(1)");
    let zygotes: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            std::fs::read(p.join("cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c).contains("/opt/codebox/python/zygote.py")
            })
        })
        .map(|p| p.display().to_string())
        .collect();
    assert!(!zygotes.is_empty(), "no zygote process found");
    let mut checked = 0;
    for z in &zygotes {
        // A zygote is non-dumpable: only root reads its maps (it may also have ended).
        let Ok(maps) = std::fs::read_to_string(format!("{z}/maps")) else {
            continue;
        };
        checked += 1;
        let shared_writable: Vec<&str> = maps
            .lines()
            .filter(|l| {
                l.split_whitespace()
                    .nth(1)
                    .is_some_and(|p| p.starts_with("rw") && p.ends_with('s'))
            })
            .collect();
        assert!(shared_writable.is_empty(), "{z}: {shared_writable:#?}");
    }
    if nix::unistd::geteuid().is_root() {
        assert!(checked > 0, "no zygote's maps could be read");
    } else {
        println!("SKIP the_zygote_maps_no_shared_writable_memory: only root reads a non-dumpable process's maps");
    }
}

#[test]
fn a_forked_program_runs_outside_every_handler_of_the_zygote() {
    if !zygote_on("a_forked_program_runs_outside_every_handler_of_the_zygote") {
        return;
    }
    // No exception of the zygote's is current, and a traceback is the program's own.
    let v = run_warm(
        "python",
        "import sys\nprint(sys.exc_info())\ntry:\n    raise\nexcept BaseException as e:\n    print(type(e).__name__)\n1/0",
    );
    assert_eq!(v["zygote"], true, "{v:#}");
    assert_eq!(v["stdout"], "(None, None, None)\nRuntimeError\n", "{v:#}");
    let stderr = v["stderr"].as_str().unwrap();
    assert!(stderr.contains("ZeroDivisionError"), "{stderr}");
    assert!(
        !stderr.contains("zygote") && !stderr.contains("BecomeProgram"),
        "{stderr}"
    );
}

#[test]
fn tracing_the_zygote_changes_nothing_for_the_program() {
    if !sandbox_available("tracing_the_zygote_changes_nothing_for_the_program") {
        return;
    }
    let out = std::process::Command::new(codebox_bin())
        .args([
            "run",
            "--zygote",
            "--json",
            "python",
            "-c",
            "import os; print(sorted(os.listdir('/proc/self/fd')))",
        ])
        .env("CODEBOX_ROOTFS", rootfs_dir())
        .env("CODEBOX_ZYGOTE_TRACE", "1")
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(v["zygote"], true, "{v:#}");
    assert_eq!(
        v["stdout"], "['0', '1', '2', '3', '4']\n",
        "the listing's own fd is 4: {v:#}"
    );
}
