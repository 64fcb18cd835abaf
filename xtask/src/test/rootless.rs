//! The rootless pass: the integration tests again, as an unprivileged user.
//!
//! Root creates the user `codebox-test` if needed, builds the test binaries, and runs each
//! integration-test binary as that user with `runuser`. When the checkout is not readable
//! by that user (a clone under /root, say), the binaries and the rootfs are staged in a
//! world-readable temporary directory first.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::{cargo_command, run_checked};

pub const USER: &str = "codebox-test";
/// In `extra_env`: not passed on, but given to each binary as its test-name filter.
pub const TEST_FILTER: &str = "CODEBOX_ROOTLESS_TEST_FILTER";

/// Runs every integration-test binary as [`USER`], or those whose file name contains
/// `only`.
pub fn run(
    root: &Path,
    rootfs: &Path,
    pydeps: &Path,
    upstreams: &Path,
    only: Option<&str>,
    extra_env: &[(&str, &str)],
) -> Result<()> {
    ensure_user()?;
    let home = PathBuf::from(format!("/home/{USER}"));
    let mut binaries = integration_test_binaries(root)?;
    if let Some(name) = only {
        binaries.retain(|b| {
            b.file_name()
                .is_some_and(|f| f.to_string_lossy().contains(name))
        });
        if binaries.is_empty() {
            bail!("no integration-test binary's name contains {name:?}");
        }
    }
    let codebox = root.join("target/debug/codebox");
    let mut paths: Vec<PathBuf> = binaries.clone();
    paths.push(codebox.clone());
    paths.push(rootfs.join(".manifest"));
    paths.push(pydeps.join("mcp/__init__.py"));
    paths.push(root.join("tests/mcp/stdio_client.py"));
    paths.push(upstreams.join("node/package.json"));
    let staged = if paths.iter().all(|p| readable_by_user(p)) {
        None
    } else {
        Some(Staging::new(
            &binaries,
            &codebox,
            rootfs,
            pydeps,
            &root.join("tests/mcp"),
            upstreams,
        )?)
    };
    let (binaries, codebox, rootfs, pydeps, mcp_dir, upstreams) = match &staged {
        Some(s) => (
            s.binaries.clone(),
            s.codebox.clone(),
            s.rootfs.clone(),
            s.dir.join("mcp-pydeps"),
            s.dir.join("mcp-tests"),
            s.dir.join("upstreams"),
        ),
        None => (
            binaries,
            codebox,
            rootfs.to_path_buf(),
            pydeps.to_path_buf(),
            root.join("tests/mcp"),
            upstreams.to_path_buf(),
        ),
    };
    let (uid, gid) = user_ids()?;
    let delegation =
        super::delegate::Delegation::create(&format!("codebox-delegated-{USER}"), uid, gid)?;
    let mut failed = Vec::new();
    for bin in &binaries {
        println!("--- {} (as {USER})", bin.display());
        let mut cmd = Command::new("runuser");
        delegation.enter_on_exec(&mut cmd)?;
        let status = cmd
            .args(["-u", USER, "--"])
            .arg("env")
            .arg("-i")
            .arg(format!("HOME={}", home.display()))
            .arg("PATH=/usr/local/bin:/usr/bin:/bin")
            .arg("CODEBOX_TEST_STRICT=1")
            .arg(format!("CODEBOX_ROOTFS={}", rootfs.display()))
            .arg(format!("CODEBOX_BIN={}", codebox.display()))
            .arg(format!("CODEBOX_TEST_PYDEPS={}", pydeps.display()))
            .arg(format!("CODEBOX_TEST_MCP_DIR={}", mcp_dir.display()))
            .arg(format!("CODEBOX_TEST_UPSTREAMS={}", upstreams.display()))
            .args(
                extra_env
                    .iter()
                    .filter(|(k, _)| *k != TEST_FILTER)
                    .map(|(k, v)| format!("{k}={v}")),
            )
            .arg(bin)
            .args(
                extra_env
                    .iter()
                    .filter(|(k, _)| *k == TEST_FILTER)
                    .map(|(_, v)| *v),
            )
            .current_dir("/")
            .status()
            .context("cannot start runuser")?;
        if !status.success() {
            failed.push(bin.display().to_string());
        }
    }
    if !failed.is_empty() {
        bail!("rootless integration tests failed: {}", failed.join(", "));
    }
    Ok(())
}

pub fn user_ids() -> Result<(u32, u32)> {
    let id = |flag: &str| -> Result<u32> {
        let out = Command::new("id").args([flag, USER]).output()?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .with_context(|| format!("id {flag} {USER}"))
    };
    Ok((id("-u")?, id("-g")?))
}

pub fn ensure_user() -> Result<()> {
    let exists = Command::new("id")
        .arg(USER)
        .output()
        .is_ok_and(|o| o.status.success());
    if !exists {
        run_checked(
            Command::new("useradd").args(["--create-home", "--shell", "/bin/sh", USER]),
            "useradd",
        )?;
    }
    Ok(())
}

fn readable_by_user(path: &Path) -> bool {
    Command::new("runuser")
        .args(["-u", USER, "--", "test", "-r"])
        .arg(path)
        .status()
        .is_ok_and(|s| s.success())
}

/// Paths of the package's integration-test executables (`cargo test --no-run`).
fn integration_test_binaries(root: &Path) -> Result<Vec<PathBuf>> {
    let out = cargo_command(
        root,
        &[
            "test",
            "--package",
            "codebox",
            "--tests",
            "--no-run",
            "--message-format=json",
        ],
    )
    .output()
    .context("cannot run cargo test --no-run")?;
    if !out.status.success() {
        bail!(
            "cargo test --no-run failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut bins = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // Only integration tests (target kind "test"); unit tests need no kernel features.
        if !line.contains("\"reason\":\"compiler-artifact\"")
            || !line.contains("\"kind\":[\"test\"]")
        {
            continue;
        }
        if let Some(exe) = json_string_field(line, "executable") {
            bins.push(PathBuf::from(exe));
        }
    }
    if bins.is_empty() {
        bail!("no integration-test binaries found");
    }
    bins.sort();
    Ok(bins)
}

/// The string value of `"field":"..."` in one line of cargo's JSON (paths hold no quotes).
fn json_string_field(line: &str, field: &str) -> Option<String> {
    let key = format!("\"{field}\":\"");
    let start = line.find(&key)? + key.len();
    let end = line[start..].find('"')? + start;
    Some(line[start..end].replace("\\\\", "\\"))
}

/// Copies of the binaries and the rootfs where the test user can read them.
struct Staging {
    dir: PathBuf,
    binaries: Vec<PathBuf>,
    codebox: PathBuf,
    rootfs: PathBuf,
}

impl Staging {
    fn new(
        binaries: &[PathBuf],
        codebox: &Path,
        rootfs: &Path,
        pydeps: &Path,
        mcp_tests: &Path,
        upstreams: &Path,
    ) -> Result<Staging> {
        let dir = std::env::temp_dir().join(format!("codebox-rootless-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        println!("staging binaries and rootfs in {}", dir.display());
        run_checked(
            Command::new("chmod").arg("755").arg(&dir),
            "chmod staging dir",
        )?;
        let mut staged = Vec::new();
        for b in binaries
            .iter()
            .chain(std::iter::once(&codebox.to_path_buf()))
        {
            let to = dir.join(b.file_name().expect("binary has a name"));
            std::fs::copy(b, &to).with_context(|| format!("copying {}", b.display()))?;
            staged.push(to);
        }
        let codebox = staged.pop().expect("codebox staged");
        let to = dir.join("rootfs");
        run_checked(
            Command::new("cp").arg("-a").arg(rootfs).arg(&to),
            "copying the rootfs",
        )?;
        for (from, name) in [
            (pydeps, "mcp-pydeps"),
            (mcp_tests, "mcp-tests"),
            (upstreams, "upstreams"),
        ] {
            run_checked(
                Command::new("cp").arg("-a").arg(from).arg(dir.join(name)),
                &format!("copying {name}"),
            )?;
        }
        // The README's quick start is a test too (tests/mcp/readme_client.py): it goes
        // beside the client scripts, where tests/mcp.rs looks first.
        let readme = mcp_tests.join("../../README.md");
        run_checked(
            Command::new("cp")
                .arg(&readme)
                .arg(dir.join("mcp-tests/README.md")),
            "copying README.md",
        )?;
        run_checked(
            Command::new("chmod").args(["-R", "a+rX"]).arg(&dir),
            "making the staging dir readable",
        )?;
        Ok(Staging {
            dir,
            binaries: staged,
            codebox,
            rootfs: to,
        })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
