//! Sandbox start-up, measured by criterion: `cargo bench --bench sandbox`.
//!
//! - `spawn/python3 -S -c pass`: a fresh sandbox with every layer (what `codebox exec`
//!   does) running the smallest program the rootfs has, spawned from this process;
//! - `python print(1)/cold|warm` and `typescript console.log(1)/cold|warm`: the codebox
//!   runtime through the spawner, as the server runs it: cold spawns a sandbox for the
//!   run, warm takes one from a warm pool of two. A warm sample starts when the pool is
//!   full (the wait is not timed), so it measures the request path: take, deliver the
//!   code, collect the output; the refill then runs beside it as it does in the server.
//!
//! A custom `main` (harness = false): in-process spawns and forking the spawner need a
//! single-threaded process, so both happen before the tokio runtime exists. Skips with
//! the reason when there is no rootfs (`cargo xtask rootfs`).

use std::time::{Duration, Instant};

use codebox::execution::{self, Host};
use codebox::pool::{Template, WarmPool};
use codebox::profile::Profile;
use codebox::rootfs;
use codebox::runtime::{self, Language};
use codebox::sandbox::{supervise::Discard, IdMapping, Program};
use codebox::spawner::{self, SpawnSpec, SpawnerClient};
use criterion::Criterion;
use tokio::runtime::Runtime;

const POOL_SIZE: usize = 2;
const RUN_TIMEOUT: Duration = Duration::from_secs(30);

fn main() {
    let host = match host() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("SKIP sandbox bench: {e}");
            return;
        }
    };
    let mut c = Criterion::default()
        .sample_size(50)
        .measurement_time(Duration::from_secs(8))
        .configure_from_args();
    spawn_trivial_program(&mut c, &host);
    assert_single_threaded("forking the spawner");
    // SAFETY: the process is single-threaded (checked just above): criterion runs the
    // benches on this thread and the tokio runtime is built only after the fork.
    let (_pid, sock) = unsafe { spawner::start(&host) }.expect("the spawner starts");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let client = rt
        .block_on(async { SpawnerClient::new(sock) })
        .expect("spawner client");
    for (language, code) in [
        (Language::Python, "print(1)"),
        (Language::TypeScript, "console.log(1)"),
    ] {
        runtime_cold_and_warm(&mut c, &rt, &client, language, code);
    }
    c.final_summary();
}

fn host() -> Result<Host, String> {
    let dir = rootfs::locate(None).map_err(|e| e.to_string())?;
    let rootfs =
        rootfs::verify(&dir, rootfs::default_stamp_dir().as_deref()).map_err(|e| e.to_string())?;
    Ok(Host::new(rootfs, IdMapping::for_current_process(65534)))
}

/// Panics unless this process has exactly one thread (`Threads:` of /proc/self/status).
fn assert_single_threaded(before: &str) {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let threads = status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .map(|n| n.trim().to_owned());
    assert_eq!(
        threads.as_deref(),
        Some("1"),
        "{before} needs a single-threaded process"
    );
}

/// A sandbox with every layer of the default profile around `python3 -S -c pass`.
fn spawn_trivial_program(c: &mut Criterion, host: &Host) {
    let profile = Profile::load("default").expect("default profile");
    let argv = ["/usr/bin/python3", "-S", "-c", "pass"];
    let env = Language::Python.env();
    assert_single_threaded("spawning sandboxes in-process");
    c.bench_function("spawn/python3 -S -c pass", |b| {
        b.iter(|| {
            let program = Program::new(argv[0], &argv, &env, "/workspace").expect("program");
            let outcome = execution::execute_program(
                host,
                program,
                &profile.limits,
                &profile.policy,
                &mut Discard,
            )
            .expect("the sandbox runs");
            assert_eq!(outcome.exit_code(), Some(0), "{outcome:?}");
        })
    });
}

fn spec(language: Language) -> SpawnSpec {
    SpawnSpec {
        language,
        profile: "default".into(),
        limits: Profile::load("default").expect("default profile").limits,
        workspace: None,
        servers: None,
        skills: None,
        workspace_mount: None,
        network: None,
        packages: None,
        pooled: false,
    }
}

/// `code` in a cold sandbox, then in pooled ones; every run must print `1`.
fn runtime_cold_and_warm(
    c: &mut Criterion,
    rt: &Runtime,
    client: &SpawnerClient,
    language: Language,
    code: &str,
) {
    let mut group = c.benchmark_group(format!("{} {code}", language.name()));
    group.bench_function("cold", |b| {
        b.iter(|| {
            rt.block_on(async {
                let sandbox = client.spawn(spec(language)).await.expect("spawn");
                run(sandbox, code).await
            })
        })
    });
    let template = Template {
        spec: spec(language),
        hold: None,
        per_sandbox: None,
    };
    let pool = rt.block_on(async {
        WarmPool::new(
            client.clone(),
            codebox::pool::Bounds::fixed(POOL_SIZE),
            [(language, template)].into_iter().collect(),
        )
    });
    group.bench_function("warm", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    until_full(&pool, language).await;
                    let start = Instant::now();
                    let warm = pool.take(&spec(language)).await.expect("a pooled sandbox");
                    let (mut sandbox, guard) = warm.into_parts();
                    sandbox.hold_until_gone(guard);
                    run(sandbox, code).await;
                    total += start.elapsed();
                }
                total
            })
        })
    });
    group.finish();
    rt.block_on(pool.shutdown());
}

/// Delivers `code`, waits for the program, and checks it printed `1`.
async fn run(sandbox: spawner::RemoteSandbox, code: &str) {
    let outcome = sandbox
        .run_with_channel(
            runtime::boot_frame(code),
            None,
            (1 << 16, 1 << 16),
            RUN_TIMEOUT,
            std::future::pending(),
            |_, _| {},
        )
        .await
        .expect("the run completes");
    assert_eq!(
        outcome.stdout.bytes,
        b"1\n",
        "stderr: {}",
        String::from_utf8_lossy(&outcome.stderr.bytes)
    );
}

/// Waits (untimed) until the pool holds `POOL_SIZE` ready sandboxes of `language`.
async fn until_full(pool: &WarmPool, language: Language) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while pool.stats().get(&language).map_or(0, |s| s.idle) < POOL_SIZE {
        assert!(
            Instant::now() < deadline,
            "the pool never refilled: {:?}",
            pool.stats()
        );
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
}
