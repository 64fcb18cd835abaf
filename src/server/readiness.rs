//! What the server knows about itself while it comes up, and who hears when it changes.
//!
//! `serve` answers as soon as its own tools exist; three things finish after that:
//! - the sandbox checks (`doctor::deferred`, followed by `sandbox_checks.rs`): until they
//!   are in, `health` says so; a checker that did not finish is retried and says nothing
//!   about the host; a required layer a finished checker found missing refuses every
//!   execution with the doctor's words;
//! - the warm pool's first fill;
//! - the upstream servers, each connecting in the background.
//!
//! [`Readiness::value`] is `/readyz` and `health.ready`. [`Listeners`] holds the peers of
//! initialized connections, so a catalog change (an upstream became ready, or listed
//! other tools) reaches every client as `notifications/resources/list_changed`: the
//! wrappers are resources. codebox's own tool list does not depend on the upstreams,
//! so it never announces `tools/list_changed`.

use std::sync::Mutex;
use std::time::Duration;

use rmcp::service::{Peer, RoleServer};

use crate::doctor::Check;
use crate::pool::WarmPool;
use crate::runtime::Language;
use crate::upstream::{ServerState, Upstreams};

/// The host's layers: those checked before serving, then the sandbox checks; and the
/// rootfs's background checks (`rootfs_watch.rs`).
#[derive(Debug)]
pub struct Layers {
    inner: Mutex<LayersState>,
    pub rootfs: std::sync::Arc<super::rootfs_watch::RootfsWatch>,
}

#[derive(Debug)]
struct LayersState {
    checks: Vec<Check>,
    sandbox_checks: SandboxChecks,
    checker: CheckerStatus,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum SandboxChecks {
    Pending,
    /// No checker has finished yet and the last one did not: why, and what happens next.
    /// Executions are not refused for it.
    Unfinished(String),
    Passed,
    /// A required layer is missing: why, in one line.
    Failed(String),
}

/// What `health` says about the sandbox checker processes (`sandbox_checker`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CheckerStatus {
    /// The current (or last) checker's pid.
    pub pid: Option<i32>,
    /// Whether a checker runs now.
    pub running: bool,
    /// Checkers started.
    pub attempts: u32,
    /// Checkers that did not finish (killed, crashed, timed out, unreadable report).
    pub unfinished: u32,
    /// Why the last one did not finish.
    pub last_reason: Option<String>,
    /// When (seconds since the Unix epoch).
    pub last_unix: Option<u64>,
    /// When the next checker starts, while one is scheduled.
    pub next_attempt_unix: Option<u64>,
    /// Why no checker can be started any more (the spawner factory is gone), if so.
    pub cannot_retry: Option<String>,
}

impl Layers {
    /// `pending`: the sandbox checks run in the background and arrive by [`Layers::add`].
    pub fn new(checks: Vec<Check>, pending: bool) -> Layers {
        Layers {
            inner: Mutex::new(LayersState {
                checks,
                sandbox_checks: if pending {
                    SandboxChecks::Pending
                } else {
                    SandboxChecks::Passed
                },
                checker: CheckerStatus::default(),
            }),
            rootfs: Default::default(),
        }
    }

    /// A checker started.
    pub fn checker_started(&self, pid: i32) {
        let mut s = lock(&self.inner);
        s.checker.pid = Some(pid);
        s.checker.running = true;
        s.checker.attempts += 1;
        s.checker.next_attempt_unix = None;
    }

    /// A checker did not finish (`reason`); the next starts after `retry_in`, or never
    /// (`cannot_retry` says why). One WARN line per event; an ERROR line once the quick
    /// attempts are over (`escalate`) or no checker can be started any more.
    pub fn checker_unfinished(
        &self,
        reason: String,
        retry_in: Duration,
        escalate: bool,
        cannot_retry: Option<String>,
    ) {
        let mut s = lock(&self.inner);
        let c = &mut s.checker;
        c.running = false;
        c.unfinished += 1;
        c.last_reason = Some(reason.clone());
        c.last_unix = unix_now();
        let (attempts, unfinished) = (c.attempts, c.unfinished);
        let what_next = match &cannot_retry {
            Some(why) => format!("they cannot be re-run: {why}; restart codebox"),
            None => {
                c.next_attempt_unix = unix_now().map(|t| t + retry_in.as_secs());
                format!("next attempt in {} s", retry_in.as_secs().max(1))
            }
        };
        c.cannot_retry = cannot_retry.clone();
        s.sandbox_checks = SandboxChecks::Unfinished(format!(
            "the sandbox checks did not finish ({reason}; {unfinished} of {attempts} attempts); {what_next}; executions are not refused for it"
        ));
        drop(s);
        tracing::warn!(
            reason,
            attempts,
            retry_in_s = retry_in.as_secs(),
            "a sandbox checker did not finish; retrying"
        );
        if let Some(why) = cannot_retry {
            tracing::error!(
                why,
                attempts,
                "the sandbox checks did not finish and cannot be re-run; restart codebox"
            );
        } else if escalate {
            tracing::error!(
                attempts,
                retry_in_s = retry_in.as_secs(),
                reason,
                "the sandbox checks keep not finishing; trying again less often (executions are not refused for it; see health.sandbox_checker)"
            );
        }
    }

    /// The checker's state, for `health`.
    pub fn checker_status(&self) -> CheckerStatus {
        lock(&self.inner).checker.clone()
    }

    /// The sandbox checks are in.
    pub fn add(&self, checks: Vec<Check>, profile: &str) {
        let missing: Vec<String> = checks
            .iter()
            .filter(|c| c.blocks())
            .map(|c| format!("{}: {}", c.layer, c.detail))
            .collect();
        let mut s = lock(&self.inner);
        s.checks.extend(checks);
        s.checker.running = false;
        s.checker.next_attempt_unix = None;
        s.sandbox_checks = if missing.is_empty() {
            tracing::info!("sandbox checks passed");
            SandboxChecks::Passed
        } else {
            let why = format!(
                "this host cannot run the {profile} profile: {} (see `codebox doctor`)",
                missing.join("; ")
            );
            tracing::error!(why, "sandbox checks failed; executions are refused");
            SandboxChecks::Failed(why)
        };
    }

    pub fn checks(&self) -> Vec<Check> {
        lock(&self.inner).checks.clone()
    }

    /// Why executions are refused, when a required layer is missing or the rootfs changed.
    pub fn refusal(&self) -> Option<String> {
        match &lock(&self.inner).sandbox_checks {
            SandboxChecks::Failed(why) => Some(why.clone()),
            _ => self.rootfs.refusal(),
        }
    }

    fn sandbox_checks(&self) -> serde_json::Value {
        match &lock(&self.inner).sandbox_checks {
            SandboxChecks::Pending => serde_json::json!("pending"),
            SandboxChecks::Unfinished(why) => serde_json::json!({"unfinished": why}),
            SandboxChecks::Passed => serde_json::json!("passed"),
            SandboxChecks::Failed(why) => serde_json::json!({"failed": why}),
        }
    }

    fn passed(&self) -> bool {
        lock(&self.inner).sandbox_checks == SandboxChecks::Passed
    }
}

/// Whether the server is ready, and the state of each part: `/readyz` and
/// `health.ready`. Ready means executions can run as configured: the sandbox checks
/// passed and (with a pool) each language's first pooled sandbox came up. Upstreams are
/// reported, never waited for: one that hangs must not keep codebox out of service.
pub fn value(
    layers: &Layers,
    pool: Option<&WarmPool>,
    upstreams: &Upstreams,
) -> (bool, serde_json::Value) {
    let pool_warm = pool.map(|p| {
        let stats = p.stats();
        Language::ALL
            .iter()
            .all(|l| stats.get(l).is_some_and(came_up))
    });
    let mut ready_servers = Vec::new();
    let mut pending = Vec::new();
    let mut failed = Vec::new();
    for s in upstreams.servers() {
        match s.state {
            ServerState::Ready => ready_servers.push(s.name),
            ServerState::Connecting | ServerState::Reconnecting => pending.push(s.name),
            ServerState::Failed => failed.push(s.name),
        }
    }
    let rootfs_intact = layers.rootfs.refusal().is_none();
    let ready = layers.passed() && pool_warm != Some(false) && rootfs_intact;
    (
        ready,
        serde_json::json!({
            "ready": ready,
            "sandbox_checks": layers.sandbox_checks(),
            "rootfs_intact": rootfs_intact,
            "pool_warm": pool_warm,
            "upstreams": {"ready": ready_servers, "pending": pending, "failed": failed},
        }),
    )
}

/// Whether a language's pool has had a sandbox come up: one is idle, or was handed out,
/// retired by a new template (every catalog change retires the idle ones at once), or
/// died idle. Once up it stays up, so `/readyz` does not flap while a new template fills.
fn came_up(s: &crate::pool::LanguageStats) -> bool {
    s.idle > 0 || s.handed_out > 0 || s.retired > 0 || s.died_idle > 0
}

/// Who is told when the resource list changed: the peers of initialized (2025-11-25)
/// connections, and the open 2026-07-28 `subscriptions/listen` streams.
#[derive(Debug, Default)]
pub struct Listeners {
    peers: Mutex<Vec<Peer<RoleServer>>>,
    pub subscriptions: crate::server::transport::listen::Subscriptions,
}

/// How long one client may take to accept a notification before it is skipped.
pub(super) const NOTIFY_BOUND: Duration = Duration::from_secs(5);

impl Listeners {
    pub fn add(&self, peer: Peer<RoleServer>) {
        let mut peers = lock(&self.peers);
        peers.retain(|p| !p.is_transport_closed());
        peers.push(peer);
    }

    /// `notifications/resources/list_changed` to every open connection and subscription,
    /// each bounded.
    pub fn resources_changed(&self) {
        self.subscriptions.resources_changed();
        let peers: Vec<Peer<RoleServer>> = {
            let mut peers = lock(&self.peers);
            peers.retain(|p| !p.is_transport_closed());
            peers.clone()
        };
        for peer in peers {
            tokio::spawn(async move {
                match tokio::time::timeout(NOTIFY_BOUND, peer.notify_resource_list_changed()).await
                {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "resources/list_changed not sent")
                    }
                    Err(_) => tracing::warn!(
                        bound_s = NOTIFY_BOUND.as_secs(),
                        "a client did not take resources/list_changed in time"
                    ),
                }
            });
        }
    }
}

fn unix_now() -> Option<u64> {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    fn check(layer: &str, status: Status) -> Check {
        serde_json::from_value(serde_json::json!({
            "layer": layer, "status": status, "detail": "d", "fix": null, "required": true
        }))
        .unwrap()
    }

    #[test]
    fn a_missing_sandbox_layer_refuses_executions() {
        let layers = Layers::new(vec![check("seccomp", Status::Ok)], true);
        assert!(!layers.passed());
        assert_eq!(layers.refusal(), None);
        layers.add(vec![check("python in sandbox", Status::Missing)], "default");
        let why = layers.refusal().unwrap();
        assert!(
            why.contains("python in sandbox") && why.contains("codebox doctor"),
            "{why}"
        );
        assert_eq!(layers.checks().len(), 2);
    }

    /// A new template (an upstream became ready: the catalog changed) retires the idle
    /// sandboxes at once; until the refill shelves new ones the pool holds none. It came
    /// up all the same: readiness must not flap back to 503 then.
    #[test]
    fn a_pool_that_came_up_stays_warm_while_a_new_template_fills() {
        let stats = |idle, handed_out, retired, died_idle| crate::pool::LanguageStats {
            size: 1,
            idle,
            starting: 1,
            handed_out,
            missed: 0,
            died_idle,
            retired,
            spawn_failures: 0,
            idle_memory_bytes: 0,
            memory_per_sandbox_bytes: None,
            ..Default::default()
        };
        assert!(!came_up(&stats(0, 0, 0, 0)));
        assert!(came_up(&stats(1, 0, 0, 0)));
        assert!(came_up(&stats(0, 1, 0, 0)));
        assert!(came_up(&stats(0, 0, 1, 0)), "retired by a new template");
        assert!(came_up(&stats(0, 0, 0, 1)), "died idle, being replaced");
    }

    #[tokio::test]
    async fn ready_waits_for_the_checks_not_for_upstreams() {
        let layers = Layers::new(vec![], true);
        let upstreams = Upstreams::empty();
        assert!(!value(&layers, None, &upstreams).0);
        layers.add(vec![check("python in sandbox", Status::Ok)], "default");
        let (ready, v) = value(&layers, None, &upstreams);
        assert!(ready, "{v}");
        assert_eq!(v["sandbox_checks"], "passed");
    }
}
