//! `codebox serve`: the MCP server on stdio, or on streamable HTTP with `--http`.
//!
//! Start-up order matters: everything that forks (host checks, the spawner) happens while
//! the process is still single-threaded; only then is the tokio runtime built.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use rmcp::ServiceExt;
use tokio_util::sync::CancellationToken;

use codebox::config::{self, Config};
use codebox::doctor;
use codebox::execution::Host;
use codebox::pii::PiiMode;
use codebox::profile::Profile;
use codebox::proxy::{AllowList, ProxyLimits};
use codebox::ratelimit::RateLimits;
use codebox::rootfs;
use codebox::sandbox::idmap::DEFAULT_ROOT_HOST_ID;
use codebox::sandbox::IdMapping;
use codebox::server::transport::http::{self, HttpOptions};
use codebox::server::{CodeboxServer, Layers, Settings};
use codebox::session::SessionLimits;
use codebox::spawner::factory::Factory;
use codebox::spawner::SpawnerClient;
use codebox::units::{parse_duration, parse_size};
use codebox::upstream::{UpstreamOptions, Upstreams};

use super::upstreams::McpConfigs;

/// Warm sandboxes per language when nothing says otherwise: enough for a client that
/// runs one program after another, at the memory cost `health` reports per sandbox.
const DEFAULT_POOL_SIZE: usize = 2;

/// The most warm sandboxes per language when nothing says otherwise (or the floor, if
/// that is higher). The pool wants the calls arriving within one time to ready + 1: on a
/// 2-core VM a warm TypeScript call takes ~10 ms and a Deno ~40-50 ms to come up (README's
/// tables), so back-to-back calls want about 6 (4 measured on a busy VM, README "Warm
/// pool"); a Python forked from a pre-initialised interpreter in a few ms wants ~3. A
/// Python started with the data set preloaded (~1 s) would want more than any sane
/// memory: 8 bounds what a flood can make the pool hold to 8 × (68 MiB for such a Python
/// + 11 MiB for a Deno) ≈ 630 MiB idle, and only until `pool_shrink_after`.
const DEFAULT_POOL_MAX: usize = 8;

/// How long the pool keeps what a burst grew when nothing says otherwise: longer than an
/// agent's pause between two bursts of calls (it reads results, thinks, writes code).
const DEFAULT_POOL_SHRINK_AFTER: Duration = Duration::from_secs(60);

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Config file [default: $CODEBOX_CONFIG, ./codebox.toml, ~/.config/codebox/config.toml].
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Sandbox profile for every execution: default, network, or a path to a .toml file.
    #[arg(long, value_name = "NAME|PATH")]
    profile: Option<String>,
    /// Executions running at once [default: 2 × cores].
    #[arg(long)]
    concurrency: Option<usize>,
    /// Sandboxes kept started and waiting for code, per language, at least; 0 disables
    /// the warm pool [default: 2].
    #[arg(long)]
    pool_size: Option<usize>,
    /// The most sandboxes the warm pool keeps per language as it follows demand; equal to
    /// --pool-size for a fixed pool [default: 8, or --pool-size if higher].
    #[arg(long)]
    pool_max: Option<usize>,
    /// How long the pool keeps sandboxes a burst of calls made it start after the demand
    /// fell, before it kills them [default: 60s].
    #[arg(long, value_parser = parse_duration)]
    pool_shrink_after: Option<Duration>,
    /// Executions allowed to wait for a slot before requests get "busy, retry" [default: 32].
    #[arg(long)]
    queue: Option<usize>,
    /// The largest timeout a request may ask for [default: 5m].
    #[arg(long, value_parser = parse_duration)]
    max_timeout: Option<Duration>,
    /// The rootfs [default: `rootfs` of the config, $CODEBOX_ROOTFS, else
    /// ../share/codebox/rootfs from the binary's directory, else a checkout's target/rootfs].
    #[arg(long, value_name = "DIR")]
    rootfs: Option<PathBuf>,
    /// When run as root: the unprivileged host uid/gid the sandbox user maps to [default: 65534].
    #[arg(long)]
    root_host_id: Option<u32>,
    /// Serve streamable HTTP at ADDR (path /mcp) instead of stdio; without ADDR, at
    /// `[http] addr` from the config, else 127.0.0.1:8080.
    #[arg(long, value_name = "ADDR", num_args = 0..=1)]
    http: Option<Option<std::net::SocketAddr>>,
    /// Browser origins allowed to call over HTTP; any other Origin gets 403
    /// [default: http://localhost:*, http://127.0.0.1:*].
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    allowed_origins: Vec<String>,
    /// Host names accepted in the Host header besides loopback (for public deployments).
    #[arg(long = "allowed-host", value_name = "HOST")]
    allowed_hosts: Vec<String>,
    /// Which of codebox's own tools clients see: full, or minimal (the execute tools and
    /// search_tools; skills and health from code and as resources) [default: full].
    #[arg(long, value_name = "SET")]
    tools: Option<codebox::server::ToolSet>,
    /// An MCP server config (`.mcp.json` format, as Claude Code writes it) naming the
    /// upstream servers, instead of the config file's `mcp_config` [default: ./.mcp.json];
    /// repeat it to merge several (a server name in two files is an error).
    #[arg(long = "mcp-config", value_name = "PATH")]
    mcp_config: Vec<PathBuf>,
    /// Also serve `GET /metrics` (Prometheus) at ADDR, without a token, over stdio or HTTP
    /// [default: `[metrics] addr` from the config, else none].
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// On SIGINT/SIGTERM, how long running executions may still finish before they are killed.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    drain_timeout: Duration,
    /// This server's name among replicas behind one load balancer (a DNS label, such as
    /// a StatefulSet's pod name): session ids start with it, so the balancer can send a
    /// session's requests to the replica that holds it [default: `[http] replica`].
    #[arg(long, env = "CODEBOX_REPLICA", value_name = "NAME")]
    replica: Option<String>,
}

/// Settings after flags, environment, config file and defaults, in that precedence.
struct Resolved {
    profile: String,
    rootfs: Option<PathBuf>,
    concurrency: usize,
    pool: codebox::pool::Bounds,
    queue: usize,
    max_timeout: Duration,
    max_files_bytes: usize,
    root_host_id: u32,
    http: Option<std::net::SocketAddr>,
    /// HTTP clients and their tokens.
    http_clients: Vec<(String, String)>,
    http_limits: codebox::server::transport::http_conn::ConnLimits,
    /// The plain `/metrics` listener's address.
    metrics: Option<std::net::SocketAddr>,
    allowed_origins: Vec<String>,
    allowed_hosts: Vec<String>,
    drain_timeout: Duration,
    replica: Option<codebox::replica::ReplicaName>,
    /// The `.mcp.json` files naming the upstream servers.
    mcp_config: McpConfigs,
    upstream_options: UpstreamOptions,
    allowed_tools: AllowList,
    tools: codebox::server::ToolSet,
    proxy_limits: ProxyLimits,
    pii_mode: PiiMode,
    pii_custom: Vec<codebox::pii::CustomPattern>,
    rate: RateLimits,
    sessions: SessionLimits,
    skills_dir: Option<PathBuf>,
    skills_shared: Option<PathBuf>,
    audit: Option<codebox::audit::AuditConfig>,
    /// `[approval]`, checked.
    approval: std::sync::Arc<codebox::approval::ApprovalPolicy>,
    /// `[network]` of the config, replacing the profile's.
    network: Option<codebox::egress::NetworkSection>,
    /// `[python] preload` of the config, replacing the profile's.
    preload: Option<Vec<String>>,
    /// `[python] zygote`: fork Python sandboxes from a zygote (default on).
    zygote: bool,
    /// `backend` of the config, replacing the profile's.
    backend: Option<codebox::microvm::Backend>,
    /// `guest` of the config: the microVM guest tree.
    guest: Option<PathBuf>,
    packages: codebox::packages::PackagesSection,
    output: codebox::output::OutputSection,
    tasks: codebox::tasks::TasksSection,
    state_dir: Option<PathBuf>,
    /// `[sessions]`: where paused sessions are kept, with which key (`None`: not kept).
    persist: Option<codebox::snapshot::PersistSettings>,
}

/// `$XDG_DATA_HOME/codebox/skills`, else `~/.local/share/codebox/skills`; as root
/// `/var/lib/codebox/skills` (the sandbox user is then an unprivileged host id, which
/// cannot pass through root's home).
fn default_skills_dir() -> Option<PathBuf> {
    if nix::unistd::geteuid().is_root() {
        return Some(PathBuf::from("/var/lib/codebox/skills"));
    }
    let env = config::process_env;
    match env("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        Some(d) => Some(PathBuf::from(d).join("codebox/skills")),
        None => env("HOME").map(|h| PathBuf::from(h).join(".local/share/codebox/skills")),
    }
}

fn resolve(args: ServeArgs) -> anyhow::Result<Resolved> {
    let env = &config::process_env;
    let (mut file, from) = Config::load(args.config.as_deref(), env)?;
    if let Some(path) = &from {
        tracing::info!(path = %path.display(), "config file");
    }
    file.apply_env(env)?;
    let http_clients = file.http_clients(env)?;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let pool = pool_bounds(&args, &file)?;
    let max_timeout = match (args.max_timeout, &file.max_timeout) {
        (Some(t), _) => t,
        (None, Some(s)) => parse_duration(s).map_err(|e| anyhow::anyhow!("max_timeout: {e}"))?,
        (None, None) => Duration::from_secs(300),
    };
    let max_files_bytes = match &file.max_files_size {
        Some(s) => codebox::units::parse_size(s)
            .map(|b| usize::try_from(b).unwrap_or(usize::MAX))
            .map_err(|e| anyhow::anyhow!("max_files_size: {e}"))?,
        None => codebox::runtime::MAX_FILES_BYTES,
    };
    // `--http ADDR` wins; `--http` alone or `[http] addr` (CODEBOX_HTTP_ADDR) names the
    // address; `--http` with neither serves the default.
    let file_addr = match &file.http.addr {
        Some(a) => Some(a.parse::<std::net::SocketAddr>().map_err(|_| {
            anyhow::anyhow!("http.addr {a:?} is not an address such as 127.0.0.1:8080")
        })?),
        None => None,
    };
    let http = match (args.http, file_addr) {
        (Some(Some(a)), _) => Some(a),
        (Some(None), Some(a)) | (None, Some(a)) => Some(a),
        (Some(None), None) => Some(std::net::SocketAddr::from(([127, 0, 0, 1], 8080))),
        (None, None) => None,
    };
    let http_limits = http_limits(&file.http)?;
    let metrics = match (args.metrics, &file.metrics.addr) {
        (Some(a), _) => Some(a),
        (None, Some(a)) => Some(a.parse::<std::net::SocketAddr>().map_err(|_| {
            anyhow::anyhow!("metrics.addr {a:?} is not an address such as 127.0.0.1:9464")
        })?),
        (None, None) => None,
    };
    let or_list = |cli: Vec<String>, file: Option<Vec<String>>, default: &[&str]| {
        if !cli.is_empty() {
            cli
        } else {
            file.unwrap_or_else(|| default.iter().map(|s| s.to_string()).collect())
        }
    };
    let sessions = {
        let mut l = SessionLimits::default();
        if let Some(t) = &file.session_ttl {
            l.idle_ttl = parse_duration(t).map_err(|e| anyhow::anyhow!("session_ttl: {e}"))?;
        }
        if let Some(q) = &file.session_quota {
            l.quota_bytes = parse_size(q).map_err(|e| anyhow::anyhow!("session_quota: {e}"))?;
        }
        if let Some(n) = file.session_max_entries {
            l.max_entries = n;
        }
        // A tmpfs takes 0 as "no limit": refuse it rather than lift the quota.
        if l.quota_bytes < 4096 || l.max_entries == 0 {
            bail!("session_quota must be at least 4KiB and session_max_entries at least 1");
        }
        if let Some(n) = file.max_sessions {
            l.max_sessions = n;
        }
        l
    };
    let rate = RateLimits {
        per_minute: file.rate_per_minute.and_then(std::num::NonZeroU32::new),
        concurrent: file.rate_concurrent.filter(|n| *n > 0),
    };
    Ok(Resolved {
        pii_mode: file.pii.mode.unwrap_or(PiiMode::Off),
        pii_custom: file.pii.custom.clone(),
        rate,
        sessions,
        skills_dir: file.skills_dir.clone().or_else(default_skills_dir),
        skills_shared: file.skills_shared.clone(),
        audit: file.audit.clone(),
        approval: std::sync::Arc::new(
            codebox::approval::ApprovalPolicy::from_section(&file.approval)
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        ),
        network: file.network.clone(),
        preload: file.python.preload.clone(),
        zygote: file.python.zygote.unwrap_or(true),
        backend: file.backend,
        guest: file.guest.clone(),
        packages: file.packages.clone(),
        output: file.output.clone(),
        tasks: file.tasks.clone(),
        persist: file
            .sessions
            .settings(
                file.state_dir
                    .clone()
                    .or_else(super::egress::default_state_dir)
                    .as_deref(),
                &|var| std::env::var(var).ok(),
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?,
        state_dir: file
            .state_dir
            .clone()
            .or_else(super::egress::default_state_dir),
        profile: args
            .profile
            .or(file.profile)
            .unwrap_or_else(|| "default".into()),
        rootfs: args.rootfs.or(file.rootfs),
        concurrency: args
            .concurrency
            .or(file.concurrency)
            .unwrap_or(cores * 2)
            .max(1),
        pool,
        queue: args.queue.or(file.queue).unwrap_or(32),
        max_timeout,
        max_files_bytes,
        root_host_id: args
            .root_host_id
            .or(file.root_host_id)
            .unwrap_or(DEFAULT_ROOT_HOST_ID),
        http,
        http_clients,
        http_limits,
        metrics,
        allowed_origins: or_list(
            args.allowed_origins,
            file.http.allowed_origins,
            &["http://localhost:*", "http://127.0.0.1:*"],
        ),
        allowed_hosts: or_list(args.allowed_hosts, file.http.allowed_hosts, &[]),
        drain_timeout: args.drain_timeout,
        replica: match args.replica.as_deref().or(file.http.replica.as_deref()) {
            Some(name) if http.is_none() => bail!(
                "a replica name ({name:?}) is for replicas behind an HTTP load balancer: serve with --http"
            ),
            Some(name) => Some(codebox::replica::ReplicaName::parse(name)?),
            None => None,
        },
        mcp_config: McpConfigs::choose(&args.mcp_config, file.mcp_config.clone()),
        upstream_options: {
            let mut o = UpstreamOptions::default();
            if let Some(t) = &file.upstream_connect_timeout {
                o.connect_timeout = parse_duration(t)
                    .map_err(|e| anyhow::anyhow!("upstream_connect_timeout: {e}"))?;
                if o.connect_timeout.is_zero() {
                    bail!("upstream_connect_timeout must be more than 0");
                }
            }
            if let Some(t) = &file.upstream_wait {
                // 0s: a call to a server that is not ready fails at once with its state.
                o.call_wait = codebox::units::parse_duration_or_zero(t)
                    .map_err(|e| anyhow::anyhow!("upstream_wait: {e}"))?;
            }
            o
        },
        tools: args.tools.or(file.tools).unwrap_or_default(),
        allowed_tools: match &file.allowed_tools {
            Some(list) => AllowList::new(list).context("allowed_tools")?,
            None => AllowList::all(),
        },
        proxy_limits: {
            let mut l = ProxyLimits::default();
            if let Some(n) = file.max_tool_calls {
                l.max_calls = n;
            }
            if let Some(n) = file.max_tool_calls_in_flight {
                if n == 0 {
                    bail!("max_tool_calls_in_flight: must be at least 1");
                }
                l.max_in_flight = n;
            }
            if let Some(n) = file.max_tool_call_records {
                l.max_call_records = n;
            }
            let size = |key: &str, value: &str| -> anyhow::Result<usize> {
                let bytes = parse_size(value).map_err(|e| anyhow::anyhow!("{key}: {e}"))?;
                Ok(usize::try_from(bytes).unwrap_or(usize::MAX).max(1))
            };
            if let Some(q) = &file.tool_answer_queue {
                l.max_queued_reply_bytes = size("tool_answer_queue", q)?;
            }
            if let Some(m) = &file.tool_request_memory {
                l.max_in_flight_bytes = size("tool_request_memory", m)?;
            }
            if let Some(t) = &file.tool_call_timeout {
                l.call_timeout =
                    parse_duration(t).map_err(|e| anyhow::anyhow!("tool_call_timeout: {e}"))?;
            }
            l
        },
    })
}

/// Connection caps and timeouts from `[http]` (and CODEBOX_HTTP_*), over the defaults.
fn http_limits(
    file: &codebox::config::HttpConfig,
) -> anyhow::Result<codebox::server::transport::http_conn::ConnLimits> {
    let mut l = codebox::server::transport::http_conn::ConnLimits::default();
    let duration = |key: &str, v: &Option<String>, into: &mut Duration| -> anyhow::Result<()> {
        if let Some(v) = v {
            let d = parse_duration(v).map_err(|e| anyhow::anyhow!("http.{key}: {e}"))?;
            if d.is_zero() {
                bail!("http.{key} must be more than 0");
            }
            *into = d;
        }
        Ok(())
    };
    duration(
        "header_timeout",
        &file.header_timeout,
        &mut l.header_timeout,
    )?;
    duration("body_timeout", &file.body_timeout, &mut l.body_timeout)?;
    duration("idle_timeout", &file.idle_timeout, &mut l.idle_timeout)?;
    for (key, v, into) in [
        (
            "max_connections",
            file.max_connections,
            &mut l.max_connections,
        ),
        (
            "max_connections_per_peer",
            file.max_connections_per_peer,
            &mut l.max_connections_per_peer,
        ),
    ] {
        match v {
            Some(0) => bail!("http.{key} must be at least 1"),
            Some(n) => *into = n,
            None => {}
        }
    }
    if let Some(list) = &file.trusted_proxies {
        l.trusted_proxies =
            codebox::server::transport::proxy_protocol::TrustedProxies::parse(list)?;
    }
    Ok(l)
}

pub fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let args = resolve(args)?;
    // --- single-threaded: verify, check, fork the spawner ---
    if let Some(addr) = args.http {
        if !addr.ip().is_loopback() && args.http_clients.is_empty() {
            bail!("{addr} is not a loopback address: a bearer token is required (set CODEBOX_HTTP_TOKEN)");
        }
        if !args.http_limits.trusted_proxies.is_empty() && args.http_clients.is_empty() {
            bail!("http.trusted_proxies is set: clients reach codebox through a balancer, so a bearer token is required, also on loopback (set CODEBOX_HTTP_TOKEN)");
        }
    }
    let mut profile = Profile::load(&args.profile)?;
    if let Some(network) = &args.network {
        profile
            .set_network(network.clone())
            .map_err(|e| anyhow::anyhow!("{e}"))
            .context("[network] of the config")?;
    }
    let on_microvm = args.backend.unwrap_or(profile.backend) == codebox::microvm::Backend::Microvm;
    if on_microvm {
        if let Some(why) = codebox::microvm::serve::refusal_at_start(profile.network_mode, false) {
            bail!("{why}");
        }
    }
    if let Some(preload) = &args.preload {
        profile
            .set_preload(preload.clone())
            .map_err(|e| anyhow::anyhow!("{e}"))
            .context("[python] of the config")?;
    }
    let sandbox_ids = IdMapping::for_current_process(args.root_host_id);
    let (network, egress) = super::egress::start(
        &profile,
        args.state_dir.as_deref(),
        (sandbox_ids.host_uid, sandbox_ids.host_gid),
    )?;
    let dir = rootfs::locate(args.rootfs.as_deref())?;
    let rootfs = rootfs::verify(&dir, rootfs::default_stamp_dir().as_deref())?;
    // The host's layers now (forked probes, milliseconds); the sandbox checks (a real
    // sandbox per runtime, ~100 ms) run in a forked checker while the server answers.
    let mut checks = doctor::host_layers(&profile, args.root_host_id);
    checks.push(doctor::rootfs_verified(&rootfs));
    let missing: Vec<String> = checks
        .iter()
        .filter(|c| c.blocks())
        .map(|c| format!("{}: {}", c.layer, c.detail))
        .collect();
    if !missing.is_empty() {
        bail!(
            "this host cannot run the {} profile: {} (see `codebox doctor`)",
            profile.name,
            missing.join("; ")
        );
    }
    // The roots trusted for the sandboxes' egress are trusted for the package index too.
    let mut packages_section = args.packages.clone();
    packages_section
        .extra_roots
        .extend(profile.network.extra_roots.iter().cloned());
    let packages = if on_microvm {
        tracing::info!("packages on request are off: the microVM backend does not offer them yet");
        None
    } else {
        super::packages::prepare(
            &packages_section,
            &rootfs.path,
            args.state_dir.as_deref(),
            (sandbox_ids.host_uid, sandbox_ids.host_gid),
        )?
    };
    let watched_rootfs = rootfs.clone();
    let mut host = Host::new(rootfs, IdMapping::for_current_process(args.root_host_id));
    host.python_preload = args.preload.clone();
    host.zygote = args.zygote;
    // Still single-threaded: choosing KVM boots a probe guest in a jail cloned from here.
    let microvm = match on_microvm {
        true => Some(std::sync::Arc::new(
            codebox::microvm::serve::ServeVms::prepare(
                &host,
                args.guest.as_deref(),
                codebox::microvm::accel::AccelMode::Auto,
                rootfs::default_stamp_dir().as_deref(),
            )?,
        )),
        false => None,
    };
    // SAFETY: no thread exists yet: the tokio runtime is built below, after the fork.
    let factory = std::sync::Arc::new(unsafe { Factory::start(&host, &profile) }?);
    // The factory forks the sandbox checkers and the spawners, these first ones included
    // (see spawner/factory.rs).
    let sandbox_checks = factory
        .start_checks()
        .context("cannot fork the sandbox checker")?;
    let first = factory.fork_spawner(None)?;
    tracing::info!(spawner = first.pid.as_raw(), factory = factory.pid().as_raw(), profile = %profile.name, "spawner started");
    let factory_pid = factory.pid();

    let upstream_servers = super::upstreams::load(&args.mcp_config)?;
    let pii_detector =
        std::sync::Arc::new(codebox::pii::Detector::new(&args.pii_custom).context("pii.custom")?);
    let audit = match &args.audit {
        Some(config) => Some(std::sync::Arc::new(
            codebox::audit::AuditLog::open(config.clone())
                .with_context(|| format!("cannot open the audit log {}", config.path.display()))?,
        )),
        None => None,
    };
    let output = args.output.settings()?;
    let tasks = args.tasks.settings(args.max_timeout)?;
    let mut proxy_limits = args.proxy_limits.clone();
    proxy_limits.out_files = output.files;
    let mut settings = Settings {
        output_budget: output.budget,
        kept_output: output.kept,
        tasks,
        approval: args.approval.clone(),
        network,
        egress,
        packages: None,
        concurrency: args.concurrency,
        // Each microVM call boots its own VM: no warm pool of namespace sandboxes.
        pool: match microvm {
            Some(_) => codebox::pool::Bounds::off(),
            None => args.pool,
        },
        microvm,
        queue: args.queue,
        max_timeout: args.max_timeout,
        max_files_bytes: args.max_files_bytes,
        allowed_tools: args.allowed_tools.clone(),
        tools: args.tools,
        proxy_limits,
        pii_mode: args.pii_mode,
        pii_detector,
        rate: args.rate,
        sessions: args.sessions.clone(),
        persist: args.persist.clone(),
        replica: args.replica.clone(),
        sessions_base: std::env::temp_dir(),
        sandbox_ids: (sandbox_ids.host_uid, sandbox_ids.host_gid),
        skills_dir: args.skills_dir.clone(),
        skills_shared: args.skills_shared.clone(),
        audit,
        rootfs_manifest_sha256: Some(host.rootfs.manifest_sha256.clone()),
        profile,
    };

    // --- multi-threaded from here on ---
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let drain = args.drain_timeout;
    rt.block_on(async move {
        // First of all: from here on SIGINT/SIGTERM are this process's to handle, at any
        // moment (also before a client initialized).
        let signals = StopSignals::install()?;
        let checker_source: std::sync::Arc<dyn codebox::server::sandbox_checks::CheckerSource> =
            factory.clone();
        let client = SpawnerClient::with_factory(first, factory)?;
        settings.packages = packages.map(|p| p.start(client.clone(), &settings.profile));
        // Upstreams connect in the background: the server answers at once. They start
        // once the first client has its `initialize` answer (their start-up takes CPU
        // that answer needs), or after UPSTREAMS_START_BOUND whatever happens.
        let gate = CancellationToken::new();
        let upstreams = Upstreams::start_gated(
            upstream_servers,
            args.upstream_options.clone(),
            gate.clone(),
        );
        let server = CodeboxServer::new(
            client.clone(),
            settings,
            Layers::new(checks, true),
            upstreams.clone(),
        )?;
        server.open_on_initialize(gate.clone());
        tokio::spawn(async move {
            tokio::time::sleep(UPSTREAMS_START_BOUND).await;
            gate.cancel();
        });
        server.follow_sandbox_checks(sandbox_checks, checker_source);
        server.watch_rootfs(watched_rootfs, rootfs::default_stamp_dir());
        // Up until the end, so a scrape sees the drain (`codebox_draining`).
        let metrics_done = CancellationToken::new();
        let metrics = match args.metrics {
            Some(addr) => Some(start_metrics(&server, addr, &args, metrics_done.clone()).await?),
            None => None,
        };
        let result = serve_until_done(server.clone(), args, drain, signals).await;
        metrics_done.cancel();
        if let Some(listener) = metrics {
            let _ = tokio::time::timeout(Duration::from_secs(1), listener).await;
        }
        client.stop();
        server.shutdown().await;
        upstreams.shutdown().await;
        result
    })?;
    // Dropping the runtime closes the spawner's and the factory's sockets: the spawner
    // kills whatever still runs, removes every cgroup and exits; the factory waits for it.
    // Tasks still blocked (a stdin read while the client keeps stdin open) are not waited
    // for.
    rt.shutdown_timeout(Duration::from_secs(1));
    let _ = nix::sys::wait::waitpid(factory_pid, None);
    Ok(ExitCode::SUCCESS)
}

/// Binds the plain `/metrics` listener (a bad address fails start-up) and serves it until
/// `done`, with the HTTP listener's connection limits.
async fn start_metrics(
    server: &CodeboxServer,
    addr: std::net::SocketAddr,
    args: &Resolved,
    done: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    use codebox::server::wiring::metrics::MetricsListener;
    let listener = MetricsListener::bind(addr).await?;
    let bound = listener.bound;
    if !bound.ip().is_loopback() {
        tracing::info!(%bound, "/metrics is served without a token on a non-loopback address (it carries no secrets)");
    }
    eprintln!("codebox: serving metrics at http://{bound}/metrics");
    let serving = listener.serve(server.clone(), args.http_limits.clone(), async move {
        done.cancelled().await
    });
    Ok(tokio::spawn(serving))
}

/// The upstream servers start at the first `initialize` answer or this long after the
/// server was up, whichever comes first.
const UPSTREAMS_START_BOUND: Duration = Duration::from_millis(300);

/// After the drain bound: how long killed executions have to be answered.
const ANSWER_BOUND: Duration = Duration::from_secs(5);

/// Serves MCP (stdio, or HTTP with `--http`) until the client leaves or a signal's drain
/// is over.
async fn serve_until_done(
    server: CodeboxServer,
    args: Resolved,
    drain: Duration,
    signals: StopSignals,
) -> anyhow::Result<()> {
    // Fires on SIGINT/SIGTERM: stop taking work, drain, then stop.
    let stopping = CancellationToken::new();
    tokio::spawn({
        let stopping = stopping.clone();
        async move {
            signals.received().await;
            tracing::info!("shutting down: draining running executions");
            stopping.cancel();
        }
    });
    // After the signal: wait until nothing runs (or the drain bound), then stop.
    let drained = {
        let server = server.clone();
        let stopping = stopping.clone();
        async move {
            stopping.cancelled().await;
            server.stop_admitting();
            let deadline = tokio::time::Instant::now() + drain;
            // A request accepted just before the signal may not hold its slot yet.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let busy = |s: &CodeboxServer| s.running() > 0 || s.unanswered() > 0;
            while busy(&server) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if busy(&server) {
                tracing::warn!(
                    ?drain,
                    running = server.running(),
                    "drain bound reached; killing what still runs"
                );
                // Each killed execution is answered "the server is stopping"; give the
                // answers a moment to be written before the transport closes.
                server.kill_running();
                let answered_by = tokio::time::Instant::now() + ANSWER_BOUND;
                while server.unanswered() > 0 && tokio::time::Instant::now() < answered_by {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    if let Some(addr) = args.http {
        let options = HttpOptions {
            addr,
            clients: args.http_clients,
            allowed_origins: args.allowed_origins,
            allowed_hosts: args.allowed_hosts,
            limits: args.http_limits,
        };
        // Connections stay open while draining (clients reconnect their SSE streams);
        // new executions are refused by admission. Once drained, the listener closes.
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let serving = http::serve(
            server.clone(),
            options,
            |bound| eprintln!("codebox: serving MCP at http://{bound}/mcp"),
            async move {
                let _ = done_rx.await;
            },
        );
        tokio::pin!(serving);
        tokio::select! {
            r = &mut serving => r?,
            _ = drained => {
                let _ = done_tx.send(());
                // Answers already produced are written first (at most ANSWERS_OUT_BOUND,
                // inside `serving`); then idle connections close at once, and open
                // streams end with the runtime 1 s later.
                let bound = codebox::server::transport::http::ANSWERS_OUT_BOUND + Duration::from_secs(1);
                let _ = tokio::time::timeout(bound, serving).await;
            }
        }
        return anyhow::Ok(());
    }
    // Until a client initializes, rmcp's `serve` waits for its `initialize`; a signal then
    // has nothing to drain (no call can have been made) and ends it at once.
    let service = tokio::select! {
        service = server.clone().serve(codebox::server::transport::stdio_guard::stdio()) => {
            service.context("the MCP session did not start")?
        }
        _ = stopping.cancelled() => {
            tracing::info!("stopped before a client initialized");
            return Ok(());
        }
    };
    let cancel = service.cancellation_token();
    tokio::select! {
        r = service.waiting() => {
            r.context("the MCP service failed")?;
        }
        _ = drained => cancel.cancel(),
    }
    Ok(())
}

/// SIGINT and SIGTERM, caught from the moment they are installed (a signal that arrives
/// before anyone waits is kept for [`StopSignals::received`]).
struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> anyhow::Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(StopSignals {
            term: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
        })
    }

    async fn received(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// The warm pool's floor, ceiling and shrink delay: flags over the environment and file
/// over the defaults, then checked together (a ceiling below the floor is an error).
fn pool_bounds(args: &ServeArgs, file: &Config) -> anyhow::Result<codebox::pool::Bounds> {
    let floor = args
        .pool_size
        .or(file.pool_size)
        .unwrap_or(DEFAULT_POOL_SIZE);
    let ceiling = args
        .pool_max
        .or(file.pool_max)
        .unwrap_or(DEFAULT_POOL_MAX.max(floor));
    let shrink_after = match (args.pool_shrink_after, &file.pool_shrink_after) {
        (Some(d), _) => d,
        (None, Some(s)) => codebox::units::parse_duration_or_zero(s)
            .map_err(|e| anyhow::anyhow!("pool_shrink_after: {e}"))?,
        (None, None) => DEFAULT_POOL_SHRINK_AFTER,
    };
    Ok(codebox::pool::Bounds::new(floor, ceiling, shrink_after)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve_args(argv: &[&str]) -> ServeArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        <Cli as clap::Parser>::try_parse_from(argv).unwrap().serve
    }

    #[test]
    fn pool_bounds_default_follow_the_floor_and_bad_ones_are_named() {
        let file = Config::default();
        let b = pool_bounds(&serve_args(&["x"]), &file).unwrap();
        assert_eq!((b.floor, b.ceiling), (DEFAULT_POOL_SIZE, DEFAULT_POOL_MAX));
        assert_eq!(b.shrink_after, DEFAULT_POOL_SHRINK_AFTER);
        // A floor above the default ceiling raises the ceiling with it (what a fixed
        // `--pool-size 12` meant before).
        let b = pool_bounds(&serve_args(&["x", "--pool-size", "12"]), &file).unwrap();
        assert_eq!((b.floor, b.ceiling), (12, 12));
        let b = pool_bounds(&serve_args(&["x", "--pool-size", "0"]), &file).unwrap();
        assert!(b.is_off());
        // Flags win over the file.
        let file = Config {
            pool_size: Some(1),
            pool_max: Some(3),
            pool_shrink_after: Some("5s".into()),
            ..Default::default()
        };
        let b = pool_bounds(&serve_args(&["x", "--pool-max", "4"]), &file).unwrap();
        assert_eq!((b.floor, b.ceiling), (1, 4));
        assert_eq!(b.shrink_after, Duration::from_secs(5));
        let e = pool_bounds(&serve_args(&["x", "--pool-size", "5"]), &file)
            .unwrap_err()
            .to_string();
        assert!(e.contains("pool_max (3) is below pool_size (5)"), "{e}");
        let e = pool_bounds(&serve_args(&["x", "--pool-max", "100000"]), &file)
            .unwrap_err()
            .to_string();
        assert!(e.contains("pool_max (100000) is above 256"), "{e}");
        for (shrink, want) in [("0s", "more than 0"), ("soon", "pool_shrink_after")] {
            let file = Config {
                pool_shrink_after: Some(shrink.into()),
                ..Default::default()
            };
            let e = pool_bounds(&serve_args(&["x"]), &file)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{shrink}: {e}");
        }
    }

    #[test]
    fn http_limits_come_from_the_config_and_bad_values_are_named() {
        let mut file = codebox::config::HttpConfig {
            header_timeout: Some("2s".into()),
            max_connections_per_peer: Some(3),
            ..Default::default()
        };
        let l = http_limits(&file).unwrap();
        assert_eq!(l.header_timeout, Duration::from_secs(2));
        assert_eq!(l.max_connections_per_peer, 3);
        assert_eq!(
            l.body_timeout,
            codebox::server::transport::http_conn::ConnLimits::default().body_timeout
        );
        file.idle_timeout = Some("soon".into());
        let e = http_limits(&file).unwrap_err().to_string();
        assert!(e.contains("http.idle_timeout"), "{e}");
        file.idle_timeout = Some("0s".into());
        let e = http_limits(&file).unwrap_err().to_string();
        assert!(e.starts_with("http.idle_timeout"), "{e}");
        file.idle_timeout = None;
        file.max_connections = Some(0);
        let e = http_limits(&file).unwrap_err().to_string();
        assert!(e.contains("http.max_connections must be at least 1"), "{e}");
    }

    #[test]
    fn http_without_an_address_takes_the_config_address() {
        let args = |argv: &[&str]| {
            #[derive(clap::Parser)]
            struct Cli {
                #[command(flatten)]
                serve: ServeArgs,
            }
            <Cli as clap::Parser>::try_parse_from(argv)
                .unwrap()
                .serve
                .http
        };
        assert_eq!(args(&["x", "--http"]), Some(None));
        assert_eq!(
            args(&["x", "--http", "127.0.0.1:9"]),
            Some(Some("127.0.0.1:9".parse().unwrap()))
        );
        assert_eq!(args(&["x"]), None);
    }
}
