//! The network of `serve`'s and `run`'s sandboxes: from the profile's (or the config's)
//! `[network]` to the spawn's mode and, in proxy mode, the egress proxy.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};

use codebox::egress::{Egress, EgressOptions, EgressPolicy, NetworkMode, SystemResolver};
use codebox::profile::Profile;
use codebox::spawner::wire::SpawnNetwork;

/// `$XDG_STATE_HOME/codebox`, else `~/.local/state/codebox`; as root `/var/lib/codebox`.
pub fn default_state_dir() -> Option<PathBuf> {
    if nix::unistd::geteuid().is_root() {
        return Some(PathBuf::from("/var/lib/codebox"));
    }
    let env = codebox::config::process_env;
    match env("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        Some(d) => Some(PathBuf::from(d).join("codebox")),
        None => env("HOME").map(|h| PathBuf::from(h).join(".local/state/codebox")),
    }
}

/// The network mode every sandbox gets and, in proxy mode, the egress proxy: policy
/// checked, secrets read, the CA made when a credential needs it, the trust bundle
/// written under `state_dir` and reachable by the sandbox user (`sandbox_ids`).
pub fn start(
    profile: &Profile,
    state_dir: Option<&Path>,
    sandbox_ids: (u32, u32),
) -> anyhow::Result<(SpawnNetwork, Option<Arc<Egress>>)> {
    match profile.network_mode {
        NetworkMode::None => return Ok((SpawnNetwork::None, None)),
        NetworkMode::Loopback => return Ok((SpawnNetwork::Loopback, None)),
        NetworkMode::Proxy => {}
    }
    let policy = EgressPolicy::from_section(&profile.network, &codebox::config::process_env)
        .context("the egress policy")?;
    let Some(state_dir) = state_dir else {
        bail!("proxy mode needs a state directory for its trust bundle: set state_dir (CODEBOX_STATE_DIR)");
    };
    let egress = Egress::new(
        policy,
        EgressOptions {
            state_dir: state_dir.to_path_buf(),
            resolver: Arc::new(SystemResolver),
        },
    )
    .with_context(|| format!("cannot set up the egress proxy in {}", state_dir.display()))?;
    let trust = egress.trust_dir().to_path_buf();
    codebox::server::reachable_by(&trust, sandbox_ids, "state_dir (CODEBOX_STATE_DIR)").map_err(
        |why| anyhow::anyhow!("the sandboxes cannot read the egress trust bundle: {why}"),
    )?;
    tracing::info!(
        policy = %egress.policy().summary(),
        trust = %trust.display(),
        "egress proxy ready"
    );
    Ok((
        SpawnNetwork::Proxy { trust: Some(trust) },
        Some(Arc::new(egress)),
    ))
}
