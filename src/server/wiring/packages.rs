//! Packages on request in an execution (`crate::packages` is the store and the installer):
//!
//! - a call's `packages` (and a TypeScript program's `npm:`/`jsr:` imports) are checked
//!   with its other arguments: a bad specifier or a denied name is refused at once;
//! - once the call is admitted, its layer is taken from the store or installed, and the
//!   sandbox binds it read-only at `/packages` (a pooled sandbox has none, so such a run
//!   starts cold); a session keeps the layer of its last set for its later runs;
//! - [`SandboxInstaller`] runs the installer program in a codebox sandbox of its own
//!   whose only way out is the installer's egress proxy (the configured index and
//!   registries), with the staging directory as its workspace.

use std::sync::Arc;
use std::time::Duration;

use crate::egress::{Egress, Narrowing};
use crate::packages::{InstallRunner, Layer, Limits, PackageSet, RunOutput};
use crate::runtime::{self, Language};
use crate::server::CodeboxServer;
use crate::spawner::wire::SpawnNetwork;
use crate::spawner::{SpawnSpec, SpawnerClient};

impl CodeboxServer {
    /// The set a call asks for, checked (`None`: nothing to install).
    pub(in crate::server) fn package_set(
        &self,
        language: Language,
        asked: Option<&[String]>,
        code: &str,
    ) -> Result<Option<PackageSet>, String> {
        let asked = asked.unwrap_or_default();
        let set = PackageSet::parse(language, asked, code).map_err(|e| e.to_string())?;
        let Some(set) = set else { return Ok(None) };
        match &self.state.settings.packages {
            Some(installer) => match installer.needed(set) {
                Some(set) => {
                    installer.check(&set).map_err(|e| e.to_string())?;
                    Ok(Some(set))
                }
                // The rootfs has it all.
                None => Ok(None),
            },
            None if !asked.is_empty() && self.state.settings.microvm.is_some() => Err(
                "packages: packages on request are not available on the microVM backend yet; what the rootfs's data set has is there"
                    .into(),
            ),
            None if !asked.is_empty() => Err(
                "packages: this server installs no packages on request ([packages] enabled = false, or no installer in its rootfs)"
                    .into(),
            ),
            // npm:/jsr: imports of a program on a server that installs nothing: the
            // runtime resolves them from the rootfs's cache, or says which is missing.
            None => Ok(None),
        }
    }

    /// The layer of `set`, kept or installed now (the call is admitted: an install holds
    /// its slot).
    pub(in crate::server) async fn package_layer(
        &self,
        set: &PackageSet,
    ) -> Result<Arc<Layer>, String> {
        let installer = self
            .state
            .settings
            .packages
            .as_ref()
            .ok_or("packages: this server installs no packages on request")?;
        installer.layer(set).await.map_err(|e| e.to_string())
    }
}

/// `health.packages`: whether packages on request are on, from where, and what the
/// store holds.
pub(crate) fn health(settings: &crate::server::Settings) -> serde_json::Value {
    use std::sync::atomic::Ordering::Relaxed;
    let Some(installer) = &settings.packages else {
        return serde_json::json!({ "enabled": false });
    };
    let c = &installer.counters;
    let limits = installer.store().limits();
    let sources = match installer.sources() {
        Ok(Some(s)) => serde_json::json!({
            "python_index": s.python_index,
            "npm_registry": s.npm_registry,
            "jsr_registry": s.jsr_registry,
            // Defaults that could not be asked (their tool was killed): why.
            "missing": s.missing,
        }),
        Ok(None) => serde_json::json!("being found"),
        Err(why) => serde_json::json!({ "error": why }),
    };
    serde_json::json!({
        "enabled": true,
        "sources": sources,
        "installed": c.installed.load(Relaxed),
        "reused": c.reused.load(Relaxed),
        "failed": c.failed.load(Relaxed),
        "refused": c.refused.load(Relaxed),
        "cache_bytes": installer.store().total_bytes(),
        "cache_limit_bytes": limits.cache_bytes,
        "max_layer_bytes": limits.max_layer_bytes,
    })
}

/// The installer sandbox, through the spawner.
pub struct SandboxInstaller {
    pub spawner: SpawnerClient,
    /// The profile the installer runs under (its limits are replaced by the install's).
    pub profile: String,
    pub base_limits: crate::sandbox::Limits,
    /// The installer's own egress: the configured index and registries only.
    pub egress: Arc<Egress>,
    /// Proxy mode with the installer egress's trust bundle.
    pub network: SpawnNetwork,
}

/// How long after its program ended the installer sandbox must be gone (killed, reaped,
/// its cgroup removed) before its staged layer is looked at.
const INSTALLER_GONE_WITHIN: Duration = Duration::from_secs(10);

impl SandboxInstaller {
    /// What an install may use: its time, `/tmp` for the download, the unpacked set and
    /// pip's temporary files (twice the layer), memory for that tmpfs and pip itself.
    fn limits(&self, l: &Limits) -> crate::sandbox::Limits {
        let mut limits = self.base_limits.clone();
        limits.timeout = l.install_timeout;
        limits.tmpfs_bytes = l.max_layer_bytes.saturating_mul(2) + (64 << 20);
        limits.file_size_bytes = l.max_layer_bytes;
        limits.memory_bytes = Some(limits.tmpfs_bytes + (768 << 20));
        limits.pids = Some(limits.pids.unwrap_or(128).max(256));
        limits.stdout_cap = 1 << 20;
        limits.stderr_cap = 1 << 20;
        limits
    }
}

impl InstallRunner for SandboxInstaller {
    fn run(
        &self,
        request: String,
        staging: std::path::PathBuf,
        limits: Limits,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<RunOutput, String>> + Send>>
    {
        let spec = SpawnSpec {
            language: Language::Python,
            profile: self.profile.clone(),
            limits: self.limits(&limits),
            workspace: Some(staging),
            servers: None,
            skills: None,
            workspace_mount: None,
            network: Some(self.network.clone()),
            packages: None,
            pooled: false,
        };
        let spawner = self.spawner.clone();
        let egress = self.egress.clone();
        Box::pin(async move {
            let timeout = spec.limits.timeout;
            let mut sandbox = spawner
                .spawn(spec)
                .await
                .map_err(|e| format!("the installer sandbox could not be created: {e}"))?;
            let proxy = match sandbox.take_egress_listener() {
                Some(l) => egress.start(std::net::TcpListener::from(l), Narrowing::none()),
                None => return Err("the installer sandbox came without its egress listener".into()),
            };
            // The staged layer is checked only once nothing of the installer lives: the
            // spawner reports the sandbox gone after its cgroup is empty and removed.
            let (gone_tx, gone_rx) = tokio::sync::oneshot::channel::<()>();
            sandbox.hold_until_gone(gone_tx);
            let files = runtime::Files::from([("request.json".to_string(), request.into_bytes())]);
            let frame = runtime::boot_frame_with_files(crate::packages::install::INSTALLER, &files);
            let outcome = sandbox
                .run_to_completion(
                    &frame,
                    1 << 20,
                    1 << 20,
                    timeout + Duration::from_secs(1),
                    std::future::pending(),
                    |_, _| {},
                )
                .await;
            let network = proxy.finish().await;
            let outcome = outcome.map_err(|e| format!("the installer sandbox failed: {e}"))?;
            if tokio::time::timeout(INSTALLER_GONE_WITHIN, gone_rx)
                .await
                .is_err()
            {
                return Err(format!(
                    "the installer sandbox was not gone {} s after its program ended",
                    INSTALLER_GONE_WITHIN.as_secs()
                ));
            }
            if network.denied > 0 {
                tracing::info!(denied = ?network.connections.iter().filter(|c| !c.allowed).map(|c| format!("{}:{} {}", c.host, c.port, c.reason.clone().unwrap_or_default())).collect::<Vec<_>>(), "the installer was refused connections");
            }
            Ok(RunOutput {
                stdout: outcome.stdout.text("stdout"),
                stderr: outcome.stderr.text("stderr"),
                exit_code: outcome.exit_code(),
                timed_out: outcome.timed_out,
                oom_killed: outcome.cgroup.as_ref().is_some_and(|c| c.oom_killed),
            })
        })
    }
}
