//! `codebox serve`'s settings: flags over the environment, over the config file, over the
//! defaults ([`resolve`]), each checked, before anything starts.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};

use codebox::config::{self, Config};
use codebox::pii::PiiMode;
use codebox::proxy::{AllowList, ProxyLimits};
use codebox::ratelimit::RateLimits;
use codebox::sandbox::idmap::DEFAULT_ROOT_HOST_ID;
use codebox::session::SessionLimits;
use codebox::units::{parse_duration, parse_size};
use codebox::upstream::UpstreamOptions;

use super::super::upstreams::McpConfigs;
use super::ServeArgs;

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

/// Settings after flags, environment, config file and defaults, in that precedence.
pub(super) struct Resolved {
    pub(super) profile: String,
    pub(super) rootfs: Option<PathBuf>,
    pub(super) concurrency: usize,
    pub(super) pool: codebox::pool::Bounds,
    pub(super) queue: usize,
    pub(super) max_timeout: Duration,
    pub(super) max_files_bytes: usize,
    pub(super) root_host_id: u32,
    pub(super) http: Option<std::net::SocketAddr>,
    /// HTTP clients and their tokens.
    pub(super) http_clients: Vec<(String, String)>,
    pub(super) http_limits: codebox::server::transport::http_conn::ConnLimits,
    /// The plain `/metrics` listener's address.
    pub(super) metrics: Option<std::net::SocketAddr>,
    pub(super) allowed_origins: Vec<String>,
    pub(super) allowed_hosts: Vec<String>,
    pub(super) drain_timeout: Duration,
    pub(super) replica: Option<codebox::replica::ReplicaName>,
    /// The `.mcp.json` files naming the upstream servers.
    pub(super) mcp_config: McpConfigs,
    pub(super) upstream_options: UpstreamOptions,
    pub(super) allowed_tools: AllowList,
    pub(super) tools: codebox::server::ToolSet,
    pub(super) proxy_limits: ProxyLimits,
    pub(super) pii_mode: PiiMode,
    pub(super) pii_custom: Vec<codebox::pii::CustomPattern>,
    pub(super) rate: RateLimits,
    pub(super) sessions: SessionLimits,
    pub(super) skills_dir: Option<PathBuf>,
    pub(super) skills_shared: Option<PathBuf>,
    pub(super) audit: Option<codebox::audit::AuditConfig>,
    /// `[approval]`, checked.
    pub(super) approval: std::sync::Arc<codebox::approval::ApprovalPolicy>,
    /// `[network]` of the config, replacing the profile's.
    pub(super) network: Option<codebox::egress::NetworkSection>,
    /// `[python] preload` of the config, replacing the profile's.
    pub(super) preload: Option<Vec<String>>,
    /// `[python] zygote`: fork Python sandboxes from a zygote (default on).
    pub(super) zygote: bool,
    /// `backend` of the config, replacing the profile's.
    pub(super) backend: Option<codebox::microvm::Backend>,
    /// `guest` of the config: the microVM guest tree.
    pub(super) guest: Option<PathBuf>,
    pub(super) packages: codebox::packages::PackagesSection,
    pub(super) output: codebox::output::OutputSection,
    pub(super) tasks: codebox::tasks::TasksSection,
    pub(super) state_dir: Option<PathBuf>,
    /// `[sessions]`: where paused sessions are kept, with which key (`None`: not kept).
    pub(super) persist: Option<codebox::snapshot::PersistSettings>,
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

pub(super) fn resolve(args: ServeArgs) -> anyhow::Result<Resolved> {
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
                    .or_else(super::super::egress::default_state_dir)
                    .as_deref(),
                &|var| std::env::var(var).ok(),
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?,
        state_dir: file
            .state_dir
            .clone()
            .or_else(super::super::egress::default_state_dir),
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
