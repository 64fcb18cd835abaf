//! Shared helpers for the integration tests: they run the real `codebox` binary against
//! the real kernel and the real rootfs.
//!
//! A test that needs something the host lacks (the rootfs, user namespaces) prints why and
//! returns early, unless `CODEBOX_TEST_STRICT=1` (set by `cargo xtask test` and CI), where
//! a missing feature is a failure.

#![allow(dead_code)]

pub mod fixtures;
pub mod guest;
pub mod pooled;
pub mod serve_stdio;
pub mod spawner_harness;

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

pub fn strict() -> bool {
    std::env::var_os("CODEBOX_TEST_STRICT").is_some_and(|v| v == "1")
}

/// The `codebox` binary (overridable for runs as another user).
pub fn codebox_bin() -> PathBuf {
    std::env::var_os("CODEBOX_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_codebox")))
}

/// Copies an executable to `to` through `cp`, never through a descriptor of this
/// process: a test thread that forks while this process holds the copy open for writing
/// hands that descriptor to its child until the child's exec, and exec of the copy fails
/// meanwhile with ETXTBSY ("Text file busy"; seen in CI's rootless pass).
pub fn copy_executable(from: &std::path::Path, to: &std::path::Path) {
    let status = Command::new("cp")
        .arg("--")
        .arg(from)
        .arg(to)
        .status()
        .expect("run cp");
    assert!(
        status.success(),
        "cp {} {}: {status}",
        from.display(),
        to.display()
    );
}

pub fn rootfs_dir() -> PathBuf {
    std::env::var_os("CODEBOX_ROOTFS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/rootfs"))
}

/// Whether sandbox tests can run here; prints the reason when they cannot.
pub fn sandbox_available(test: &str) -> bool {
    let reason = if !rootfs_dir().join(".manifest").exists() {
        Some(format!(
            "no rootfs at {} (run `cargo xtask rootfs`)",
            rootfs_dir().display()
        ))
    } else if std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .is_ok_and(|s| s.trim() == "0")
    {
        Some("user namespaces are disabled (user.max_user_namespaces = 0)".into())
    } else {
        cgroup_problem()
    };
    match reason {
        None => true,
        Some(r) if strict() => panic!("{test}: required feature missing: {r}"),
        Some(r) => {
            eprintln!("SKIP {test}: {r}");
            false
        }
    }
}

/// Whether this process may create the cgroups the default profile's limits need (as
/// root, or rootless inside a delegated cgroup); probed once per test binary.
fn cgroup_problem() -> Option<String> {
    static PROBE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    PROBE
        .get_or_init(|| {
            let out = codebox(&["run", "python", "-c", "pass"]);
            let err = String::from_utf8_lossy(&out.stderr);
            // A run that worked says nothing against the host's cgroups, whatever it
            // logged (e.g. a stale cleanup racing another supervisor's own).
            (!out.status.success() && err.contains("cgroup")).then(|| {
                format!(
                    "no writable cgroup for the limits (delegate one, see the book, docs/src/operations/service.md, \"Running rootless\"): {}",
                    err.trim()
                )
            })
        })
        .clone()
}

/// `codebox run` with the given arguments.
pub fn codebox(args: &[&str]) -> Output {
    Command::new(codebox_bin())
        .args(args)
        .env("CODEBOX_ROOTFS", rootfs_dir())
        .output()
        .expect("codebox runs")
}

/// Whether this run of the suite forks its Python sandboxes from a zygote
/// (`CODEBOX_TEST_ZYGOTE=1`: `cargo xtask test` runs the escape and isolation suites a
/// second time so).
pub fn zygote_run() -> bool {
    std::env::var_os("CODEBOX_TEST_ZYGOTE").is_some_and(|v| v == "1")
}

/// `codebox run --json LANG -c CODE [extra]`, parsed. In a zygote run ([`zygote_run`]),
/// a Python sandbox a zygote can serve (no host workspace, no egress proxy) is forked
/// from one, and the result must say so.
pub fn run_json(lang: &str, code: &str, extra: &[&str]) -> Value {
    let mut args = vec!["run", "--json", lang];
    let forked = zygote_run()
        && lang == "python"
        && !extra
            .iter()
            .any(|a| *a == "--workspace" || a.starts_with("--allow-"));
    if forked {
        args.push("--zygote");
    }
    args.extend_from_slice(extra);
    args.extend_from_slice(&["-c", code]);
    let out = codebox(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON from codebox ({e}); status {:?}\nstdout: {stdout}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    });
    if forked {
        assert_eq!(v["zygote"], true, "not forked from the zygote: {v:#}");
    }
    v
}

/// Runs Python and asserts it exited 0; returns stdout.
pub fn python_ok(code: &str) -> String {
    let v = run_json("python", code, &[]);
    assert_eq!(v["exit_code"], 0, "program failed: {v:#}");
    v["stdout"].as_str().unwrap().to_string()
}

/// Host processes (uid, pid) that live in a pid namespace other than ours and belong to
/// the uid the sandbox user maps to: a sandbox process that survived its run.
pub fn foreign_sandbox_processes() -> Vec<(u32, i32)> {
    let me = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let sandbox_uid = if nix::unistd::geteuid().is_root() {
        65534
    } else {
        nix::unistd::geteuid().as_raw()
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(ns) = std::fs::read_link(entry.path().join("ns/pid")) else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next()?.parse::<u32>().ok());
        if ns != me && uid == Some(sandbox_uid) {
            found.push((sandbox_uid, pid));
        }
    }
    found
}

/// Waits (up to 15 s) until no sandbox process is left on the host. Tests run in
/// parallel, so another test's sandbox may be alive for a moment; a leaked one stays.
pub fn assert_no_sandbox_process_remains() {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let left = foreign_sandbox_processes();
        if left.is_empty() {
            return;
        }
        if std::time::Instant::now() > deadline {
            panic!("sandbox processes left behind: {left:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Host processes whose command line contains `marker`.
pub fn processes_with_marker(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == std::process::id() as i32 {
            continue;
        }
        if let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) {
            if String::from_utf8_lossy(&cmd).contains(marker) {
                found.push(pid);
            }
        }
    }
    found
}

/// A unique marker for this test process and call site.
pub fn marker(tag: &str) -> String {
    format!("codebox-marker-{}-{tag}", std::process::id())
}

/// Sandbox cgroups (`codebox-<supervisor pid>-…`) whose supervisor pid passes `which`,
/// below this process's own cgroups: the `codebox` processes this test starts create
/// theirs there. Other processes' cgroups are none of its business.
pub fn sandbox_cgroups(which: impl Fn(i32) -> bool) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack: Vec<std::path::PathBuf> =
        match codebox::sandbox::cgroup::CgroupManager::discover_host() {
            Ok(m) => m.hierarchies().into_iter().map(|h| h.base).collect(),
            Err(e) => panic!("cannot find this process's cgroups: {e}"),
        };
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("codebox-")
                    && !name.starts_with("codebox-delegated")
                    && !name.starts_with("codebox-supervisor")
                {
                    let pid: Option<i32> = name.split('-').nth(1).and_then(|p| p.parse().ok());
                    if pid.is_some_and(&which) {
                        found.push(e.path().display().to_string());
                    }
                }
                stack.push(e.path());
            }
        }
    }
    found
}
