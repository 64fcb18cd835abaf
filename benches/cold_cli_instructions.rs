//! The cold CLI's own side, in instructions: how many `codebox run python -c pass`
//! executes from its first instruction (the dynamic loader's) until it clones its
//! sandbox, counted by valgrind's callgrind (`cargo xtask instructions`;
//! `benches/instruction_budgets.toml` holds the budget). That is everything codebox does
//! before the program can start: argument parsing, logging, the profile and its seccomp
//! filter, locating and verifying the rootfs, discovering and cleaning the cgroups, and
//! the sandbox's cgroup, plan and pipes. Instruction counts repeat from run to run where
//! seconds do not, so the budget holds on a busy machine, and a change that puts the
//! cold path back on a slow road (the rootfs's whole manifest read on every run, say,
//! which is ~10x this budget) fails it.
//!
//! Why only up to the clone: valgrind does not implement `clone3` (it answers `ENOSYS`,
//! as it does to make glibc fall back to `clone`), so under valgrind the run ends there
//! with "clone3 into new namespaces failed: Function not implemented". callgrind dumps
//! its counts right before `clone_into_namespaces` (`--dump-before`), and that dump is
//! what is counted; `--trace-children=no` keeps valgrind out of anything the run
//! starts. What the supervisor does after the clone (id maps, the code on fd 3, the
//! output, the cgroup's figures and removal) is not counted.
//!
//! The run is made as `cargo xtask test` makes it: the rootfs of `$CODEBOX_ROOTFS` (else
//! the one codebox finds), a fresh private cache (its stamp from a first, native run),
//! an empty configuration and environment. The rootfs must be sealed (`cargo xtask
//! rootfs` seals it): the budget is that of the path users take.
//!
//! By hand: `CODEBOX_ROOTFS=$PWD/target/rootfs target/debug/deps/cold_cli_instructions-*`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

/// Measured runs (each takes a few seconds under valgrind).
const RUNS: usize = 3;
const CODEBOX: &str = env!("CARGO_BIN_EXE_codebox");
/// The function whose entry ends the count.
const CLONE: &str = "codebox::sandbox::clone::clone_into_namespaces";

fn main() -> ExitCode {
    // `cargo bench` passes `--bench`: this is no criterion bench.
    if std::env::args().nth(1).as_deref() == Some("--bench") {
        println!("cold_cli_instructions: run it with `cargo xtask instructions`");
        return ExitCode::SUCCESS;
    }
    match measure() {
        Ok(counts) => {
            let line: Vec<String> = counts.iter().map(u64::to_string).collect();
            let mut sorted = counts.clone();
            sorted.sort_unstable();
            println!(
                "instructions {} {}",
                sorted[sorted.len() / 2],
                line.join(" ")
            );
            ExitCode::SUCCESS
        }
        Err(Outcome::CannotRun(why)) => {
            eprintln!("cold_cli_instructions: cannot run here: {why}");
            ExitCode::from(2)
        }
        Err(Outcome::Failed(why)) => {
            eprintln!("cold_cli_instructions: {why}");
            ExitCode::FAILURE
        }
    }
}

enum Outcome {
    /// The host lacks what the measurement needs (exit 2).
    CannotRun(String),
    Failed(String),
}

fn measure() -> Result<Vec<u64>, Outcome> {
    let rootfs = match std::env::var_os("CODEBOX_ROOTFS").filter(|v| !v.is_empty()) {
        Some(r) => PathBuf::from(r),
        None => codebox::rootfs::locate(None)
            .map_err(|e| Outcome::CannotRun(format!("no rootfs: {e}")))?,
    };
    let valgrind = std::env::var("VALGRIND").unwrap_or_else(|_| "valgrind".into());
    match Command::new(&valgrind).arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => return Err(Outcome::CannotRun(format!("no {valgrind}"))),
    }
    let scratch = tempfile::tempdir().map_err(|e| Outcome::Failed(e.to_string()))?;
    let home = scratch.path();

    // Natively, twice: the first verifies the tree in full and leaves the stamp; the
    // second must take the sealed path, as users' runs do.
    let native = run(home, &rootfs, None).map_err(Outcome::Failed)?;
    if !native.status.success() {
        return Err(Outcome::CannotRun(format!(
            "codebox run python -c pass fails here ({}): {}",
            native.status,
            String::from_utf8_lossy(&native.stderr).trim()
        )));
    }
    let mut debug = command(home, &rootfs, None);
    debug.env("RUST_LOG", "codebox=debug");
    let out = debug.output().map_err(|e| Outcome::Failed(e.to_string()))?;
    let log = strip_ansi(&String::from_utf8_lossy(&out.stderr));
    if !log.contains("verification=Sealed") {
        return Err(Outcome::Failed(format!(
            "the rootfs at {} did not verify by its seal on the second run (is it sealed? \
             `cargo xtask rootfs` seals it): {}",
            rootfs.display(),
            log.lines()
                .filter(|l| l.contains("rootfs") || l.contains("fast path"))
                .collect::<Vec<_>>()
                .join(" | ")
        )));
    }

    let mut counts = Vec::new();
    for i in 0..RUNS {
        let out_file = home.join(format!("callgrind.{i}"));
        let args = [
            "--tool=callgrind".to_string(),
            "--quiet".into(),
            "--trace-children=no".into(),
            format!("--callgrind-out-file={}", out_file.display()),
            format!("--dump-before={CLONE}"),
        ];
        let out = run(home, &rootfs, Some((&valgrind, &args))).map_err(Outcome::Failed)?;
        let dump = PathBuf::from(format!("{}.1", out_file.display()));
        let count = summary(&dump).map_err(|e| {
            Outcome::Failed(format!(
                "no count before the clone in {} ({e}); the run ended {}: {}",
                dump.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        })?;
        counts.push(count);
    }
    Ok(counts)
}

/// `codebox run python -c pass` in `home` (its HOME, cache, configuration and working
/// directory), under `wrapper` when given.
fn command(home: &Path, rootfs: &Path, wrapper: Option<(&str, &[String])>) -> Command {
    let mut cmd = match wrapper {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(CODEBOX);
            c
        }
        None => Command::new(CODEBOX),
    };
    cmd.args(["run", "python", "-c", "pass"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("CODEBOX_ROOTFS", rootfs)
        .current_dir(home)
        .stdin(Stdio::null());
    cmd
}

fn run(
    home: &Path,
    rootfs: &Path,
    wrapper: Option<(&str, &[String])>,
) -> Result<std::process::Output, String> {
    command(home, rootfs, wrapper)
        .output()
        .map_err(|e| format!("cannot start codebox: {e}"))
}

/// The total of a callgrind dump (its `summary:` line); the file is removed.
fn summary(path: &Path) -> std::io::Result<u64> {
    let text = std::fs::read_to_string(path)?;
    let _ = std::fs::remove_file(path);
    text.lines()
        .find_map(|l| l.strip_prefix("summary: ").or(l.strip_prefix("totals: ")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| std::io::Error::other("no summary line"))
}

/// `text` without its terminal colour sequences (`ESC [ ... m`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
