//! The two peers of `cargo xtask bench-sdk`, installed into target/bench-peers at bench
//! time from their public source; nothing of either is kept in this repository.
//!
//! - pydantic's **mcp-run-python** (PyPI, pinned) runs Python in Pyodide inside Deno, every
//!   call in one long-lived interpreter. On a machine that reaches only the package
//!   registries it cannot start as published: `benches/peers/mrp_offline.py` patches the
//!   installed copy (see there: an import-map stand-in for JSR's `@std/cli`, Pyodide's
//!   wheels from PyPI, a `pydantic_core` stand-in used only for return values).
//! - **code-executor-mcp** (not on npm at this version) runs each TypeScript call in a fresh
//!   Deno process. Its source is the pinned commit of its public repository, cloned (or
//!   taken from `--code-executor-src`, a local clone or mirror), exported with `git archive`,
//!   its dependencies installed with `npm ci` from its lock file (install scripts off), and
//!   compiled with its own `tsc`. At v1.0.5 its type check fails on one of its own files
//!   (`src/cli/daily-sync.ts`, not on the execution path); `tsc` still emits, and the
//!   emitted server is what runs (the warning is printed).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::test::host;

/// mcp-run-python and the Deno both peers run, pinned: a new version is taken on purpose.
const RUN_PYTHON: &str = "mcp-run-python==0.0.22";
const DENO: &str = "deno==2.9.8";

/// code-executor-mcp: its public repository and the commit of its v1.0.5 release.
const CODE_EXECUTOR_REPO: &str = "https://github.com/aberemia24/code-executor-MCP";
pub const CODE_EXECUTOR_COMMIT: &str = "9421b827dd26de8b441f7c60783f5d61578b2eb2";

/// An installed mcp-run-python: its `--target` directory, the deno it runs, its Deno cache.
pub struct RunPython {
    pub dir: PathBuf,
    pub deno: PathBuf,
    pub deno_dir: PathBuf,
}

/// A built code-executor-mcp: its directory (`dist/index.js` inside) and the deno it runs.
pub struct CodeExecutor {
    pub dir: PathBuf,
    pub deno: PathBuf,
}

fn peers_dir(root: &Path) -> PathBuf {
    root.join("target/bench-peers")
}

/// The Deno both peers run (pip `deno`, the same as the rootfs's).
fn deno(root: &Path) -> Result<PathBuf> {
    let dir = peers_dir(root).join("deno");
    host::pip_install_into(&dir, DENO, "bin/deno")?;
    Ok(dir.join("bin/deno"))
}

/// Installs mcp-run-python (once) and patches it to start offline (every time: the patch
/// is idempotent and checks its own steps).
pub fn mcp_run_python(root: &Path) -> Result<RunPython> {
    let dir = peers_dir(root).join("mcp-run-python");
    host::pip_install_into(&dir, RUN_PYTHON, "mcp_run_python/__init__.py")?;
    let deno = deno(root)?;
    let deno_dir = peers_dir(root).join("deno-dir");
    crate::test::run_checked(
        Command::new("python3")
            .arg(root.join("benches/peers/mrp_offline.py"))
            .arg(&dir)
            .arg(&deno)
            .arg(&deno_dir),
        "benches/peers/mrp_offline.py (mcp-run-python offline)",
    )?;
    Ok(RunPython {
        dir,
        deno,
        deno_dir,
    })
}

/// Builds code-executor-mcp at [`CODE_EXECUTOR_COMMIT`] into
/// target/bench-peers/code-executor-mcp (once per commit: a stamp file says which).
pub fn code_executor_mcp(root: &Path, source: Option<&Path>) -> Result<CodeExecutor> {
    let deno = deno(root)?;
    let dir = peers_dir(root).join("code-executor-mcp");
    let stamp = dir.join(".codebox-built");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == CODE_EXECUTOR_COMMIT) {
        println!("present: {}", dir.display());
        return Ok(CodeExecutor { dir, deno });
    }
    let git_dir = match source {
        Some(src) => src.to_path_buf(),
        None => clone(&peers_dir(root).join("code-executor-mcp.git"))?,
    };
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    export(&git_dir, &dir)?;
    crate::test::run_checked(
        Command::new("npm")
            .args([
                "ci",
                "--ignore-scripts",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
            ])
            .current_dir(&dir),
        "npm ci (code-executor-mcp's dependencies, from its package-lock.json)",
    )?;
    let tsc = Command::new(dir.join("node_modules/.bin/tsc"))
        .current_dir(&dir)
        .output()
        .context("running code-executor-mcp's tsc")?;
    if !dir.join("dist/index.js").is_file() {
        bail!(
            "code-executor-mcp's tsc emitted no dist/index.js ({}):\n{}",
            tsc.status,
            String::from_utf8_lossy(&tsc.stdout)
        );
    }
    if !tsc.status.success() {
        println!(
            "note: code-executor-mcp's own type check fails at {} (tsc still emitted the server, which is what runs):\n{}",
            &CODE_EXECUTOR_COMMIT[..7],
            String::from_utf8_lossy(&tsc.stdout).trim_end()
        );
    }
    // Its configuration lookup: an MCP client's config file in $HOME (no upstream servers).
    let home = dir.join("bench-home");
    std::fs::create_dir_all(&home)?;
    std::fs::write(home.join(".claude.json"), "{\"mcpServers\":{}}\n")?;
    std::fs::write(&stamp, format!("{CODE_EXECUTOR_COMMIT}\n"))?;
    Ok(CodeExecutor { dir, deno })
}

/// A blob-less clone of the public repository (or the one already there), fetched again
/// when it lacks the pinned commit.
fn clone(git_dir: &Path) -> Result<PathBuf> {
    if !git_dir.exists() {
        crate::test::run_checked(
            Command::new("git")
                .args(["clone", "--bare", "--filter=blob:none", CODE_EXECUTOR_REPO])
                .arg(git_dir),
            &format!("git clone {CODE_EXECUTOR_REPO} (code-executor-mcp's public source)"),
        )?;
    } else if !has_commit(git_dir) {
        crate::test::run_checked(
            Command::new("git").arg("-C").arg(git_dir).args([
                "fetch",
                "--filter=blob:none",
                "origin",
            ]),
            "git fetch (code-executor-mcp)",
        )?;
    }
    Ok(git_dir.to_path_buf())
}

fn has_commit(git_dir: &Path) -> bool {
    Command::new("git")
        .arg("-C")
        .arg(git_dir)
        .args([
            "cat-file",
            "-e",
            &format!("{CODE_EXECUTOR_COMMIT}^{{commit}}"),
        ])
        .status()
        .is_ok_and(|s| s.success())
}

/// The pinned commit's tree into `dir` (`git archive | tar -x`).
fn export(git_dir: &Path, dir: &Path) -> Result<()> {
    if !has_commit(git_dir) {
        bail!(
            "{} does not hold code-executor-mcp's commit {CODE_EXECUTOR_COMMIT}",
            git_dir.display()
        );
    }
    let archive = Command::new("git")
        .arg("-C")
        .arg(git_dir)
        .args(["archive", "--format=tar", CODE_EXECUTOR_COMMIT])
        .output()
        .context("running git archive")?;
    if !archive.status.success() {
        bail!(
            "git archive {CODE_EXECUTOR_COMMIT} failed: {}",
            String::from_utf8_lossy(&archive.stderr)
        );
    }
    let mut tar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(dir)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .context("running tar")?;
    use std::io::Write;
    tar.stdin
        .take()
        .context("tar's stdin")?
        .write_all(&archive.stdout)?;
    let status = tar.wait()?;
    if !status.success() {
        bail!("unpacking code-executor-mcp's source failed ({status})");
    }
    Ok(())
}
