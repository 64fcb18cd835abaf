//! `codebox serve`: the MCP server on stdio, or on streamable HTTP with `--http`.
//!
//! Start-up order matters: everything that forks (host checks, the spawner) happens while
//! the process is still single-threaded; only then is the tokio runtime built.

mod resolve;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use rmcp::ServiceExt;
use tokio_util::sync::CancellationToken;

use codebox::doctor;
use codebox::execution::Host;
use codebox::profile::Profile;
use codebox::rootfs;
use codebox::sandbox::IdMapping;
use codebox::server::transport::http::{self, HttpOptions};
use codebox::server::{CodeboxServer, Layers, Settings};
use codebox::spawner::factory::Factory;
use codebox::spawner::SpawnerClient;
use codebox::units::parse_duration;
use codebox::upstream::Upstreams;

use resolve::{resolve, Resolved};

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
        if let Some(why) = codebox::microvm::serve::refusal_at_start(profile.network_mode) {
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
                // Warm clones instead of pooled sandboxes: pool_size of them per language,
                // at most microvm::warm::MAX_WAITING.
                args.pool.floor,
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
        // The microVM backend keeps warm clones (ServeVms), not pooled sandboxes.
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
