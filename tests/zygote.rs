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
    // /workspace holds only the out/ every run starts with (boot.py's make_out_dir).
    assert!(
        out.contains("scratch [] [] ['out']\n"),
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
        // This test binary's own server's (not another codebox's on the host).
        .filter(|p| {
            let pid = p.file_name().and_then(|n| n.to_str()?.parse().ok());
            pid.is_some_and(descends_from_this_process)
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
    // Each child's C1 makes the memory it shares with the zygote dumpable for a moment
    // (to write its id maps): the zygote must still not be. A non-dumpable process's
    // /proc entries belong to root (its user namespace maps no root), a dumpable one's to
    // its own user.
    let mut zygotes_checked = 0;
    for z in &zygotes {
        // A forked program (dumpable: its /proc/self is its own) has the zygote's command
        // line too; its parent is its sandbox's codebox-zinit.
        let pid: i32 = z.trim_start_matches("/proc/").parse().unwrap();
        let parent = std::fs::read(format!("/proc/{}/cmdline", parent_of(pid))).unwrap_or_default();
        if parent.starts_with(b"codebox-zinit") {
            continue;
        }
        // While a child of the pool's refill is between its clone and its id maps, the
        // zygote's memory is dumpable by design (C1 shares it): a zygote must be found
        // non-dumpable once that moment has passed, not at every instant. A zygote that
        // stays dumpable fails after 10 s of looking (2 s were not enough on a 2-core
        // host compiling beside the rootless pass: a child's C1 waited that long for a
        // core between its clone and its id maps).
        use std::os::unix::fs::MetadataExt;
        let mut observed = None;
        for _ in 0..500 {
            let Ok(status) = std::fs::read_to_string(format!("{z}/status")) else {
                break;
            };
            let Ok(meta) = std::fs::metadata(format!("{z}/status")) else {
                break;
            };
            let uid: u32 = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().next()?.parse().ok())
                .unwrap();
            observed = Some((meta.uid(), uid));
            if meta.uid() != uid {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let Some((owner, uid)) = observed else {
            continue; // gone meanwhile (a child that ended)
        };
        assert_ne!(
            owner, uid,
            "{z} is dumpable: its /proc entries are its user's"
        );
        zygotes_checked += 1;
    }
    assert!(zygotes_checked > 0, "no zygote checked among {zygotes:?}");
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

#[test]
fn a_pooled_sandbox_s_rehearsal_leaves_nothing_behind() {
    if !zygote_on("a_pooled_sandbox_s_rehearsal_leaves_nothing_behind") {
        return;
    }
    // A pooled sandbox rehearses a whole one-shot call (boot.rehearse) before it says
    // ready; a sandbox forked for `codebox run --zygote` does not. The program must find
    // the same world in both: its own globals only, fds 0-3 (plus the listing's own), the
    // real stdout and stderr, no `_`, an empty /workspace/out, boot.py's state as a fresh
    // serve has it.
    let probe = r#"
names = sorted(globals())
import builtins, os, sys
boot = sys.modules["_codebox_boot"]
print("globals", names)
print("main", sys.modules["__main__"].__dict__ is globals())
print("fds", sorted(os.listdir("/proc/self/fd")))
print("std", [os.readlink("/proc/self/fd/%d" % fd).split(":")[0] for fd in (1, 2)])
print("underscore", hasattr(builtins, "_"))
print("workspace", os.listdir("/workspace"), os.listdir("/workspace/out"))
print("boot", boot.CHANNEL_FD, boot._last_value is not None and not hasattr(builtins, "_"))
print("streams", sys.stdout.fileno(), sys.stderr.fileno(), sys.stdout.line_buffering)
print("exc", sys.exc_info(), hasattr(sys, "last_exc"), hasattr(sys, "last_value"))
import linecache
print("lines", [f for f in linecache.cache if f.startswith("/codebox") or f.startswith("<")])
"#;
    let warm = forked(probe);
    let cold = run_json("python", probe, &[]);
    assert_eq!(cold["zygote"], true, "{cold:#}");
    assert_eq!(
        warm["stdout"], cold["stdout"],
        "warm {warm:#}\ncold {cold:#}"
    );
    let out = warm["stdout"].as_str().unwrap();
    for line in [
        "globals ['__builtins__', '__doc__', '__loader__', '__name__', '__package__', '__spec__']\n",
        "main True\n",
        "fds ['0', '1', '2', '3', '4']\n",
        "std ['pipe', 'pipe']\n",
        "underscore False\n",
        "workspace ['out'] []\n",
        "boot 3 True\n",
        "exc (None, None, None) False False\n",
        "lines []\n",
    ] {
        assert!(out.contains(line), "expected {line:?} in {out}");
    }
    // The rest of the request the rehearsal parsed is the real one's: the value of the
    // last expression and the output files.
    let v = run_warm(
        "python",
        "open('/workspace/out/made.txt', 'w').write('x')\n6 * 7",
    );
    assert_eq!(v["zygote"], true, "{v:#}");
    assert_eq!(v["exit_code"], 0, "{v:#}");
    let text = v.to_string();
    assert!(text.contains("made.txt"), "no output file: {v:#}");
    assert!(text.contains("42"), "no value: {v:#}");
}

/// What every layer of a sandbox looks like from inside, one fact a line (the namespaces'
/// identities on their own line: they differ from one sandbox to the next).
const LAYERS_PROBE: &str = r#"
import os, resource
print("ns", [os.readlink("/proc/self/ns/" + n) for n in ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")])
print("uid_map", open("/proc/self/uid_map").read().split(), "gid_map", open("/proc/self/gid_map").read().split())
print("ids", os.getresuid(), os.getresgid(), os.getgroups())
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
print("caps", [status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")])
print("nnp", status["NoNewPrivs"].strip(), "seccomp", status["Seccomp"].strip())
print("rlimits", [resource.getrlimit(r) for r in (resource.RLIMIT_CORE, resource.RLIMIT_NOFILE, resource.RLIMIT_FSIZE)])
print("fds", sorted(os.listdir("/proc/self/fd")), os.readlink("/proc/self/fd/0"))
# The program's own seccomp filter refuses unshare (the zygote's allows it: it unshares).
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000) == 0:
    print("unshare allowed")
else:
    print("unshare", ctypes.get_errno())
# Landlock's signal scope: pid 1 (same uid, outside the program's domain) is out of reach.
try:
    os.kill(1, 0)
    print("signal to pid 1 allowed")
except OSError as e:
    print("signal to pid 1", e.errno)
here, there = os.stat("."), os.stat("/workspace")
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()), "cwd", os.getcwd(), (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino))
"#;

/// The probe's lines but the namespaces' identities and the id maps (a forked sandbox's
/// map is onto the zygote's user namespace, a cold one's onto the host's).
fn without_ns(out: &str) -> String {
    out.lines()
        .filter(|l| !l.starts_with("ns ") && !l.starts_with("uid_map "))
        .map(|l| format!("{l}\n"))
        .collect()
}

fn ns_line(out: &str) -> Vec<String> {
    let line = out.lines().find(|l| l.starts_with("ns ")).unwrap();
    line.split('\'')
        .filter(|s| s.contains(":["))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_layer_of_a_cold_sandbox_is_in_force_in_a_forked_one() {
    if !zygote_on("every_layer_of_a_cold_sandbox_is_in_force_in_a_forked_one") {
        return;
    }
    // The same probe in a cold sandbox (the Rust spawner's layers), a CLI fork (no
    // warm-up) and two pooled forks.
    let cold = codebox(&["run", "--json", "python", "-c", LAYERS_PROBE]);
    let cold: Value = serde_json::from_slice(&cold.stdout).unwrap();
    assert_ne!(cold["zygote"], true, "{cold:#}");
    assert_eq!(cold["exit_code"], 0, "{cold:#}");
    let cli = run_json("python", LAYERS_PROBE, &[]);
    assert_eq!(cli["zygote"], true, "{cli:#}");
    let warm = [forked(LAYERS_PROBE), forked(LAYERS_PROBE)];
    let expected = without_ns(cold["stdout"].as_str().unwrap());
    for v in [&cli, &warm[0], &warm[1]] {
        let out = v["stdout"].as_str().unwrap();
        assert_eq!(without_ns(out), expected, "forked {v:#}\ncold {cold:#}");
        assert_eq!(v["landlock"], cold["landlock"], "{v:#}");
    }
    // What the cold sandbox shows is what a sandbox must show.
    assert!(!expected.contains("ids (0,"), "{expected}");
    let id = expected
        .lines()
        .find_map(|l| l.strip_prefix("ids ("))
        .and_then(|l| l.split(',').next())
        .unwrap()
        .to_string();
    // The forked sandbox's user namespace maps its one id onto itself, nothing else.
    for v in [&cli, &warm[0], &warm[1]] {
        let map = format!("uid_map ['{id}', '{id}', '1'] gid_map ['{id}', '{id}', '1']\n");
        assert!(v["stdout"].as_str().unwrap().contains(&map), "{map} {v:#}");
    }
    for fact in [
        "caps ['0000000000000000', '0000000000000000', '0000000000000000', '0000000000000000', '0000000000000000']\n".to_string(),
        "nnp 1 seccomp 2\n".to_string(),
        "rlimits [(0, 0), (256, 256), (268435456, 268435456)]\n".to_string(),
        "fds ['0', '1', '2', '3', '4'] /dev/null\n".to_string(),
        "unshare 1\n".to_string(),
        "pids [1, 2] cwd /workspace True\n".to_string(),
    ] {
        assert!(expected.contains(&fact), "expected {fact:?} in {expected}");
    }
    if cold["landlock"] == "fully_enforced" {
        assert!(expected.contains("signal to pid 1 1\n"), "{expected}");
    }
    // No namespace is this process's. (That none is the zygote's is checked from the host
    // on a running child: a_running_forked_sandbox_has_its_own_cgroups_and_namespaces.
    // Two children in turn may show the same identity: the first one's namespaces are
    // freed and their inode numbers reused.)
    let ours = NAMESPACES.map(|n| {
        std::fs::read_link(format!("/proc/self/ns/{n}"))
            .unwrap()
            .display()
            .to_string()
    });
    for v in [&cli, &warm[0], &warm[1]] {
        let theirs = ns_line(v["stdout"].as_str().unwrap());
        assert_eq!(theirs.len(), 7, "{theirs:?}");
        for (a, b) in theirs.iter().zip(&ours) {
            assert_ne!(a, b, "a forked sandbox shares this process's namespace");
        }
    }
}

const NAMESPACES: [&str; 7] = ["user", "mnt", "pid", "net", "ipc", "uts", "cgroup"];

/// `/proc/<pid>/cgroup` as (controllers, path) pairs.
fn cgroups_of(pid: i32) -> Vec<(String, String)> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let _ = parts.next()?;
            Some((parts.next()?.to_string(), parts.next()?.to_string()))
        })
        .collect()
}

/// Whether `pid` is a descendant of this test process.
fn descends_from_this_process(pid: i32) -> bool {
    let me = std::process::id() as i32;
    let mut p = pid;
    for _ in 0..64 {
        p = parent_of(p);
        if p == me {
            return true;
        }
        if p <= 1 {
            return false;
        }
    }
    false
}

fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    after
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_running_forked_sandbox_has_its_own_cgroups_and_namespaces() {
    if !zygote_on("a_running_forked_sandbox_has_its_own_cgroups_and_namespaces") {
        return;
    }
    // The program names itself (its command line is the zygote's) and waits until this
    // process, having found it and compared its cgroups with the zygote's (its init's
    // parent: the zygote reaps its children's inits), lowers its RLIMIT_MSGQUEUE: a
    // signal from here would be simpler, but a pooled forked sandbox's call then waits
    // for its timeout (see docs/pending/warm-python.md).
    let tag = format!("cbz{:012}", std::process::id());
    let code = format!(
        "import ctypes, resource, time\n\
         ctypes.CDLL(None).prctl(15, b'{tag}', 0, 0, 0)\n\
         for _ in range(30000):\n    \
             if resource.getrlimit(resource.RLIMIT_MSGQUEUE)[0] == {RELEASE}:\n        \
                 break\n    \
             time.sleep(0.01)\n\
         print('released')"
    );
    let call = std::thread::spawn(move || run_warm("python", &code));
    let mut checked = None;
    let mut released = std::collections::HashSet::new();
    while !call.is_finished() {
        let found: Vec<i32> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim_end() == tag)
            })
            .collect();
        for pid in found {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let forked = String::from_utf8_lossy(&cmdline).contains("zygote.py");
            if forked && checked.is_none() {
                // Checked after the program is released, so a failure cannot keep the
                // call waiting.
                checked = Some(check_namespaces(pid).and_then(|()| check_cgroups(pid)));
            }
            if released.insert(pid) {
                let limit = libc::rlimit {
                    rlim_cur: RELEASE,
                    rlim_max: RELEASE,
                };
                // SAFETY: prlimit with a valid new limit and no old-limit buffer.
                let r = unsafe {
                    libc::prlimit(pid, libc::RLIMIT_MSGQUEUE, &limit, std::ptr::null_mut())
                };
                assert_eq!(r, 0, "prlimit {pid}: {}", std::io::Error::last_os_error());
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let v = call.join().unwrap();
    let Some(checked) = checked else {
        panic!("the forked program was never found: {v:#}");
    };
    if let Err(e) = checked {
        panic!("{e}");
    }
    assert_eq!(v["zygote"], true, "{v:#}");
    assert_eq!(v["stdout"], "released\n", "{v:#}");
}

/// What the forked program `pid` lowers its RLIMIT_MSGQUEUE to when it may end.
const RELEASE: u64 = 4321;

/// None of the forked program `pid`'s namespaces is its zygote's (whose are readable
/// only by root: the zygote is not dumpable).
fn check_namespaces(pid: i32) -> Result<(), String> {
    let zygote = parent_of(parent_of(pid));
    for n in NAMESPACES {
        let mine = std::fs::read_link(format!("/proc/{pid}/ns/{n}"))
            .map_err(|e| format!("the program's {n} namespace: {e}"))?;
        let Ok(its_zygote) = std::fs::read_link(format!("/proc/{zygote}/ns/{n}")) else {
            println!("SKIP the zygote's namespaces: only root reads a non-dumpable process's");
            return Ok(());
        };
        if mine == its_zygote {
            return Err(format!(
                "the forked program shares the zygote's {}",
                mine.display()
            ));
        }
    }
    Ok(())
}

/// The forked program `pid` is in its execution's memory and pids cgroups, not in its
/// zygote's.
fn check_cgroups(pid: i32) -> Result<(), String> {
    let zygote = parent_of(parent_of(pid));
    let zygote_cmd = std::fs::read(format!("/proc/{zygote}/cmdline")).unwrap_or_default();
    if !String::from_utf8_lossy(&zygote_cmd).contains("zygote.py") {
        return Err(format!(
            "the program's init's parent {zygote} is not the zygote"
        ));
    }
    let mine = cgroups_of(pid);
    let its_zygote = cgroups_of(zygote);
    if sandbox_cgroups(|_| true).is_empty() {
        println!("SKIP cgroup membership: this host gives codebox no cgroups");
        return Ok(());
    }
    let limited: Vec<_> = mine
        .iter()
        .filter(|(c, _)| c.split(',').any(|c| c == "memory" || c == "pids"))
        .collect();
    if limited.is_empty() {
        return Err(format!("no memory or pids cgroup: {mine:?}"));
    }
    for (controllers, path) in limited {
        if !path.contains("/codebox-") {
            return Err(format!("{controllers}: {path} is no sandbox cgroup"));
        }
        if its_zygote.contains(&(controllers.clone(), path.clone())) {
            return Err(format!(
                "the forked program is in the zygote's {controllers} cgroup {path}"
            ));
        }
    }
    Ok(())
}

/// The fork request parser of the native loop (fork.c's `parse`, through
/// `codebox_zygote_check_request`), loaded from the rootfs's library.
type CheckRequest = unsafe extern "C" fn(*const u8, usize, i32) -> i32;

struct NativeParser {
    check: CheckRequest,
}

impl NativeParser {
    fn load() -> NativeParser {
        let path = rootfs_dir().join("opt/codebox/zygote/fork.so");
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: dlopen of the rootfs's fork library, which has no constructors; the
        // handle stays open for the life of the process.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null(), "dlopen {}", path.display());
        // SAFETY: a symbol lookup in the handle just opened.
        let sym = unsafe { libc::dlsym(handle, c"codebox_zygote_check_request".as_ptr()) };
        assert!(
            !sym.is_null(),
            "fork.so exports no codebox_zygote_check_request"
        );
        NativeParser {
            // SAFETY: the symbol is fork.c's `int (const unsigned char *, size_t, int)`.
            check: unsafe { std::mem::transmute::<*mut libc::c_void, CheckRequest>(sym) },
        }
    }

    /// Whether the loop would take `bytes` with `nfds` descriptors. The bytes end right
    /// below a page that cannot be read: a read past the request's end faults.
    fn accepts(&self, bytes: &[u8], nfds: i32) -> bool {
        let page = 4096;
        let pages = bytes.len().div_ceil(page) + 1;
        // SAFETY: a fresh anonymous mapping, its last page made inaccessible; the request
        // is copied to end where that page starts; unmapped before returning.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                pages * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(base, libc::MAP_FAILED);
            let guard = (base as *mut u8).add((pages - 1) * page);
            assert_eq!(libc::mprotect(guard.cast(), page, libc::PROT_NONE), 0);
            let start = guard.sub(bytes.len());
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), start, bytes.len());
            let r = (self.check)(start, bytes.len(), nfds);
            libc::munmap(base, pages * page);
            r == 0
        }
    }
}

/// A request as `ForkRequest::to_bytes` writes it (src/sandbox/zygote/plan.rs, whose unit
/// test pins the layout).
fn request(joins: u32, mounts: &[(u32, u64, &[u8], &[u8])]) -> Vec<u8> {
    let mut b = Vec::new();
    for v in [0x5a42_5a43u32, 1, 1, joins] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&256u64.to_le_bytes());
    b.extend_from_slice(&(1u64 << 28).to_le_bytes());
    b.extend_from_slice(&(mounts.len() as u32).to_le_bytes());
    for (kind, flags, target, data) in mounts {
        b.extend_from_slice(&kind.to_le_bytes());
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&(target.len() as u32).to_le_bytes());
        b.extend_from_slice(&(data.len() as u32).to_le_bytes());
        b.extend_from_slice(target);
        b.extend_from_slice(data);
    }
    b
}

#[test]
fn the_native_loop_refuses_every_malformed_fork_request() {
    if !sandbox_available("the_native_loop_refuses_every_malformed_fork_request") {
        return;
    }
    let parser = NativeParser::load();
    let mounts: &[(u32, u64, &[u8], &[u8])] = &[
        (1, 14, b"/proc", b""),
        (2, 6, b"/tmp", b"size=67108864,mode=1777"),
        (2, 6, b"/workspace", b"size=268435456,mode=755"),
    ];
    let good = request(3, mounts);
    assert!(
        parser.accepts(&good, 10),
        "a well-formed request is refused"
    );
    // Every truncation, and one byte too many.
    for len in 0..good.len() {
        assert!(
            !parser.accepts(&good[..len], 10),
            "taken cut to {len} bytes"
        );
    }
    let mut longer = good.clone();
    longer.push(0);
    assert!(!parser.accepts(&longer, 10), "taken with a trailing byte");
    // Descriptors that do not match the joins; limits of the fixed tables.
    for nfds in [0, 3, 7, 9, 11, 1000] {
        assert!(
            !parser.accepts(&good, nfds),
            "taken with {nfds} descriptors"
        );
    }
    assert!(!parser.accepts(&request(17, mounts), 24), "17 joins taken");
    let many = vec![(2u32, 0u64, &b"/tmp"[..], &b""[..]); 17];
    assert!(!parser.accepts(&request(0, &many), 7), "17 mounts taken");
    let sixteen = vec![(2u32, 0u64, &b"/tmp"[..], &b""[..]); 16];
    assert!(
        parser.accepts(&request(0, &sixteen), 7),
        "16 mounts refused"
    );
    // Bad mounts: unknown kind, empty, relative or NUL-bearing target, a target or data
    // longer than the loop's buffers.
    let long_target = [b"/".as_slice(), &[b'a'; 4095]].concat();
    let longest_target = [b"/".as_slice(), &[b'a'; 4094]].concat();
    let long_data = [b'a'; 256];
    let longest_data = [b'a'; 255];
    for (what, m, ok) in [
        ("kind 0", (0, 0, &b"/tmp"[..], &b""[..]), false),
        ("kind 3", (3, 0, &b"/tmp"[..], &b""[..]), false),
        ("an empty target", (2, 0, &b""[..], &b""[..]), false),
        ("a relative target", (2, 0, &b"tmp"[..], &b""[..]), false),
        (
            "a NUL in the target",
            (2, 0, &b"/tm\0p"[..], &b""[..]),
            false,
        ),
        (
            "a NUL in the data",
            (2, 0, &b"/tmp"[..], &b"size=1\0"[..]),
            false,
        ),
        (
            "a 4096-byte target",
            (2, 0, &long_target[..], &b""[..]),
            false,
        ),
        (
            "a 4095-byte target",
            (2, 0, &longest_target[..], &b""[..]),
            true,
        ),
        (
            "256 bytes of data",
            (2, 0, &b"/tmp"[..], &long_data[..]),
            false,
        ),
        (
            "255 bytes of data",
            (2, 0, &b"/tmp"[..], &longest_data[..]),
            true,
        ),
    ] {
        assert_eq!(parser.accepts(&request(0, &[m]), 7), ok, "{what}");
    }
    // Lengths that point past the end, whatever their size: each length field of the
    // last mount set to every boundary value.
    let last = good.len() - b"/workspace".len() - b"size=268435456,mode=755".len() - 8;
    for field in [last, last + 4] {
        for v in [u32::MAX, u32::MAX - 3, 1 << 31, 4095, 4096, 300, 255, 24] {
            let mut bad = good.clone();
            bad[field..field + 4].copy_from_slice(&v.to_le_bytes());
            assert!(!parser.accepts(&bad, 10), "length {v} at {field} taken");
        }
    }
    // Counts at every boundary.
    for (at, v) in [
        (12usize, u32::MAX),
        (12, 16),
        (32, u32::MAX),
        (32, 4),
        (32, 2),
    ] {
        let mut bad = good.clone();
        bad[at..at + 4].copy_from_slice(&v.to_le_bytes());
        assert!(!parser.accepts(&bad, 10), "count {v} at {at} taken");
    }
    // Random corruption (a fixed generator: the same cases every run) never makes it read
    // past the request (which would fault on the guard page).
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..20_000 {
        let mut bad = good.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() as usize) % bad.len();
            bad[i] = next() as u8;
        }
        let cut = bad.len() - (next() as usize % 8).min(bad.len());
        let _ = parser.accepts(&bad[..cut], 10);
    }
}
