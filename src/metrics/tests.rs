use std::collections::HashMap;
use std::time::Duration;

use super::labels::{EgressDecision, Outcome, Refusal, UpstreamOutcome};
use super::*;
use crate::execution::SandboxStart;
use crate::upstream::ServerState;

/// A result as `result_from` makes it: exit 0, warm, 120 ms of CPU, 40 MiB peak.
fn result(language: Language) -> ExecutionResult {
    let mut r = crate::execution::result_from(
        language,
        None,
        true,
        crate::sandbox::Outcome {
            status: Some(crate::sandbox::ProgramStatus::Exited(0)),
            timed_out: false,
            stdout: Default::default(),
            stderr: Default::default(),
            duration: Duration::from_millis(30),
            landlock: None,
            cgroup: None,
        },
    );
    r.start = Some(SandboxStart::Warm);
    r.cpu_ms = Some(120.0);
    r.peak_memory_bytes = Some(40 << 20);
    r
}

/// Every sample line of a text exposition: `name{labels}` → value.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("a sample line");
            (series.to_string(), value.parse().expect("a number"))
        })
        .collect()
}

/// `# TYPE` of every family.
fn types(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let (name, kind) = l.split_once(' ').unwrap();
            (name.to_string(), kind.to_string())
        })
        .collect()
}

fn snapshot() -> Snapshot {
    Snapshot {
        slots: 4,
        queue_depth: 2,
        draining: true,
        pool: vec![PoolFigures {
            language: Language::Python,
            floor: 2,
            ceiling: 8,
            target: 5,
            arrival_rate_per_s: 12.0,
            ready_seconds: Some(0.25),
            shrunk: 4,
            warm: 1,
            starting: 1,
            handed_out: 7,
            missed: 3,
            died_idle: 1,
            spawn_failures: 0,
            idle_memory_bytes: 9 << 20,
        }],
        upstreams: vec![("memory".into(), ServerState::Reconnecting)],
        sessions_open: 5,
        session_interpreters: 1,
        sessions_paused: 3,
        sessions_paused_bytes: 4096,
        tasks_running: 0,
    }
}

#[test]
fn executions_are_counted_by_language_outcome_and_start() {
    let m = Metrics::new();
    m.execution_ended(&result(Language::Python), Duration::from_millis(40));
    let mut failed = result(Language::TypeScript);
    failed.exit_code = Some(1);
    failed.start = Some(SandboxStart::Cold);
    m.execution_ended(&failed, Duration::from_millis(700));
    let mut timed_out = result(Language::Python);
    timed_out.timed_out = true;
    timed_out.exit_code = None;
    timed_out.signal = Some(9);
    timed_out.start = None;
    m.execution_ended(&timed_out, Duration::from_secs(3));
    m.execution_refused(Language::Python, Refusal::QueueFull);
    m.execution_unfinished(Language::TypeScript, Outcome::Stopped);
    let text = m.render(&Snapshot::default(), Format::Prometheus).unwrap();
    let s = samples(&text);
    let count = |labels: &str| s[&format!("codebox_executions_total{{{labels}}}")];
    assert_eq!(count(r#"language="python",outcome="ok",start="warm""#), 1.0);
    assert_eq!(
        count(r#"language="typescript",outcome="error",start="cold""#),
        1.0
    );
    assert_eq!(
        count(r#"language="python",outcome="timeout",start="session""#),
        1.0
    );
    assert_eq!(
        count(r#"language="python",outcome="refused",start="none""#),
        1.0
    );
    assert_eq!(
        count(r#"language="typescript",outcome="stopped",start="none""#),
        1.0
    );
    // Created ahead at 0, so a first event is an increase.
    assert_eq!(
        count(r#"language="python",outcome="oom",start="cold""#),
        0.0
    );
    assert_eq!(
        s[r#"codebox_admission_refusals_total{reason="queue_full"}"#],
        1.0
    );
    assert_eq!(
        s[r#"codebox_admission_refusals_total{reason="draining"}"#],
        0.0
    );
    // The histogram: a 40 ms warm run is in the 0.05 bucket, not the 0.025 one.
    let bucket = |le: &str| {
        s[&format!(
            r#"codebox_execution_duration_seconds_bucket{{language="python",start="warm",le="{le}"}}"#
        )]
    };
    assert_eq!(bucket("0.025"), 0.0);
    assert_eq!(bucket("0.05"), 1.0);
    assert_eq!(bucket("+Inf"), 1.0);
    assert_eq!(
        s[r#"codebox_sandbox_cpu_seconds_total{language="python"}"#],
        0.24
    );
    assert_eq!(
        s[r#"codebox_sandbox_memory_peak_bytes_count{language="typescript"}"#],
        1.0
    );
    let t = types(&text);
    assert_eq!(t["codebox_executions_total"], "counter");
    assert_eq!(t["codebox_execution_duration_seconds"], "histogram");
    assert_eq!(t["codebox_executions_in_flight"], "gauge");
    assert_eq!(t["codebox_sandbox_memory_peak_bytes"], "histogram");
}

#[test]
fn outcomes_follow_how_the_program_ended() {
    let ok = result(Language::Python);
    assert_eq!(Outcome::of(&ok), Outcome::Ok);
    let mut r = ok.clone();
    r.oom_killed = true;
    r.signal = Some(9);
    r.exit_code = None;
    assert_eq!(Outcome::of(&r), Outcome::Oom);
    let mut r = ok.clone();
    r.signal = Some(31);
    r.exit_code = None;
    r.seccomp_violation = true;
    assert_eq!(Outcome::of(&r), Outcome::Killed);
    let mut r = ok.clone();
    r.exit_code = None;
    assert_eq!(Outcome::of(&r), Outcome::Cancelled);
    let mut r = ok;
    r.workspace_quota_exceeded = true;
    assert_eq!(Outcome::of(&r), Outcome::Error);
}

#[test]
fn in_flight_counts_held_guards_only() {
    let m = Metrics::new();
    let in_flight = |m: &Metrics| {
        samples(&m.render(&Snapshot::default(), Format::Prometheus).unwrap())
            ["codebox_executions_in_flight"]
    };
    let a = m.running();
    let b = m.running();
    assert_eq!(in_flight(&m), 2.0);
    drop(a);
    assert_eq!(in_flight(&m), 1.0);
    // A guard dropped by a panic (an execution's task aborted) is given back too.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _c = m.running();
        panic!("aborted");
    }));
    drop(b);
    assert_eq!(in_flight(&m), 0.0);
}

#[test]
fn the_snapshot_is_encoded_with_every_language_and_upstream_state() {
    let m = Metrics::new();
    let s = samples(&m.render(&snapshot(), Format::Prometheus).unwrap());
    assert_eq!(s["codebox_execution_slots"], 4.0);
    assert_eq!(s["codebox_execution_queue_depth"], 2.0);
    assert_eq!(s["codebox_draining"], 1.0);
    assert_eq!(s["codebox_sessions_open"], 5.0);
    assert_eq!(s["codebox_sessions_paused"], 3.0);
    assert_eq!(s["codebox_sessions_paused_bytes"], 4096.0);
    assert_eq!(s[r#"codebox_pool_warm{language="python"}"#], 1.0);
    assert_eq!(s[r#"codebox_pool_target{language="python"}"#], 5.0);
    assert_eq!(s[r#"codebox_pool_floor{language="python"}"#], 2.0);
    assert_eq!(s[r#"codebox_pool_ceiling{language="python"}"#], 8.0);
    assert_eq!(s[r#"codebox_pool_arrival_rate{language="python"}"#], 12.0);
    assert_eq!(s[r#"codebox_pool_ready_seconds{language="python"}"#], 0.25);
    assert_eq!(s[r#"codebox_pool_shrunk_total{language="python"}"#], 4.0);
    assert_eq!(s[r#"codebox_pool_ceiling{language="typescript"}"#], 0.0);
    // A language without pool figures still has its series.
    assert_eq!(s[r#"codebox_pool_target{language="typescript"}"#], 0.0);
    assert_eq!(
        s[r#"codebox_pool_takes_total{language="python",result="hit"}"#],
        7.0
    );
    assert_eq!(
        s[r#"codebox_pool_takes_total{language="python",result="miss"}"#],
        3.0
    );
    let state = |st: &str| s[&format!(r#"codebox_upstream_state{{server="memory",state="{st}"}}"#)];
    assert_eq!(state("reconnecting"), 1.0);
    assert_eq!(state("ready") + state("failed") + state("connecting"), 0.0);
    let version = format!(
        r#"codebox_build_info{{version="{}"}}"#,
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(s[&version], 1.0);
}

#[test]
fn openmetrics_ends_with_eof_and_both_formats_carry_the_same_samples() {
    let m = Metrics::new();
    m.execution_ended(&result(Language::Python), Duration::from_millis(5));
    m.egress(EgressDecision::Denied);
    m.upstream_call("memory", UpstreamOutcome::Ok, Duration::from_millis(2));
    let open = m.render(&snapshot(), Format::OpenMetrics).unwrap();
    assert!(open.ends_with("# EOF\n"), "{open}");
    let plain = m.render(&snapshot(), Format::Prometheus).unwrap();
    assert!(!plain.contains("# EOF"));
    // The formats order a histogram's `le` differently and write numbers differently.
    let normal = |text: &str| -> HashMap<String, f64> {
        samples(text)
            .into_iter()
            .map(|(series, v)| {
                let Some((name, labels)) = series.split_once('{') else {
                    return (series, v);
                };
                let mut labels: Vec<String> = labels
                    .trim_end_matches('}')
                    .split(',')
                    .map(|l| match l.strip_prefix("le=") {
                        Some(le) => {
                            format!("le={:?}", le.trim_matches('"').parse::<f64>().unwrap())
                        }
                        None => l.to_string(),
                    })
                    .collect();
                labels.sort();
                (format!("{name}{{{}}}", labels.join(",")), v)
            })
            .collect()
    };
    let a = normal(&open);
    assert_eq!(a, normal(&plain));
    assert_eq!(
        a[r#"codebox_egress_decisions_total{decision="denied"}"#],
        1.0
    );
    assert_eq!(
        a[r#"codebox_upstream_call_duration_seconds_count{outcome="ok",server="memory"}"#],
        1.0
    );
}

#[test]
fn upstream_names_past_the_cap_share_one_series() {
    let m = Metrics::new();
    for i in 0..(MAX_UPSTREAM_SERVERS + 500) {
        m.upstream_call(&format!("s{i}"), UpstreamOutcome::Timeout, Duration::ZERO);
    }
    let s = samples(&m.render(&Snapshot::default(), Format::Prometheus).unwrap());
    let series = s
        .keys()
        .filter(|k| k.starts_with("codebox_upstream_call_duration_seconds_count"))
        .count();
    assert_eq!(series, MAX_UPSTREAM_SERVERS + 1);
    assert_eq!(
        s[r#"codebox_upstream_call_duration_seconds_count{server="_other",outcome="timeout"}"#],
        500.0
    );
}

#[test]
fn label_values_are_escaped() {
    // An upstream name comes from the configuration; a quote or newline in it must not
    // break the exposition.
    let m = Metrics::new();
    m.upstream_call("we\"ird\nname", UpstreamOutcome::Ok, Duration::ZERO);
    let text = m.render(&Snapshot::default(), Format::Prometheus).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("codebox_upstream_call_duration_seconds_count"))
        .unwrap();
    assert!(line.contains(r#"server="we\"ird\nname""#), "{line}");
}

#[test]
fn the_format_is_negotiated_from_accept() {
    use Format::*;
    let prometheus_2 = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    assert_eq!(Format::negotiate(Some(prometheus_2)), OpenMetrics);
    assert_eq!(
        Format::negotiate(Some("application/openmetrics-text")),
        OpenMetrics
    );
    assert_eq!(Format::negotiate(None), Prometheus);
    assert_eq!(Format::negotiate(Some("*/*")), Prometheus);
    assert_eq!(
        Format::negotiate(Some("text/plain;version=0.0.4")),
        Prometheus
    );
    // Only a version the encoder writes, and not when text is preferred or q is 0.
    assert_eq!(
        Format::negotiate(Some("application/openmetrics-text;version=0.0.1")),
        Prometheus
    );
    assert_eq!(
        Format::negotiate(Some("application/openmetrics-text;q=0.2, text/plain")),
        Prometheus
    );
    assert_eq!(
        Format::negotiate(Some("application/openmetrics-text;q=0")),
        Prometheus
    );
    assert_eq!(Format::negotiate(Some(";;;,,=q=;q=nan")), Prometheus);
    assert!(Prometheus
        .content_type()
        .starts_with("text/plain; version=0.0.4"));
    assert!(OpenMetrics
        .content_type()
        .starts_with("application/openmetrics-text; version=1.0.0"));
}
