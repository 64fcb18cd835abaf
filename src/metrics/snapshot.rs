//! The server's state at a scrape, as plain data, and its encoding: gauges for what is
//! now, counters for what the pool already counts. Made fresh per scrape (a few dozen
//! series), so nothing mirrors the server's own state between scrapes.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use super::labels::{upstream_state, LanguageLabels, UpstreamStateLabels, UPSTREAM_STATES};
use crate::runtime::Language;
use crate::upstream::ServerState;

/// What the server reports at a scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Executions that may run at once (`concurrency`).
    pub slots: usize,
    /// Executions waiting for a slot.
    pub queue_depth: usize,
    /// SIGINT/SIGTERM arrived: no new executions are taken.
    pub draining: bool,
    /// The warm pool per language (empty when it is off).
    pub pool: Vec<PoolFigures>,
    /// Every configured upstream server: its name and state.
    pub upstreams: Vec<(String, ServerState)>,
    pub sessions_open: usize,
    /// Sessions' live interpreters (`keep_alive`).
    pub session_interpreters: usize,
    /// Paused sessions in the snapshot store (every client, every server sharing it),
    /// and their bytes; zero without a store.
    pub sessions_paused: u64,
    pub sessions_paused_bytes: u64,
    /// Executions running as tasks.
    pub tasks_running: usize,
}

/// The warm pool's figures of one language (see `pool::LanguageStats`).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolFigures {
    pub language: Language,
    /// The fewest it keeps (`pool_size`) and the most (`pool_max`).
    pub floor: usize,
    pub ceiling: usize,
    /// What it keeps now, between the two.
    pub target: usize,
    /// Calls that asked for a sandbox in the last second.
    pub arrival_rate_per_s: f64,
    /// Measured spawn to ready of its own starts (`None` before the first).
    pub ready_seconds: Option<f64>,
    /// Idle sandboxes killed as the target fell.
    pub shrunk: u64,
    pub warm: usize,
    pub starting: usize,
    pub handed_out: u64,
    pub missed: u64,
    pub died_idle: u64,
    pub spawn_failures: u64,
    pub idle_memory_bytes: u64,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TakeLabels {
    language: Language,
    result: &'static str,
}

fn gauge(value: usize) -> Gauge {
    let g = Gauge::default();
    g.set(i64::try_from(value).unwrap_or(i64::MAX));
    g
}

impl Snapshot {
    /// The registry of this snapshot's series.
    pub(super) fn registry(&self) -> Registry {
        let mut r = Registry::default();
        let build = Family::<VersionLabels, Gauge>::default();
        build
            .get_or_create(&VersionLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        r.register("codebox_build_info", "codebox's version (always 1)", build);
        r.register(
            "codebox_execution_slots",
            "Executions that may run at once (concurrency)",
            gauge(self.slots),
        );
        r.register(
            "codebox_execution_queue_depth",
            "Executions waiting for a slot",
            gauge(self.queue_depth),
        );
        r.register(
            "codebox_draining",
            "1 once SIGINT/SIGTERM arrived: new executions are refused while running ones finish",
            gauge(usize::from(self.draining)),
        );
        r.register(
            "codebox_sessions_open",
            "Sessions open (persistent workspaces)",
            gauge(self.sessions_open),
        );
        r.register(
            "codebox_sessions_paused",
            "Paused sessions in the snapshot store ([sessions] dir, shared by the servers using it)",
            gauge(usize::try_from(self.sessions_paused).unwrap_or(usize::MAX)),
        );
        r.register(
            "codebox_sessions_paused_bytes",
            "Bytes of the paused sessions' snapshots",
            gauge(usize::try_from(self.sessions_paused_bytes).unwrap_or(usize::MAX)),
        );
        r.register(
            "codebox_session_interpreters",
            "Sessions' live interpreters (keep_alive)",
            gauge(self.session_interpreters),
        );
        r.register(
            "codebox_tasks_running",
            "Executions running as tasks (MCP Tasks extension)",
            gauge(self.tasks_running),
        );
        self.register_pool(&mut r);
        let states = Family::<UpstreamStateLabels, Gauge>::default();
        for (server, now) in &self.upstreams {
            for state in UPSTREAM_STATES {
                states
                    .get_or_create(&UpstreamStateLabels {
                        server: server.clone(),
                        state: upstream_state(state),
                    })
                    .set(i64::from(state == *now));
            }
        }
        r.register(
            "codebox_upstream_state",
            "Each configured upstream server's state: 1 for the current one, 0 for the others",
            states,
        );
        r
    }

    fn register_pool(&self, r: &mut Registry) {
        let warm = Family::<LanguageLabels, Gauge>::default();
        let starting = Family::<LanguageLabels, Gauge>::default();
        let target = Family::<LanguageLabels, Gauge>::default();
        let floor = Family::<LanguageLabels, Gauge>::default();
        let ceiling = Family::<LanguageLabels, Gauge>::default();
        let rate = Family::<LanguageLabels, Gauge<f64, AtomicU64>>::default();
        let ready = Family::<LanguageLabels, Gauge<f64, AtomicU64>>::default();
        let shrunk = Family::<LanguageLabels, Counter>::default();
        let memory = Family::<LanguageLabels, Gauge>::default();
        let takes = Family::<TakeLabels, Counter>::default();
        let died = Family::<LanguageLabels, Counter>::default();
        let failures = Family::<LanguageLabels, Counter>::default();
        // Every language has its series, 0 when the pool is off.
        for language in Language::ALL {
            let l = LanguageLabels { language };
            let p = self.pool.iter().find(|p| p.language == language);
            let of = |f: fn(&PoolFigures) -> u64| p.map_or(0, f);
            let to_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            warm.get_or_create(&l).set(to_i64(of(|p| p.warm as u64)));
            starting
                .get_or_create(&l)
                .set(to_i64(of(|p| p.starting as u64)));
            target
                .get_or_create(&l)
                .set(to_i64(of(|p| p.target as u64)));
            floor.get_or_create(&l).set(to_i64(of(|p| p.floor as u64)));
            ceiling
                .get_or_create(&l)
                .set(to_i64(of(|p| p.ceiling as u64)));
            rate.get_or_create(&l)
                .set(p.map_or(0.0, |p| p.arrival_rate_per_s));
            ready
                .get_or_create(&l)
                .set(p.and_then(|p| p.ready_seconds).unwrap_or(0.0));
            shrunk.get_or_create(&l).inc_by(of(|p| p.shrunk));
            memory
                .get_or_create(&l)
                .set(to_i64(of(|p| p.idle_memory_bytes)));
            for (result, value) in [("hit", of(|p| p.handed_out)), ("miss", of(|p| p.missed))] {
                takes
                    .get_or_create(&TakeLabels { language, result })
                    .inc_by(value);
            }
            died.get_or_create(&l).inc_by(of(|p| p.died_idle));
            failures.get_or_create(&l).inc_by(of(|p| p.spawn_failures));
        }
        r.register(
            "codebox_pool_warm",
            "Warm sandboxes ready and waiting for code",
            warm,
        );
        r.register(
            "codebox_pool_starting",
            "Warm sandboxes being started by the refill",
            starting,
        );
        r.register(
            "codebox_pool_target",
            "Warm sandboxes the pool keeps now (ready + starting), between pool_size and pool_max",
            target,
        );
        r.register(
            "codebox_pool_floor",
            "The fewest warm sandboxes the pool keeps (pool_size)",
            floor,
        );
        r.register(
            "codebox_pool_ceiling",
            "The most warm sandboxes the pool keeps (pool_max)",
            ceiling,
        );
        r.register(
            "codebox_pool_arrival_rate",
            "Calls per second that asked the pool, over the last second",
            rate,
        );
        r.register(
            "codebox_pool_ready_seconds",
            "Measured time from spawn to ready of the pool's own starts (smoothed; 0 before the first)",
            ready,
        );
        r.register(
            "codebox_pool_shrunk",
            "Idle warm sandboxes killed as the pool's target fell",
            shrunk,
        );
        r.register(
            "codebox_pool_idle_memory_bytes",
            "Memory held by the idle warm sandboxes' cgroups",
            memory,
        );
        r.register(
            "codebox_pool_takes",
            "Executions that asked the pool: hit (a warm sandbox) or miss (started cold)",
            takes,
        );
        r.register(
            "codebox_pool_died_idle",
            "Warm sandboxes that died while waiting (and were replaced)",
            died,
        );
        r.register(
            "codebox_pool_spawn_failures",
            "Refill starts that failed",
            failures,
        );
    }
}
