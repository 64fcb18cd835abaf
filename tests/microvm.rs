//! The microVM backend end to end, under TCG on this machine: the real `codebox` binary,
//! the real guest tree (`cargo xtask guest`), jailed QEMU.
//!
//! One test at a time (harness = false): each cold VM is seconds of emulated CPU, and the
//! first test spawns a sandbox in this process, which must be single-threaded. Every test
//! prints what it cost (`cost:` lines), so the suite's share of CI time stays visible.

#[path = "microvm/clones.rs"]
mod clones;
mod common;
#[path = "microvm/escapes.rs"]
mod escapes;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::guest::*;
use common::*;
use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::Value;

/// `codebox run --json` of `code` on `backend`, with extra arguments.
fn run_json(backend: &str, language: &str, code: &str, extra: &[&str]) -> Value {
    let child = Command::new(codebox_bin())
        .args(["run", "--json", "--backend", backend, language, "-c", code])
        .args(extra)
        .env("CODEBOX_ROOTFS", rootfs_dir())
        .env("CODEBOX_GUEST", guest_dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run codebox");
    started(child.id());
    let out = child.wait_with_output().expect("run codebox");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "{backend}: not JSON ({e}): {text}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn cost(test: &str, started: Instant, vms: usize) {
    println!(
        "cost: {test}: {:.1} s, {vms} VM(s)",
        started.elapsed().as_secs_f64()
    );
}

/// A program inherits the descriptors its spec names, at 13, 14, ..., and nothing else
/// (the jailed VMM's sockets reach QEMU this way).
fn inherited_descriptors_reach_the_program() -> Result<(), Failed> {
    use codebox::sandbox::{self, Discard, IdMapping, Limits, Program, SandboxSpec};
    if !sandbox_available("inherited_descriptors_reach_the_program") {
        return Ok(());
    }
    let (r1, w1) = nix::unistd::pipe().unwrap();
    let (r2, w2) = nix::unistd::pipe().unwrap();
    let mut program = Program::new(
        "/usr/bin/python3",
        &[
            "python3",
            "-S",
            "-c",
            "import os; os.write(13, b'one'); os.write(14, b'two'); \
             print(sorted(int(f) for f in os.listdir('/proc/self/fd')))",
        ],
        &[("PATH", "/usr/bin")],
        "/",
    )
    .unwrap();
    program.inherit = vec![
        std::os::fd::AsRawFd::as_raw_fd(&w1),
        std::os::fd::AsRawFd::as_raw_fd(&w2),
    ];
    let spec = SandboxSpec {
        rootfs: rootfs_dir(),
        workspace: None,
        workspace_mount: None,
        servers: None,
        skills: None,
        trust: None,
        packages: None,
        program,
        limits: Limits::default(),
        id_mapping: IdMapping::for_current_process(sandbox::idmap::DEFAULT_ROOT_HOST_ID),
        hostname: "codebox".into(),
        policy: sandbox::SecurityPolicy::default_profile().unwrap(),
    };
    let cgroups = sandbox::CgroupManager::discover_host().ok();
    let sb = sandbox::spawn(&spec, cgroups.as_ref()).map_err(|e| format!("{e:#}"))?;
    drop((w1, w2));
    let outcome = sb
        .run_to_completion(&[], &spec.limits, &mut Discard)
        .map_err(|e| format!("{e:#}"))?;
    let read = |fd: std::os::fd::OwnedFd| {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(fd), &mut s).unwrap();
        s
    };
    assert_eq!(read(r1), "one");
    assert_eq!(read(r2), "two");
    let listed = String::from_utf8_lossy(&outcome.stdout.bytes).to_string();
    // 0-2, fd 3, the two inherited, and the directory listing itself.
    assert_eq!(listed.trim(), "[0, 1, 2, 3, 4, 13, 14]", "{listed}");
    Ok(())
}

/// The same programs print the same and end the same on both backends.
fn both_backends_agree() -> Result<(), Failed> {
    if !microvm_available("both_backends_agree") {
        return Ok(());
    }
    let started = Instant::now();
    let cases: &[(&str, &str)] = &[
        (
            "python",
            "import sys\nprint(1)\nprint('é ∑ 🙂', file=sys.stderr)\nsys.exit(3)",
        ),
        ("python", "raise ValueError('boom')"),
        (
            "python",
            "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)",
        ),
        (
            "typescript",
            "console.log(1 + 1); console.error('err'); Deno.exit(4);",
        ),
    ];
    let mut vms = 0;
    for (language, code) in cases {
        let ns = run_json("namespace", language, code, &[]);
        let vm = run_json("microvm", language, code, &[]);
        vms += 1;
        assert_eq!(ns["backend"], "namespace");
        assert_eq!(vm["backend"], "microvm", "{vm:#}");
        for key in ["stdout", "stderr", "exit_code", "signal", "timed_out"] {
            assert_eq!(
                ns[key], vm[key],
                "{language} {code:?}: {key}\n{ns:#}\n{vm:#}"
            );
        }
        // Landlock in the guest: its kernel (6.1) has ABI 3, so no TCP rules and no
        // scopes: partially enforced, and said so.
        assert_eq!(vm["landlock"], "partially_enforced", "{vm:#}");
    }
    cost("both_backends_agree", started, vms);
    Ok(())
}

/// `codebox doctor` says which accelerator a microVM gets here, and why.
fn doctor_names_the_accelerator_and_why() -> Result<(), Failed> {
    if !microvm_available("doctor_names_the_accelerator_and_why") {
        return Ok(());
    }
    let out = Command::new(codebox_bin())
        .args(["doctor", "--json"])
        .env("CODEBOX_ROOTFS", rootfs_dir())
        .env("CODEBOX_GUEST", guest_dir())
        .output()
        .expect("run codebox doctor");
    let report: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let line = |layer: &str| {
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["layer"] == layer)
            .cloned()
            .unwrap_or_else(|| panic!("no {layer} line: {report:#}"))
    };
    assert_eq!(line("microvm guest")["status"], "ok", "{report:#}");
    let accel = line("microvm accelerator");
    let detail = accel["detail"].as_str().unwrap();
    let kvm = detail.starts_with("kvm: a probe booted the guest");
    let tcg = detail.starts_with("tcg: ") && detail.len() > 20;
    assert!(kvm || tcg, "{accel:#}");
    if std::path::Path::new("/dev/kvm").exists() && tcg {
        // Why not KVM is said, not assumed.
        assert!(
            detail.contains("/dev/kvm") || detail.contains("asked for"),
            "{accel:#}"
        );
    }
    Ok(())
}

/// `codebox serve` on the microVM backend refuses to start with what the backend does not
/// do yet (controlled egress), naming it, rather than serve it another way. (What it does
/// serve is tested through the MCP client scripts: `tests/mcp.rs`
/// `results_and_upstream_tools_on_the_microvm_backend`.)
fn serve_refuses_what_the_microvm_backend_cannot_do_yet() -> Result<(), Failed> {
    if !sandbox_available("serve_refuses_what_the_microvm_backend_cannot_do_yet") {
        return Ok(());
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("codebox.toml");
    std::fs::write(
        &config,
        "[network]\nmode = \"proxy\"\nallow = [\"example.org\"]\n",
    )
    .unwrap();
    let out = Command::new(codebox_bin())
        .arg("serve")
        .env("CODEBOX_ROOTFS", rootfs_dir())
        .env("CODEBOX_BACKEND", "microvm")
        .env("CODEBOX_CONFIG", &config)
        .env("CODEBOX_STATE_DIR", dir.path().join("state"))
        .env("CODEBOX_GUEST", guest_dir())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run codebox serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("backend microvm") && err.contains("\"proxy\""),
        "{err}"
    );
    Ok(())
}

/// What a VM could leave behind: QEMU processes, `codebox-*` cgroups below ours, files in
/// /dev/shm, and the mounts this process sees.
#[derive(Debug, PartialEq)]
struct Traces {
    qemu: Vec<u32>,
    cgroups: Vec<PathBuf>,
    shm: Vec<PathBuf>,
    mounts: usize,
}

fn qemu_processes() -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim().starts_with("qemu-system"))
        {
            out.push(pid);
        }
    }
    out
}

thread_local! {
    /// The `codebox` processes this test binary started: their cgroups are
    /// `codebox-<pid>-...` (other tests on the machine make their own).
    static STARTED: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn started(pid: u32) {
    STARTED.with(|s| s.borrow_mut().push(pid));
}

fn ours(name: &str) -> bool {
    let me = std::process::id();
    STARTED.with(|s| {
        s.borrow()
            .iter()
            .chain(std::iter::once(&me))
            .any(|pid| name.starts_with(&format!("codebox-{pid}-")))
    })
}

fn traces() -> Traces {
    let mut cgroups = Vec::new();
    for line in std::fs::read_to_string("/proc/self/cgroup")
        .unwrap()
        .lines()
    {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        let rel = path.trim_start_matches('/');
        let bases: Vec<PathBuf> = if controllers.is_empty() {
            vec!["/sys/fs/cgroup/unified".into(), "/sys/fs/cgroup".into()]
        } else {
            controllers
                .split(',')
                .map(|c| PathBuf::from("/sys/fs/cgroup").join(c.trim_start_matches("name=")))
                .collect()
        };
        for base in bases {
            if let Ok(rd) = std::fs::read_dir(base.join(rel)) {
                for e in rd.flatten() {
                    if ours(&e.file_name().to_string_lossy()) {
                        cgroups.push(e.path());
                    }
                }
            }
        }
    }
    cgroups.sort();
    cgroups.dedup();
    let mut shm: Vec<PathBuf> = std::fs::read_dir("/dev/shm")
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    shm.sort();
    Traces {
        qemu: qemu_processes(),
        cgroups,
        shm,
        mounts: std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .count(),
    }
}

/// Waits (a bounded number of checks) until nothing is left beyond `before`.
fn nothing_left(before: &Traces) {
    let mut now = traces();
    for _ in 0..100 {
        if now == *before {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        now = traces();
    }
    assert_eq!(now, *before, "left behind");
}

/// `codebox run --backend microvm` as a child (output streamed, not JSON), for tests
/// that act on its VM.
fn spawn_run(code: &str, extra: &[&str]) -> std::process::Child {
    Command::new(codebox_bin())
        .args(["run", "--backend", "microvm", "python", "-c", code])
        .args(extra)
        .env("CODEBOX_ROOTFS", rootfs_dir())
        .env("CODEBOX_GUEST", guest_dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .inspect(|c| started(c.id()))
        .expect("start codebox run")
}

/// The QEMU started by process `parent` (its jail's program), once it exists.
fn qemu_of(parent: u32) -> u32 {
    let ppid = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit(')')
            .next()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    for _ in 0..600 {
        for q in qemu_processes() {
            // QEMU → the jail's init → `codebox run`.
            if ppid(q).and_then(ppid) == Some(parent) {
                return q;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("no QEMU below {parent}");
}

/// Waits until the program printed `up` (it streams): the VM is booted and runs it.
fn wait_until_up(child: &mut std::process::Child) -> std::process::ChildStdout {
    use std::io::BufRead;
    let stdout = child.stdout.take().unwrap();
    let mut reader = std::io::BufReader::new(stdout);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line, "up\n");
    reader.into_inner()
}

/// The run's timeout kills the whole VM: the result says timed out, and no QEMU,
/// cgroup, /dev/shm file or mount is left.
fn a_timeout_ends_the_vm_and_leaves_nothing() -> Result<(), Failed> {
    if !microvm_available("a_timeout_ends_the_vm_and_leaves_nothing") {
        return Ok(());
    }
    let started = Instant::now();
    let before = traces();
    let v = run_json(
        "microvm",
        "python",
        "while True: pass",
        &["--timeout", "3s"],
    );
    assert_eq!(v["timed_out"], true, "{v:#}");
    assert_eq!(v["signal"], 9, "{v:#}");
    nothing_left(&before);
    cost("a_timeout_ends_the_vm_and_leaves_nothing", started, 1);
    Ok(())
}

/// A program that fills its memory limit in the guest is OOM-killed there, as in a
/// namespace sandbox: the VM and the host are not affected.
fn the_memory_limit_holds_in_the_guest() -> Result<(), Failed> {
    if !microvm_available("the_memory_limit_holds_in_the_guest") {
        return Ok(());
    }
    let started = Instant::now();
    let before = traces();
    let code = "b = []\nwhile True: b.append(bytearray(16 << 20))";
    let ns = run_json("namespace", "python", code, &["--memory", "96M"]);
    let vm = run_json("microvm", "python", code, &["--memory", "96M"]);
    assert_eq!(ns["oom_killed"], true, "{ns:#}");
    assert_eq!(vm["oom_killed"], true, "{vm:#}");
    assert_eq!(vm["signal"], ns["signal"], "{vm:#}");
    nothing_left(&before);
    cost("the_memory_limit_holds_in_the_guest", started, 1);
    Ok(())
}

/// A VMM that dies under a running program (SIGKILL, as an OOM kill or a crash would) is
/// reported as such, not as the program's end; nothing is left.
fn a_killed_vmm_is_reported_and_leaves_nothing() -> Result<(), Failed> {
    if !microvm_available("a_killed_vmm_is_reported_and_leaves_nothing") {
        return Ok(());
    }
    let started = Instant::now();
    let before = traces();
    let mut child = spawn_run(
        "import time\nprint('up', flush=True)\ntime.sleep(600)",
        &["--timeout", "300s"],
    );
    let qemu = qemu_of(child.id());
    let _stdout = wait_until_up(&mut child);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(qemu as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("the microVM ended"), "{err}");
    nothing_left(&before);
    cost("a_killed_vmm_is_reported_and_leaves_nothing", started, 1);
    Ok(())
}

/// A VMM that hangs (SIGSTOP: no guest output, no exit) is ended by the run's timeout.
fn a_hung_vmm_is_ended_at_the_timeout() -> Result<(), Failed> {
    if !microvm_available("a_hung_vmm_is_ended_at_the_timeout") {
        return Ok(());
    }
    let started = Instant::now();
    let before = traces();
    let mut child = spawn_run(
        "import time\nprint('up', flush=True)\ntime.sleep(600)",
        &["--timeout", "15s"],
    );
    let qemu = qemu_of(child.id());
    let _stdout = wait_until_up(&mut child);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(qemu as i32),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // The run's timeout ends it like any run that outlives it (exit 124, said on stderr).
    assert_eq!(out.status.code(), Some(124), "{err}");
    assert!(err.contains("timed out"), "{err}");
    nothing_left(&before);
    cost("a_hung_vmm_is_ended_at_the_timeout", started, 1);
    Ok(())
}

/// Peak RSS (KiB) of `codebox run --json` of `code` on `backend`, and its result.
fn run_measured(backend: &str, code: &str) -> (u64, Value) {
    let dir = tempfile::tempdir().unwrap();
    let rss = dir.path().join("rss");
    let child = Command::new("/usr/bin/time")
        .arg("-o")
        .arg(&rss)
        .args(["-f", "%M"])
        .arg(codebox_bin())
        .args(["run", "--json", "--backend", backend, "python", "-c", code])
        .env("CODEBOX_ROOTFS", rootfs_dir())
        .env("CODEBOX_GUEST", guest_dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run /usr/bin/time codebox");
    started(child.id() + 1);
    let out = child.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    // The last line: time(1) prefixes "Command exited with non-zero status N".
    let text = std::fs::read_to_string(&rss).unwrap();
    let kib = text
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "time(1) said {text:?}; stderr {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    (kib, v)
}

/// A program that floods stdout with 64 MiB: the result keeps its cap and counts the
/// rest, and the supervising process does not grow with the flood (fixed buffers from
/// the port to the capture); as in a namespace sandbox.
fn a_flood_of_output_is_capped_and_the_host_stays_small() -> Result<(), Failed> {
    if !microvm_available("a_flood_of_output_is_capped_and_the_host_stays_small") {
        return Ok(());
    }
    if !Path::new("/usr/bin/time").exists() {
        eprintln!("SKIP: /usr/bin/time is not installed");
        return Ok(());
    }
    let started_at = Instant::now();
    let code = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(64): sys.stdout.write(chunk)";
    let (ns_kib, ns) = run_measured("namespace", code);
    let (vm_kib, vm) = run_measured("microvm", code);
    for v in [&ns, &vm] {
        let brief = format!(
            "{} truncated {} total {} exit {} timed out {}",
            v["backend"],
            v["stdout_truncated"],
            v["stdout_total_bytes"],
            v["exit_code"],
            v["timed_out"]
        );
        assert_eq!(v["stdout_truncated"], true, "{brief}");
        assert_eq!(v["stdout_total_bytes"], 64u64 << 20, "{brief}");
        assert_eq!(v["exit_code"], 0, "{brief}");
    }
    println!("cost: peak RSS of codebox run: namespace {ns_kib} KiB, microvm {vm_kib} KiB");
    // 64 MiB went through; the microVM's supervisor holds a few buffers more than the
    // namespace backend's, not the flood.
    assert!(vm_kib < ns_kib + 24 * 1024, "{vm_kib} KiB vs {ns_kib} KiB");
    cost(
        "a_flood_of_output_is_capped_and_the_host_stays_small",
        started_at,
        1,
    );
    Ok(())
}

fn main() {
    let mut args = Arguments::from_args();
    // One VM at a time: each is CPU-bound under TCG.
    args.test_threads = Some(1);
    let tests = vec![
        Trial::test(
            "inherited_descriptors_reach_the_program",
            inherited_descriptors_reach_the_program,
        ),
        Trial::test("both_backends_agree", both_backends_agree),
        Trial::test(
            "escapes_are_refused_in_the_guest_as_on_the_host",
            escapes::escapes_are_refused_in_the_guest_as_on_the_host,
        ),
        Trial::test(
            "doctor_names_the_accelerator_and_why",
            doctor_names_the_accelerator_and_why,
        ),
        Trial::test(
            "serve_refuses_what_the_microvm_backend_cannot_do_yet",
            serve_refuses_what_the_microvm_backend_cannot_do_yet,
        ),
        Trial::test(
            "a_timeout_ends_the_vm_and_leaves_nothing",
            a_timeout_ends_the_vm_and_leaves_nothing,
        ),
        Trial::test(
            "the_memory_limit_holds_in_the_guest",
            the_memory_limit_holds_in_the_guest,
        ),
        Trial::test(
            "a_killed_vmm_is_reported_and_leaves_nothing",
            a_killed_vmm_is_reported_and_leaves_nothing,
        ),
        Trial::test(
            "a_hung_vmm_is_ended_at_the_timeout",
            a_hung_vmm_is_ended_at_the_timeout,
        ),
        Trial::test(
            "a_flood_of_output_is_capped_and_the_host_stays_small",
            a_flood_of_output_is_capped_and_the_host_stays_small,
        ),
        Trial::test(
            "kernel_stage_clones_share_no_randomness",
            clones::kernel_stage_clones_share_no_randomness,
        ),
        Trial::test(
            "interpreter_stage_clones_share_only_what_is_documented",
            clones::interpreter_stage_clones_share_only_what_is_documented,
        ),
    ];
    libtest_mimic::run(&args, tests).exit();
}
