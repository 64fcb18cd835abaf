//! `cargo xtask fuzz`: the coverage-guided fuzz targets of `fuzz/` under AFL++
//! (`cargo afl`, stable toolchain), each for a bounded time or number of executions.
//!
//! For each target: its seeds (`fuzz/corpus/<target>`) and regression inputs
//! (`fuzz/regressions/<target>`) are replayed through the instrumented binary first (each
//! must pass), then `afl-fuzz` runs from the seeds with the target's dictionary into
//! `fuzz/out/<target>`. A crash fails the command and names the saved input; hangs are
//! reported. The figures (executions, speed, edges covered) come from AFL++'s
//! `fuzzer_stats`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

pub mod rustc_wrapper;

const HELP: &str = "\
cargo xtask fuzz [TARGET...] [--seconds N] [--execs N] [--resume] [--no-build] [--list]

Runs the fuzz targets of fuzz/ (all of them when none is named) under AFL++, one after
the other, each for N seconds (default 60) or until N executions (--execs; whichever
comes first when both are given). Installs cargo-afl when it is missing.

  --seconds N   time per target
  --execs N     executions per target (afl-fuzz -E)
  --resume      continue the previous campaign in fuzz/out/<target> (its queue)
  --no-build    use the binaries of the last `cargo afl build`
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

/// How one target's run went, from its `fuzzer_stats`.
#[derive(Debug, Default)]
pub struct Outcome {
    pub target: String,
    pub execs: u64,
    pub execs_per_sec: f64,
    pub edges_found: u64,
    pub total_edges: u64,
    pub corpus: u64,
    pub crashes: u64,
    pub hangs: u64,
    pub seconds: u64,
}

/// Options of one campaign.
#[derive(Debug, Clone)]
pub struct Options {
    pub seconds: Option<u64>,
    pub execs: Option<u64>,
    pub resume: bool,
    pub build: bool,
}

pub fn run(args: &[OsString]) -> Result<()> {
    let mut targets = Vec::new();
    let mut options = Options {
        seconds: None,
        execs: None,
        resume: false,
        build: true,
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
            Some("--resume") => options.resume = true,
            Some("--no-build") => options.build = false,
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
        crate::test::run_checked(&mut build, "cargo afl build (fuzz/)")?;
        println!("built the fuzz targets in {:.0?}", started.elapsed());
    }
    let mut outcomes = Vec::new();
    for target in targets {
        replay(&fuzz, target)?;
        outcomes.push(fuzz_one(&fuzz, target, options)?);
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

fn fuzz_one(fuzz: &Path, target: &str, options: &Options) -> Result<Outcome> {
    let out = fuzz.join("out").join(target);
    if !options.resume && out.exists() {
        std::fs::remove_dir_all(&out)
            .with_context(|| format!("cannot remove {}", out.display()))?;
    }
    let mut afl = Command::new(cargo());
    afl.arg("afl").arg("fuzz").current_dir(fuzz);
    match options.resume && out.join("default/fuzzer_stats").exists() {
        true => afl.args(["-i", "-"]),
        false => afl.arg("-i").arg(fuzz.join("corpus").join(target)),
    };
    afl.arg("-o").arg(&out);
    let dict = fuzz.join("dict").join(format!("{target}.dict"));
    if dict.exists() {
        afl.arg("-x").arg(dict);
    }
    if let Some(s) = options.seconds {
        afl.args(["-V", &s.to_string()]);
    }
    if let Some(n) = options.execs {
        afl.args(["-E", &n.to_string()]);
    }
    // Per input: 2 s (`+`: seeds that time out are skipped, not fatal).
    afl.args(["-t", "2000+", "--"]).arg(binary(fuzz, target));
    afl.env("AFL_NO_UI", "1")
        // The machine's CPU governor and core pattern are not ours to change.
        .env("AFL_SKIP_CPUFREQ", "1")
        .env("AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES", "1")
        // Calibrate new inputs with fewer runs: the slow targets (codegen) spent most of
        // their time calibrating inputs whose path varies with hash seeds.
        .env("AFL_FAST_CAL", "1")
        // Two campaigns may share this machine's cores: bind to none.
        .env("AFL_NO_AFFINITY", "1")
        .stdin(Stdio::null());
    println!(
        "\n==> fuzzing {target} ({})",
        match (options.seconds, options.execs) {
            (Some(s), Some(n)) => format!("{s} s or {n} executions"),
            (Some(s), None) => format!("{s} s"),
            (None, Some(n)) => format!("{n} executions"),
            (None, None) => unreachable!("a bound is always set"),
        }
    );
    let log = std::fs::File::create(fuzz.join("out").join(format!("{target}.log")))
        .or_else(|_| {
            std::fs::create_dir_all(fuzz.join("out"))?;
            std::fs::File::create(fuzz.join("out").join(format!("{target}.log")))
        })
        .context("cannot create the afl-fuzz log")?;
    afl.stdout(log.try_clone()?).stderr(log);
    let status = afl.status().context("cannot start cargo afl fuzz")?;
    let stats = out.join("default/fuzzer_stats");
    if !status.success() || !stats.exists() {
        bail!("afl-fuzz on {target} failed ({status}); see fuzz/out/{target}.log");
    }
    let outcome = read_stats(target, &stats)?;
    println!(
        "{target}: {} executions ({:.0}/s), {} of {} edges, {} crashes, {} hangs",
        outcome.execs,
        outcome.execs_per_sec,
        outcome.edges_found,
        outcome.total_edges,
        outcome.crashes,
        outcome.hangs
    );
    Ok(outcome)
}

/// The figures of AFL++'s `fuzzer_stats` (`key : value` lines).
fn read_stats(target: &str, path: &Path) -> Result<Outcome> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let field = |key: &str| -> Option<&str> {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim())
        })
    };
    let int = |key: &str| field(key).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let started = int("start_time");
    let updated = int("last_update");
    Ok(Outcome {
        target: target.to_string(),
        execs: int("execs_done"),
        execs_per_sec: field("execs_per_sec")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0),
        edges_found: int("edges_found"),
        total_edges: int("total_edges"),
        corpus: int("corpus_count"),
        crashes: int("saved_crashes"),
        hangs: int("saved_hangs"),
        seconds: updated.saturating_sub(started),
    })
}

/// The figures as a table.
pub fn report(outcomes: &[Outcome]) {
    println!(
        "\n{:<16} {:>12} {:>9} {:>8} {:>16} {:>7} {:>8} {:>6}",
        "target", "executions", "exec/s", "seconds", "edges (of map)", "corpus", "crashes", "hangs"
    );
    for o in outcomes {
        println!(
            "{:<16} {:>12} {:>9.0} {:>8} {:>16} {:>7} {:>8} {:>6}",
            o.target,
            o.execs,
            o.execs_per_sec,
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
        let dir = root
            .join("fuzz/out")
            .join(&o.target)
            .join("default/crashes");
        let inputs: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.file_name().is_some_and(|n| n != "README.txt"))
                    .map(|p| p.display().to_string())
                    .collect()
            })
            .unwrap_or_default();
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
