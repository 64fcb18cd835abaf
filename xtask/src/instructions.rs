//! `cargo xtask instructions`: instruction budgets, checked under valgrind's callgrind.
//!
//! Seconds move with the machine (a shared VM, other builds); the number of instructions a
//! process executes for the same work repeats within a few percent. So the hot paths that
//! must stay fast are guarded by what they execute, not by how long they take:
//! `benches/instruction_budgets.toml` holds one budget per path, and this command
//! measures each and fails when one is over its budget by more than its margin.
//!
//! A budget names a **harness**: a `harness = false` bench target of the codebox package
//! that measures one path under callgrind however that path needs (forking what must stay
//! outside valgrind first, toggling collection on the function that is the path) and
//! prints, as the last line of its standard output,
//! `instructions <median> [<each measurement> ...]`. The harness exits 2 when the host
//! cannot run it (no rootfs, no valgrind), which fails the check under
//! `CODEBOX_TEST_STRICT=1` and is a printed skip otherwise. This command builds the
//! harness in the budget's profile, runs it, and compares. `--update` writes the measured
//! medians into the file instead (for a deliberate change; the diff shows it).
//!
//! Budgets so far: `warm_python_call` (`benches/warm_call_instructions.rs`) and `cold_cli`
//! (`benches/cold_cli_instructions.rs`: `codebox run python -c pass` up to its sandbox's
//! clone). A new one is a harness that prints the line, and an entry in the file.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

const HELP: &str = "\
cargo xtask instructions [--update] [NAME...]

Measures each budget of benches/instruction_budgets.toml (or only those named) under
valgrind --tool=callgrind and fails when one is over its budget by more than its margin.
Each budget's harness is a bench target printing `instructions <median> ...` last.

  --update   write the measured medians into the file instead of checking them
";

/// `benches/instruction_budgets.toml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budgets {
    pub budget: Vec<Budget>,
}

#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    pub name: String,
    /// What is counted, for the report.
    pub what: String,
    /// The bench target that measures it.
    pub harness: String,
    /// The cargo profile it is built in (`dev`: what `cargo xtask test` builds anyway).
    pub profile: String,
    /// Instructions, median of the harness's measurements.
    pub instructions: u64,
    /// How far above `instructions` a measurement may be, in percent.
    pub margin_percent: u64,
}

/// What one check found.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Within,
    Over {
        limit: u64,
    },
    /// Far below the budget: the budget no longer says much (lower it with --update).
    WellUnder,
}

impl Budget {
    /// The most a measurement may be.
    pub fn limit(&self) -> u64 {
        self.instructions + self.instructions * self.margin_percent / 100
    }

    pub fn verdict(&self, measured: u64) -> Verdict {
        if measured > self.limit() {
            Verdict::Over {
                limit: self.limit(),
            }
        } else if measured + measured * self.margin_percent * 2 / 100 < self.instructions {
            Verdict::WellUnder
        } else {
            Verdict::Within
        }
    }
}

pub fn budgets_path(root: &Path) -> PathBuf {
    root.join("benches/instruction_budgets.toml")
}

pub fn load(path: &Path) -> Result<Budgets> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let b: Budgets =
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    for x in &b.budget {
        if x.margin_percent == 0 || x.margin_percent > 100 || x.instructions == 0 {
            bail!(
                "{}: budget {:?} needs instructions > 0 and a margin of 1 to 100 percent",
                path.display(),
                x.name
            );
        }
    }
    Ok(b)
}

pub fn run(args: &[OsString]) -> Result<()> {
    let mut update = false;
    let mut names = Vec::new();
    for a in args {
        match a.to_str() {
            Some("--update") => update = true,
            Some("-h" | "--help") => {
                print!("{HELP}");
                return Ok(());
            }
            Some(n) if !n.starts_with('-') => names.push(n.to_string()),
            _ => bail!("unknown option {a:?}; see `cargo xtask instructions --help`"),
        }
    }
    let root = crate::test::workspace_root();
    let rootfs = std::env::var_os("CODEBOX_ROOTFS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/rootfs"));
    let strict = std::env::var_os("CODEBOX_TEST_STRICT").is_some_and(|v| v == "1");
    check(&root, &rootfs, &names, update, strict)
}

/// Measures the budgets named (all when `names` is empty) with the rootfs at `rootfs`;
/// `strict`: a harness that cannot run on this host fails the check (else it is a printed
/// skip). See the module documentation.
pub fn check(
    root: &Path,
    rootfs: &Path,
    names: &[String],
    update: bool,
    strict: bool,
) -> Result<()> {
    let path = budgets_path(root);
    let budgets = load(&path)?;
    for n in names {
        if !budgets.budget.iter().any(|b| &b.name == n) {
            bail!("no budget named {n:?} in {}", path.display());
        }
    }
    let mut over = Vec::new();
    let mut text = std::fs::read_to_string(&path)?;
    for b in budgets
        .budget
        .iter()
        .filter(|b| names.is_empty() || names.contains(&b.name))
    {
        let measured = match measure(root, rootfs, b)? {
            Some(m) => m,
            None if strict => bail!("{}: the harness cannot run on this host", b.name),
            None => {
                println!("SKIP {}: the harness cannot run on this host", b.name);
                continue;
            }
        };
        let pct = |m: u64| m as f64 * 100.0 / b.instructions as f64;
        println!(
            "{}: {} instructions (budget {} + {} % = {}; {:.1} % of the budget)\n  {}",
            b.name,
            measured.median,
            b.instructions,
            b.margin_percent,
            b.limit(),
            pct(measured.median),
            b.what
        );
        println!("  each measurement: {:?}", measured.each);
        if update {
            text = set_instructions(&text, &b.name, measured.median)?;
            continue;
        }
        match b.verdict(measured.median) {
            Verdict::Within => {}
            Verdict::WellUnder => println!(
                "  note: far under its budget: lower it with `cargo xtask instructions --update {}`",
                b.name
            ),
            Verdict::Over { limit } => over.push(format!(
                "{}: {} instructions, over its limit of {limit} ({} + {} %)",
                b.name, measured.median, b.instructions, b.margin_percent
            )),
        }
    }
    if update {
        std::fs::write(&path, text)?;
        println!("updated {}", path.display());
        return Ok(());
    }
    if !over.is_empty() {
        bail!(
            "over budget (a change put a hot path on a slower road; if it is deliberate, say why and run `cargo xtask instructions --update`):\n  {}",
            over.join("\n  ")
        );
    }
    Ok(())
}

/// A harness's measurements.
#[derive(Debug, PartialEq, Eq)]
pub struct Measured {
    pub median: u64,
    pub each: Vec<u64>,
}

/// Builds and runs `b`'s harness; `None` when it says the host cannot run it (exit 2).
fn measure(root: &Path, rootfs: &Path, b: &Budget) -> Result<Option<Measured>> {
    let exe = build_harness(root, &b.harness, &b.profile)?;
    let out = Command::new(&exe)
        .env("CODEBOX_ROOTFS", rootfs)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    if out.status.code() == Some(2) {
        return Ok(None);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("{} failed ({}):\n{stdout}", b.harness, out.status);
    }
    let line = stdout.lines().last().unwrap_or_default();
    parse_line(line)
        .with_context(|| format!("{}'s last line {line:?}", b.harness))
        .map(Some)
}

/// `instructions <median> [<each> ...]`.
pub fn parse_line(line: &str) -> Result<Measured> {
    let mut words = line.split_whitespace();
    if words.next() != Some("instructions") {
        bail!("not an `instructions <median> ...` line");
    }
    let mut numbers = words.map(|w| w.parse::<u64>().context("not a number"));
    let median = numbers.next().context("no median")??;
    let each = numbers.collect::<Result<Vec<_>>>()?;
    Ok(Measured { median, each })
}

/// The harness's executable, built with cargo in `profile`.
fn build_harness(root: &Path, harness: &str, profile: &str) -> Result<PathBuf> {
    let out = crate::test::cargo_command(
        root,
        &[
            "build",
            "--profile",
            profile,
            "--bench",
            harness,
            "--message-format=json-render-diagnostics",
        ],
    )
    .stderr(std::process::Stdio::inherit())
    .output()
    .context("running cargo build")?;
    if !out.status.success() {
        bail!("building the harness {harness} failed");
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == harness)
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
        .with_context(|| format!("cargo built no executable for {harness}"))
}

/// `text` with budget `name`'s `instructions = ...` line set to `value` (the rest, its
/// comments included, as it was).
fn set_instructions(text: &str, name: &str, value: u64) -> Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut in_it = false;
    let mut done = false;
    for line in text.split_inclusive('\n') {
        let t = line.trim();
        if t.starts_with("name") && t.contains('=') {
            in_it = t.split_once('=').map(|(_, v)| v.trim()) == Some(&format!("{name:?}"));
        }
        if in_it && !done && t.starts_with("instructions") && t.contains('=') {
            let eol = if line.ends_with('\n') { "\n" } else { "" };
            out.push_str(&format!("instructions = {value}{eol}"));
            done = true;
            continue;
        }
        out.push_str(line);
    }
    if !done {
        bail!("no `instructions = ...` line for {name:?}");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(instructions: u64, margin_percent: u64) -> Budget {
        Budget {
            name: "x".into(),
            what: "y".into(),
            harness: "h".into(),
            profile: "dev".into(),
            instructions,
            margin_percent,
        }
    }

    #[test]
    fn the_committed_budgets_parse_and_name_bench_targets() {
        let root = crate::test::workspace_root();
        let b = load(&budgets_path(&root)).unwrap();
        let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        for x in &b.budget {
            assert!(x.margin_percent > 0 && x.instructions > 0, "{x:?}");
            assert!(
                cargo.contains(&format!(
                    "[[bench]]\nname = {:?}\nharness = false",
                    x.harness
                )),
                "{} names the harness {}, which is no harness = false bench of Cargo.toml",
                x.name,
                x.harness
            );
        }
        assert!(b.budget.iter().any(|b| b.name == "warm_python_call"));
        assert!(b.budget.iter().any(|b| b.name == "cold_cli"));
    }

    #[test]
    fn a_measurement_is_judged_against_budget_and_margin() {
        let b = budget(1_000_000, 10);
        assert_eq!(b.limit(), 1_100_000);
        assert_eq!(b.verdict(1_000_000), Verdict::Within);
        assert_eq!(b.verdict(1_100_000), Verdict::Within);
        assert_eq!(b.verdict(1_100_001), Verdict::Over { limit: 1_100_000 });
        assert_eq!(b.verdict(850_000), Verdict::Within);
        assert_eq!(b.verdict(700_000), Verdict::WellUnder);
    }

    #[test]
    fn harness_lines_parse_and_bad_ones_do_not() {
        assert_eq!(
            parse_line("instructions 12 10 12 14").unwrap(),
            Measured {
                median: 12,
                each: vec![10, 12, 14]
            }
        );
        for bad in [
            "",
            "instructions",
            "instructions x",
            "count 12",
            "instructions 1 y",
        ] {
            assert!(parse_line(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn update_rewrites_only_the_named_budget() {
        let text = "# c\n[[budget]]\nname = \"a\"\ninstructions = 1\n\n[[budget]]\nname = \"b\"\ninstructions = 2\n";
        let out = set_instructions(text, "b", 99).unwrap();
        assert_eq!(out, text.replace("instructions = 2", "instructions = 99"));
        assert!(set_instructions(text, "c", 1).is_err());
    }
}
