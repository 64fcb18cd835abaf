//! microVM figures: template boot and snapshot, clone restore, a warm `print(1)` on a
//! clone next to a cold namespace sandbox's, and the memory an idle clone adds.
//!
//! `cargo bench --bench microvm` (needs `cargo xtask rootfs` and `cargo xtask guest`
//! built from `target/release/codebox` or, for a debug guest, `CODEBOX_GUEST`): a plain
//! main, single-threaded (every jail and sandbox is cloned from it), TCG unless the
//! accelerator probe found KVM. Prints medians; `CODEBOX_BENCH_ROUNDS` (default 10).
//! Timings of a busy machine are not figures: run it on a quiet one, or read the
//! side-by-side ratios only.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use codebox::execution::Host;
use codebox::microvm::{image, qemu::Accel, run, template};
use codebox::runtime::{self, Language};
use codebox::sandbox::{self, Discard, IdMapping};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// PSS and private (USS) KiB of a process, from smaps_rollup.
fn memory_kib(pid: i32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (
        field("Pss:"),
        field("Private_Clean:") + field("Private_Dirty:"),
    )
}

/// The mappings of a process holding the most private memory: (KiB, what).
fn top_private(pid: i32, n: usize) -> Vec<(u64, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut out: Vec<(u64, String)> = Vec::new();
    let mut name = String::new();
    let mut private = 0;
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            if private > 0 {
                out.push((private, name.clone()));
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            name = format!("{} {}", f[0], f.get(5).copied().unwrap_or("[anon]"));
            private = 0;
        } else if first == "Private_Clean:" || first == "Private_Dirty:" {
            private += line
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    if private > 0 {
        out.push((private, name));
    }
    out.sort_by_key(|m| std::cmp::Reverse(m.0));
    out.truncate(n);
    out
}

/// The QEMU of a jail: the only child of its init.
fn qemu_pid(init: i32) -> i32 {
    let children =
        std::fs::read_to_string(format!("/proc/{init}/task/{init}/children")).unwrap_or_default();
    children
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the jail's QEMU")
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let rootfs_dir = std::env::var_os("CODEBOX_ROOTFS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/rootfs"));
    let rounds: usize = std::env::var("CODEBOX_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let Ok(rootfs) = codebox::rootfs::verify(&rootfs_dir, None) else {
        eprintln!(
            "SKIP: no rootfs at {} (cargo xtask rootfs)",
            rootfs_dir.display()
        );
        return;
    };
    let host = Host::new(
        rootfs,
        IdMapping::for_current_process(sandbox::idmap::DEFAULT_ROOT_HOST_ID),
    );
    let Ok(image) = image::locate(None).and_then(|d| image::load(&d)) else {
        eprintln!("SKIP: no guest tree (cargo xtask guest)");
        return;
    };
    let build_id = image.description.init_build_id.clone();
    let accel = match codebox::microvm::accel::choose(
        &host,
        &image,
        codebox::microvm::accel::AccelMode::Auto,
        codebox::rootfs::default_stamp_dir().as_deref(),
    ) {
        Ok(c) => {
            println!("accelerator: {} ({})", c.accel.name(), c.reason);
            c.accel
        }
        Err(_) => Accel::Tcg,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let profile = codebox::profile::Profile::load("default").unwrap();
    let frame = runtime::ephemeral(runtime::boot_frame("print(1)"));

    // The namespace floor: a cold in-process sandbox running the same print(1).
    let mut ns = Vec::new();
    for _ in 0..rounds {
        let mut program = Language::Python.program().unwrap();
        program
            .set_env(&runtime::thread_env(profile.limits.cpu_millicores))
            .unwrap();
        let spec = host.spec(program, None, &profile.limits, &profile.policy);
        let t = Instant::now();
        let sb = sandbox::spawn(&spec, host.cgroups.as_ref()).unwrap();
        let out = sb
            .run_to_completion(&frame, &spec.limits, &mut Discard)
            .unwrap();
        ns.push(t.elapsed());
        assert_eq!(out.stdout.bytes, b"1\n");
    }
    println!(
        "namespace, cold print(1) in-process: median {}",
        ms(median(ns.clone()))
    );

    for stage in [template::Stage::Interpreter, template::Stage::Kernel] {
        let spec = run::run_spec(Language::Python, &profile.limits, &profile.policy).unwrap();
        let launched = Instant::now();
        let (jailed, ram) = template::launch(&host, &image, accel, &spec).unwrap();
        let t = rt
            .block_on(template::make(
                jailed,
                ram,
                &build_id,
                Language::Python,
                spec,
                stage,
                launched,
            ))
            .unwrap();
        println!(
            "\npython template ({stage:?}): boot {}, to ready {}, snapshot {}, device state {} KiB, RAM {} MiB",
            ms(t.figures.boot),
            ms(t.figures.ready),
            ms(t.figures.snapshot),
            t.figures.state_bytes / 1024,
            t.machine.memory_mib
        );
        let (mut restore, mut total, mut launch) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let started = Instant::now();
            let jailed = t.launch_clone(&host, &image).unwrap();
            launch.push(started.elapsed());
            let (sb, r) = rt
                .block_on(t.restore(jailed, started, Duration::from_secs(120)))
                .unwrap();
            restore.push(r);
            let (out, ending) = rt
                .block_on(run::capture(
                    sb,
                    frame.clone(),
                    None,
                    (t.spec.limits.stdout_cap, t.spec.limits.stderr_cap),
                    t.spec.limits.timeout,
                    std::future::pending::<()>(),
                    |_, _| {},
                ))
                .unwrap();
            total.push(started.elapsed());
            assert_eq!(out.stdout.bytes, b"1\n", "{}", ending.console);
        }
        let nsm = median(ns.clone());
        let tm = median(total.clone());
        println!(
            "  clone: jail launched {}, restored (running, reseeded{}) {}, print(1) done {} = {:.1}x the namespace run",
            ms(median(launch)),
            if stage == template::Stage::Kernel { ", program exec'd" } else { "" },
            ms(median(restore)),
            ms(tm),
            tm.as_secs_f64() / nsm.as_secs_f64()
        );
        // Idle clones: restored, waiting for code; their memory beyond the template's
        // shared RAM file.
        let mut idle = Vec::new();
        for _ in 0..4 {
            let started = Instant::now();
            let jailed = t.launch_clone(&host, &image).unwrap();
            let init = jailed.process.init_pid().expect("cloned here");
            let (sb, _) = rt
                .block_on(t.restore(jailed, started, Duration::from_secs(120)))
                .unwrap();
            idle.push((sb, qemu_pid(init)));
        }
        // Let them settle (the guest's idle loop after the resume).
        rt.block_on(async { tokio::time::sleep(Duration::from_secs(2)).await });
        let mut line = String::new();
        for (_, pid) in &idle {
            let (pss, uss) = memory_kib(*pid);
            line.push_str(&format!(
                " [PSS {} MiB, private {} MiB]",
                pss / 1024,
                uss / 1024
            ));
        }
        println!("  4 idle clones (QEMU each):{line}");
        if let Some((_, pid)) = idle.first() {
            for (kib, what) in top_private(*pid, 5) {
                println!("    private {kib} KiB in {what}");
            }
        }
        for (mut sb, _) in idle {
            sb.kill();
            rt.block_on(sb.ended());
        }
    }
}
