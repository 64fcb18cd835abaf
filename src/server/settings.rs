//! What a server runs with: every setting `codebox serve` resolves from its flags,
//! environment and configuration, and the defaults for harnesses that build a server in
//! their own process.

use std::sync::Arc;
use std::time::Duration;

use crate::audit::AuditLog;
use crate::pii::{Detector, PiiMode};
use crate::profile::Profile;
use crate::proxy::{AllowList, ProxyLimits};
use crate::ratelimit::RateLimits;
use crate::session::SessionLimits;

use super::ToolSet;

/// Server settings.
#[derive(Clone)]
pub struct Settings {
    /// The profile every execution runs with.
    pub profile: Profile,
    /// Executions running at once.
    pub concurrency: usize,
    /// Sandboxes started ahead of demand per language: between `pool_size` (the floor; 0:
    /// no warm pool) and `pool_max`, following demand.
    pub pool: crate::pool::Bounds,
    /// Executions waiting for a slot before "busy" is answered.
    pub queue: usize,
    /// No request may ask for more.
    pub max_timeout: Duration,
    /// Bytes of `files` one call may bring, all together.
    pub max_files_bytes: usize,
    /// The upstream tools sandboxed code may call; a request's `allowed_tools` can only
    /// narrow it.
    pub allowed_tools: AllowList,
    /// Per-execution limits of the tool channel.
    pub proxy_limits: ProxyLimits,
    /// PII handling when a call does not ask for stricter.
    pub pii_mode: PiiMode,
    /// The PII detectors (built-in and custom).
    pub pii_detector: Arc<Detector>,
    /// Per-client limits.
    pub rate: RateLimits,
    pub sessions: SessionLimits,
    /// `[sessions]`: paused sessions kept in a snapshot store (`None`: sessions end with
    /// the process).
    pub persist: Option<crate::snapshot::PersistSettings>,
    /// This process's name among replicas behind one balancer (`None`: a single server):
    /// session ids carry it (see [`crate::replica`]).
    pub replica: Option<crate::replica::ReplicaName>,
    /// Where earlier versions kept sessions' workspaces (the system temporary
    /// directory): what dead processes left there is removed at start.
    pub sessions_base: std::path::PathBuf,
    /// Host uid and gid of the sandbox user (owner of session workspaces).
    pub sandbox_ids: (u32, u32),
    /// The skills root: every client's own skills below it (`None`: no skills).
    pub skills_dir: Option<std::path::PathBuf>,
    /// The operator's shared skills, read-only to clients (`None`: none).
    pub skills_shared: Option<std::path::PathBuf>,
    /// The audit log, opened by the caller (start-up fails clearly when it cannot be).
    pub audit: Option<Arc<AuditLog>>,
    /// SHA-256 of the rootfs manifest (audit records name the exact tree).
    pub rootfs_manifest_sha256: Option<String>,
    /// The network every sandbox is spawned with (the profile's mode, or the config's),
    /// with the trust bundle in proxy mode.
    pub network: crate::spawner::wire::SpawnNetwork,
    /// The egress proxy, in proxy mode.
    pub egress: Option<Arc<crate::egress::Egress>>,
    /// Packages on request (`None`: off, or no installer in the rootfs).
    pub packages: Option<Arc<crate::packages::Installer>>,
    /// Characters of output a result carries, by default and at most.
    pub output_budget: crate::output::Budget,
    /// Which of codebox's own tools `tools/list` offers.
    pub tools: ToolSet,
    /// How long and how much of cut results' whole streams is kept.
    pub kept_output: crate::output::KeptLimits,
    /// Executions as tasks (MCP Tasks extension).
    pub tasks: crate::tasks::TaskSettings,
    /// `[approval]`: which sandboxed calls wait for the user (`approval_glue.rs`).
    pub approval: Arc<crate::approval::ApprovalPolicy>,
    /// The microVM backend: each execution in a fresh VM (`None`: namespace sandboxes).
    pub microvm: Option<Arc<crate::microvm::serve::ServeVms>>,
}

impl Settings {
    /// What `codebox serve` runs with when nothing is configured, for `profile` (whose
    /// network mode must not be proxy: that needs the egress proxy `serve` starts) and
    /// sandboxes owned by `sandbox_ids` on the host. For harnesses that build a server in
    /// their own process (`benches/warm_call_instructions.rs`); `serve` resolves each
    /// field from its configuration.
    pub fn defaults(profile: Profile, sandbox_ids: (u32, u32)) -> anyhow::Result<Settings> {
        let network = match profile.network_mode {
            crate::egress::NetworkMode::None => crate::spawner::wire::SpawnNetwork::None,
            crate::egress::NetworkMode::Loopback => crate::spawner::wire::SpawnNetwork::Loopback,
            mode => anyhow::bail!(
                "a profile in {mode:?} mode needs the egress proxy of `codebox serve`"
            ),
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Settings {
            profile,
            concurrency: cores * 2,
            pool: crate::pool::Bounds::new(2, 8, Duration::from_secs(60))?,
            queue: 32,
            max_timeout: Duration::from_secs(300),
            max_files_bytes: crate::runtime::MAX_FILES_BYTES,
            allowed_tools: AllowList::all(),
            proxy_limits: ProxyLimits::default(),
            pii_mode: PiiMode::Off,
            pii_detector: Arc::new(Detector::new(&[])?),
            rate: RateLimits::default(),
            sessions: SessionLimits::default(),
            persist: None,
            replica: None,
            sessions_base: std::env::temp_dir(),
            sandbox_ids,
            skills_dir: None,
            skills_shared: None,
            audit: None,
            rootfs_manifest_sha256: None,
            network,
            egress: None,
            packages: None,
            output_budget: crate::output::Budget::default(),
            tools: ToolSet::default(),
            kept_output: crate::output::KeptLimits::default(),
            tasks: crate::tasks::TaskSettings::default(),
            approval: Arc::new(crate::approval::ApprovalPolicy::default()),
            microvm: None,
        })
    }
}
