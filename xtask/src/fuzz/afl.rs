//! One campaign of one target: `afl-fuzz` instances side by side in `fuzz/out/<target>`
//! (a main, `-M main`, and secondaries `-S s1`, `-S s2` … syncing with it: AFL++'s own
//! way of using several cores), watched until their bound, and their figures summed.
//!
//! A bound of executions counts every instance's: one instance is told it with `-E`;
//! several are stopped together (SIGINT, which makes `afl-fuzz` write its final
//! statistics and exit) once their `execs_done` add up to it. A bound of time is each
//! instance's `-V`.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::Options;

/// How often each instance rewrites its `fuzzer_stats` (AFL++'s default is 60 s), and so
/// about how far past a bound of executions several instances can run.
const STATS_INTERVAL_SECS: u64 = 1;

/// How one target's campaign went: from its instances' `fuzzer_stats`, summed (executions,
/// speed, crashes, hangs) or the largest (edges, corpus: the main instance takes in what
/// the others find).
#[derive(Debug, Default)]
pub struct Outcome {
    pub target: String,
    pub instances: usize,
    pub execs: u64,
    pub execs_per_sec: f64,
    pub edges_found: u64,
    pub total_edges: u64,
    pub corpus: u64,
    pub crashes: u64,
    pub hangs: u64,
    pub seconds: u64,
}

impl Outcome {
    fn add(&mut self, instance: &Outcome) {
        self.instances += 1;
        self.execs += instance.execs;
        self.execs_per_sec += instance.execs_per_sec;
        self.edges_found = self.edges_found.max(instance.edges_found);
        self.total_edges = self.total_edges.max(instance.total_edges);
        self.corpus = self.corpus.max(instance.corpus);
        self.crashes += instance.crashes;
        self.hangs += instance.hangs;
        self.seconds = self.seconds.max(instance.seconds);
    }
}

/// The instances' names, in `fuzz/out/<target>/`: `main`, then `s1` …
pub fn instance_names(jobs: usize) -> Vec<String> {
    std::iter::once("main".to_string())
        .chain((1..jobs).map(|i| format!("s{i}")))
        .collect()
}

/// The directories of a campaign's instances that exist (whatever their names: a
/// campaign may have been run with more instances than this one).
pub fn instance_dirs(out: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(out)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.join("fuzzer_stats").exists() || p.join("queue").is_dir())
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs
}

/// Runs the campaign of `target` (binary `bin`) and returns its figures.
pub fn fuzz(fuzz: &Path, target: &str, bin: &Path, options: &Options) -> Result<Outcome> {
    let out = fuzz.join("out").join(target);
    if !options.resume && out.exists() {
        std::fs::remove_dir_all(&out)
            .with_context(|| format!("cannot remove {}", out.display()))?;
    }
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    println!(
        "\n==> fuzzing {target} ({}{})",
        match (options.seconds, options.execs) {
            (Some(s), Some(n)) => format!("{s} s or {n} executions"),
            (Some(s), None) => format!("{s} s"),
            (None, Some(n)) => format!("{n} executions"),
            (None, None) => unreachable!("a bound is always set"),
        },
        match options.jobs {
            1 => String::new(),
            n => format!(", {n} instances"),
        }
    );
    let names = instance_names(options.jobs);
    let mut running = Vec::new();
    for name in &names {
        let child = start(fuzz, target, bin, &out, name, options)
            .with_context(|| format!("cannot start afl-fuzz instance {name} of {target}"))?;
        running.push((name.clone(), child));
    }
    let (statuses, stopped) = watch(&out, &names, running, options)?;
    let mut outcome = Outcome {
        target: target.to_string(),
        ..Default::default()
    };
    for (name, status) in names.iter().zip(statuses) {
        let stats = out.join(name).join("fuzzer_stats");
        // Stopped here, cargo-afl dies of the interrupt its afl-fuzz handles.
        let interrupted = stopped && status.signal() == Some(libc::SIGINT);
        if !(status.success() || interrupted) || !stats.exists() {
            bail!(
                "afl-fuzz instance {name} of {target} failed ({status}); see {}",
                log_path(fuzz, target, name).display()
            );
        }
        outcome.add(&read_stats(target, &stats)?);
    }
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

fn log_path(fuzz: &Path, target: &str, instance: &str) -> PathBuf {
    fuzz.join("out").join(format!("{target}-{instance}.log"))
}

/// Starts one `afl-fuzz` (through `cargo afl fuzz`) in a process group of its own, so
/// that a stop reaches it and nothing else.
fn start(
    fuzz: &Path,
    target: &str,
    bin: &Path,
    out: &Path,
    name: &str,
    options: &Options,
) -> Result<Child> {
    let mut afl = Command::new(super::cargo());
    afl.arg("afl").arg("fuzz").current_dir(fuzz);
    afl.args([if name == "main" { "-M" } else { "-S" }, name]);
    // A resumed instance continues from its queue; a new one starts from the seeds (and
    // takes in the others' queues when it syncs).
    match options.resume && out.join(name).join("fuzzer_stats").exists() {
        true => afl.args(["-i", "-"]),
        false => afl.arg("-i").arg(fuzz.join("corpus").join(target)),
    };
    afl.arg("-o").arg(out);
    let dict = fuzz.join("dict").join(format!("{target}.dict"));
    if dict.exists() {
        afl.arg("-x").arg(dict);
    }
    if let Some(s) = options.seconds {
        afl.args(["-V", &s.to_string()]);
    }
    if let Some(n) = options.execs.filter(|_| options.jobs == 1) {
        // One instance stops itself; several are stopped by `watch` on their sum.
        afl.args(["-E", &n.to_string()]);
    }
    // Per input: 2 s (`+`: seeds that time out are skipped, not fatal).
    afl.args(["-t", "2000+", "--"]).arg(bin);
    afl.env("AFL_NO_UI", "1")
        // The machine's CPU governor and core pattern are not ours to change.
        .env("AFL_SKIP_CPUFREQ", "1")
        .env("AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES", "1")
        // Calibrate new inputs with fewer runs: the slow targets (codegen) spent most of
        // their time calibrating inputs whose path varies with hash seeds.
        .env("AFL_FAST_CAL", "1")
        // Campaigns may share this machine's cores with each other and with CI: bind to
        // none.
        .env("AFL_NO_AFFINITY", "1")
        .env(
            "AFL_FUZZER_STATS_UPDATE_INTERVAL",
            STATS_INTERVAL_SECS.to_string(),
        )
        .stdin(Stdio::null());
    let log_file = log_path(fuzz, target, name);
    let log = std::fs::File::create(&log_file)
        .with_context(|| format!("cannot create {}", log_file.display()))?;
    afl.stdout(log.try_clone()?).stderr(log);
    afl.process_group(0);
    afl.spawn().context("cannot start cargo afl fuzz")
}

/// Waits for every instance to end; with several and a bound of executions, stops them
/// all once their executions add up to it, and all once one has ended. Returns each
/// instance's status and whether they were stopped here.
fn watch(
    out: &Path,
    names: &[String],
    mut running: Vec<(String, Child)>,
    options: &Options,
) -> Result<(Vec<ExitStatus>, bool)> {
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; running.len()];
    let mut stopped_at: Option<Instant> = None;
    let started = Instant::now();
    let mut last_report = Instant::now();
    loop {
        for (i, (_, child)) in running.iter_mut().enumerate() {
            if statuses[i].is_none() {
                statuses[i] = child.try_wait().context("cannot wait for afl-fuzz")?;
            }
        }
        if statuses.iter().all(Option::is_some) {
            break;
        }
        let execs: u64 = names
            .iter()
            .filter_map(|n| read_stats("", &out.join(n).join("fuzzer_stats")).ok())
            .map(|o| o.execs)
            .sum();
        let over = options
            .execs
            .is_some_and(|n| running.len() > 1 && execs >= n);
        // An instance that ended on its own (its -V, or a failure) ends the campaign too.
        let one_ended = statuses.iter().any(Option::is_some);
        if (over || one_ended) && stopped_at.is_none() {
            stopped_at = Some(Instant::now());
            for (i, (name, child)) in running.iter().enumerate() {
                if statuses[i].is_none() {
                    println!("stopping afl-fuzz instance {name} ({execs} executions in all)");
                    interrupt(child);
                }
            }
        }
        if stopped_at.is_some_and(|t| t.elapsed() > Duration::from_secs(60)) {
            // afl-fuzz writes its statistics and exits within a second of SIGINT; one
            // that has not in a minute is killed (its figures are then missing).
            for (i, (_, child)) in running.iter_mut().enumerate() {
                if statuses[i].is_none() {
                    let _ = child.kill();
                }
            }
        }
        if running.len() > 1 && last_report.elapsed() > Duration::from_secs(600) {
            last_report = Instant::now();
            println!("{:.0?}: {execs} executions in all", started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let statuses = statuses.into_iter().flatten().collect();
    Ok((statuses, stopped_at.is_some()))
}

/// SIGINT to an instance's process group (cargo-afl and its afl-fuzz).
fn interrupt(child: &Child) {
    let Ok(pid) = i32::try_from(child.id()) else {
        return;
    };
    // SAFETY: kill(2) with a negative pid signals that process group; the group is the
    // one `start` made for this child (process_group(0)), so nothing else is reached.
    unsafe {
        libc::kill(-pid, libc::SIGINT);
    }
}

/// The figures of AFL++'s `fuzzer_stats` (`key : value` lines).
pub fn read_stats(target: &str, path: &Path) -> Result<Outcome> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let field = |key: &str| -> Option<&str> {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim())
        })
    };
    let int = |key: &str| field(key).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Ok(Outcome {
        target: target.to_string(),
        instances: 1,
        execs: int("execs_done"),
        execs_per_sec: field("execs_per_sec")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0),
        edges_found: int("edges_found"),
        total_edges: int("total_edges"),
        corpus: int("corpus_count"),
        crashes: int("saved_crashes"),
        hangs: int("saved_hangs"),
        // `run_time` counts a resumed campaign's earlier runs too.
        seconds: int("run_time"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_are_one_main_and_numbered_secondaries() {
        assert_eq!(instance_names(1), ["main"]);
        assert_eq!(instance_names(3), ["main", "s1", "s2"]);
    }

    #[test]
    fn instances_add_up() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            std::fs::write(dir.path().join(name), text).unwrap();
            read_stats("t", &dir.path().join(name)).unwrap()
        };
        let main = write(
            "a",
            "start_time : 1\nrun_time : 100\nexecs_done : 1000\nexecs_per_sec : 10.5\n\
             corpus_count : 40\nsaved_crashes : 1\nsaved_hangs : 0\nedges_found : 300\n\
             total_edges : 9000\n",
        );
        let secondary = write(
            "b",
            "run_time : 90\nexecs_done : 900\nexecs_per_sec : 9.5\ncorpus_count : 30\n\
             saved_crashes : 2\nsaved_hangs : 1\nedges_found : 310\ntotal_edges : 9000\n",
        );
        let mut all = Outcome::default();
        all.add(&main);
        all.add(&secondary);
        assert_eq!(
            (
                all.instances,
                all.execs,
                all.execs_per_sec,
                all.crashes,
                all.hangs
            ),
            (2, 1900, 20.0, 3, 1)
        );
        assert_eq!(
            (all.edges_found, all.total_edges, all.corpus, all.seconds),
            (310, 9000, 40, 100)
        );
    }
}
