//! Selective instrumentation: `cargo xtask fuzz` builds the targets with this very binary
//! as `RUSTC_WRAPPER`, and it compiles the oracle crate (`fuzz/oracles`) and the crates
//! only the oracles use (oxc, RustPython's parser and theirs) without AFL++'s coverage
//! instrumentation.
//!
//! `cargo afl build` puts the sanitizer-coverage pass and its options into `RUSTFLAGS`
//! for every crate. Coverage of an oracle says nothing about codebox: it fills AFL++'s
//! map with edges of a TypeScript parser and costs a call on every edge, which was most
//! of an execution of the `codegen` and `seccomp_policy` targets. Code under test keeps
//! its instrumentation: a crate is left out only when nothing but the oracles reaches it
//! (`cargo tree` with the oracles pruned), and the oracles are not generic over
//! codebox's types, so none of its code is compiled in them.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result};

/// Set (to the comma-separated crate names to leave uninstrumented) when this process
/// runs as the wrapper.
pub const ENV: &str = "CODEBOX_XTASK_UNINSTRUMENTED";

/// The package of the oracles.
const ORACLES: &str = "codebox-fuzz-oracles";

/// Whether this process was started by cargo as the rustc wrapper.
pub fn wrapping() -> bool {
    std::env::var_os(ENV).is_some()
}

/// The environment for `cargo afl build` in `fuzz`: this binary as the wrapper, and the
/// crates (library names) it is to leave uninstrumented.
pub fn build_env(fuzz: &Path) -> Result<Vec<(&'static str, OsString)>> {
    let oracle_crates = crates(fuzz, &["-p", ORACLES])?;
    let under_test = crates(fuzz, &["-p", "codebox-fuzz", "--prune", ORACLES])?;
    let only_oracles: Vec<String> = oracle_crates.difference(&under_test).cloned().collect();
    anyhow::ensure!(
        only_oracles.iter().any(|c| c == "codebox_fuzz_oracles"),
        "cargo tree did not list the oracle crate: {only_oracles:?}"
    );
    let me = std::env::current_exe().context("the path of cargo xtask")?;
    let list = only_oracles.join(",");
    // Cargo does not rebuild a crate when only the wrapper's decision about it changes:
    // a cfg naming the list (cargo-afl appends RUSTFLAGS to its own) puts that decision
    // into every crate's fingerprint, so a target directory built before, or for another
    // list, is rebuilt rather than mixed.
    let mut rustflags = std::env::var_os("RUSTFLAGS").unwrap_or_default();
    if !rustflags.is_empty() {
        rustflags.push(" ");
    }
    rustflags.push(format!(
        "--cfg=codebox_uninstrumented=\"{:016x}\"",
        digest(&list)
    ));
    Ok(vec![
        ("RUSTC_WRAPPER", me.into_os_string()),
        ("RUSTFLAGS", rustflags),
        (ENV, list.into()),
    ])
}

/// A digest of `text` that is the same in every process (SipHash with fixed keys).
fn digest(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// Library names of the normal dependencies of what `selection` picks, itself included.
fn crates(fuzz: &Path, selection: &[&str]) -> Result<BTreeSet<String>> {
    let out = Command::new(super::cargo())
        .args(["tree", "--locked", "-e", "normal", "--prefix", "none"])
        .args(["--format", "{lib}"])
        .args(selection)
        .current_dir(fuzz)
        .output()
        .context("cannot run cargo tree")?;
    anyhow::ensure!(
        out.status.success(),
        "cargo tree {selection:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_end_matches(" (*)").trim().to_string())
        .filter(|l| !l.is_empty())
        .collect())
}

/// Runs `rustc ARGS...` (cargo's wrapper convention: `args` starts with rustc's path),
/// without the coverage options when the crate being compiled is one of [`ENV`]'s.
pub fn run(args: Vec<OsString>) -> ExitCode {
    let Some((rustc, args)) = args.split_first() else {
        eprintln!("xtask as rustc wrapper: no rustc to run");
        return ExitCode::FAILURE;
    };
    let skip = std::env::var(ENV).unwrap_or_default();
    let uninstrumented = crate_name(args).is_some_and(|c| skip.split(',').any(|s| s == c));
    let args = if uninstrumented {
        without_coverage(args)
    } else {
        args.to_vec()
    };
    match Command::new(rustc).args(&args).status() {
        Ok(status) => ExitCode::from(status.code().unwrap_or(1).clamp(0, 255) as u8),
        Err(e) => {
            eprintln!(
                "xtask as rustc wrapper: cannot run {}: {e}",
                rustc.to_string_lossy()
            );
            ExitCode::FAILURE
        }
    }
}

/// The value of `--crate-name`.
fn crate_name(args: &[OsString]) -> Option<&str> {
    let i = args.iter().position(|a| a == "--crate-name")?;
    args.get(i + 1)?.to_str()
}

/// `args` without the sanitizer-coverage pass and its LLVM options, in either spelling
/// (`-C opt` or `-Copt`).
fn without_coverage(args: &[OsString]) -> Vec<OsString> {
    let coverage = |opt: &OsStr| {
        opt.to_str().is_some_and(|o| {
            o.starts_with("passes=sancov") || o.starts_with("llvm-args=-sanitizer-coverage")
        })
    };
    let mut out = Vec::with_capacity(args.len());
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a == "-C" && args.get(i + 1).is_some_and(|v| coverage(v)) {
            i += 2;
            continue;
        }
        if a.to_str()
            .and_then(|s| s.strip_prefix("-C"))
            .is_some_and(|v| coverage(OsStr::new(v)))
        {
            i += 1;
            continue;
        }
        out.push(a.clone());
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn coverage_options_go_in_both_spellings_and_nothing_else_does() {
        let args = os(&[
            "--crate-name",
            "oxc_parser",
            "-C",
            "passes=sancov-module",
            "-C",
            "llvm-args=-sanitizer-coverage-level=3",
            "-Cllvm-args=-sanitizer-coverage-trace-compares",
            "-C",
            "opt-level=3",
            "-C",
            "debug-assertions",
            "--cfg",
            "fuzzing",
        ]);
        assert_eq!(crate_name(&args), Some("oxc_parser"));
        assert_eq!(
            without_coverage(&args),
            os(&[
                "--crate-name",
                "oxc_parser",
                "-C",
                "opt-level=3",
                "-C",
                "debug-assertions",
                "--cfg",
                "fuzzing"
            ])
        );
    }

    #[test]
    fn a_trailing_dash_c_is_kept() {
        assert_eq!(without_coverage(&os(&["x", "-C"])), os(&["x", "-C"]));
    }
}
