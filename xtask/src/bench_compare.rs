//! `cargo xtask bench-compare`: start-up latency, side by side, in one run.
//!
//! Alternates, round-robin on the same machine, the bare interpreters, the same under
//! `bwrap --unshare-all` (a peer sandbox), and `codebox run` (a cold sandbox with every
//! layer), so slow phases of the machine hit all of them alike. Prints median, p90 and p99
//! and each one's ratio to the bare interpreter. Installs bubblewrap if missing (as root).

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

const HELP: &str = "\
cargo xtask bench-compare [--runs N]

Times, alternating in one run: bare `python3 -S -c pass`, the same under
`bwrap --unshare-all`, `codebox run python -c pass`, and the Deno equivalents.
Builds codebox in release mode and the rootfs first. Default: 100 runs each.
";

struct Case {
    name: &'static str,
    /// The bare case this one is compared with.
    baseline: &'static str,
    argv: Vec<OsString>,
    samples: Vec<f64>,
}

pub fn run(args: &[OsString]) -> Result<()> {
    let mut runs = 100usize;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("--runs") => {
                runs = it
                    .next()
                    .and_then(|v| v.to_str()?.parse().ok())
                    .context("--runs needs a number")?
            }
            Some("-h" | "--help") => {
                print!("{HELP}");
                return Ok(());
            }
            _ => bail!("unknown option {a:?}; see `cargo xtask bench-compare --help`"),
        }
    }
    let root = crate::test::workspace_root();
    crate::rootfs::run(&[])?;
    crate::test::run_checked(
        &mut crate::test::cargo_command(&root, &["build", "--release", "--package", "codebox"]),
        "cargo build --release",
    )?;
    ensure_bwrap()?;
    let rootfs = root.join("target/rootfs");
    let codebox = root.join("target/release/codebox");
    let deno = rootfs.join("usr/bin/deno");
    let os = |s: &str| OsString::from(s);
    let path = |p: &Path| p.as_os_str().to_owned();
    let bwrap = |argv: Vec<OsString>| -> Vec<OsString> {
        let mut v: Vec<OsString> = [
            "bwrap",
            "--unshare-all",
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--tmpfs",
            "/tmp",
            "--",
        ]
        .iter()
        .map(|s| os(s))
        .collect();
        v.extend(argv);
        v
    };
    let py = vec![os("/usr/bin/python3"), os("-S"), os("-c"), os("pass")];
    let de = vec![path(&deno), os("eval"), os("")];
    let mut cases = vec![
        Case {
            name: "python3 -S -c pass (bare)",
            baseline: "",
            argv: py.clone(),
            samples: vec![],
        },
        Case {
            name: "bwrap --unshare-all python3",
            baseline: "python3 -S -c pass (bare)",
            argv: bwrap(py),
            samples: vec![],
        },
        Case {
            name: "codebox run python -c pass",
            baseline: "python3 -S -c pass (bare)",
            argv: vec![
                path(&codebox),
                os("run"),
                os("python"),
                os("-c"),
                os("pass"),
            ],
            samples: vec![],
        },
        Case {
            name: "deno eval '' (bare)",
            baseline: "",
            argv: de.clone(),
            samples: vec![],
        },
        Case {
            name: "bwrap --unshare-all deno",
            baseline: "deno eval '' (bare)",
            argv: bwrap(de),
            samples: vec![],
        },
        Case {
            name: "codebox run typescript -c ''",
            baseline: "deno eval '' (bare)",
            argv: vec![
                path(&codebox),
                os("run"),
                os("typescript"),
                os("-c"),
                os(""),
            ],
            samples: vec![],
        },
    ];
    let denodir = std::env::temp_dir().join(format!("codebox-bench-deno-{}", std::process::id()));
    // One warm-up round, then the measured rounds.
    for round in 0..=runs {
        for case in &mut cases {
            let started = Instant::now();
            let status = Command::new(&case.argv[0])
                .args(&case.argv[1..])
                .env("DENO_DIR", &denodir)
                .env("CODEBOX_ROOTFS", &rootfs)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .status()
                .with_context(|| format!("cannot start {}", case.name))?;
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            if !status.success() {
                bail!("{} failed: {status}", case.name);
            }
            if round > 0 {
                case.samples.push(ms);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&denodir);
    println!("\n{runs} runs each, alternating; wall time per start in ms\n");
    println!(
        "{:34} {:>8} {:>8} {:>8} {:>10}",
        "", "median", "p90", "p99", "vs bare"
    );
    let medians: Vec<(&str, f64)> = cases
        .iter_mut()
        .map(|c| {
            c.samples.sort_by(f64::total_cmp);
            (c.name, percentile(&c.samples, 0.5))
        })
        .collect();
    for c in &cases {
        let median = percentile(&c.samples, 0.5);
        let ratio = medians
            .iter()
            .find(|(n, _)| *n == c.baseline)
            .map(|(_, b)| format!("{:.2}x", median / b))
            .unwrap_or_else(|| "1.00x".into());
        println!(
            "{:34} {:8.2} {:8.2} {:8.2} {:>10}",
            c.name,
            median,
            percentile(&c.samples, 0.9),
            percentile(&c.samples, 0.99),
            ratio
        );
    }
    Ok(())
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[idx]
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
