//! `codebox run`: one program in one fresh sandbox.

use std::ffi::OsString;
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

use codebox::execution::{self, ExecutionRequest, ExecutionResult};
use codebox::runtime::Language;
use codebox::sandbox::idmap::DEFAULT_ROOT_HOST_ID;
use codebox::units::{parse_duration, parse_size};

use super::passthrough::{exit_status, Passthrough, Redacting};
use super::prepare::{prepare, Prepared};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Language of the program: python or typescript.
    language: Language,
    /// The program text.
    #[arg(short = 'c', value_name = "CODE", conflicts_with = "file")]
    code: Option<OsString>,
    /// A file holding the program ("-" for standard input).
    #[arg(value_name = "FILE", required_unless_present = "code")]
    file: Option<PathBuf>,
    /// codebox.toml to read: its profile, rootfs, root_host_id, state_dir and [network]
    /// (e.g. extra_roots for a private CA, credentials) apply as in `serve`; flags win
    /// [default: $CODEBOX_CONFIG, ./codebox.toml, ~/.config/codebox/config.toml].
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// An MCP server configuration (`.mcp.json`, Claude Code's format) whose servers'
    /// tools the program may call (`from servers.<name> import ...`); repeatable. The run
    /// then goes through a `codebox serve` started for it (no --workspace, --memory,
    /// --pids, --output-limit, --allow-host or --zygote: a profile and the config give
    /// those).
    #[arg(long = "mcp-config", value_name = "PATH")]
    mcp_configs: Vec<PathBuf>,
    /// Sandbox profile: a shipped one (default, network) or a path to a .toml file
    /// [default: the config's profile, else default].
    #[arg(long, value_name = "NAME|PATH")]
    profile: Option<String>,
    /// Wall-clock limit, e.g. 500ms, 30s, 2m (a bare number means seconds) [profile: 30s].
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// Memory limit, e.g. 256M, enforced through cgroups [profile: 512M].
    #[arg(long, value_parser = parse_size)]
    memory: Option<u64>,
    /// Task (process + thread) limit, enforced through cgroups [profile: 128].
    #[arg(long)]
    pids: Option<u64>,
    /// Host directory mounted read-write at /workspace (default: a private tmpfs).
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Copy a host file (text or binary) into /workspace before the run, as DEST=SRC (DEST
    /// relative to /workspace); repeatable.
    #[arg(long = "file", value_name = "DEST=SRC", value_parser = parse_file_arg)]
    files: Vec<(String, PathBuf)>,
    /// Print one JSON object with the captured output and how the program ended.
    #[arg(long)]
    json: bool,
    /// Bytes of stdout and of stderr kept; the rest is counted and dropped [profile: 1M].
    #[arg(long, value_parser = parse_size)]
    output_limit: Option<u64>,
    /// The rootfs [default: $CODEBOX_ROOTFS, else ../share/codebox/rootfs from the
    /// binary's directory, else a checkout's target/rootfs].
    #[arg(long, value_name = "DIR")]
    rootfs: Option<PathBuf>,
    /// When run as root: the unprivileged host uid/gid the sandbox user maps to
    /// [default: the config's root_host_id, else 65534].
    #[arg(long)]
    root_host_id: Option<u32>,
    /// Let the program reach HOST (a name, `*.domain`, an IP; optional `:port`, default
    /// 80 and 443) over HTTP(S) through codebox's egress proxy; repeatable. Turns on the
    /// profile's proxy mode.
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_hosts: Vec<String>,
    /// A non-public address the proxy may connect to (`127.0.0.1:8443`, `10.0.0.0/8`):
    /// refused otherwise, even for an allowed host; repeatable.
    #[arg(long = "allow-private", value_name = "ADDR")]
    allow_private: Vec<String>,
    /// Where codebox keeps the egress CA and trust bundle [default: $CODEBOX_STATE_DIR,
    /// $XDG_STATE_HOME/codebox, ~/.local/state/codebox; as root /var/lib/codebox].
    #[arg(long, env = "CODEBOX_STATE_DIR", value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Fork the sandbox from a Python zygote started for this run, as `serve` does for
    /// every Python sandbox a zygote can serve (for tests and comparisons; slower than a
    /// plain run, which need not start the zygote). Python only, without --workspace as
    /// root and without --allow-host.
    #[arg(long)]
    zygote: bool,
    /// Where the sandbox runs: `namespace` (fresh namespaces on this kernel) or
    /// `microvm` (the same sandbox inside a jailed QEMU microVM) [profile: namespace].
    #[arg(long, value_name = "BACKEND")]
    backend: Option<codebox::microvm::Backend>,
    /// The microVM guest tree (`cargo xtask guest`) [default: $CODEBOX_GUEST, else next
    /// to the binary, else a checkout's target/guest].
    #[arg(long, value_name = "DIR")]
    guest: Option<PathBuf>,
    /// The microVM's accelerator: `auto` (KVM if a probe boots the guest under it, cached
    /// per host boot; else TCG), `kvm` or `tcg`.
    #[arg(long, default_value = "auto", value_name = "ACCEL")]
    accel: codebox::microvm::accel::AccelMode,
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let code = read_program(&args)?;
    if code.len() > codebox::runtime::MAX_CODE_BYTES {
        bail!(
            "the program is {} bytes; the limit is {} bytes",
            code.len(),
            codebox::runtime::MAX_CODE_BYTES
        );
    }
    let workspace = match &args.workspace {
        Some(dir) => {
            let dir = std::fs::canonicalize(dir)
                .with_context(|| format!("workspace {} does not exist", dir.display()))?;
            if !dir.is_dir() {
                bail!("workspace {} is not a directory", dir.display());
            }
            Some(dir)
        }
        None => None,
    };
    let files = read_files(&args.files)?;
    if !args.mcp_configs.is_empty() {
        return run_with_tools(&args, code, files);
    }
    // codebox.toml as `serve` reads it: what applies to one run.
    let env = &codebox::config::process_env;
    let (mut config, _) = codebox::config::Config::load(args.config.as_deref(), env)?;
    config.apply_env(env)?;
    let profile_name = args
        .profile
        .clone()
        .or(config.profile.clone())
        .unwrap_or_else(|| "default".into());
    let rootfs = args.rootfs.clone().or(config.rootfs.clone());
    let root_host_id = args
        .root_host_id
        .or(config.root_host_id)
        .unwrap_or(DEFAULT_ROOT_HOST_ID);
    let Prepared { mut profile, host } = prepare(&profile_name, rootfs.as_deref(), root_host_id)?;
    if let Some(network) = &config.network {
        profile
            .set_network(network.clone())
            .map_err(|e| anyhow::anyhow!("{e}"))
            .context("[network] of the config")?;
    }
    if args.zygote && args.language != Language::Python {
        bail!("--zygote: only Python sandboxes are forked from a zygote");
    }
    if !args.allow_hosts.is_empty() || !args.allow_private.is_empty() {
        let mut network = profile.network.clone();
        network.mode = Some(codebox::egress::NetworkMode::Proxy);
        network.enabled = None;
        network.allow.extend(args.allow_hosts.iter().cloned());
        network
            .allow_private
            .extend(args.allow_private.iter().cloned());
        profile
            .set_network(network)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let state_dir = args
        .state_dir
        .clone()
        .or(config.state_dir.clone())
        .or_else(super::egress::default_state_dir);
    let ids = (host.id_mapping.host_uid, host.id_mapping.host_gid);
    let egress = match super::egress::start(&profile, state_dir.as_deref(), ids)? {
        (codebox::spawner::wire::SpawnNetwork::Proxy { trust }, Some(egress)) => {
            Some(execution::EgressForRun {
                egress,
                narrowing: codebox::egress::Narrowing::none(),
                trust,
            })
        }
        _ => None,
    };
    let mut limits = profile.limits.clone();
    if let Some(t) = args.timeout {
        limits.timeout = t;
    }
    if let Some(m) = args.memory {
        limits.memory_bytes = Some(m);
    }
    if let Some(p) = args.pids {
        limits.pids = Some(p);
    }
    if let Some(o) = args.output_limit {
        let cap = usize::try_from(o).unwrap_or(usize::MAX);
        limits.stdout_cap = cap;
        limits.stderr_cap = cap;
    }
    let timeout = limits.timeout;
    let secrets = egress
        .as_ref()
        .map(|e| e.egress.secrets().clone())
        .filter(|s| !s.is_empty());
    let request = ExecutionRequest {
        language: args.language,
        code,
        files,
        workspace,
        limits,
        policy: profile.policy.clone(),
        egress,
        zygote: args.zygote,
    };
    let microvm = args.backend.unwrap_or(profile.backend) == codebox::microvm::Backend::Microvm;
    let mut result = if microvm {
        run_microvm(&args, &host, &request)?
    } else {
        let executed = match (&secrets, args.json) {
            (_, true) => execution::execute(&host, &request, &mut codebox::sandbox::Discard),
            (None, false) => execution::execute(&host, &request, &mut Passthrough),
            (Some(secrets), false) => {
                let mut sink = Redacting::new(secrets);
                let result = execution::execute(&host, &request, &mut sink);
                sink.finish();
                result
            }
        };
        executed.map_err(|e| {
        let cgroup = matches!(
            e,
            execution::Error::Sandbox(codebox::sandbox::Error::Cgroup(_))
        );
        if cgroup {
            anyhow::anyhow!(
                "{}; `codebox doctor` shows which cgroup controllers this host gives and how to delegate them",
                codebox::error_chain::error_chain(&e)
            )
        } else {
            anyhow::Error::new(e)
        }
    })?
    };
    if let Some(secrets) = &secrets {
        result.redact_secrets(secrets);
    }
    let limits = &request.limits;
    result.hints = codebox::hints::for_result(
        &result,
        &codebox::hints::Context {
            surface: codebox::hints::Surface::Cli,
            language: args.language,
            profile: &profile.name,
            timeout,
            max_timeout: None,
            memory_bytes: limits.memory_bytes,
            pids: limits.pids,
            network: profile.network_mode,
            packages: codebox::hints::Packages::NotHere,
            kept_interpreter: false,
            sessions: false,
        },
    );
    report(&result, args.json)
}

/// `--mcp-config`: the run goes through a `codebox serve` of its own (see `run_tools`).
fn run_with_tools(
    args: &RunArgs,
    code: String,
    files: codebox::runtime::Files,
) -> anyhow::Result<ExitCode> {
    let given = [
        ("--workspace", args.workspace.is_some()),
        ("--memory", args.memory.is_some()),
        ("--pids", args.pids.is_some()),
        ("--output-limit", args.output_limit.is_some()),
        ("--allow-host", !args.allow_hosts.is_empty()),
        ("--allow-private", !args.allow_private.is_empty()),
        ("--zygote", args.zygote),
    ];
    for (flag, _) in given.iter().filter(|(_, on)| *on) {
        if let Some(why) = super::run_tools::refused_with_tools(flag) {
            bail!("{flag} cannot go with --mcp-config: {why}");
        }
    }
    super::run_tools::run(super::run_tools::ServedRun {
        language: args.language,
        code,
        files,
        mcp_configs: &args.mcp_configs,
        config: args.config.as_deref(),
        profile: args.profile.as_deref(),
        rootfs: args.rootfs.as_deref(),
        root_host_id: args.root_host_id,
        timeout: args.timeout,
        json: args.json,
    })
}

/// The run on the microVM backend: the same request, in a fresh jailed VM; its result
/// gets the same hints and report as the namespace backend's.
fn run_microvm(
    args: &RunArgs,
    host: &codebox::execution::Host,
    request: &ExecutionRequest,
) -> anyhow::Result<ExecutionResult> {
    use codebox::microvm;
    let dir = microvm::image::locate(args.guest.as_deref())?;
    let image = microvm::image::load(&dir)?;
    let choice = microvm::accel::choose(
        host,
        &image,
        args.accel,
        codebox::rootfs::default_stamp_dir().as_deref(),
    )?;
    tracing::debug!(accel = choice.accel.name(), reason = %choice.reason, "microVM accelerator");
    let accel = choice.accel;
    let (result, ending) = if args.json {
        microvm::run::execute(host, &image, accel, request, &mut codebox::sandbox::Discard)?
    } else {
        microvm::run::execute(host, &image, accel, request, &mut Passthrough)?
    };
    if !ending.end.is_normal() {
        // The sandbox's infrastructure failed, not the program: no result to report.
        let last: Vec<&str> = ending
            .console
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect();
        bail!(
            "the microVM ended: {}{}",
            ending.end.describe(),
            match last.len() {
                0 => String::new(),
                n => format!(" (console: {})", last[n.saturating_sub(3)..].join(" | ")),
            }
        );
    }
    Ok(result)
}

fn parse_file_arg(arg: &str) -> Result<(String, PathBuf), String> {
    match arg.split_once('=') {
        Some((dest, src)) if !dest.is_empty() && !src.is_empty() => {
            Ok((dest.to_string(), PathBuf::from(src)))
        }
        _ => Err(format!(
            "expected DEST=SRC, e.g. data.csv=./local.csv; got {arg:?}"
        )),
    }
}

/// The `--file` contents, read from the host and validated as the MCP tools validate them.
fn read_files(args: &[(String, PathBuf)]) -> anyhow::Result<codebox::runtime::Files> {
    let mut files = codebox::runtime::Files::new();
    for (dest, src) in args {
        let bytes =
            std::fs::read(src).with_context(|| format!("cannot read --file {}", src.display()))?;
        if files.insert(dest.clone(), bytes).is_some() {
            bail!("--file {dest} is given twice");
        }
    }
    codebox::runtime::validate_files(&files, codebox::runtime::MAX_FILES_BYTES)?;
    Ok(files)
}

/// The program text from `-c` or a file, which must be UTF-8.
fn read_program(args: &RunArgs) -> anyhow::Result<String> {
    let bytes = match (&args.code, &args.file) {
        (Some(code), _) => code.as_encoded_bytes().to_vec(),
        (None, Some(path)) if path.as_os_str() == "-" => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("cannot read the program from standard input")?;
            buf
        }
        (None, Some(path)) => std::fs::read(path)
            .with_context(|| format!("cannot read program file {}", path.display()))?,
        (None, None) => bail!("give the program with -c CODE or as a FILE"),
    };
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "the program is not valid UTF-8 (first bad byte at offset {}); save it as UTF-8",
            e.utf8_error().valid_up_to()
        )
    })
}

fn report(result: &ExecutionResult, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        super::out::write(format_args!("{}\n", serde_json::to_string(result)?))?;
    } else {
        for (name, truncated, kept, total) in [
            (
                "stdout",
                result.stdout_truncated,
                result.stdout.len(),
                result.stdout_total_bytes,
            ),
            (
                "stderr",
                result.stderr_truncated,
                result.stderr.len(),
                result.stderr_total_bytes,
            ),
        ] {
            if truncated {
                eprintln!("codebox: {name} truncated: kept {kept} of {total} bytes");
            }
        }
        // The limit met, with its value and flag; the network being off; a missing module.
        for hint in &result.hints {
            eprintln!("codebox: {hint}");
        }
        if result.seccomp_violation {
            eprintln!("codebox: killed by the seccomp policy (a system call from a foreign ABI)");
        }
    }
    Ok(ExitCode::from(exit_status(
        result.timed_out,
        result.exit_code,
        result.signal,
    )))
}
