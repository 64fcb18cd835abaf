//! The server's warm pool: its templates (the profile's limits, the current `/servers`
//! tree, the shared skills directory: a client with skills of its own binds its own view
//! and so starts a cold sandbox, see `crate::skills::ClientSkills`), kept current as the upstream catalog changes, and its
//! figures in `health`.
//!
//! The wrapper tree of a new catalog is generated here, in the background, as soon as the
//! catalog changes: the pool refills with sandboxes that bind the new tree, and executions
//! find it generated instead of generating it on their request path.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use super::{wrappers, State};
use crate::pool::{Template, WarmPool};
use crate::proxy::{IndexedUpstreams, ToolBackend};
use crate::runtime::Language;
use crate::spawner::SpawnSpec;

/// What a sandbox of `language` binds and is limited by when it serves a call without a
/// session (the calls a pooled sandbox can serve).
pub(super) fn template(
    state_settings: &super::Settings,
    skills: Option<&std::path::Path>,
    language: Language,
    servers: Option<Arc<wrappers::WrapperDir>>,
) -> Template {
    let spec = SpawnSpec {
        language,
        profile: state_settings.profile.source.clone(),
        limits: state_settings.profile.limits.clone(),
        workspace: None,
        servers: servers.as_ref().map(|w| w.path().to_path_buf()),
        skills: skills.map(|p| p.to_path_buf()),
        workspace_mount: None,
        network: Some(state_settings.network.clone()),
        packages: None,
        pooled: false,
    };
    Template {
        spec,
        hold: servers.map(|w| w as Arc<dyn std::any::Any + Send + Sync>),
    }
}

/// The templates of both languages for the catalog as it is now.
pub(super) fn templates(
    settings: &super::Settings,
    skills: Option<&std::path::Path>,
    wrappers: &wrappers::Wrappers,
    backend: &IndexedUpstreams,
) -> HashMap<Language, Template> {
    let servers = current_wrappers(wrappers, backend);
    Language::ALL
        .into_iter()
        .map(|l| (l, template(settings, skills, l, servers.clone())))
        .collect()
}

/// The wrapper tree of the current catalog (generated if its version is new).
pub(super) fn current_wrappers(
    wrappers: &wrappers::Wrappers,
    backend: &IndexedUpstreams,
) -> Option<Arc<wrappers::WrapperDir>> {
    match wrappers.for_catalog(&backend.catalog()) {
        Ok(dir) => dir,
        Err(e) => {
            tracing::error!(error = ?e, "generating the tool wrappers failed");
            None
        }
    }
}

/// Follows the upstream catalog: on every change, generates the new wrapper tree (on the
/// blocking pool) and gives the pool new templates. Ends with the server.
pub(super) fn follow_catalog(state: Weak<State>) {
    let Some(s) = state.upgrade() else { return };
    let mut changes = s.backend.upstreams().subscribe();
    drop(s);
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            let Some(s) = state.upgrade() else { return };
            let refreshed = tokio::task::spawn_blocking(move || {
                let skills = s.skills.as_ref().and_then(|k| k.shared_root());
                let templates = templates(&s.settings, skills, &s.wrappers, &s.backend);
                if let Some(pool) = &s.pool {
                    for (language, template) in templates {
                        pool.set_template(language, template);
                    }
                }
                // The wrappers are resources: clients list them again.
                s.listeners.resources_changed();
            })
            .await;
            if let Err(e) = refreshed {
                tracing::error!(error = %e, "refreshing the pool's templates failed");
            }
        }
    });
}

/// The pool's part of `health`: its bounds, and per language its target, idle and
/// starting sandboxes, the arrival rate and time to ready it follows, how many executions
/// it served and missed, and the memory an idle sandbox holds.
pub(super) fn health(pool: Option<&WarmPool>) -> serde_json::Value {
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
