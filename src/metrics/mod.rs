//! `/metrics`: codebox's figures in the Prometheus text format (or OpenMetrics, when the
//! scraper asks for it), with `prometheus-client`.
//!
//! Two kinds of figures:
//!
//! - events, recorded where they happen through [`Metrics`]'s methods (one line at each
//!   call site): executions by language, outcome and start, their latency, the sandbox's
//!   CPU and peak memory, refusals, upstream calls, egress decisions, and the executions
//!   running now (a guard, so the gauge the autoscaler reads is exact however a call
//!   ends);
//! - state the server already keeps (queue, slots, pool, upstream states, sessions,
//!   tasks, draining), read when scraped into a [`Snapshot`] and encoded with it, so
//!   nothing is kept twice.
//!
//! One process-wide [`Metrics`] ([`global`]), as Firecracker keeps its `METRICS`: the
//! events happen deep in modules (the egress proxy, the upstream manager) that have no
//! server value to carry one, and every figure is an atomic.
//!
//! Labels are enums ([`labels`]): a request cannot create a series. The only free-text
//! label, an upstream server's name, comes from the configuration and is capped again at
//! [`MAX_UPSTREAM_SERVERS`] names (the rest count as `_other`). Nothing here is secret:
//! no client names, tokens, session ids, code or host names.

pub mod labels;
mod snapshot;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use prometheus_client::encoding::{prometheus_text, text};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::execution::ExecutionResult;
use crate::runtime::Language;
use labels::{
    DurationLabels, EgressDecision, EgressLabels, ExecutionLabels, LanguageLabels, Outcome,
    Refusal, RefusalLabels, Start, UpstreamCallLabels, UpstreamOutcome,
};
pub use snapshot::{PoolFigures, Snapshot};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot encode the metrics")]
    Encode(#[from] std::fmt::Error),
}

/// Distinct upstream server names labelled; the configuration names fewer, this only
/// guards against a caller passing something else.
pub const MAX_UPSTREAM_SERVERS: usize = 256;

/// The label an upstream server past [`MAX_UPSTREAM_SERVERS`] is counted under.
const OTHER_SERVER: &str = "_other";

/// Execution latency: a warm `print(1)` takes milliseconds, the default timeout is 30 s
/// and `max_timeout` 5 min.
const EXECUTION_BUCKETS: [f64; 15] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Upstream call latency: a local stdio tool answers in a millisecond, the default
/// `tool_call_timeout` is 60 s.
const UPSTREAM_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Peak memory of one sandbox, 8 MiB to 8 GiB by powers of two: what `memory` limits and
/// a pod's requests are sized in.
fn memory_buckets() -> impl Iterator<Item = f64> {
    (0..11).map(|k| (8u64 << 20 << k) as f64)
}

fn execution_histogram() -> Histogram {
    Histogram::new(EXECUTION_BUCKETS)
}

fn upstream_histogram() -> Histogram {
    Histogram::new(UPSTREAM_BUCKETS)
}

fn memory_histogram() -> Histogram {
    Histogram::new(memory_buckets())
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The event figures, and the registry that names them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    executions: Family<ExecutionLabels, Counter>,
    duration: HistogramFamily<DurationLabels>,
    in_flight: Gauge,
    refusals: Family<RefusalLabels, Counter>,
    cpu_seconds: Family<LanguageLabels, Counter<f64, std::sync::atomic::AtomicU64>>,
    memory_peak: HistogramFamily<LanguageLabels>,
    egress: Family<EgressLabels, Counter>,
    upstream_calls: HistogramFamily<UpstreamCallLabels>,
    /// The upstream server names labelled so far (at most [`MAX_UPSTREAM_SERVERS`]).
    upstream_names: Mutex<HashSet<String>>,
}

/// The process's figures.
pub fn global() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
}

/// An execution holding its admission slot: counted in `codebox_executions_in_flight`
/// until dropped.
#[must_use = "the execution counts as running only while this is held"]
pub struct Running(Gauge);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let m = Metrics {
            registry: Registry::default(),
            executions: Family::default(),
            duration: Family::new_with_constructor(execution_histogram),
            in_flight: Gauge::default(),
            refusals: Family::default(),
            cpu_seconds: Family::default(),
            memory_peak: Family::new_with_constructor(memory_histogram),
            egress: Family::default(),
            upstream_calls: Family::new_with_constructor(upstream_histogram),
            upstream_names: Mutex::default(),
        };
        m.register()
    }

    /// Names every family and creates the series known in advance at 0, so the first
    /// event of each is seen by `rate()` and `increase()`.
    fn register(mut self) -> Metrics {
        let r = &mut self.registry;
        r.register(
            "codebox_executions",
            "Execute calls by language, how they ended, and where their sandbox came from",
            self.executions.clone(),
        );
        r.register(
            "codebox_execution_duration_seconds",
            "Time from an execute call's arrival to its result (queue wait, sandbox start, run), of calls that ran",
            self.duration.clone(),
        );
        r.register(
            "codebox_executions_in_flight",
            "Executions holding an admission slot now (running, or installing their packages)",
            self.in_flight.clone(),
        );
        r.register(
            "codebox_admission_refusals",
            "Executions refused before they ran, by reason",
            self.refusals.clone(),
        );
        r.register(
            "codebox_sandbox_cpu_seconds",
            "CPU time of the sandboxes' processes (user and system), summed over executions",
            self.cpu_seconds.clone(),
        );
        r.register(
            "codebox_sandbox_memory_peak_bytes",
            "Peak memory of one execution's sandbox (its cgroup's high-water mark)",
            self.memory_peak.clone(),
        );
        r.register(
            "codebox_egress_decisions",
            "Egress proxy connections by decision",
            self.egress.clone(),
        );
        r.register(
            "codebox_upstream_call_duration_seconds",
            "Calls from sandboxed code to upstream servers' tools, by server and outcome",
            self.upstream_calls.clone(),
        );
        for language in Language::ALL {
            for start in [Start::Warm, Start::Cold, Start::Session] {
                for outcome in &Outcome::ALL[..6] {
                    let _ = self.executions.get_or_create(&ExecutionLabels {
                        language,
                        outcome: *outcome,
                        start,
                    });
                }
            }
            for outcome in [Outcome::Stopped, Outcome::SandboxError, Outcome::Refused] {
                let _ = self.executions.get_or_create(&ExecutionLabels {
                    language,
                    outcome,
                    start: Start::None,
                });
            }
            let _ = self.cpu_seconds.get_or_create(&LanguageLabels { language });
        }
        for reason in Refusal::ALL {
            let _ = self.refusals.get_or_create(&RefusalLabels { reason });
        }
        for decision in EgressDecision::ALL {
            let _ = self.egress.get_or_create(&EgressLabels { decision });
        }
        self
    }

    /// An execution got its admission slot; it counts as in flight until the guard is
    /// dropped.
    pub fn running(&self) -> Running {
        self.in_flight.inc();
        Running(self.in_flight.clone())
    }

    /// A program ran (whatever its exit): its outcome, latency `took` (from the call's
    /// arrival), CPU and peak memory.
    pub fn execution_ended(&self, result: &ExecutionResult, took: Duration) {
        let language = result.language;
        let start = Start::from(result.start);
        self.executions
            .get_or_create(&ExecutionLabels {
                language,
                outcome: Outcome::of(result),
                start,
            })
            .inc();
        self.duration
            .get_or_create(&DurationLabels { language, start })
            .observe(took.as_secs_f64());
        if let Some(ms) = result.cpu_ms {
            self.cpu_seconds
                .get_or_create(&LanguageLabels { language })
                .inc_by(ms / 1000.0);
        }
        if let Some(bytes) = result.peak_memory_bytes {
            self.memory_peak
                .get_or_create(&LanguageLabels { language })
                .observe(bytes as f64);
        }
    }

    /// An execution that ended without a program result: killed by the server's drain
    /// bound ([`Outcome::Stopped`]) or its sandbox failed ([`Outcome::SandboxError`]).
    pub fn execution_unfinished(&self, language: Language, outcome: Outcome) {
        self.executions
            .get_or_create(&ExecutionLabels {
                language,
                outcome,
                start: Start::None,
            })
            .inc();
    }

    /// An execute call refused before it ran.
    pub fn execution_refused(&self, language: Language, reason: Refusal) {
        self.execution_unfinished(language, Outcome::Refused);
        self.refused(reason);
    }

    /// A refusal that is not an execute call's own (a sandbox a running one asked for).
    pub fn refused(&self, reason: Refusal) {
        self.refusals.get_or_create(&RefusalLabels { reason }).inc();
    }

    /// The egress proxy decided a connection.
    pub fn egress(&self, decision: EgressDecision) {
        self.egress.get_or_create(&EgressLabels { decision }).inc();
    }

    /// A call to upstream `server` (its configured name) ended after `took`.
    pub fn upstream_call(&self, server: &str, outcome: UpstreamOutcome, took: Duration) {
        let server = self.upstream_label(server);
        self.upstream_calls
            .get_or_create(&UpstreamCallLabels { server, outcome })
            .observe(took.as_secs_f64());
    }

    /// `server`, or [`OTHER_SERVER`] once [`MAX_UPSTREAM_SERVERS`] names are labelled.
    fn upstream_label(&self, server: &str) -> String {
        let mut names = self
            .upstream_names
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if names.contains(server) {
            return server.to_string();
        }
        if names.len() >= MAX_UPSTREAM_SERVERS {
            return OTHER_SERVER.to_string();
        }
        names.insert(server.to_string());
        server.to_string()
    }

    /// The exposition: these figures and the state in `snapshot`, in `format`.
    pub fn render(&self, snapshot: &Snapshot, format: Format) -> Result<String, Error> {
        let state = snapshot.registry();
        let mut out = String::with_capacity(32 * 1024);
        match format {
            Format::OpenMetrics => {
                text::encode_registry(&mut out, &self.registry)?;
                text::encode_registry(&mut out, &state)?;
                text::encode_eof(&mut out)?;
            }
            Format::Prometheus => {
                prometheus_text::encode(&mut out, &self.registry)?;
                prometheus_text::encode(&mut out, &state)?;
            }
        }
        Ok(out)
    }
}

/// The exposition format, negotiated from the scraper's `Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4 (`text/plain`): curl, older scrapers.
    Prometheus,
    /// OpenMetrics 1.0.0 text, which Prometheus asks for first.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when `accept` prefers it (version 1.0.0 or unversioned, by `q`) over
    /// the text format; anything else, nothing or garbage gets the text format, which
    /// every scraper reads.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Prometheus;
        };
        let (mut open, mut plain) = (0.0f32, 0.0f32);
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let (mut q, mut version) = (1.0f32, None);
            for param in parts {
                match param.split_once('=') {
                    Some((k, v)) if k.trim().eq_ignore_ascii_case("q") => {
                        q = v.trim().parse().unwrap_or(0.0)
                    }
                    Some((k, v)) if k.trim().eq_ignore_ascii_case("version") => {
                        version = Some(v.trim().to_string())
                    }
                    _ => {}
                }
            }
            if !(0.0..=1.0).contains(&q) {
                continue;
            }
            match media.as_str() {
                "application/openmetrics-text"
                    if version.as_deref().is_none_or(|v| v == "1.0.0") =>
                {
                    open = open.max(q)
                }
                "text/plain" | "text/*" | "*/*" => plain = plain.max(q),
                _ => {}
            }
        }
        if open > 0.0 && open >= plain {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}
