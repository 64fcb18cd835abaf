//! The spawner process with the async client, against the real kernel.
//!
//! `harness = false`: the spawner must be forked while the process is single-threaded,
//! before the tokio runtime exists. Cases run one at a time through libtest-mimic.

use std::time::{Duration, Instant};

use codebox::runtime::{self, Language};
use codebox::sandbox::{IdMapping, ProgramStatus};
use codebox::spawner::{self, Stream};
use libtest_mimic::{Failed, Trial};

mod common;
use common::spawner_harness as harness;

fn main() {
    let (args, host) = harness::arguments_and_host("spawner tests", || Ok(()));
    // SAFETY: no thread exists yet: libtest-mimic has not started and tokio is not built.
    unsafe { harness::start_spawner(&host) };
    let trials = vec![
        Trial::test("runs_python_and_typescript", runs_python_and_typescript),
        Trial::test(
            "concurrent_sandboxes_do_not_mix",
            concurrent_sandboxes_do_not_mix,
        ),
        Trial::test("timeout_kills_the_sandbox", timeout_kills_the_sandbox),
        Trial::test("cancel_kills_promptly", cancel_kills_promptly),
        Trial::test("output_streams_while_running", output_streams_while_running),
        Trial::test("dropping_a_sandbox_kills_it", dropping_a_sandbox_kills_it),
        Trial::test(
            "spawn_errors_are_reported_and_the_spawner_survives",
            spawn_errors_are_reported,
        ),
        Trial::test("limits_and_figures_come_back", limits_and_figures_come_back),
        Trial::test(
            "a_workspace_mount_travels_with_the_spawn",
            a_workspace_mount_travels_with_the_spawn,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}

use harness::{block_on, client, spec};

struct Run {
    stdout: String,
    stderr: String,
    status: Option<ProgramStatus>,
    timed_out: bool,
    outcome: codebox::sandbox::Outcome,
}

async fn run(language: Language, code: &str, timeout: Duration) -> Result<Run, Failed> {
    let sb = client()
        .spawn(spec(language))
        .await
        .map_err(|e| e.to_string())?;
    let outcome = sb
        .run_to_completion(
            &runtime::boot_frame(code),
            1 << 20,
            1 << 20,
            timeout,
            std::future::pending(),
            |_, _| {},
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(Run {
        stdout: String::from_utf8_lossy(&outcome.stdout.bytes).into_owned(),
        stderr: String::from_utf8_lossy(&outcome.stderr.bytes).into_owned(),
        status: outcome.status,
        timed_out: outcome.timed_out,
        outcome,
    })
}

fn check(cond: bool, msg: impl Into<String>) -> Result<(), Failed> {
    if cond {
        Ok(())
    } else {
        Err(msg.into().into())
    }
}

fn runs_python_and_typescript() -> Result<(), Failed> {
    block_on(async {
        let r = run(
            Language::Python,
            "print('py', 6 * 7)",
            Duration::from_secs(10),
        )
        .await?;
        check(
            r.stdout == "py 42\n",
            format!("{:?} {:?}", r.stdout, r.stderr),
        )?;
        check(
            r.status == Some(ProgramStatus::Exited(0)),
            format!("{:?}", r.status),
        )?;
        let r = run(
            Language::TypeScript,
            "const n: number = 42; console.log('ts', n)",
            Duration::from_secs(10),
        )
        .await?;
        check(
            r.stdout == "ts 42\n",
            format!("{:?} {:?}", r.stdout, r.stderr),
        )
    })
}

fn concurrent_sandboxes_do_not_mix() -> Result<(), Failed> {
    block_on(async {
        let mut tasks = Vec::new();
        for i in 0..8 {
            tasks.push(tokio::spawn(async move {
                let lang = if i % 4 == 0 {
                    Language::TypeScript
                } else {
                    Language::Python
                };
                let code = match lang {
                    Language::Python => format!("import time; time.sleep(0.2); print({i})"),
                    Language::TypeScript => {
                        format!("await new Promise(r => setTimeout(r, 200)); console.log({i})")
                    }
                };
                (i, run(lang, &code, Duration::from_secs(20)).await)
            }));
        }
        for t in tasks {
            let (i, r) = t.await.map_err(|e| e.to_string())?;
            let r = r?;
            check(
                r.stdout == format!("{i}\n"),
                format!("sandbox {i}: {:?} {:?}", r.stdout, r.stderr),
            )?;
        }
        Ok(())
    })
}

fn timeout_kills_the_sandbox() -> Result<(), Failed> {
    block_on(async {
        let started = Instant::now();
        let r = run(
            Language::Python,
            "while True: pass",
            Duration::from_millis(500),
        )
        .await?;
        check(r.timed_out, "timed out")?;
        check(r.status.is_none(), format!("status {:?}", r.status))?;
        check(
            started.elapsed() < Duration::from_secs(5),
            format!("took {:?}", started.elapsed()),
        )
    })
}

fn cancel_kills_promptly() -> Result<(), Failed> {
    block_on(async {
        let sb = client()
            .spawn(spec(Language::Python))
            .await
            .map_err(|e| e.to_string())?;
        let started = Instant::now();
        let outcome = sb
            .run_to_completion(
                &runtime::boot_frame("while True: pass"),
                1024,
                1024,
                Duration::from_secs(60),
                tokio::time::sleep(Duration::from_millis(300)),
                |_, _| {},
            )
            .await
            .map_err(|e| e.to_string())?;
        check(
            !outcome.timed_out && outcome.status.is_none(),
            format!("{outcome:?}"),
        )?;
        check(
            started.elapsed() < Duration::from_secs(3),
            format!("took {:?}", started.elapsed()),
        )
    })
}

fn output_streams_while_running() -> Result<(), Failed> {
    block_on(async {
        let sb = client()
            .spawn(spec(Language::Python))
            .await
            .map_err(|e| e.to_string())?;
        let started = Instant::now();
        let mut seen = Vec::new();
        let outcome = sb
            .run_to_completion(
                &runtime::boot_frame(
                    "import time\nfor i in range(3):\n    print(i)\n    time.sleep(0.3)",
                ),
                1 << 20,
                1 << 20,
                Duration::from_secs(10),
                std::future::pending(),
                |stream, chunk| {
                    if stream == Stream::Stdout {
                        seen.push((
                            started.elapsed(),
                            String::from_utf8_lossy(chunk).into_owned(),
                        ))
                    }
                },
            )
            .await
            .map_err(|e| e.to_string())?;
        check(outcome.stdout.bytes == b"0\n1\n2\n", format!("{outcome:?}"))?;
        // The first line arrived well before the program ended.
        check(seen.len() >= 2, format!("{seen:?}"))?;
        check(
            seen[0].0 + Duration::from_millis(400) < outcome.duration,
            format!("{seen:?} {:?}", outcome.duration),
        )
    })
}

fn dropping_a_sandbox_kills_it() -> Result<(), Failed> {
    let marker = format!("codebox-spawner-drop-{}", std::process::id());
    block_on(async {
        let sb = client()
            .spawn(spec(Language::Python))
            .await
            .map_err(|e| e.to_string())?;
        drop(sb);
        // The sandbox was killed before its program even got its code; now one that runs.
        let sb = client()
            .spawn(spec(Language::Python))
            .await
            .map_err(|e| e.to_string())?;
        let code = format!("import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60) # {marker}'])\nimport time; time.sleep(60)");
        let frame = runtime::boot_frame(&code);
        let run = sb.run_to_completion(
            &frame,
            1024,
            1024,
            Duration::from_secs(60),
            std::future::pending(),
            |_, _| {},
        );
        // Abandon the run after a moment: dropping the future drops the sandbox.
        let _ = tokio::time::timeout(Duration::from_millis(700), run).await;
        Ok::<_, Failed>(())
    })?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if !any_process_with(&marker) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err("a dropped sandbox's process survived".into())
}

fn spawn_errors_are_reported() -> Result<(), Failed> {
    block_on(async {
        let mut bad = spec(Language::Python);
        bad.profile = "no-such-profile".into();
        match client().spawn(bad).await {
            Err(spawner::Error::Spawn { message }) => {
                check(message.contains("no-such-profile"), message)?
            }
            Err(e) => return Err(e.to_string().into()),
            Ok(_) => return Err("a bad profile spawned".into()),
        }
        let r = run(
            Language::Python,
            "print('still serving')",
            Duration::from_secs(10),
        )
        .await?;
        check(r.stdout == "still serving\n", r.stdout)
    })
}

fn limits_and_figures_come_back() -> Result<(), Failed> {
    block_on(async {
        let mut s = spec(Language::Python);
        s.limits.memory_bytes = Some(64 << 20);
        let sb = client().spawn(s).await.map_err(|e| e.to_string())?;
        let outcome = sb
            .run_to_completion(
                &runtime::boot_frame("b = []\nwhile True: b.append(bytearray(8 << 20))"),
                1 << 20,
                1 << 20,
                Duration::from_secs(20),
                std::future::pending(),
                |_, _| {},
            )
            .await
            .map_err(|e| e.to_string())?;
        let cg = outcome.cgroup.ok_or("no cgroup figures")?;
        check(cg.oom_killed, format!("{cg:?}"))?;
        let r = run(Language::Python, "pass", Duration::from_secs(10)).await?;
        check(
            r.outcome.cgroup.and_then(|c| c.cpu_usec).is_some(),
            "cpu time reported",
        )
    })
}

fn any_process_with(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        e.file_name().to_string_lossy().parse::<u32>().is_ok()
            && std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
    })
}

/// A session's workspace: a keeper-made tmpfs whose copy goes to the spawner with the
/// spawn request and is attached at `/workspace`; the host sees the program's files
/// through the original descriptor, and the kernel enforces its size.
fn a_workspace_mount_travels_with_the_spawn() -> Result<(), Failed> {
    use std::os::fd::AsFd;
    let ids = IdMapping::for_current_process(65534);
    let keeper = codebox::session::keeper::Keeper::start((ids.host_uid, ids.host_gid))
        .map_err(|e| format!("{:#}", anyhow::Error::new(e)))?;
    let fs = keeper.create(256 * 1024, 20).map_err(|e| e.to_string())?;
    let copy = keeper.clone_mount(fs.as_fd()).map_err(|e| e.to_string())?;
    let mut spec = spec(Language::Python);
    spec.workspace_mount = Some(spawner::wire::MountFd(std::sync::Arc::new(copy)));
    let code = "import os\nopen('/workspace/hello', 'w').write('from the sandbox')\ntry:\n    open('/workspace/big', 'wb').write(b'x' * 1_000_000)\nexcept OSError as e:\n    print(e.errno)";
    let outcome = block_on(async {
        let sb = client().spawn(spec).await.map_err(|e| e.to_string())?;
        sb.run_to_completion(
            &runtime::boot_frame(code),
            1 << 20,
            1 << 20,
            Duration::from_secs(10),
            std::future::pending(),
            |_, _| {},
        )
        .await
        .map_err(|e| e.to_string())
    })?;
    let stdout = String::from_utf8_lossy(&outcome.stdout.bytes).into_owned();
    check(
        stdout == "28\n",
        format!(
            "ENOSPC expected: {stdout:?} {:?}",
            String::from_utf8_lossy(&outcome.stderr.bytes)
        ),
    )?;
    let hello =
        codebox::session::disk::read_file(fs.as_fd(), "hello", 100).map_err(|e| e.to_string())?;
    check(hello == b"from the sandbox", format!("{hello:?}"))?;
    let usage = codebox::session::disk::usage(fs.as_fd()).map_err(|e| e.to_string())?;
    check(
        usage.full && usage.bytes <= 256 * 1024,
        format!("{usage:?}"),
    )
}
