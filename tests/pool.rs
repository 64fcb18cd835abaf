//! The warm pool against the real spawner and kernel: correctness, not speed.
//!
//! `harness = false`: the spawner must be forked while the process is single-threaded,
//! before the tokio runtime exists. Cases run one at a time through libtest-mimic.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use codebox::pool::{Bounds, Template, WarmPool};
use codebox::runtime::{self, Language};
use codebox::sandbox::ProgramStatus;
use codebox::spawner::SpawnSpec;
use libtest_mimic::{Failed, Trial};

mod common;
use common::spawner_harness as harness;

/// Where sandbox cgroups are created, and the pid that names them.
static CGROUPS: OnceLock<(Option<PathBuf>, i32)> = OnceLock::new();

fn main() {
    let (args, host) = harness::arguments_and_host("pool tests", || Ok(()));
    let base = host
        .cgroups
        .as_ref()
        .and_then(|m| m.hierarchies().first().map(|h| h.base.clone()));
    // SAFETY: no thread exists yet: libtest-mimic has not started and tokio is not built.
    unsafe { harness::start_spawner(&host) };
    // Sandbox cgroups are named after the process that discovered the hierarchies (this
    // one), whose copy the spawner is.
    let _ = CGROUPS.set((base, std::process::id() as i32));
    let trials = vec![
        Trial::test(
            "pooled_runs_give_the_same_results_as_cold_ones",
            same_results_as_cold,
        ),
        Trial::test(
            "a_pooled_sandbox_is_never_handed_out_twice",
            never_handed_out_twice,
        ),
        Trial::test(
            "a_sandbox_killed_while_idle_is_replaced_not_handed_out",
            killed_idle_sandbox_is_replaced,
        ),
        Trial::test(
            "refill_under_load_stays_within_the_limit",
            refill_stays_within_the_limit,
        ),
        Trial::test(
            "the_timeout_counts_from_the_code_s_delivery",
            timeout_counts_from_delivery,
        ),
        Trial::test(
            "a_new_template_retires_the_old_sandboxes",
            new_template_retires_old_sandboxes,
        ),
        Trial::test(
            "a_request_that_does_not_fit_is_not_served",
            misfit_request_is_not_served,
        ),
        Trial::test(
            "shutdown_removes_every_pooled_sandbox_and_cgroup",
            shutdown_removes_everything,
        ),
        Trial::test(
            "a_burst_grows_the_pool_which_serves_the_next_one_warm_then_shrinks_back",
            burst_grows_then_shrinks,
        ),
        Trial::test(
            "a_flood_never_grows_the_pool_past_its_ceiling",
            flood_stays_under_the_ceiling,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}

use harness::{block_on, client, spec};

fn pool(size: usize, languages: &[Language]) -> WarmPool {
    let templates = languages
        .iter()
        .map(|l| {
            (
                *l,
                Template {
                    spec: spec(*l),
                    hold: None,
                    per_sandbox: None,
                },
            )
        })
        .collect();
    WarmPool::new(client().clone(), Bounds::fixed(size), templates)
}

fn check(cond: bool, msg: impl Into<String>) -> Result<(), Failed> {
    if cond {
        Ok(())
    } else {
        Err(msg.into().into())
    }
}

/// Waits until `language` has `n` idle sandboxes.
async fn until_idle(pool: &WarmPool, language: Language, n: usize) -> Result<(), Failed> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while pool.stats()[&language].idle < n {
        if Instant::now() > deadline {
            return Err(format!("the pool never had {n} idle: {:?}", pool.stats()).into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

struct Ran {
    stdout: String,
    stderr: String,
    status: Option<ProgramStatus>,
    timed_out: bool,
    warm: bool,
}

/// Runs `code` in a pooled sandbox (`warm`) or a fresh one.
async fn run(
    pool: Option<&WarmPool>,
    language: Language,
    code: &str,
    timeout: Duration,
) -> Result<Ran, Failed> {
    run_admitted(pool, language, code, timeout, ()).await
}

/// As [`run`], holding `admitted` (an admission slot) until the sandbox is gone, as the
/// server does.
async fn run_admitted(
    pool: Option<&WarmPool>,
    language: Language,
    code: &str,
    timeout: Duration,
    admitted: impl std::any::Any + Send,
) -> Result<Ran, Failed> {
    let s = spec(language);
    let warm = match pool {
        Some(p) => p.take(&s).await,
        None => None,
    };
    let is_warm = warm.is_some();
    let mut sandbox = match warm {
        Some(w) => {
            let (mut sandbox, guard) = w.into_parts();
            sandbox.hold_until_gone(guard);
            sandbox
        }
        None => client().spawn(s).await.map_err(|e| e.to_string())?,
    };
    sandbox.hold_until_gone(admitted);
    let o = sandbox
        .run_with_channel(
            runtime::boot_frame(code),
            None,
            (1 << 20, 1 << 20),
            timeout,
            std::future::pending(),
            |_, _| {},
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(Ran {
        stdout: String::from_utf8_lossy(&o.stdout.bytes).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr.bytes).into_owned(),
        status: o.status,
        timed_out: o.timed_out,
        warm: is_warm,
    })
}

/// Sandbox cgroups of this test's spawner that exist now (in the first hierarchy).
fn live_cgroups() -> usize {
    let (Some(base), pid) = CGROUPS.get().expect("cgroups").clone() else {
        return 0;
    };
    let prefix = format!("codebox-{pid}-");
    std::fs::read_dir(base)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .count()
        })
        .unwrap_or(0)
}

/// Programs whose output shows the sandbox's isolation and state.
const PROBES: [(Language, &str); 3] = [
    (
        Language::Python,
        r#"
import os, socket, sys
print("uid", os.getuid(), "pid", os.getpid(), "host", socket.gethostname())
print("fds", sorted(int(f) for f in os.listdir("/proc/self/fd")))
print("ifaces", sorted(n for _, n in socket.if_nameindex()))
print("caps", [l.split()[1] for l in open("/proc/self/status") if l.startswith("Cap")])
print("nnp", [l.split()[1] for l in open("/proc/self/status") if l.startswith("NoNewPrivs")])
print("seccomp", [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")])
print("tmp", os.listdir("/tmp"), "workspace", os.listdir("/workspace"))
try:
    open("/usr/x", "w")
except OSError as e:
    print("rootfs", e.errno)
print("argv", sys.argv, "env", sorted(os.environ))
"#,
    ),
    (
        Language::Python,
        "import sys\nprint('err', file=sys.stderr)\nraise SystemExit(3)",
    ),
    (
        Language::TypeScript,
        r#"
console.log("uid", Deno.uid(), "pid", Deno.pid, "host", Deno.hostname());
console.log("env", Object.keys(Deno.env.toObject()).sort().join(","));
console.log("tmp", [...Deno.readDirSync("/tmp")].map((e) => e.name).filter((n) => n !== ".deno").join(","));
try { Deno.writeTextFileSync("/usr/x", "x"); } catch (e) { console.log("rootfs", e.name); }
"#,
    ),
];

fn same_results_as_cold() -> Result<(), Failed> {
    block_on(async {
        let pool = pool(2, &[Language::Python, Language::TypeScript]);
        for (language, code) in PROBES {
            until_idle(&pool, language, 1).await?;
            let warm = run(Some(&pool), language, code, Duration::from_secs(20)).await?;
            let cold = run(None, language, code, Duration::from_secs(20)).await?;
            check(warm.warm && !cold.warm, "one warm, one cold")?;
            check(
                warm.stdout == cold.stdout && warm.stderr == cold.stderr,
                format!(
                    "warm and cold differ:\n--- warm\n{}{}\n--- cold\n{}{}",
                    warm.stdout, warm.stderr, cold.stdout, cold.stderr
                ),
            )?;
            check(
                warm.status == cold.status,
                format!("{:?} vs {:?}", warm.status, cold.status),
            )?;
        }
        pool.shutdown().await;
        Ok(())
    })
}

fn never_handed_out_twice() -> Result<(), Failed> {
    block_on(async {
        let pool = Arc::new(pool(3, &[Language::Python]));
        until_idle(&pool, Language::Python, 3).await?;
        // Each program claims its sandbox with a file that must not exist yet: a sandbox
        // handed out twice would find the first claim.
        let code = r#"
import os, sys
fd = os.open("/tmp/claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
print("fresh")
"#;
        let mut tasks = Vec::new();
        for _ in 0..24 {
            let pool = pool.clone();
            tasks.push(tokio::spawn(async move {
                run(Some(&pool), Language::Python, code, Duration::from_secs(30)).await
            }));
        }
        let mut warm = 0;
        for t in tasks {
            let r = t.await.map_err(|e| e.to_string())??;
            check(
                r.stdout == "fresh\n" && r.status == Some(ProgramStatus::Exited(0)),
                format!(
                    "a sandbox was not fresh: {:?} {:?} {:?}",
                    r.stdout, r.stderr, r.status
                ),
            )?;
            warm += r.warm as usize;
        }
        check(warm >= 3, format!("only {warm} of 24 runs were warm"))?;
        let stats = pool.stats()[&Language::Python].clone();
        check(
            stats.handed_out as usize == warm,
            format!("{stats:?} vs {warm} warm"),
        )?;
        pool.shutdown().await;
        Ok(())
    })
}

fn killed_idle_sandbox_is_replaced() -> Result<(), Failed> {
    block_on(async {
        let pool = pool(1, &[Language::Python]);
        until_idle(&pool, Language::Python, 1).await?;
        let idle = pool.idle_sandboxes(Language::Python);
        let (victim, dirs) = idle.first().cloned().ok_or("no idle sandbox")?;
        // Kill every process of the idle sandbox, as the OOM killer or a crash would.
        let procs = dirs
            .iter()
            .find_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
            .ok_or("no cgroup.procs")?;
        let pids: Vec<i32> = procs.lines().filter_map(|l| l.parse().ok()).collect();
        check(!pids.is_empty(), "the idle sandbox has processes")?;
        for pid in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        // It is noticed, dropped and replaced by another.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let stats = pool.stats()[&Language::Python].clone();
            let ids: Vec<u64> = pool
                .idle_sandboxes(Language::Python)
                .iter()
                .map(|(id, _)| *id)
                .collect();
            if stats.died_idle == 1 && stats.idle == 1 && !ids.contains(&victim) {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("not replaced: {stats:?} {ids:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let r = run(
            Some(&pool),
            Language::Python,
            "print(7)",
            Duration::from_secs(10),
        )
        .await?;
        check(
            r.warm && r.stdout == "7\n",
            format!("{:?} {:?}", r.stdout, r.stderr),
        )?;
        pool.shutdown().await;
        Ok(())
    })
}

fn refill_stays_within_the_limit() -> Result<(), Failed> {
    block_on(async {
        const SIZE: usize = 2;
        const CONCURRENCY: usize = 3;
        let before = live_cgroups();
        let pool = Arc::new(pool(SIZE, &[Language::Python]));
        until_idle(&pool, Language::Python, SIZE).await?;
        // The server's admission: at most CONCURRENCY executions at once.
        let admission = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
        // (a slot is free again only once its sandbox is gone, as in the server)
        let peak = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(tokio::sync::Notify::new());
        let sampler = {
            let (peak, done) = (peak.clone(), done.clone());
            tokio::spawn(async move {
                loop {
                    peak.fetch_max(live_cgroups() - before, Ordering::Relaxed);
                    tokio::select! {
                        _ = done.notified() => return,
                        _ = tokio::time::sleep(Duration::from_millis(2)) => {}
                    }
                }
            })
        };
        let mut tasks = Vec::new();
        for i in 0..16 {
            let (pool, admission) = (pool.clone(), admission.clone());
            tasks.push(tokio::spawn(async move {
                let slot = admission.acquire_owned().await.expect("admission");
                let code = format!("import time\ntime.sleep(0.15)\nprint({i})");
                run_admitted(
                    Some(&pool),
                    Language::Python,
                    &code,
                    Duration::from_secs(30),
                    slot,
                )
                .await
            }));
        }
        for (i, t) in tasks.into_iter().enumerate() {
            let r = t.await.map_err(|e| e.to_string())??;
            check(r.stdout == format!("{i}\n"), format!("{:?}", r.stdout))?;
        }
        done.notify_one();
        sampler.await.map_err(|e| e.to_string())?;
        let peak = peak.load(Ordering::Relaxed);
        // Running executions, plus the pool's own (ready and starting).
        check(
            peak <= CONCURRENCY + SIZE,
            format!(
                "{peak} sandboxes alive at once; the limit is {} running + {SIZE} pooled",
                CONCURRENCY
            ),
        )?;
        check(peak > SIZE, format!("the load never ran: peak {peak}"))?;
        pool.shutdown().await;
        Ok(())
    })
}

fn timeout_counts_from_delivery() -> Result<(), Failed> {
    block_on(async {
        let pool = pool(1, &[Language::Python]);
        until_idle(&pool, Language::Python, 1).await?;
        // Idle for longer than the run's timeout: the run still gets all of it. (2 s of
        // room beside the program's 0.5 s: the interpreter's exit and a loaded CI
        // machine took more than 0.5 s once.)
        tokio::time::sleep(Duration::from_millis(3000)).await;
        let r = run(
            Some(&pool),
            Language::Python,
            "import time\ntime.sleep(0.5)\nprint('in time')",
            Duration::from_millis(2500),
        )
        .await?;
        check(
            r.warm && !r.timed_out && r.stdout == "in time\n",
            format!("{:?} {:?} timed_out={}", r.stdout, r.stderr, r.timed_out),
        )?;
        // And a run that overstays its timeout is killed.
        until_idle(&pool, Language::Python, 1).await?;
        let r = run(
            Some(&pool),
            Language::Python,
            "while True: pass",
            Duration::from_millis(300),
        )
        .await?;
        check(r.warm && r.timed_out, format!("timed_out={}", r.timed_out))?;
        pool.shutdown().await;
        Ok(())
    })
}

fn new_template_retires_old_sandboxes() -> Result<(), Failed> {
    block_on(async {
        let pool = pool(2, &[Language::Python]);
        until_idle(&pool, Language::Python, 2).await?;
        let old: HashSet<u64> = pool
            .idle_sandboxes(Language::Python)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        let mut limits = spec(Language::Python).limits;
        limits.stdout_cap = 4096;
        let new_spec = SpawnSpec {
            limits,
            ..spec(Language::Python)
        };
        pool.set_template(
            Language::Python,
            Template {
                spec: new_spec.clone(),
                hold: None,
                per_sandbox: None,
            },
        );
        // The old spec no longer fits; the new one is served by new sandboxes.
        check(
            pool.take(&spec(Language::Python)).await.is_none(),
            "the old template was served",
        )?;
        until_idle(&pool, Language::Python, 2).await?;
        let stats = pool.stats()[&Language::Python].clone();
        check(stats.retired == 2, format!("{stats:?}"))?;
        let warm = pool
            .take(&new_spec)
            .await
            .ok_or("no sandbox for the new template")?;
        check(
            !old.contains(&warm.sandbox.id()),
            "an old sandbox was served",
        )?;
        drop(warm);
        pool.shutdown().await;
        Ok(())
    })
}

fn misfit_request_is_not_served() -> Result<(), Failed> {
    block_on(async {
        let pool = pool(1, &[Language::Python]);
        until_idle(&pool, Language::Python, 1).await?;
        let with_workspace = SpawnSpec {
            workspace: Some(std::env::temp_dir()),
            ..spec(Language::Python)
        };
        check(
            pool.take(&with_workspace).await.is_none(),
            "a pooled sandbox without the workspace was handed out",
        )?;
        check(
            pool.take(&spec(Language::TypeScript)).await.is_none(),
            "no TypeScript pool exists",
        )?;
        check(
            pool.stats()[&Language::Python].idle == 1,
            "the idle sandbox stays",
        )?;
        pool.shutdown().await;
        Ok(())
    })
}

fn shutdown_removes_everything() -> Result<(), Failed> {
    block_on(async {
        let before = live_cgroups();
        let pool = pool(2, &[Language::Python, Language::TypeScript]);
        until_idle(&pool, Language::Python, 2).await?;
        until_idle(&pool, Language::TypeScript, 2).await?;
        let dirs: Vec<PathBuf> = Language::ALL
            .iter()
            .flat_map(|l| pool.idle_sandboxes(*l))
            .flat_map(|(_, d)| d)
            .collect();
        check(!dirs.is_empty(), "idle sandboxes have cgroups")?;
        check(live_cgroups() >= before + 4, "four pooled sandboxes")?;
        pool.shutdown().await;
        let left: Vec<&PathBuf> = dirs.iter().filter(|d| d.exists()).collect();
        check(
            left.is_empty(),
            format!("cgroups left after shutdown: {left:?}"),
        )?;
        check(live_cgroups() == before, "no sandbox cgroup is left")?;
        let stats: HashMap<_, _> = pool.stats();
        check(
            stats.values().all(|s| s.idle == 0 && s.starting == 0),
            format!("{stats:?}"),
        )?;
        check(
            pool.take(&spec(Language::Python)).await.is_none(),
            "a closed pool hands nothing out",
        )?;
        Ok(())
    })
}

/// A pool that follows demand: between `floor` and `ceiling`, held `shrink_after`.
fn adaptive(floor: usize, ceiling: usize, shrink_after: Duration, language: Language) -> WarmPool {
    let templates = [(
        language,
        Template {
            spec: spec(language),
            hold: None,
            per_sandbox: None,
        },
    )]
    .into_iter()
    .collect();
    let bounds = Bounds::new(floor, ceiling, shrink_after).expect("bounds");
    WarmPool::new(client().clone(), bounds, templates)
}

/// Runs `n` programs one after another, each sent as soon as the last answered; which
/// were warm.
async fn sequential(pool: &WarmPool, language: Language, n: usize) -> Result<Vec<bool>, Failed> {
    let mut warm = Vec::new();
    for i in 0..n {
        let r = run(
            Some(pool),
            language,
            &format!("console.log({i})"),
            Duration::from_secs(30),
        )
        .await?;
        check(
            r.stdout == format!("{i}\n"),
            format!("{:?} {:?}", r.stdout, r.stderr),
        )?;
        warm.push(r.warm);
    }
    Ok(warm)
}

fn burst_grows_then_shrinks() -> Result<(), Failed> {
    // TypeScript: a warm run (code delivered to a started Deno) is much shorter than a
    // start (a Deno start and the runtime's load), so back-to-back calls arrive within a
    // time-to-ready of each other: the demand the pool must follow.
    const LANGUAGE: Language = Language::TypeScript;
    const FLOOR: usize = 1;
    const CEILING: usize = 6;
    const CALLS: usize = 12;
    block_on(async {
        let before = live_cgroups();
        // Held long enough for the pool to fill up to what the burst asked for.
        let pool = adaptive(FLOOR, CEILING, Duration::from_secs(8), LANGUAGE);
        until_idle(&pool, LANGUAGE, FLOOR).await?;
        let first = sequential(&pool, LANGUAGE, CALLS).await?;
        let grown = pool.stats()[&LANGUAGE].clone();
        check(
            grown.target > FLOOR && grown.target <= CEILING,
            format!("the burst did not grow the pool within its bounds: {grown:?}"),
        )?;
        check(
            grown.ready_ms.is_some(),
            format!("no time to ready measured: {grown:?}"),
        )?;
        // It fills up to its target while nothing arrives (never past the ceiling) ...
        let deadline = Instant::now() + Duration::from_secs(6);
        let full = loop {
            let s = pool.stats()[&LANGUAGE].clone();
            check(
                s.idle + s.starting <= CEILING,
                format!("past the ceiling: {s:?}"),
            )?;
            if s.idle == s.target && s.starting == 0 {
                break s;
            }
            if Instant::now() > deadline {
                return Err(format!("the pool never filled to its target: {s:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        check(
            full.target > FLOOR,
            format!("it shrank before it filled: {full:?}"),
        )?;
        // ... so the next burst finds that many warm (the first burst found FLOOR).
        let second = sequential(&pool, LANGUAGE, CALLS).await?;
        let served = second.iter().take_while(|w| **w).count();
        check(
            served >= full.target,
            format!(
                "{full:?} ready, but the second burst began {:?} (the first {:?})",
                pattern(&second),
                pattern(&first)
            ),
        )?;
        // Idle for longer than shrink_after: back to the floor, the rest killed and reaped.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = pool.stats()[&LANGUAGE].clone();
            if s.target == FLOOR
                && s.idle == FLOOR
                && s.starting == 0
                && live_cgroups() == before + FLOOR
            {
                check(s.shrunk > 0, format!("nothing counted as shrunk: {s:?}"))?;
                check(s.arrival_rate_per_s == 0.0, format!("{s:?}"))?;
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "it never shrank back: {s:?}, {} cgroups",
                    live_cgroups() - before
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        pool.shutdown().await;
        check(live_cgroups() == before, "no sandbox cgroup is left")?;
        Ok(())
    })
}

fn pattern(warm: &[bool]) -> String {
    warm.iter().map(|w| if *w { 'W' } else { 'c' }).collect()
}

fn flood_stays_under_the_ceiling() -> Result<(), Failed> {
    // A hostile client: many calls at once, as fast as admission lets them in. The pool
    // grows to its ceiling and no further; live sandboxes stay within the admission
    // limit plus the ceiling.
    const CEILING: usize = 3;
    const CONCURRENCY: usize = 3;
    block_on(async {
        let before = live_cgroups();
        let pool = Arc::new(adaptive(
            1,
            CEILING,
            Duration::from_secs(60),
            Language::Python,
        ));
        until_idle(&pool, Language::Python, 1).await?;
        let admission = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
        let peak = Arc::new(AtomicUsize::new(0));
        let peak_pool = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(tokio::sync::Notify::new());
        let sampler = {
            let (peak, peak_pool, done, pool) =
                (peak.clone(), peak_pool.clone(), done.clone(), pool.clone());
            tokio::spawn(async move {
                loop {
                    peak.fetch_max(live_cgroups() - before, Ordering::Relaxed);
                    let s = pool.stats()[&Language::Python].clone();
                    peak_pool.fetch_max(s.idle + s.starting, Ordering::Relaxed);
                    tokio::select! {
                        _ = done.notified() => return,
                        _ = tokio::time::sleep(Duration::from_millis(2)) => {}
                    }
                }
            })
        };
        let mut tasks = Vec::new();
        for i in 0..40 {
            let (pool, admission) = (pool.clone(), admission.clone());
            tasks.push(tokio::spawn(async move {
                let slot = admission.acquire_owned().await.expect("admission");
                run_admitted(
                    Some(&pool),
                    Language::Python,
                    &format!("print({i})"),
                    Duration::from_secs(30),
                    slot,
                )
                .await
            }));
        }
        for (i, t) in tasks.into_iter().enumerate() {
            let r = t.await.map_err(|e| e.to_string())??;
            check(r.stdout == format!("{i}\n"), format!("{:?}", r.stdout))?;
        }
        done.notify_one();
        sampler.await.map_err(|e| e.to_string())?;
        let stats = pool.stats()[&Language::Python].clone();
        check(
            stats.target == CEILING,
            format!("the flood did not reach the ceiling: {stats:?}"),
        )?;
        let (peak, peak_pool) = (
            peak.load(Ordering::Relaxed),
            peak_pool.load(Ordering::Relaxed),
        );
        check(
            peak_pool <= CEILING,
            format!("the pool held {peak_pool} (ready + starting); its ceiling is {CEILING}"),
        )?;
        check(
            peak <= CONCURRENCY + CEILING,
            format!("{peak} sandboxes alive at once; the limit is {CONCURRENCY} running + {CEILING} pooled"),
        )?;
        pool.shutdown().await;
        check(live_cgroups() == before, "no sandbox cgroup is left")?;
        Ok(())
    })
}
