//! `cargo xtask bench-sdk`: what a tool call costs as the official Python MCP SDK sees it
//! over stdio, over the client's own floor, warm and in back-to-back bursts, side by side
//! with two peers: pydantic's mcp-run-python (Python in Pyodide) and code-executor-mcp
//! (TypeScript in a fresh Deno per call).
//!
//! A command of its own rather than a flag of `bench-compare`: that one is a Rust client
//! timing raw JSON-RPC next to bare processes; this one is a Python script
//! (`benches/sdk_latency.py`) driving the SDK, with its own installs (the SDK into
//! target/mcp-pydeps as `xtask test` does, the peers and their Deno into
//! target/bench-peers). Neither peer's code is kept in this repository: both are fetched
//! and built here, at bench time, from their public source (`peers.rs`).
//!
//! The procedure: build (codebox release, rootfs) unless `--no-build`, install the SDK,
//! install the peers unless `--no-peer` (a failed install is reported in the table, the
//! rest still runs), then run the script with Debian's python3.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::test::host;

mod peers;

const HELP: &str = "\
cargo xtask bench-sdk [options]

Client-side latency over stdio with the official Python MCP SDK, in one run with rounds
shuffled between servers: the client's floor (a no-op tool on a trivial SDK server),
codebox warm execute_python print(1) and execute_typescript console.log(1), back-to-back
bursts (warm/cold pattern, % warm), and pydantic's mcp-run-python as a peer when it can
be installed and run here (else the table says why). Medians and p99 over the floor.
Builds codebox in release mode and the rootfs first; installs the SDK into
target/mcp-pydeps and the peer into target/bench-peers.

  --rounds N       shuffled rounds (default 10), after 3 warm-up rounds
  --samples N      calls per case and round (default 10)
  --bursts N       bursts per language (default 5)
  --burst-size N   calls per burst, no pause between them (default 20)
  --pool-size N    codebox's warm pool per language (default 2)
  --no-peer        install and run neither peer
  --code-executor-src DIR
                   take code-executor-mcp's source from the git repository DIR (a
                   clone or a bare mirror holding the pinned commit) instead of
                   cloning it from its public repository
  --microvm        also measure the two codebox calls on a microVM-backend server (one
                   warm clone per language), its guest built for the release binary
                   into target/guest-release (`cargo xtask guest`)
  --no-build       use the existing target/release/codebox and target/rootfs
";

/// What to run, from the command line.
#[derive(Debug, PartialEq, Eq)]
struct Options {
    /// `(flag, value)` passed on to the script, in order.
    counts: Vec<(&'static str, usize)>,
    peer: bool,
    build: bool,
    microvm: bool,
    /// Where code-executor-mcp's git history is, instead of its public repository.
    code_executor_src: Option<PathBuf>,
}

fn parse(args: &[OsString]) -> Result<Option<Options>> {
    const COUNTS: [&str; 5] = [
        "--rounds",
        "--samples",
        "--bursts",
        "--burst-size",
        "--pool-size",
    ];
    let mut o = Options {
        counts: Vec::new(),
        peer: true,
        build: true,
        microvm: false,
        code_executor_src: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let a = a.to_str().unwrap_or("<not UTF-8>");
        match a {
            "--no-peer" => o.peer = false,
            "--no-build" => o.build = false,
            "--microvm" => o.microvm = true,
            "--code-executor-src" => {
                let dir = it.next().context("--code-executor-src needs a directory")?;
                o.code_executor_src = Some(PathBuf::from(dir));
            }
            "-h" | "--help" => return Ok(None),
            _ => {
                let Some(flag) = COUNTS.iter().find(|f| **f == a) else {
                    bail!("unknown option {a:?}; see `cargo xtask bench-sdk --help`");
                };
                let n = it
                    .next()
                    .and_then(|v| v.to_str()?.parse().ok())
                    .filter(|n: &usize| *n > 0)
                    .with_context(|| format!("{flag} needs a positive number"))?;
                o.counts.retain(|(f, _)| f != flag);
                o.counts.push((flag, n));
            }
        }
    }
    Ok(Some(o))
}

pub fn run(args: &[OsString]) -> Result<()> {
    let Some(opts) = parse(args)? else {
        print!("{HELP}");
        return Ok(());
    };
    let root = crate::test::workspace_root();
    // 1. What is measured: the release binary and the rootfs.
    let (codebox, rootfs) = crate::bench::prepare(opts.build)?;
    // 2. The client: the official SDK for Debian's python3.
    let pydeps = host::ensure_mcp_sdk(&root)?;
    // 3. The peers, if wanted: a failure to install is a row of the report, not an error.
    let run_python = opts.peer.then(|| peers::mcp_run_python(&root));
    let code_executor = opts
        .peer
        .then(|| peers::code_executor_mcp(&root, opts.code_executor_src.as_deref()));

    let mut cmd = Command::new("/usr/bin/python3");
    cmd.arg(root.join("benches/sdk_latency.py"))
        .arg("--codebox")
        .arg(&codebox)
        .env("PYTHONPATH", &pydeps)
        .env("CODEBOX_ROOTFS", &rootfs);
    for (flag, n) in &opts.counts {
        cmd.arg(flag).arg(n.to_string());
    }
    if opts.microvm {
        // The guest's init must be this very binary (its build ID is checked).
        let guest = root.join("target/guest-release");
        let args: Vec<OsString> = vec![
            "--codebox".into(),
            codebox.clone().into(),
            "--out".into(),
            guest.clone().into(),
        ];
        crate::guest::run(&args)?;
        cmd.arg("--microvm-guest").arg(&guest);
    }
    match run_python {
        Some(Ok(p)) => {
            cmd.arg("--peer")
                .arg(p.dir)
                .arg("--deno")
                .arg(p.deno)
                .arg("--deno-dir")
                .arg(p.deno_dir);
        }
        Some(Err(err)) => {
            eprintln!("warning: mcp-run-python is not measured: {err:#}");
            cmd.arg("--peer-unavailable").arg(format!("{err:#}"));
        }
        None => {}
    }
    match code_executor {
        Some(Ok(p)) => {
            cmd.arg("--code-executor")
                .arg(p.dir)
                .arg("--code-executor-deno")
                .arg(p.deno);
        }
        Some(Err(err)) => {
            eprintln!("warning: code-executor-mcp is not measured: {err:#}");
            cmd.arg("--code-executor-unavailable")
                .arg(format!("{err:#}"));
        }
        None => {}
    }
    crate::test::run_checked(&mut cmd, "benches/sdk_latency.py")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn options_are_parsed() {
        let o = parse(&os(&["--rounds", "3", "--no-peer", "--rounds", "4"]))
            .unwrap()
            .unwrap();
        assert_eq!(o.counts, [("--rounds", 4)]);
        assert!(!o.peer && o.build && o.code_executor_src.is_none());
        let o = parse(&os(&["--code-executor-src", "/srv/mirror"]))
            .unwrap()
            .unwrap();
        assert_eq!(o.code_executor_src, Some(PathBuf::from("/srv/mirror")));
        assert!(parse(&os(&["--help"])).unwrap().is_none());
    }

    #[test]
    fn bad_options_are_refused() {
        for bad in [
            &["--rounds"][..],
            &["--rounds", "0"],
            &["--pool-size", "-1"],
            &["--bursts", "many"],
            &["--peer"],
            &["--code-executor-src"],
        ] {
            assert!(parse(&os(bad)).is_err(), "{bad:?} accepted");
        }
    }
}
