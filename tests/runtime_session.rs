//! Keep-alive sessions in the runtime files (`src/runtime/python/boot.py`,
//! `src/runtime/deno/boot.js` and `session.js`), end to end but without the supervisor:
//! `tests/runtime/session_harness.py` runs the rootfs's interpreters chrooted into the
//! rootfs inside `unshare -rm`, speaks the fd-3 session protocol to them and checks state,
//! errors, files, tool calls and exits. Skipped (a failure under `CODEBOX_TEST_STRICT=1`)
//! without a rootfs or user namespaces.

use std::path::{Path, PathBuf};
use std::process::Command;

fn strict() -> bool {
    std::env::var_os("CODEBOX_TEST_STRICT").is_some_and(|v| v == "1")
}

fn rootfs_dir() -> PathBuf {
    std::env::var_os("CODEBOX_ROOTFS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/rootfs"))
}

fn skip(test: &str, why: &str) {
    assert!(!strict(), "{test}: required feature missing: {why}");
    eprintln!("SKIP {test}: {why}");
}

fn harness(test: &str, language: &str) {
    let rootfs = rootfs_dir();
    if !rootfs.join(".manifest").exists() {
        return skip(
            test,
            &format!(
                "no rootfs at {} (run `cargo xtask rootfs`)",
                rootfs.display()
            ),
        );
    }
    // Debian's python3 (ctypes for the mounts), as tests/mcp.rs prefers it.
    let python = ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|p| !p.starts_with('/') || Path::new(p).exists())
        .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/runtime/session_harness.py");
    let out = Command::new(python)
        .arg(&script)
        .arg(&rootfs)
        .arg(language)
        .output()
        .expect("python3 starts");
    let report = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    match out.status.code() {
        Some(0) => println!("{report}"),
        Some(77) => skip(test, report.trim()),
        _ => panic!("{test}: session harness failed ({}):\n{report}", out.status),
    }
}

#[test]
fn python_session() {
    harness("python_session", "python");
}

#[test]
fn typescript_session() {
    harness("typescript_session", "typescript");
}
