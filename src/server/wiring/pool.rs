//! The server's warm pool: its templates (the profile's limits, the shared skills
//! directory: a client with skills of its own binds its own view and so starts a cold
//! sandbox, see `crate::skills::ClientSkills`), each pooled sandbox's own `/servers` view,
//! kept current as the upstream catalog changes, and its figures in `health`.
//!
//! The wrapper tree of a new catalog is generated here, in the background, as soon as the
//! catalog changes, and the idle pooled sandboxes' views are brought up to it
//! ([`crate::codegen::wrapper_views`]): the pool keeps its sandboxes (a catalog change used to
//! retire them all, so the calls right after the upstreams came up ran cold), and
//! executions find the tree generated instead of generating it on their request path.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use crate::codegen::wrapper_dir;
use crate::codegen::wrapper_views;
use crate::pool::{Own, PerSandbox, Template, WarmPool};
use crate::proxy::{IndexedUpstreams, ToolBackend};
use crate::runtime::Language;
use crate::server::State;
use crate::spawner::SpawnSpec;

/// What a sandbox of `language` binds and is limited by when it serves a call without a
/// session (the calls a pooled sandbox can serve). With upstream servers configured, each
/// sandbox gets a `/servers` view of its own from `views`.
pub(in crate::server) fn template(
    state_settings: &crate::server::Settings,
    skills: Option<&std::path::Path>,
    language: Language,
    views: Option<Arc<ServersViews>>,
) -> Template {
    let spec = SpawnSpec {
        language,
        profile: state_settings.profile.source.clone(),
        limits: state_settings.profile.limits.clone(),
        workspace: None,
        // Each sandbox's own view, set when it is started (none without upstreams).
        servers: None,
        skills: skills.map(|p| p.to_path_buf()),
        workspace_mount: None,
        network: Some(state_settings.network.clone()),
        packages: None,
        pooled: false,
    };
    Template {
        spec,
        hold: None,
        per_sandbox: views.map(|v| v as Arc<dyn PerSandbox>),
    }
}

/// The templates of both languages.
pub(in crate::server) fn templates(
    settings: &crate::server::Settings,
    skills: Option<&std::path::Path>,
    wrappers: &Arc<wrapper_dir::Wrappers>,
    backend: &Arc<IndexedUpstreams>,
) -> HashMap<Language, Template> {
    // No server configured: nothing to bind at /servers, ever (the configuration is
    // read once).
    let views = current_wrappers(wrappers, backend).map(|_| {
        Arc::new(ServersViews {
            wrappers: wrappers.clone(),
            backend: backend.clone(),
        })
    });
    Language::ALL
        .into_iter()
        .map(|l| (l, template(settings, skills, l, views.clone())))
        .collect()
}

/// The wrapper tree of the current catalog (generated if its version is new).
pub(in crate::server) fn current_wrappers(
    wrappers: &wrapper_dir::Wrappers,
    backend: &IndexedUpstreams,
) -> Option<Arc<wrapper_dir::WrapperDir>> {
    match wrappers.for_catalog(&backend.catalog()) {
        Ok(dir) => dir,
        Err(e) => {
            tracing::error!(error = ?e, "generating the tool wrappers failed");
            None
        }
    }
}

/// Gives each pooled sandbox a `/servers` view of the current tree.
pub(in crate::server) struct ServersViews {
    wrappers: Arc<wrapper_dir::Wrappers>,
    backend: Arc<IndexedUpstreams>,
}

impl PerSandbox for ServersViews {
    fn prepare(&self, spec: &mut SpawnSpec) -> Result<Box<dyn Own>, String> {
        let tree = current_wrappers(&self.wrappers, &self.backend)
            .ok_or("the tool wrappers could not be generated")?;
        let view = self
            .wrappers
            .views()
            .view(&tree)
            .map_err(|e| crate::error_chain::error_chain(&e))?;
        spec.servers = Some(view.path().to_path_buf());
        Ok(Box::new(ViewOwn {
            view,
            wrappers: self.wrappers.clone(),
            backend: self.backend.clone(),
        }))
    }
}

/// A pooled sandbox's `/servers` view.
struct ViewOwn {
    view: Arc<wrapper_views::View>,
    wrappers: Arc<wrapper_dir::Wrappers>,
    backend: Arc<IndexedUpstreams>,
}

impl Own for ViewOwn {
    /// Brought to the current catalog first: the call that takes the sandbox may come
    /// right after a change, before the follower updated this view (a version check
    /// when it did).
    fn freeze(&self) {
        if let Some(tree) = current_wrappers(&self.wrappers, &self.backend) {
            if let Err(e) = self.wrappers.views().update(&self.view, &tree) {
                tracing::warn!(
                    err = crate::error_chain::error_chain(&e),
                    "a pooled sandbox's /servers could not be brought up to date; it runs with the tools it had"
                );
            }
        }
        self.view.freeze();
    }
}

/// Follows the upstream catalog: on every change, generates the new wrapper tree (on the
/// blocking pool) and brings the idle pooled sandboxes' views up to it. Ends with the
/// server.
pub(in crate::server) fn follow_catalog(state: Weak<State>) {
    let Some(s) = state.upgrade() else { return };
    let mut changes = s.backend.upstreams().subscribe();
    drop(s);
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            let Some(s) = state.upgrade() else { return };
            let refreshed = tokio::task::spawn_blocking(move || {
                if let Some(tree) = current_wrappers(&s.wrappers, &s.backend) {
                    let started = std::time::Instant::now();
                    let updated = s.wrappers.views().follow(&tree);
                    tracing::debug!(
                        version = tree.version,
                        updated,
                        elapsed_us = started.elapsed().as_micros() as u64,
                        "pooled sandboxes' /servers brought up to date"
                    );
                }
                // The wrappers are resources: clients list them again.
                s.listeners.resources_changed();
            })
            .await;
            if let Err(e) = refreshed {
                tracing::error!(error = %e, "following the upstream catalog failed");
            }
        }
    });
}

/// The pool's part of `health`: its bounds, and per language its target, idle and
/// starting sandboxes, the arrival rate and time to ready it follows, how many executions
/// it served and missed, and the memory an idle sandbox holds.
pub(in crate::server) fn health(pool: Option<&WarmPool>) -> serde_json::Value {
    match pool {
        None => serde_json::json!({"size": 0, "floor": 0, "ceiling": 0}),
        Some(pool) => {
            let stats = pool.stats();
            let mut languages = serde_json::Map::new();
            for language in Language::ALL {
                if let Some(s) = stats.get(&language) {
                    languages.insert(
                        language.name().into(),
                        serde_json::to_value(s).unwrap_or_default(),
                    );
                }
            }
            let b = pool.bounds();
            serde_json::json!({
                // `size`: the floor (the pool's one size before it followed demand).
                "size": b.floor,
                "floor": b.floor,
                "ceiling": b.ceiling,
                "shrink_after_s": b.shrink_after.as_secs_f64(),
                "languages": languages,
            })
        }
    }
}
