//! What `/metrics` costs: recording one execution's figures (the in-flight guard, the
//! counter, the latency and memory histograms, the CPU counter), one egress decision,
//! one upstream call, and encoding a whole scrape (both formats, 10 upstream servers).
//!
//! `cargo bench --bench metrics`; medians in
//! `target/criterion/metrics/<id>/new/estimates.json`. Goal: recording far below a
//! microsecond, next to an execution's milliseconds.

use std::hint::black_box;
use std::time::Duration;

use codebox::execution::{result_from, SandboxStart};
use codebox::metrics::labels::{EgressDecision, UpstreamOutcome};
use codebox::metrics::{Format, Metrics, PoolFigures, Snapshot};
use codebox::runtime::Language;
use codebox::sandbox::{Outcome, ProgramStatus};
use codebox::upstream::ServerState;
use criterion::{criterion_group, criterion_main, Criterion};

fn bench(c: &mut Criterion) {
    let m = Metrics::new();
    let mut result = result_from(
        Language::Python,
        None,
        true,
        Outcome {
            status: Some(ProgramStatus::Exited(0)),
            timed_out: false,
            stdout: Default::default(),
            stderr: Default::default(),
            duration: Duration::from_millis(20),
            landlock: None,
            cgroup: None,
        },
    );
    result.start = Some(SandboxStart::Warm);
    result.cpu_ms = Some(15.0);
    result.peak_memory_bytes = Some(30 << 20);
    let mut g = c.benchmark_group("metrics");
    g.bench_function("record_one_execution", |b| {
        b.iter(|| {
            let running = m.running();
            m.execution_ended(black_box(&result), Duration::from_millis(25));
            drop(running);
        })
    });
    g.bench_function("record_egress_decision", |b| {
        b.iter(|| m.egress(black_box(EgressDecision::Allowed)))
    });
    g.bench_function("record_upstream_call", |b| {
        b.iter(|| {
            m.upstream_call(
                black_box("github"),
                UpstreamOutcome::Ok,
                Duration::from_millis(3),
            )
        })
    });
    let snapshot = Snapshot {
        slots: 8,
        queue_depth: 1,
        draining: false,
        pool: Language::ALL
            .iter()
            .map(|&language| PoolFigures {
                language,
                floor: 2,
                ceiling: 8,
                target: 2,
                arrival_rate_per_s: 1.0,
                ready_seconds: Some(0.05),
                shrunk: 0,
                warm: 2,
                starting: 0,
                handed_out: 100,
                missed: 3,
                died_idle: 0,
                spawn_failures: 0,
                idle_memory_bytes: 40 << 20,
            })
            .collect(),
        upstreams: (0..10)
            .map(|i| (format!("server{i}"), ServerState::Ready))
            .collect(),
        sessions_open: 3,
        session_interpreters: 1,
        sessions_paused: 0,
        sessions_paused_bytes: 0,
        tasks_running: 0,
    };
    for i in 0..10 {
        m.upstream_call(
            &format!("server{i}"),
            UpstreamOutcome::Ok,
            Duration::from_millis(3),
        );
    }
    g.bench_function("render_prometheus_text", |b| {
        b.iter(|| black_box(m.render(&snapshot, Format::Prometheus).unwrap().len()))
    });
    g.bench_function("render_openmetrics", |b| {
        b.iter(|| black_box(m.render(&snapshot, Format::OpenMetrics).unwrap().len()))
    });
    g.finish();
    let size = m.render(&snapshot, Format::Prometheus).unwrap().len();
    println!("a scrape with 10 upstream servers: {size} bytes");
}

criterion_group!(benches, bench);
criterion_main!(benches);
