//! What each isolation layer costs: `cargo bench --bench layers`.
//!
//! Runs `python -c pass` in real sandboxes, alternating round-robin between
//! configurations in one process, rotating the order each round (so machine noise and
//! the previous sandbox's asynchronous teardown hit all alike): namespaces + mounts
//! only, then each policy layer added alone, then all layers, plus the bare interpreter
//! for scale. Prints the median and p90 wall time per run and each configuration's
//! difference from the namespaces-only baseline. `LAYERS_RUNS` sets the runs per
//! configuration (default 60).
//!
//! A plain `main` (harness = false): the process stays single-threaded, which the
//! sandbox spawn requires.

use std::time::Instant;

use codebox::execution::{self, ExecutionRequest, Host};
use codebox::profile::Profile;
use codebox::rootfs;
use codebox::runtime::Language;
use codebox::sandbox::{self, IdMapping, Limits, SecurityPolicy};

struct Config {
    name: &'static str,
    cgroups: bool,
    landlock: bool,
    seccomp: bool,
    samples: Vec<f64>,
}

fn main() {
    let runs: usize = std::env::var("LAYERS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let dir = match rootfs::locate(None) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIP layers bench: {e}");
            return;
        }
    };
    let rootfs = rootfs::verify(&dir, rootfs::default_stamp_dir().as_deref()).expect("rootfs");
    let host = Host::new(rootfs, IdMapping::for_current_process(65534));
    let profile = Profile::load("default").expect("default profile");
    let mut configs = vec![
        cfg("namespaces + mounts only", false, false, false),
        cfg("+ cgroups (limits, kill, stats)", true, false, false),
        cfg("+ landlock", false, true, false),
        cfg("+ seccomp", false, false, true),
        cfg("all layers (default profile)", true, true, true),
    ];
    if host.cgroups.is_none() {
        eprintln!("note: no usable cgroups here; the cgroup rows are skipped");
        configs.retain(|c| !c.cgroups);
    }
    let mut bare = Vec::new();
    for round in 0..=runs {
        let t = Instant::now();
        let ok = std::process::Command::new("/usr/bin/python3")
            .args(["-S", "-c", "pass"])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "bare python3 failed");
        if round > 0 {
            bare.push(ms(t));
        }
        // Rotate the order every round, so no configuration always follows the same one
        // (namespace teardown of the previous sandbox finishes asynchronously).
        let n = configs.len();
        for i in 0..n {
            let c = &mut configs[(round + i) % n];
            let limits = if c.cgroups {
                profile.limits.clone()
            } else {
                Limits {
                    memory_bytes: None,
                    pids: None,
                    cpu_millicores: None,
                    ..profile.limits.clone()
                }
            };
            let policy = SecurityPolicy {
                landlock: if c.landlock {
                    profile.policy.landlock
                } else {
                    None
                },
                network: codebox::sandbox::NetworkAccess::None,
                seccomp: if c.seccomp {
                    profile.policy.seccomp.clone()
                } else {
                    None
                },
            };
            let request = ExecutionRequest {
                language: Language::Python,
                code: "pass".into(),
                files: Default::default(),
                workspace: None,
                limits,
                policy,
                egress: None,
                zygote: false,
            };
            let t = Instant::now();
            let r = execution::execute(&host, &request, &mut sandbox::Discard).expect("run");
            assert!(!r.failed(), "{}: {r:?}", c.name);
            if round > 0 {
                c.samples.push(ms(t));
            }
        }
    }
    bare.sort_by(f64::total_cmp);
    println!("\n{runs} runs each, alternating; wall time per run of `python -c pass`, ms\n");
    println!(
        "{:36} {:>8} {:>8} {:>12}",
        "", "median", "p90", "vs baseline"
    );
    println!(
        "{:36} {:8.2} {:8.2} {:>12}",
        "bare python3 -S -c pass (no sandbox)",
        pct(&bare, 0.5),
        pct(&bare, 0.9),
        ""
    );
    for c in &mut configs {
        c.samples.sort_by(f64::total_cmp);
    }
    let base = pct(&configs[0].samples, 0.5);
    for c in &configs {
        let m = pct(&c.samples, 0.5);
        println!(
            "{:36} {:8.2} {:8.2} {:>+11.2}",
            c.name,
            m,
            pct(&c.samples, 0.9),
            m - base
        );
    }
}

fn cfg(name: &'static str, cgroups: bool, landlock: bool, seccomp: bool) -> Config {
    Config {
        name,
        cgroups,
        landlock,
        seccomp,
        samples: Vec::new(),
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}
