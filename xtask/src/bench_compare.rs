//! `cargo xtask bench-compare`: start-up latency, side by side, in one run.
//!
//! Alternates, round-robin on the same machine, per language:
//! - the bare interpreter (`python3 -S -c pass`, `deno eval ''`);
//! - the same under `bwrap --unshare-all` (a peer sandbox);
//! - the same under `codebox exec` (every codebox layer, the same program: the
//!   apples-to-apples cold sandbox), when this build has `exec`;
//! - `codebox run` (a cold sandbox with every layer and codebox's runtime);
//! - an MCP `tools/call` `print(1)` round trip on stdio against a long-running
//!   `codebox serve --pool-size 0` ("serve cold") and `--pool-size 2` ("pooled"), timed
//!   from writing the request to reading the response, each result checked.
//!
//! All in one run, so slow phases of the machine hit all of them alike. Prints median, p90
//! and p99, each row's ratio to and distance from its bare interpreter, and how many
//! pooled calls got a warm sandbox. Installs bubblewrap if missing (as root).

mod report;
mod rows;

use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::bench::mcp::{self, Outcome};
use crate::bench::server::Server;
use rows::{Probe, Row};

const HELP: &str = "\
cargo xtask bench-compare [--runs N] [--no-build]

Times, alternating in one run, per language: the bare interpreter, the same under
`bwrap --unshare-all`, under `codebox exec`, `codebox run`, and an MCP tools/call
print(1) round trip against `codebox serve` with the warm pool off (serve cold) and on
(pooled, --pool-size 2). Builds codebox in release mode and the rootfs first.

  --runs N     measured rounds (default 100), after one warm-up round
  --no-build   use the existing target/release/codebox and target/rootfs
";

pub fn run(args: &[OsString]) -> Result<()> {
    let mut runs = 100usize;
    let mut build = true;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("--runs") => {
                runs = it
                    .next()
                    .and_then(|v| v.to_str()?.parse().ok())
                    .filter(|n| *n > 0)
                    .context("--runs needs a positive number")?
            }
            Some("--no-build") => build = false,
            Some("-h" | "--help") => {
                print!("{HELP}");
                return Ok(());
            }
            _ => bail!("unknown option {a:?}; see `cargo xtask bench-compare --help`"),
        }
    }
    let (codebox, rootfs) = crate::bench::prepare(build)?;
    ensure_bwrap()?;
    let denodir = std::env::temp_dir().join(format!("codebox-bench-deno-{}", std::process::id()));
    let env = [
        ("DENO_DIR", denodir.as_os_str()),
        ("CODEBOX_ROOTFS", rootfs.as_os_str()),
    ];
    let mut servers: Vec<Server> = Vec::new();
    let result = (|| {
        let (mut rows, notes) = rows::build(&codebox, &rootfs, &env, &mut servers)?;
        measure(&mut rows, &mut servers, &env, runs)?;
        report::print(&rows, &notes, runs);
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&denodir);
    let mut stopped = Ok(());
    for s in servers {
        let pid = s.pid();
        stopped = stopped.and(s.stop().with_context(|| format!("stopping server {pid}")));
    }
    result.and(stopped)
}

/// One warm-up round, then `runs` measured rounds, every row once per round.
fn measure(
    rows: &mut [Row],
    servers: &mut [Server],
    env: &[(&str, &std::ffi::OsStr)],
    runs: usize,
) -> Result<()> {
    for round in 0..=runs {
        for row in rows.iter_mut() {
            let (ms, start) = match &row.probe {
                Probe::Process(argv) => (time_process(argv, env, &row.name)?, None),
                Probe::Mcp { server, lang } => {
                    let session = servers[*server]
                        .stdio()
                        .context("an MCP row needs a stdio server")?;
                    match mcp::execute_print_one(session, *lang)
                        .with_context(|| row.name.clone())?
                    {
                        (Outcome::Ok { start }, ms) => (ms, start),
                        (Outcome::Busy(m), _) => bail!("{}: refused: {m}", row.name),
                    }
                }
            };
            if round > 0 {
                row.samples.push(ms);
                *row.starts.entry(start.unwrap_or_default()).or_default() += 1;
            }
        }
    }
    Ok(())
}

/// Wall time of one run of `argv` in ms; a failure fails the benchmark.
fn time_process(argv: &[OsString], env: &[(&str, &std::ffi::OsStr)], name: &str) -> Result<f64> {
    let started = Instant::now();
    let status = Command::new(&argv[0])
        .args(&argv[1..])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .with_context(|| format!("cannot start {name}"))?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    if !status.success() {
        bail!("{name} failed: {status}");
    }
    Ok(ms)
}

fn ensure_bwrap() -> Result<()> {
    if Command::new("bwrap")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(());
    }
    if !crate::test::is_root() {
        bail!("bubblewrap is missing: install it with `sudo apt-get install bubblewrap`");
    }
    crate::test::run_checked(
        Command::new("apt-get").args(["update", "-q"]),
        "apt-get update",
    )?;
    crate::test::run_checked(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "bubblewrap"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
        "apt-get install bubblewrap",
    )
}
