//! `cargo xtask bench-sdk`: what a tool call costs as the official Python MCP SDK sees it
//! over stdio, over the client's own floor, warm and in back-to-back bursts, side by side
//! with pydantic's mcp-run-python when that runs here.
//!
//! A command of its own rather than a flag of `bench-compare`: that one is a Rust client
//! timing raw JSON-RPC next to bare processes; this one is a Python script
//! (`benches/sdk_latency.py`) driving the SDK, with its own installs (the SDK into
//! target/mcp-pydeps as `xtask test` does, the peer and its Deno into target/bench-peers).
//!
//! The procedure: build (codebox release, rootfs) unless `--no-build`, install the SDK,
//! install the peer unless `--no-peer` (a failed install is reported in the table, the
//! rest still runs), then run the script with Debian's python3.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::test::host;

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
  --no-peer        do not install or run mcp-run-python
  --no-build       use the existing target/release/codebox and target/rootfs
";

/// The peer and the Deno it runs, pinned: a new version is taken on purpose.
const PEER: &str = "mcp-run-python==0.0.22";
const PEER_DENO: &str = "deno==2.9.8";

/// What to run, from the command line.
#[derive(Debug, PartialEq, Eq)]
struct Options {
    /// `(flag, value)` passed on to the script, in order.
    counts: Vec<(&'static str, usize)>,
    peer: bool,
    build: bool,
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
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let a = a.to_str().unwrap_or("<not UTF-8>");
        match a {
            "--no-peer" => o.peer = false,
            "--no-build" => o.build = false,
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
    // 3. The peer, if wanted: a failure to install is a row of the report, not an error.
    let peer = opts.peer.then(|| install_peer(&root));

    let mut cmd = Command::new("/usr/bin/python3");
    cmd.arg(root.join("benches/sdk_latency.py"))
        .arg("--codebox")
        .arg(&codebox)
        .env("PYTHONPATH", &pydeps)
        .env("CODEBOX_ROOTFS", &rootfs);
    for (flag, n) in &opts.counts {
        cmd.arg(flag).arg(n.to_string());
    }
    match peer {
        Some(Ok((dir, deno))) => {
            cmd.arg("--peer").arg(dir).arg("--deno").arg(deno);
        }
        Some(Err(err)) => {
            eprintln!("warning: mcp-run-python is not measured: {err:#}");
            cmd.arg("--peer-unavailable")
                .arg(format!("installing {PEER}: {err:#}"));
        }
        None => {}
    }
    crate::test::run_checked(&mut cmd, "benches/sdk_latency.py")
}

/// Installs mcp-run-python and the Deno it runs into target/bench-peers (each once);
/// returns the peer's directory and the deno binary.
fn install_peer(root: &Path) -> Result<(PathBuf, PathBuf)> {
    let dir = root.join("target/bench-peers");
    let peer = dir.join("mcp-run-python");
    host::pip_install_into(&peer, PEER, "mcp_run_python/__init__.py")?;
    let deno = dir.join("deno");
    host::pip_install_into(&deno, PEER_DENO, "bin/deno")?;
    Ok((peer, deno.join("bin/deno")))
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
        assert!(!o.peer && o.build);
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
        ] {
            assert!(parse(&os(bad)).is_err(), "{bad:?} accepted");
        }
    }
}
