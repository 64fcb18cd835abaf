//! The warm pool: per language, sandboxes started ahead of demand and waiting for their
//! code, so an execution skips everything that does not depend on the code.
//!
//! A pooled sandbox is complete before it is counted: namespaces, cgroup with limits,
//! mounts, capabilities dropped, no_new_privs, landlock and seccomp, the interpreter
//! started and the codebox runtime loaded, blocked reading fd 3 — it said so with a
//! `codebox/ready` line ([`RemoteSandbox::wait_ready`]). An execution takes one
//! ([`WarmPool::take`]), writes its boot frame, and the sandbox ends with that program:
//! a pooled sandbox serves exactly one execution.
//!
//! - Every idle sandbox is owned by its own small task ([`holder`]), which hands it out at
//!   most once, or notices that it died while waiting and drops it from the pool; so a
//!   sandbox is never handed out twice and a dead one never handed out.
//! - How many a language keeps follows demand ([`policy`]): a target between `floor`
//!   (`pool_size`) and `ceiling` (`pool_max`), from the calls that arrived within the
//!   measured time a new sandbox takes to become ready; it rises at once on a burst and
//!   falls back after `shrink_after` without such demand.
//! - One refill task ([`refill`]) keeps ready + starting at each language's target, off
//!   the request path, and kills idle sandboxes above it. The pool never holds more than
//!   its ceiling per language, so the sandboxes alive at once are at most the running
//!   executions (the server's admission limit) plus the pool's ceiling per language.
//! - What a pooled sandbox binds (`/servers`, `/skills`) and its limits come from a
//!   [`Template`] per language; a new template retires every sandbox made from the old
//!   one. What each sandbox gets of its own ([`PerSandbox`]: the server's `/servers` view,
//!   which follows the upstream catalog while the sandbox waits) is prepared when it is
//!   started and frozen when it is taken, so a catalog change needs no new template. A
//!   request whose spawn spec differs from the template (a session's workspace) is not
//!   served from the pool.
//! - [`WarmPool::shutdown`] kills every pooled sandbox and waits until the spawner has
//!   reaped them and removed their cgroups.

mod holder;
pub mod policy;
mod refill;

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;

use crate::runtime::Language;
use crate::spawner::{client::cgroup_memory_bytes, RemoteSandbox, SpawnSpec, SpawnerClient};
pub use policy::Bounds;
use policy::Demand;

/// How long a new sandbox may take to announce that it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// What pooled sandboxes of one language are made from.
#[derive(Clone)]
pub struct Template {
    pub spec: SpawnSpec,
    /// Kept alive as long as a sandbox made from this template lives (the generated
    /// `/servers` tree bound into it).
    pub hold: Option<Arc<dyn Any + Send + Sync>>,
    /// What each sandbox gets of its own: its `spec.servers` is then its own, and a
    /// request fits whatever `/servers` it names (the sandbox's follows the catalog).
    pub per_sandbox: Option<Arc<dyn PerSandbox>>,
}

/// What each pooled sandbox of a template gets of its own when it is started — a
/// `/servers` view that follows the upstream catalog while the sandbox waits — and what
/// stops following when an execution takes it (before its code is sent).
pub trait PerSandbox: Send + Sync {
    /// Sets `spec`'s own parts for one sandbox (file work: called on the blocking pool);
    /// what it returns lives as long as the sandbox.
    fn prepare(&self, spec: &mut SpawnSpec) -> Result<Box<dyn Own>, String>;
}

/// One pooled sandbox's own part.
pub trait Own: Send + Sync {
    /// Stops following: the sandbox was handed out.
    fn freeze(&self);
}

/// A sandbox from the pool: ready, waiting for its boot frame on fd 3.
pub struct Warm {
    pub sandbox: RemoteSandbox,
    /// What its template held (must live as long as the sandbox).
    pub hold: Option<Arc<dyn Any + Send + Sync>>,
    /// Its own part ([`PerSandbox`]), frozen when it is handed out.
    own: Option<Box<dyn Own>>,
    /// Wakes the refill when the sandbox is gone (see [`REFILL_DELAY`]).
    refill: Option<RefillOnDrop>,
}

impl Warm {
    /// The sandbox, and a guard to keep until the sandbox is gone (hand it to
    /// [`RemoteSandbox::hold_until_gone`]): it holds what the sandbox binds and wakes the
    /// refill when dropped.
    pub fn into_parts(self) -> (RemoteSandbox, WarmGuard) {
        (
            self.sandbox,
            WarmGuard {
                _hold: self.hold,
                _own: self.own,
                _refill: self.refill,
            },
        )
    }
}

/// Kept until a pooled sandbox that was handed out is gone (see [`Warm::into_parts`]).
pub struct WarmGuard {
    _hold: Option<Arc<dyn Any + Send + Sync>>,
    _own: Option<Box<dyn Own>>,
    _refill: Option<RefillOnDrop>,
}

/// How long after a lone take the refill starts a replacement if the execution has not
/// ended by then. Starting one costs a core for several milliseconds; on a small machine
/// that slows the very execution that took the sandbox, so a short execution is let
/// finish first (the pool keeps at least its floor, so the next call still finds one).
/// In a burst (another call arrived within a time-to-ready, [`Demand::in_burst`]), or when
/// the take emptied the shelf, the replacement starts at once: waiting would only make a
/// later call of the burst cold.
const REFILL_DELAY: Duration = Duration::from_millis(50);

/// Wakes the pool's refill when dropped.
struct RefillOnDrop(std::sync::Weak<Inner>);

impl Drop for RefillOnDrop {
    fn drop(&mut self) {
        if let Some(pool) = self.0.upgrade() {
            pool.wake.notify_one();
        }
    }
}

/// The pool's figures for one language, as `health` reports them.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LanguageStats {
    /// The fewest it keeps (`pool_size`).
    pub floor: usize,
    /// The most it keeps (`pool_max`).
    pub ceiling: usize,
    /// What it keeps now (ready + starting), between floor and ceiling.
    pub target: usize,
    /// The same as `target` (its name before the pool followed demand).
    pub size: usize,
    /// Ready and waiting.
    pub idle: usize,
    /// Being started by the refill.
    pub starting: usize,
    /// Executions served by a pooled sandbox.
    pub handed_out: u64,
    /// Executions that found no ready sandbox (or could not use one) and started cold.
    pub missed: u64,
    /// Pooled sandboxes that died while waiting (and were replaced).
    pub died_idle: u64,
    /// Pooled sandboxes retired because their template changed.
    pub retired: u64,
    /// Refill spawns that failed.
    pub spawn_failures: u64,
    /// Idle sandboxes killed because the target fell below what the pool held.
    pub shrunk: u64,
    /// Calls that asked for a sandbox of this language in the last second (served warm
    /// or not; counted up to [`policy::ARRIVALS_KEPT`]).
    pub arrival_rate_per_s: f64,
    /// The measured time from spawn to `codebox/ready` of the pool's own starts
    /// (smoothed), in milliseconds; `None` before the first.
    pub ready_ms: Option<f64>,
    /// Memory held by the idle sandboxes' cgroups now, in bytes.
    pub idle_memory_bytes: u64,
    /// The same per idle sandbox.
    pub memory_per_sandbox_bytes: Option<u64>,
}

#[derive(Default)]
struct Counters {
    handed_out: AtomicU64,
    missed: AtomicU64,
    died_idle: AtomicU64,
    retired: AtomicU64,
    spawn_failures: AtomicU64,
    shrunk: AtomicU64,
}

/// A ready sandbox on the shelf; its holder task owns the sandbox itself.
struct Slot {
    id: u64,
    generation: u64,
    /// Asks the holder for the sandbox; dropping it makes the holder kill the sandbox.
    take: oneshot::Sender<oneshot::Sender<Warm>>,
    cgroups: Vec<PathBuf>,
    holder: JoinHandle<()>,
}

#[derive(Default)]
struct Shelf {
    /// Bumped by every new template of this language.
    generation: u64,
    idle: VecDeque<Slot>,
    starting: usize,
    counters: Counters,
    /// What arrived and how fast sandboxes came up: the target follows it.
    demand: Demand,
}

struct State {
    templates: HashMap<Language, Template>,
    shelves: HashMap<Language, Shelf>,
    closed: bool,
    /// Holders of sandboxes taken off the shelf for retirement, awaited at shutdown.
    retiring: Vec<JoinHandle<()>>,
}

struct Inner {
    spawner: SpawnerClient,
    bounds: Bounds,
    /// Starts in flight per language at most: the host's cores. Each start takes a core
    /// for its interpreter's start (and a Python's preload), so more at once only slows
    /// the running executions and each other; a pool that grew by more fills over a few
    /// rounds.
    max_starting: usize,
    state: Mutex<State>,
    /// Wakes the refill task: a sandbox was taken, died or retired, or a template changed.
    wake: Notify,
    /// Refill spawns that failed since the refill task last looked (for its back-off).
    failed_since_wake: AtomicU64,
}

/// The warm pool. Cheap to clone.
#[derive(Clone)]
pub struct WarmPool {
    inner: Arc<Inner>,
    refill: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl WarmPool {
    /// A pool per language in `templates` that keeps between `bounds.floor` and
    /// `bounds.ceiling` sandboxes; starts filling to the floor at once. Must be called
    /// inside a tokio runtime.
    pub fn new(
        spawner: SpawnerClient,
        bounds: Bounds,
        templates: HashMap<Language, Template>,
    ) -> WarmPool {
        let shelves = templates.keys().map(|l| (*l, Shelf::default())).collect();
        let inner = Arc::new(Inner {
            spawner,
            bounds,
            max_starting: std::thread::available_parallelism().map_or(1, |n| n.get()),
            state: Mutex::new(State {
                templates,
                shelves,
                closed: false,
                retiring: Vec::new(),
            }),
            wake: Notify::new(),
            failed_since_wake: AtomicU64::new(0),
        });
        let task = tokio::spawn(refill::run(inner.clone()));
        WarmPool {
            inner,
            refill: Arc::new(Mutex::new(Some(task))),
        }
    }

    /// Between how many sandboxes per language the pool keeps.
    pub fn bounds(&self) -> Bounds {
        self.inner.bounds
    }

    /// Replaces the template of `language` (e.g. a new `/servers` tree): the sandboxes
    /// made from the old one are killed and the pool refills with the new one.
    pub fn set_template(&self, language: Language, template: Template) {
        let mut st = self.inner.lock();
        if st.closed {
            return;
        }
        st.templates.insert(language, template);
        let shelf = st.shelves.entry(language).or_default();
        shelf.generation += 1;
        let old: Vec<Slot> = shelf.idle.drain(..).collect();
        shelf
            .counters
            .retired
            .fetch_add(old.len() as u64, Ordering::Relaxed);
        // Dropping a slot's `take` makes its holder kill the sandbox.
        let holders = old.into_iter().map(|s| s.holder);
        st.retiring.retain(|h| !h.is_finished());
        st.retiring.extend(holders);
        drop(st);
        self.inner.wake.notify_one();
    }

    /// A ready sandbox for `spec`, or `None` (pool empty, closed, or `spec` is not what
    /// the pool makes; the caller starts one cold). Never blocks on a spawn.
    pub async fn take(&self, spec: &SpawnSpec) -> Option<Warm> {
        let language = spec.language;
        let mut arrived = false;
        loop {
            let (slot, at_once) = {
                let mut st = self.inner.lock();
                let fits = !st.closed
                    && st
                        .templates
                        .get(&language)
                        .is_some_and(|t| same_sandbox(&t.spec, spec, t.per_sandbox.is_some()));
                let shelf = st.shelves.get_mut(&language)?;
                let now = Instant::now();
                if fits && !arrived {
                    // Demand is what the pool could have served (not a session's run).
                    shelf.demand.arrived(now, &self.inner.bounds);
                    arrived = true;
                }
                let generation = shelf.generation;
                // A new template empties the shelf and the refill shelves only current
                // sandboxes, so an old one is not expected; it would be retired here.
                shelf.idle.retain(|s| s.generation == generation);
                let slot = if fits { shelf.idle.pop_front() } else { None };
                match slot {
                    Some(slot) => (slot, shelf.idle.is_empty() || shelf.demand.in_burst(now)),
                    None => {
                        shelf.counters.missed.fetch_add(1, Ordering::Relaxed);
                        drop(st);
                        if fits {
                            // The demand may have raised the target: start at once.
                            self.inner.wake.notify_one();
                        }
                        return None;
                    }
                }
            };
            let (tx, rx) = oneshot::channel();
            if slot.take.send(tx).is_err() {
                // Its holder is gone: the sandbox died just now. Try the next one.
                self.inner.wake.notify_one();
                continue;
            }
            if let Ok(mut warm) = rx.await {
                // From here on the sandbox's own parts stay as they are: its program
                // never sees its /servers change.
                if let Some(own) = &warm.own {
                    own.freeze();
                }
                warm.refill = Some(RefillOnDrop(Arc::downgrade(&self.inner)));
                if at_once {
                    self.inner.wake.notify_one();
                } else {
                    let pool = Arc::downgrade(&self.inner);
                    tokio::spawn(async move {
                        tokio::time::sleep(REFILL_DELAY).await;
                        if let Some(pool) = pool.upgrade() {
                            pool.wake.notify_one();
                        }
                    });
                }
                self.inner
                    .lock()
                    .shelves
                    .get(&language)
                    .map(|s| s.counters.handed_out.fetch_add(1, Ordering::Relaxed));
                return Some(warm);
            }
        }
    }

    /// The idle sandboxes of `language`: their spawner ids and cgroup directories (for
    /// diagnostics and tests: the processes in those cgroups are the sandbox).
    pub fn idle_sandboxes(&self, language: Language) -> Vec<(u64, Vec<PathBuf>)> {
        let st = self.inner.lock();
        st.shelves
            .get(&language)
            .map(|s| s.idle.iter().map(|s| (s.id, s.cgroups.clone())).collect())
            .unwrap_or_default()
    }

    /// Whether every language holds its target, ready, with nothing starting: nothing of
    /// the pool's is under way (for harnesses that measure one call at a time).
    pub fn is_full(&self) -> bool {
        let now = Instant::now();
        let bounds = self.inner.bounds;
        let mut st = self.inner.lock();
        st.shelves.values_mut().all(|shelf| {
            let target = shelf.demand.target(now, &bounds);
            shelf.starting == 0 && shelf.idle.len() >= target
        })
    }

    /// The figures per language.
    pub fn stats(&self) -> HashMap<Language, LanguageStats> {
        let now = Instant::now();
        let bounds = self.inner.bounds;
        let mut st = self.inner.lock();
        st.shelves
            .iter_mut()
            .map(|(language, shelf)| {
                let memory: Vec<u64> = shelf
                    .idle
                    .iter()
                    .filter_map(|s| cgroup_memory_bytes(&s.cgroups))
                    .collect();
                let total: u64 = memory.iter().sum();
                let c = &shelf.counters;
                let target = shelf.demand.target(now, &bounds);
                let stats = LanguageStats {
                    floor: bounds.floor,
                    ceiling: bounds.ceiling,
                    target,
                    size: target,
                    idle: shelf.idle.len(),
                    starting: shelf.starting,
                    handed_out: c.handed_out.load(Ordering::Relaxed),
                    missed: c.missed.load(Ordering::Relaxed),
                    died_idle: c.died_idle.load(Ordering::Relaxed),
                    retired: c.retired.load(Ordering::Relaxed),
                    spawn_failures: c.spawn_failures.load(Ordering::Relaxed),
                    shrunk: c.shrunk.load(Ordering::Relaxed),
                    arrival_rate_per_s: shelf.demand.rate_per_s(now),
                    ready_ms: shelf.demand.ready().map(|d| d.as_secs_f64() * 1000.0),
                    idle_memory_bytes: total,
                    memory_per_sandbox_bytes: (!memory.is_empty())
                        .then(|| total / memory.len() as u64),
                };
                (*language, stats)
            })
            .collect()
    }

    /// Stops refilling, kills every pooled sandbox and waits until the spawner has
    /// reaped them all and removed their cgroups (also those still starting).
    pub async fn shutdown(&self) {
        let holders = {
            let mut st = self.inner.lock();
            st.closed = true;
            let mut holders: Vec<JoinHandle<()>> = st.retiring.drain(..).collect();
            for shelf in st.shelves.values_mut() {
                holders.extend(shelf.idle.drain(..).map(|s| s.holder));
            }
            holders
        };
        self.inner.wake.notify_one();
        // The refill task kills what it is still starting before it returns.
        let refill = self.refill.lock().expect("pool refill lock").take();
        if let Some(task) = refill {
            let _ = task.await;
        }
        for holder in holders {
            let _ = holder.await;
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("pool state lock")
    }

    /// A holder's sandbox died while waiting: forget its slot and refill. `with_spawner`:
    /// its spawner died (that event is logged once, by the spawner client).
    fn died_idle(&self, language: Language, id: u64, with_spawner: bool) {
        let mut st = self.lock();
        if let Some(shelf) = st.shelves.get_mut(&language) {
            let before = shelf.idle.len();
            shelf.idle.retain(|s| s.id != id);
            if shelf.idle.len() < before {
                shelf.counters.died_idle.fetch_add(1, Ordering::Relaxed);
                if with_spawner {
                    tracing::debug!(%language, sandbox = id, "a pooled sandbox died with its spawner; replacing it");
                } else {
                    tracing::warn!(%language, sandbox = id, "a pooled sandbox died while idle; replacing it");
                }
            }
        }
        drop(st);
        self.wake.notify_one();
    }
}

/// Whether a sandbox made for `pooled` can run a request for `asked`: everything fixed at
/// spawn time is equal (the timeout is not: it counts from the code's delivery; nor is
/// `/servers` when each sandbox has its own, which follows the catalog).
fn same_sandbox(pooled: &SpawnSpec, asked: &SpawnSpec, own_servers: bool) -> bool {
    let mut asked_limits = asked.limits.clone();
    asked_limits.timeout = pooled.limits.timeout;
    pooled.language == asked.language
        && pooled.profile == asked.profile
        && pooled.limits == asked_limits
        && pooled.workspace == asked.workspace
        && asked.workspace_mount.is_none()
        && (own_servers || pooled.servers == asked.servers)
        && pooled.skills == asked.skills
        && pooled.network == asked.network
        && pooled.packages == asked.packages
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::Limits;

    fn spec() -> SpawnSpec {
        SpawnSpec {
            language: Language::Python,
            profile: "default".into(),
            limits: Limits::default(),
            workspace: None,
            servers: Some("/tmp/codebox-servers-1/v3".into()),
            skills: None,
            workspace_mount: None,
            network: None,
            packages: None,
            pooled: false,
        }
    }

    #[test]
    fn a_request_fits_a_pooled_sandbox_only_when_all_spawn_time_choices_match() {
        let pooled = spec();
        let mut asked = spec();
        asked.limits.timeout = Duration::from_millis(5);
        assert!(
            same_sandbox(&pooled, &asked, false),
            "the timeout is the caller's"
        );
        for change in [
            |s: &mut SpawnSpec| s.language = Language::TypeScript,
            |s: &mut SpawnSpec| s.profile = "strict".into(),
            |s: &mut SpawnSpec| s.workspace = Some("/tmp/ws".into()),
            |s: &mut SpawnSpec| s.servers = Some("/tmp/codebox-servers-1/v4".into()),
            |s: &mut SpawnSpec| s.skills = Some("/var/lib/codebox/skills".into()),
            |s: &mut SpawnSpec| s.limits.memory_bytes = Some(1 << 20),
            |s: &mut SpawnSpec| s.limits.stdout_cap = 1,
            |s: &mut SpawnSpec| s.packages = Some("/var/lib/codebox/layers/python/k".into()),
            |s: &mut SpawnSpec| {
                s.network = Some(crate::spawner::wire::SpawnNetwork::Proxy { trust: None })
            },
        ] {
            let mut asked = spec();
            change(&mut asked);
            assert!(!same_sandbox(&pooled, &asked, false), "{asked:?}");
        }
        // A pool whose sandboxes have /servers views of their own serves any tree.
        let mut asked = spec();
        asked.servers = Some("/tmp/codebox-servers-1/v4".into());
        assert!(same_sandbox(&pooled, &asked, true));
        asked.skills = Some("/var/lib/codebox/skills".into());
        assert!(!same_sandbox(&pooled, &asked, true));
    }
}
