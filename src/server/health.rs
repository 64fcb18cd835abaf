//! `health`: the server's own state for any client (also `codebox.health()` from code
//! and the resource `codebox://health`): version, layers, readiness, load, limits,
//! pool, sessions, network, packages, upstreams, what the tool lists cost in tokens.

use std::sync::atomic::Ordering;

use super::{upstream_status, wiring, CodeboxServer};
use crate::proxy::ToolBackend;

impl CodeboxServer {
    /// What `health` shows, to any client: the server's own state, nothing of other
    /// clients beyond counts (also `codebox.health()` from code and `codebox://health`).
    pub(super) fn health_value(&self) -> serde_json::Value {
        let s = &self.state;
        // The checker's counters before the readiness they explain: the readiness is
        // then at least as new, so a reader who sees `sandbox_checker.unfinished == n`
        // also sees the state the n-th unfinished checker left (they are two locks).
        let sandbox_checker = s.layers.checker_status();
        let layers: Vec<serde_json::Value> = s
            .layers
            .checks()
            .iter()
            .map(|c| serde_json::json!({"layer": c.layer, "status": c.status, "detail": c.detail}))
            .collect();
        let (open_sessions, live_interpreters) = s.sessions.counts();
        serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_s": s.started.elapsed().as_secs(),
            "profile": s.settings.profile.name,
            "ready": self.readiness().1,
            "layers": layers,
            "executions": {
                "run": s.counters.run.load(Ordering::Relaxed),
                "failed": s.counters.failed.load(Ordering::Relaxed),
                "running": s.admission.running(),
            },
            "queue_depth": s.admission.waiting(),
            "concurrency": s.settings.concurrency,
            "pool": wiring::pool::health(s.pool.as_ref()),
            "backend": match &s.settings.microvm {
                Some(vms) => serde_json::json!({"name": "microvm", "microvm": vms.health()}),
                None => serde_json::json!({"name": "namespace"}),
            },
            "spawner": s.spawner.status(),
            "sandbox_checker": sandbox_checker,
            "rootfs": s.layers.rootfs.status(),
            "sessions": {
                "keeper": s.sessions.keeper_status(),
                "open": open_sessions,
                "live_interpreters": live_interpreters,
                "idle_ttl_s": s.settings.sessions.idle_ttl.as_secs(),
                "quota_bytes": s.settings.sessions.quota_bytes,
                "max_entries": s.settings.sessions.max_entries,
                "paused": s.sessions.store_health(),
            },
            "tasks": {
                "enabled": s.settings.tasks.enabled,
                "running": s.tasks.running(),
                "keep_for_s": s.settings.tasks.keep_for.as_secs(),
                "calls_waiting_for_input": s.parked.len(),
            },
            "rate_limits": {
                "per_minute": s.settings.rate.per_minute.map(|n| n.get()),
                "concurrent": s.settings.rate.concurrent,
            },
            "network": wiring::egress::health(&s.settings),
            "packages": wiring::packages::health(&s.settings),
            "pii": s.settings.pii_mode,
            "audit": s.settings.audit.as_ref().map(|a| serde_json::to_value(a.status()).unwrap_or_default()),
            "skills": match &s.skills {
                Some(store) => serde_json::json!({"dir": store.root(), "shared": store.shared_root()}),
                None => serde_json::json!({"error": s.skills_error}),
            },
            "upstreams": upstream_status::list(s.backend.upstreams()).1,
            "context_tokens": {
                "upstream_tools_list": crate::tokens::catalog_tokens(&s.backend.catalog()),
                "codebox_tools_list": crate::tokens::tools_list_tokens(
                    &self
                        .tool_router
                        .list_all()
                        .iter()
                        .filter_map(|t| serde_json::to_value(t).ok())
                        .collect::<Vec<_>>(),
                ),
                "tools": s.settings.tools,
            },
        })
    }
}
