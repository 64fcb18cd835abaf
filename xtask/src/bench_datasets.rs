//! `cargo xtask bench-datasets`: what the rootfs's data set costs and what the warm pool's
//! preload saves, the figures of README's "Packages in the rootfs":
//!
//! - size: files and MiB of the full rootfs (target/rootfs) and a slim one
//!   (`cargo xtask rootfs --slim --out target/rootfs-slim`);
//! - cold start: `codebox run python -c pass` (and TypeScript's `''`) on each, alternating;
//! - `import pandas, numpy`: timed inside the program in a pooled sandbox, a cold one, and
//!   by Debian's python3 on the host with the same wheels (installed once into
//!   target/bench-host-packages, never committed); plus the processes' wall time;
//! - warm executions over MCP: `print(1)` with and without the preload, and the import
//!   followed by `print(1)`;
//! - `health`'s memory per idle pooled sandbox, with and without the preload.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::bench::mcp::{self, Rpc};
use crate::bench::server::{Launch, Server, Transport};
use crate::bench::stats::Summary;
use crate::bench::Lang;

const HELP: &str = "\
cargo xtask bench-datasets [--runs N] [--no-build]

What the data set (rootfs/recipe.toml [python] packages) adds to the rootfs and to cold
start, and what the warm pool's preload ([python] preload in the profile) saves: sizes,
`codebox run` start-up against a slim rootfs, `import pandas, numpy` pooled, cold and on
the host, warm MCP executions, memory per idle pooled sandbox. Builds the full rootfs,
a slim one (target/rootfs-slim) and codebox in release mode first.

  --runs N     measured rounds (default 20), after one warm-up round
  --no-build   use the existing target/release/codebox, target/rootfs, target/rootfs-slim
";

/// The program whose own clock times the import, in ms.
const TIMED_IMPORT: &str = "import time\nt = time.perf_counter()\nimport pandas, numpy\n\
     print(round((time.perf_counter() - t) * 1000, 3))";

pub fn run(args: &[OsString]) -> Result<()> {
    let mut runs = 20usize;
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
            _ => bail!("unknown option {a:?}; see `cargo xtask bench-datasets --help`"),
        }
    }
    let root = crate::test::workspace_root();
    let slim = root.join("target/rootfs-slim");
    if build {
        crate::rootfs::run(&["--slim".into(), "--out".into(), slim.clone().into()])?;
    }
    let (codebox, full) = crate::bench::prepare(build)?;

    println!("\n== size (from each .manifest)");
    let (f, s) = (Totals::of(&full)?, Totals::of(&slim)?);
    for (name, t) in [("full", &f), ("slim", &s)] {
        println!("{name:<5} {:>6} files {:>8.1} MiB", t.files, mib(t.bytes));
    }
    println!(
        "data set adds {} files, {:.1} MiB",
        f.files - s.files,
        mib(f.bytes - s.bytes)
    );

    println!("\n== cold start: `codebox run` wall time, ms ({runs} runs, alternating)");
    let cold = |rootfs: &Path, lang: &str, code: &str| -> Vec<OsString> {
        let mut v: Vec<OsString> = vec![codebox.clone().into(), "run".into()];
        v.extend(["--rootfs".into(), rootfs.into(), lang.into(), "-c".into()]);
        v.push(code.into());
        v
    };
    let rows = [
        ("python -c pass, full", cold(&full, "python", "pass")),
        ("python -c pass, slim", cold(&slim, "python", "pass")),
        ("typescript -c '', full", cold(&full, "typescript", "")),
        ("typescript -c '', slim", cold(&slim, "typescript", "")),
    ];
    let mut samples = vec![Vec::new(); rows.len()];
    for round in 0..=runs {
        for (i, (name, argv)) in rows.iter().enumerate() {
            let (ms, _) = time_process(argv, name)?;
            if round > 0 {
                samples[i].push(ms);
            }
        }
    }
    for ((name, _), s) in rows.iter().zip(&samples) {
        print_summary(name, s);
    }

    println!(
        "\n== import pandas, numpy ({runs} runs): time inside the program | process wall time, ms"
    );
    let host = host_packages(&root)?;
    let host_argv: Vec<OsString> = vec![
        "/usr/bin/python3".into(),
        "-I".into(),
        "-c".into(),
        format!(
            "import sys\nsys.path.insert(0, {:?})\n{TIMED_IMPORT}",
            host.display()
        )
        .into(),
    ];
    let cold_argv = cold(&full, "python", TIMED_IMPORT);
    let (mut host_in, mut host_wall, mut cold_in, mut cold_wall) = (vec![], vec![], vec![], vec![]);
    for round in 0..=runs {
        let (w, out) = time_process(&host_argv, "host python3")?;
        let (cw, cout) = time_process(&cold_argv, "codebox run")?;
        if round > 0 {
            host_wall.push(w);
            host_in.push(parse_ms(&out)?);
            cold_wall.push(cw);
            cold_in.push(parse_ms(&cout)?);
        }
    }

    let profile_dir = tempfile_dir("codebox-bench-profile")?;
    let no_preload = profile_dir.join("no-preload.toml");
    let default = std::fs::read_to_string(root.join("policies/profiles/default.toml"))?;
    let without = default
        .lines()
        .map(|l| {
            if l.starts_with("preload = ") {
                "preload = []"
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    if without == default {
        bail!("policies/profiles/default.toml has no `preload = ` line to replace");
    }
    std::fs::write(&no_preload, without)?;
    let result = (|| -> Result<()> {
        let mut with = start(&codebox, &full, &[])?;
        let mut bare = start(
            &codebox,
            &full,
            &["--profile", no_preload.to_str().unwrap_or("")],
        )?;
        let pooled_in = warm_runs(&mut with, TIMED_IMPORT, runs, Some(parse_ms))?;
        print_summary("pooled (preloaded), in the program", &pooled_in);
        print_summary("cold `codebox run`, in the program", &cold_in);
        print_summary("host python3, in the program", &host_in);
        print_summary("cold `codebox run`, wall", &cold_wall);
        print_summary("host python3, wall", &host_wall);

        println!("\n== warm executions over MCP (stdio), round trip ms ({runs} runs)");
        let import_print = format!("{TIMED_IMPORT}\nprint(1)");
        let print_with = warm_runs(&mut with, "print(1)", runs, None)?;
        let print_without = warm_runs(&mut bare, "print(1)", runs, None)?;
        let import_with = warm_runs(&mut with, &import_print, runs, None)?;
        print_summary("print(1), preloaded pool", &print_with);
        print_summary("print(1), pool without preload", &print_without);
        print_summary("import pandas, numpy; print(1), preloaded", &import_with);

        println!("\n== memory per idle pooled sandbox (health), MiB");
        for (name, server) in [("with preload", &mut with), ("without", &mut bare)] {
            let session = server.stdio().context("stdio session")?;
            mcp::wait_pools_full(
                session,
                &[Lang::Python, Lang::TypeScript],
                Duration::from_secs(120),
            )?;
            let h = mcp::health(session)?;
            let m = |l: &str| {
                h["pool"]["languages"][l]["memory_per_sandbox_bytes"]
                    .as_u64()
                    .map_or("?".into(), |b| format!("{:.1}", mib(b)))
            };
            println!(
                "{name:<14} python {:>7}  typescript {:>7}",
                m("python"),
                m("typescript")
            );
        }
        with.stop()?;
        bare.stop()?;
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&profile_dir);
    result
}

fn start(codebox: &Path, rootfs: &Path, extra: &[&str]) -> Result<Server> {
    let mut args = vec!["--pool-size", "2"];
    args.extend_from_slice(extra);
    match Server::start(codebox, rootfs, Transport::Stdio, &args)? {
        Launch::Up(s) => Ok(s),
        Launch::Unsupported(why) => bail!("this codebox cannot serve a pool: {why}"),
    }
}

/// `runs` warm executions of `code` (one warm-up first), each on a full pool: the MCP
/// round trip in ms, or what `parse` reads from stdout.
fn warm_runs(
    server: &mut Server,
    code: &str,
    runs: usize,
    parse: Option<fn(&str) -> Result<f64>>,
) -> Result<Vec<f64>> {
    let session = server.stdio().context("stdio session")?;
    let mut out = Vec::new();
    for round in 0..=runs {
        if !mcp::wait_pools_full(session, &[Lang::Python], Duration::from_secs(120))? {
            bail!("the pool did not fill within 120 s");
        }
        let started = Instant::now();
        let r = session.rpc(
            "tools/call",
            json!({"name": "execute_python", "arguments": {"code": code}}),
        )?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        let sc = &r["structuredContent"];
        if sc["exit_code"] != json!(0) || sc["start"] != json!("warm") {
            bail!("a warm run of {code:?} failed or was not warm: {sc}");
        }
        if round > 0 {
            out.push(match parse {
                Some(p) => p(sc["stdout"].as_str().unwrap_or_default())?,
                None => ms,
            });
        }
    }
    Ok(out)
}

/// The data set's wheels for the host's python3, installed once (the same requirement
/// list, through the rootfs build's own wheel staging).
fn host_packages(root: &Path) -> Result<PathBuf> {
    let recipe = crate::rootfs::recipe_packages(&root.join("rootfs/recipe.toml"))?;
    let target = crate::rootfs::wheels::Target::for_rootfs("3.11")?;
    let build = root.join("target/bench-host");
    std::fs::create_dir_all(&build)?;
    let staged = crate::rootfs::wheels::stage(&build, "packages", &recipe, &target, &[])?;
    // Byte-compiled as a host install would be (pip's own compile step; compileall skips
    // what is current).
    crate::test::run_checked(
        Command::new("/usr/bin/python3")
            .args(["-I", "-m", "compileall", "-q", "-j0"])
            .arg(&staged.dir)
            .stdout(Stdio::null()),
        "python3 -m compileall",
    )?;
    Ok(staged.dir)
}

fn time_process(argv: &[OsString], name: &str) -> Result<(f64, String)> {
    let started = Instant::now();
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot start {name}"))?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    if !out.status.success() {
        bail!(
            "{name} failed: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok((ms, String::from_utf8_lossy(&out.stdout).into_owned()))
}

fn parse_ms(stdout: &str) -> Result<f64> {
    stdout
        .trim()
        .lines()
        .next()
        .and_then(|l| l.parse().ok())
        .with_context(|| format!("no time in {stdout:?}"))
}

fn print_summary(name: &str, samples: &[f64]) {
    let s = Summary::of(samples);
    println!(
        "{name:<44} median {:>9.3}  p90 {:>9.3}  max {:>9.3}",
        s.median, s.p90, s.max
    );
}

struct Totals {
    files: u64,
    bytes: u64,
}

impl Totals {
    fn of(rootfs: &Path) -> Result<Totals> {
        let path = rootfs.join(".manifest");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let mut t = Totals { files: 0, bytes: 0 };
        for line in text.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            if f.first() == Some(&"f") {
                t.files += 1;
                t.bytes += f.get(2).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
            }
        }
        Ok(t)
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn tempfile_dir(prefix: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}
