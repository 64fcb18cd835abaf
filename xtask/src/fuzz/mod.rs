//! `cargo xtask fuzz`: the coverage-guided fuzz targets of `fuzz/` under AFL++
//! (`cargo afl`, stable toolchain), each for a bounded time or number of executions.
//!
//! For each target: its seeds (`fuzz/corpus/<target>`) and regression inputs
//! (`fuzz/regressions/<target>`) are replayed through the instrumented binary first (each
//! must pass), then `afl-fuzz` runs from the seeds with the target's dictionary into
//! `fuzz/out/<target>`, as one instance or several side by side ([`afl`]). A crash fails
//! the command and names the saved input; hangs are reported. The figures (executions,
//! speed, edges covered) come from AFL++'s `fuzzer_stats`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

pub mod afl;
pub mod rustc_wrapper;

pub use afl::Outcome;

const HELP: &str = "\
cargo xtask fuzz [TARGET...] [--seconds N] [--execs N] [--jobs N] [--resume] [--no-build] [--replay-only] [--list]

Runs the fuzz targets of fuzz/ (all of them when none is named) under AFL++, one after
the other, each for N seconds (default 60) or until N executions (--execs; whichever
comes first when both are given). Installs cargo-afl when it is missing.

  --seconds N   time per target
  --execs N     executions per target, summed over its instances
  --jobs N      afl-fuzz instances per target (one main, N-1 secondaries syncing with
                it), for N cores; default 1
  --resume      continue the previous campaign in fuzz/out/<target> (each instance from
                its queue; an instance it did not have starts from the seeds)
  --opt-level N the instrumented build's optimisation level (default 3). 0 builds in
                under a third of the time (here, 2 cores: 3.5 min against 11.7 at 3
                and 8.5 at 1) and runs each input several times slower: CI's short
                bounded run uses it
  --no-build    use the binaries of the last `cargo afl build`
  --replay-only build, replay the seeds and regression inputs, and stop (fuzz/out is
                left as it is)
  --list        print the targets and exit
";

/// Every target (`fuzz/fuzz_targets/<name>.rs`); `fuzz/src/lib.rs` lists the same.
pub const TARGETS: &[&str] = &[
    "jsonrpc",
    "stdio",
    "http_body",
    "proxy_channel",
    "boot_frame",
    "pii",
    "codegen",
    "config",
    "seccomp_policy",
    "egress_head",
];

/// Options of one campaign.
#[derive(Debug, Clone)]
pub struct Options {
    pub seconds: Option<u64>,
    pub execs: Option<u64>,
    pub resume: bool,
    pub build: bool,
    /// Stop after the seeds and regression inputs have been replayed.
    pub replay_only: bool,
    /// afl-fuzz instances side by side (one per core to give it).
    pub jobs: usize,
    /// The optimisation level of the instrumented build (cargo-afl's `AFL_OPT_LEVEL`;
    /// its default, 3, when `None`).
    pub opt_level: Option<u8>,
}

pub fn run(args: &[OsString]) -> Result<()> {
    let mut targets = Vec::new();
    let mut options = Options {
        seconds: None,
        execs: None,
        resume: false,
        build: true,
        replay_only: false,
        jobs: 1,
        opt_level: None,
    };
    let mut args = args.iter();
    let number = |v: Option<&OsString>, flag: &str| -> Result<u64> {
        v.and_then(|v| v.to_str())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{flag} needs a whole number"))
    };
    while let Some(a) = args.next() {
        match a.to_str() {
            Some("--seconds") => options.seconds = Some(number(args.next(), "--seconds")?),
            Some("--execs") => options.execs = Some(number(args.next(), "--execs")?),
            Some("--jobs") => {
                options.jobs = match number(args.next(), "--jobs")? {
                    0 => bail!("--jobs needs at least one instance"),
                    n => usize::try_from(n).context("--jobs is too large")?,
                }
            }
            Some("--opt-level") => {
                options.opt_level = match number(args.next(), "--opt-level")? {
                    n @ 0..=3 => Some(n as u8),
                    _ => bail!("--opt-level is 0, 1, 2 or 3"),
                }
            }
            Some("--resume") => options.resume = true,
            Some("--no-build") => options.build = false,
            Some("--replay-only") => options.replay_only = true,
            Some("--list") => {
                TARGETS.iter().for_each(|t| println!("{t}"));
                return Ok(());
            }
            Some("-h" | "--help") => {
                print!("{HELP}");
                return Ok(());
            }
            Some(t) if TARGETS.contains(&t) => targets.push(t.to_string()),
            _ => bail!(
                "unknown target or option {a:?}; targets: {}",
                TARGETS.join(", ")
            ),
        }
    }
    if targets.is_empty() {
        targets = TARGETS.iter().map(|t| t.to_string()).collect();
    }
    if options.seconds.is_none() && options.execs.is_none() {
        options.seconds = Some(60);
    }
    let root = crate::test::workspace_root();
    let outcomes = campaign(&root, &targets, &options)?;
    report(&outcomes);
    check(&root, &outcomes)
}

/// Builds (unless told not to), then replays and fuzzes each target in turn.
pub fn campaign(root: &Path, targets: &[String], options: &Options) -> Result<Vec<Outcome>> {
    ensure_cargo_afl()?;
    let fuzz = root.join("fuzz");
    if options.build {
        let started = Instant::now();
        let mut build = Command::new(cargo());
        build
            .args(["afl", "build", "--release", "--locked"])
            .envs(rustc_wrapper::build_env(&fuzz)?)
            .current_dir(&fuzz);
        if let Some(level) = options.opt_level {
            build.env("AFL_OPT_LEVEL", level.to_string());
        }
        crate::test::run_checked(&mut build, "cargo afl build (fuzz/)")?;
        println!("built the fuzz targets in {:.0?}", started.elapsed());
    }
    let mut outcomes = Vec::new();
    for target in targets {
        replay(&fuzz, target)?;
        if options.replay_only {
            continue;
        }
        outcomes.push(afl::fuzz(&fuzz, target, &binary(&fuzz, target), options)?);
    }
    Ok(outcomes)
}

fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// Installs cargo-afl (which builds AFL++ itself) when `cargo afl` is missing.
fn ensure_cargo_afl() -> Result<()> {
    let present = Command::new(cargo())
        .args(["afl", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        return Ok(());
    }
    println!("installing cargo-afl (it builds AFL++)");
    crate::test::run_checked(
        Command::new(cargo()).args(["install", "cargo-afl", "--locked"]),
        "cargo install cargo-afl",
    )
}

fn binary(fuzz: &Path, target: &str) -> PathBuf {
    fuzz.join("target/release").join(target)
}

/// Every seed and regression input through the instrumented binary (outside AFL++ it
/// reads one input from stdin): each must pass before fuzzing starts.
fn replay(fuzz: &Path, target: &str) -> Result<()> {
    let bin = binary(fuzz, target);
    let mut count = 0;
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join(target)) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            let input = std::fs::File::open(&path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            let output = Command::new(&bin)
                .stdin(input)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .output()
                .with_context(|| format!("cannot run {}", bin.display()))?;
            if !output.status.success() {
                bail!(
                    "{target}: {} fails ({}):\n{}",
                    path.display(),
                    output.status,
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            count += 1;
        }
    }
    if count == 0 {
        bail!("{target} has no seeds in fuzz/corpus/{target}");
    }
    println!("{target}: {count} seed and regression inputs pass");
    Ok(())
}

/// The figures as a table.
pub fn report(outcomes: &[Outcome]) {
    println!(
        "\n{:<16} {:>12} {:>9} {:>9} {:>8} {:>16} {:>7} {:>8} {:>6}",
        "target",
        "executions",
        "exec/s",
        "instances",
        "seconds",
        "edges (of map)",
        "corpus",
        "crashes",
        "hangs"
    );
    for o in outcomes {
        println!(
            "{:<16} {:>12} {:>9.0} {:>9} {:>8} {:>16} {:>7} {:>8} {:>6}",
            o.target,
            o.execs,
            o.execs_per_sec,
            o.instances,
            o.seconds,
            format!("{} ({})", o.edges_found, o.total_edges),
            o.corpus,
            o.crashes,
            o.hangs
        );
    }
}

/// Fails when a target crashed, naming the inputs AFL++ saved.
pub fn check(root: &Path, outcomes: &[Outcome]) -> Result<()> {
    let mut found = Vec::new();
    for o in outcomes.iter().filter(|o| o.crashes > 0) {
        let out = root.join("fuzz/out").join(&o.target);
        let inputs: Vec<String> = afl::instance_dirs(&out)
            .iter()
            .filter_map(|dir| std::fs::read_dir(dir.join("crashes")).ok())
            .flat_map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.file_name().is_some_and(|n| n != "README.txt"))
                    .map(|p| p.display().to_string())
            })
            .collect();
        found.push(format!("{}: {}", o.target, inputs.join(", ")));
    }
    if !found.is_empty() {
        bail!(
            "fuzzing found crashes (reproduce with `fuzz/target/release/<target> < input`; \
             a fixed one goes to fuzz/regressions/<target>/):\n  {}",
            found.join("\n  ")
        );
    }
    Ok(())
}
