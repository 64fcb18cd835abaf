//! The declaration scanner of keep-alive TypeScript sessions (`src/runtime/deno/scope.js`):
//! runs its Deno tests (`src/runtime/tests/scope_test.js`) with the first deno binary
//! found — `$DENO`, the rootfs's, or one on PATH — or prints why it is skipped (a failure
//! under `CODEBOX_TEST_STRICT=1`).

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

fn runs(deno: &Path) -> bool {
    Command::new(deno)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn find_deno() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("DENO")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.push(rootfs_dir().join("usr/bin/deno"));
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("deno")));
    }
    candidates.into_iter().find(|c| c.is_file() && runs(c))
}

#[test]
fn scope_scanner_deno_tests() {
    let Some(deno) = find_deno() else {
        let why = "no deno binary ($DENO, the rootfs's usr/bin/deno, PATH)";
        assert!(!strict(), "scope_scanner_deno_tests: {why}");
        eprintln!("SKIP scope_scanner_deno_tests: {why}");
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cache = tempfile::tempdir().unwrap();
    let out = Command::new(&deno)
        .args([
            "test",
            "--no-config",
            "--no-lock",
            "--allow-read",
            "--allow-write",
        ])
        .arg(root.join("src/runtime/tests/scope_test.js"))
        .arg(root.join("src/runtime/tests/value_test.js"))
        .env("DENO_DIR", cache.path())
        .env("NO_COLOR", "1")
        .env("DENO_NO_UPDATE_CHECK", "1")
        .env("DENO_NO_PROMPT", "1")
        .output()
        .expect("deno starts");
    let report = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "deno test ({}) failed:\n{report}",
        deno.display()
    );
    assert!(report.contains(" passed"), "{report}");
}
