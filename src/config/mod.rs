//! `codebox.toml`: server settings, found via `--config`, `$CODEBOX_CONFIG`,
//! `./codebox.toml`, then `~/.config/codebox/config.toml`.
//!
//! Every setting can be overridden from the environment (`CODEBOX_<KEY>`, with
//! `CODEBOX_HTTP_<KEY>` for the `[http]` table; lists are comma-separated), and command-line
//! flags override both. Relative paths in the file are relative to the file's directory. A secret may be written `env:VAR` to read it from the
//! environment. Unknown keys are an error naming the key.
//!
//! ```toml
//! profile = "default"
//! concurrency = 4
//! pool_size = 2                                     # warm sandboxes per language, at least (0: none)
//! pool_max = 8                                      # ... and at most, as demand grows
//! pool_shrink_after = "60s"                         # held that long after demand fell
//! queue = 32
//! max_timeout = "5m"
//! rootfs = "/opt/codebox/rootfs"
//! root_host_id = 65534
//! mcp_config = "./.mcp.json"
//! tools = "full"                                    # or "minimal": execute tools + search_tools
//! allowed_tools = ["filesystem__read_*", "time__*"]   # default: every upstream tool
//! max_tool_calls = 1000                             # requests of any kind per execution
//! max_tool_calls_in_flight = 16                     # requests handled at once per execution
//! max_tool_call_records = 100                       # call records per result / audit log
//! tool_answer_queue = "16MiB"                       # unread answers queued per execution
//! tool_request_memory = "64MiB"                     # parsed requests handled at once
//! tool_call_timeout = "60s"
//! upstream_connect_timeout = "30s"                  # an upstream's start and first tools/list
//! upstream_wait = "10s"                             # a call waits this long for a connecting server
//!
//! [tasks]
//! keep_for = "15m"                                  # a task's lifetime and result retention
//!
//! [approval]                                        # see crate::approval::policy
//! require_approval = ["github__delete_*"]
//! destructive = "ask"
//!
//! [http]
//! addr = "127.0.0.1:8080"
//! token = "env:CODEBOX_TOKEN"
//! allowed_origins = ["http://localhost:*"]
//! allowed_hosts = ["codebox.internal"]
//! header_timeout = "10s"          # a request's headers must arrive within this
//! body_timeout = "30s"            # a request's body must arrive within this
//! idle_timeout = "60s"            # a connection with no byte either way is closed
//! max_connections = 256           # open connections, in total
//! max_connections_per_peer = 64   # open connections from one client: IPv4 address or IPv6 /64
//! trusted_proxies = ["10.0.0.0/8"] # balancers sending PROXY protocol v2 (required from them)
//!
//! [metrics]
//! addr = "0.0.0.0:9464"           # GET /metrics without a token (CODEBOX_METRICS_ADDR)
//!
//! [sessions]                      # sessions that outlive the server: crate::snapshot::config
//! snapshot_key = "env:CODEBOX_SNAPSHOT_KEY"
//! on_idle = "pause"
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("{key}: environment variable {var} (named by env:{var}) is not set")]
    MissingSecret { key: String, var: String },
    #[error("environment variable {var}={value:?} is not valid: {reason}")]
    BadEnv {
        var: String,
        value: String,
        reason: String,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// Every server setting; `None` means "not set here" (a default applies later).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The sandbox profile every execution runs with: a shipped one (`default`,
    /// `network`) or a path to a profile file (relative to this file); default `default`.
    pub profile: Option<String>,
    /// Where sandboxes run: `namespace` or `microvm`; replaces the profile's `backend`.
    pub backend: Option<crate::microvm::Backend>,
    /// The microVM guest tree (`cargo xtask guest`; default: next to the binary, or a
    /// checkout's `target/guest`).
    pub guest: Option<PathBuf>,
    /// The rootfs (relative to this file); default: `$CODEBOX_ROOTFS`, else
    /// `../share/codebox/rootfs` from the binary's directory, else a checkout's
    /// `target/rootfs`.
    pub rootfs: Option<PathBuf>,
    /// Executions running at once (default: twice the CPUs).
    pub concurrency: Option<usize>,
    /// Sandboxes kept started and waiting, per language, at least (0: no warm pool).
    pub pool_size: Option<usize>,
    /// Sandboxes kept waiting per language at most, as the pool follows demand (default 8,
    /// at least `pool_size`).
    pub pool_max: Option<usize>,
    /// How long the pool keeps sandboxes above what demand wants now before it kills
    /// them (default 60s).
    pub pool_shrink_after: Option<String>,
    /// Executions waiting for a slot beyond `concurrency` before a call is answered
    /// "busy, retry" (default 32).
    pub queue: Option<usize>,
    /// The longest `timeout_ms` a call may ask for, e.g. `"5m"` (default 5 minutes).
    pub max_timeout: Option<String>,
    /// Bytes of `files` one call may bring, all files together (default 10M; an MCP
    /// message is at most 16 MiB, base64 included).
    pub max_files_size: Option<String>,
    /// When codebox runs as root: the unprivileged host uid and gid the sandbox user maps
    /// to (default 65534, `nobody`; 0 is refused).
    pub root_host_id: Option<u32>,
    /// The `.mcp.json` naming the upstream MCP servers (default `./.mcp.json`).
    pub mcp_config: Option<PathBuf>,
    /// Upstream tools sandboxed code may call (names and `server__*` globs).
    pub allowed_tools: Option<Vec<String>>,
    /// Which of codebox's own tools `tools/list` offers: `full` (default) or `minimal`
    /// (the execute tools and `search_tools`; see `server::tool_set`).
    pub tools: Option<tool_set::ToolSet>,
    /// Requests (calls, searches, gets, anything) one execution may send to the proxy
    /// (default 1000); past it each gets a limit error.
    pub max_tool_calls: Option<u32>,
    /// Requests of one execution the proxy handles at once; past it, it stops reading
    /// the sandbox's channel until answers have been read (default 16, at least 1).
    pub max_tool_calls_in_flight: Option<usize>,
    /// Call records one result keeps and the audit log writes per execution (default
    /// 100); the rest are counted.
    pub max_tool_call_records: Option<usize>,
    /// Bytes of answers the proxy queues for a program that has not read them yet, before
    /// it stops reading the program's requests (default 16MiB).
    pub tool_answer_queue: Option<String>,
    /// Memory the requests of one execution being handled at once may take once parsed
    /// (default 64MiB); a request estimated above it is refused.
    pub tool_request_memory: Option<String>,
    /// Wall-clock limit of one upstream tool call (default 60s).
    pub tool_call_timeout: Option<String>,
    /// How long an upstream server may take to start and list its tools (default 30s).
    pub upstream_connect_timeout: Option<String>,
    /// How long a tool call waits for its server while it connects or reconnects before
    /// failing with the server's state (default 10s; `0s`: never wait).
    pub upstream_wait: Option<String>,
    /// Where saved skills live, one directory per client below it (default
    /// `$XDG_DATA_HOME/codebox/skills`).
    pub skills_dir: Option<PathBuf>,
    /// The operator's shared skills (a directory laid out like a client's), visible to
    /// every client and read-only to them (default: none).
    pub skills_shared: Option<PathBuf>,
    /// A session unused this long is removed (default 15m).
    pub session_ttl: Option<String>,
    /// Bytes a session's workspace may hold (default 256MiB).
    pub session_quota: Option<String>,
    /// Entries (files, directories, links) a session's workspace may hold (default 10000).
    pub session_max_entries: Option<u64>,
    /// Sessions open at once (default 64).
    pub max_sessions: Option<usize>,
    /// Executions one client may start per minute (default unlimited).
    pub rate_per_minute: Option<u32>,
    /// Executions one client may run at once (default unlimited).
    pub rate_concurrent: Option<usize>,
    /// `[pii]`: personal data in what goes back to the model (off by default).
    #[serde(default)]
    pub pii: PiiConfig,
    /// The audit log (default: none).
    pub audit: Option<crate::audit::AuditConfig>,
    /// `[approval]`: which sandboxed calls wait for the user's approval (default: none).
    #[serde(default)]
    pub approval: crate::approval::ApprovalSection,
    /// `[http]`: the streamable HTTP listener (`serve --http`): address, tokens, origins,
    /// connection limits, balancers.
    #[serde(default)]
    pub http: HttpConfig,
    /// `[metrics]`: the plain `/metrics` listener.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// `[network]`: the sandboxes' network mode and the egress proxy's policy; replaces
    /// the profile's `[network]` whole when given.
    pub network: Option<crate::egress::NetworkSection>,
    /// `[python]`: `preload` replaces the profile's list of modules a pooled interpreter
    /// imports before it is ready (`[]`: none).
    #[serde(default)]
    pub python: PythonConfig,
    /// `[output]`: the model-facing output budget and the kept streams of cut results.
    #[serde(default)]
    pub output: crate::output::OutputSection,
    /// `[packages]`: packages on request (indexes, allow/deny, sizes, time).
    #[serde(default)]
    pub packages: crate::packages::PackagesSection,
    /// `[tasks]`: executions as tasks for clients of the MCP Tasks extension.
    #[serde(default)]
    pub tasks: crate::tasks::TasksSection,
    /// `[sessions]`: sessions that outlive the server (pause, resume, fork), encrypted
    /// at rest with the operator's key (`crate::snapshot::config`).
    #[serde(default)]
    pub sessions: crate::snapshot::SessionsSection,
    /// Where codebox keeps state of its own: the egress CA, the sandboxes' trust bundle,
    /// installed package layers (default `$XDG_STATE_HOME/codebox`, `~/.local/state/codebox`; as root
    /// `/var/lib/codebox`).
    pub state_dir: Option<PathBuf>,
}

/// `[python]` of `codebox.toml`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PythonConfig {
    /// Modules a pooled Python interpreter imports before it is ready (dotted names),
    /// replacing the profile's `[python] preload`; a program's own import of them is then
    /// a lookup (default: the profile's, `numpy`, `pandas`, `matplotlib.pyplot`).
    pub preload: Option<Vec<String>>,
    /// Fork Python sandboxes from a zygote (`sandbox::zygote`; default on).
    pub zygote: Option<bool>,
}

/// `[pii]`: personal data in what goes back to the model.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PiiConfig {
    /// off (default), output or strict.
    pub mode: Option<crate::pii::PiiMode>,
    /// Extra detectors: `{ label = "EMPLOYEE_ID", regex = "E-[0-9]{6}" }`.
    #[serde(default)]
    pub custom: Vec<crate::pii::CustomPattern>,
}

/// `[metrics]` of `codebox.toml`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Where to serve `GET /metrics` without a token (e.g. "0.0.0.0:9464"); none by
    /// default (`/metrics` on the HTTP listener is there either way).
    pub addr: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// The address `serve --http` listens on (default `127.0.0.1:8080`); a non-loopback
    /// address needs a token.
    pub addr: Option<String>,
    /// This server's name among replicas behind one balancer (`--replica`).
    pub replica: Option<String>,
    /// The bearer token, or `env:VAR` (one client, named "default").
    pub token: Option<String>,
    /// More clients, each with its own token (or `env:VAR`): `{ alice = "env:ALICE_TOKEN" }`.
    /// Rate limits and sessions are per client.
    #[serde(default)]
    pub clients: std::collections::BTreeMap<String, String>,
    /// Browser origins allowed to call (`Origin` header; `*` globs such as
    /// `http://localhost:*`); a request with another Origin is refused (default: none but
    /// requests without one).
    pub allowed_origins: Option<Vec<String>>,
    /// Names the `Host` header may carry besides loopback ones (DNS-rebinding defence).
    pub allowed_hosts: Option<Vec<String>>,
    /// How long a request's headers may take to arrive, e.g. `"10s"` (a deadline:
    /// trickling does not extend it; default 10s).
    pub header_timeout: Option<String>,
    /// How long a request's body may take to arrive, else 408 (default 30s).
    pub body_timeout: Option<String>,
    /// A connection with no byte moving either way for this long is closed (running
    /// executions keep theirs alive; default 60s).
    pub idle_timeout: Option<String>,
    /// Open connections in total; past it a new one is answered 503 (default 256).
    pub max_connections: Option<usize>,
    /// Open connections from one client: an IPv4 address, an IPv6 /64, or the client a
    /// trusted balancer names (default 64).
    pub max_connections_per_peer: Option<usize>,
    /// Balancers (addresses and networks, `10.0.0.0/8`) that put a PROXY protocol v2
    /// header before each connection, naming the client: per-client caps and logs then
    /// use that client. From these addresses the header is required; from any other it
    /// is refused. Needs bearer tokens (clients behind a balancer are not the local
    /// user).
    pub trusted_proxies: Option<Vec<String>>,
}

impl Config {
    /// Finds and parses the config file (none found is an empty config). Returns the
    /// config and the path it came from.
    pub fn load(
        explicit: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(Config, Option<PathBuf>)> {
        let candidates: Vec<(PathBuf, bool)> = match explicit {
            Some(p) => vec![(p.to_path_buf(), true)],
            None => {
                let mut c = Vec::new();
                if let Some(p) = env("CODEBOX_CONFIG") {
                    c.push((PathBuf::from(p), true));
                }
                c.push((PathBuf::from("codebox.toml"), false));
                if let Some(home) = env("HOME") {
                    c.push((
                        PathBuf::from(home).join(".config/codebox/config.toml"),
                        false,
                    ));
                }
                c
            }
        };
        for (path, required) in candidates {
            match std::fs::read_to_string(&path) {
                Ok(text) => {
                    let mut config = Config::parse(&text, &path)?;
                    if let Some(dir) = path.parent() {
                        config.resolve_paths(dir);
                    }
                    return Ok((config, Some(path)));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => continue,
                Err(source) => return Err(Error::Read { path, source }),
            }
        }
        Ok((Config::default(), None))
    }

    /// Parses config TOML; `path` names the file in errors, with the line and column
    /// where the parser stopped.
    pub fn parse(text: &str, path: &Path) -> Result<Config> {
        toml::from_str(text).map_err(|e| {
            let at = e
                .span()
                .map(|span| {
                    let before = &text[..span.start.min(text.len())];
                    let line = before.matches('\n').count() + 1;
                    // In characters, as editors count them (the span is in bytes).
                    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
                    let column = before[line_start..].chars().count() + 1;
                    format!("line {line}, column {column}: ")
                })
                .unwrap_or_default();
            Error::Invalid {
                path: path.to_path_buf(),
                message: format!("{at}{}", e.message().trim_end()),
            }
        })
    }

    /// Makes the file's relative paths relative to `dir`, the file's directory (not to
    /// the directory `serve` was started in). Paths from the environment or flags stay
    /// relative to the working directory.
    pub fn resolve_paths(&mut self, dir: &Path) {
        let under = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = dir.join(&*p);
            }
        };
        for p in [
            &mut self.rootfs,
            &mut self.guest,
            &mut self.mcp_config,
            &mut self.skills_dir,
            &mut self.skills_shared,
            &mut self.state_dir,
            &mut self.packages.cache_dir,
            &mut self.sessions.dir,
        ]
        .into_iter()
        .flatten()
        {
            under(p);
        }
        if let Some(audit) = &mut self.audit {
            under(&mut audit.path);
        }
        if let Some(network) = &mut self.network {
            network.extra_roots.iter_mut().for_each(under);
        }
        self.packages.extra_roots.iter_mut().for_each(under);
        // A profile is a name (`default`) or a path to a .toml file.
        if let Some(profile) = &mut self.profile {
            if profile.contains('/') || profile.ends_with(".toml") {
                let mut p = PathBuf::from(&*profile);
                under(&mut p);
                *profile = p.to_string_lossy().into_owned();
            }
        }
    }

    /// Applies `CODEBOX_*` environment overrides.
    pub fn apply_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<()> {
        fn num<T: std::str::FromStr>(var: &str, v: String) -> Result<T> {
            v.trim().parse().map_err(|_| Error::BadEnv {
                var: var.into(),
                value: v.clone(),
                reason: "not a number".into(),
            })
        }
        let list = |v: String| -> Vec<String> {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        };
        if let Some(v) = env("CODEBOX_PROFILE") {
            self.profile = Some(v);
        }
        if let Some(v) = env("CODEBOX_BACKEND") {
            self.backend = Some(v.trim().parse().map_err(|reason| Error::BadEnv {
                var: "CODEBOX_BACKEND".into(),
                value: v.clone(),
                reason,
            })?);
        }
        if let Some(v) = env("CODEBOX_ROOTFS") {
            self.rootfs = Some(v.into());
        }
        if let Some(v) = env("CODEBOX_CONCURRENCY") {
            self.concurrency = Some(num("CODEBOX_CONCURRENCY", v)?);
        }
        if let Some(v) = env("CODEBOX_ZYGOTE") {
            self.python.zygote = Some(match v.trim() {
                "1" | "true" | "on" => true,
                "0" | "false" | "off" => false,
                _ => {
                    return Err(Error::BadEnv {
                        var: "CODEBOX_ZYGOTE".into(),
                        value: v.clone(),
                        reason: "expected 1 or 0 (true/false, on/off)".into(),
                    })
                }
            });
        }
        if let Some(v) = env("CODEBOX_POOL_SIZE") {
            self.pool_size = Some(num("CODEBOX_POOL_SIZE", v)?);
        }
        if let Some(v) = env("CODEBOX_POOL_MAX") {
            self.pool_max = Some(num("CODEBOX_POOL_MAX", v)?);
        }
        if let Some(v) = env("CODEBOX_POOL_SHRINK_AFTER") {
            self.pool_shrink_after = Some(v);
        }
        if let Some(v) = env("CODEBOX_QUEUE") {
            self.queue = Some(num("CODEBOX_QUEUE", v)?);
        }
        if let Some(v) = env("CODEBOX_MAX_TIMEOUT") {
            self.max_timeout = Some(v);
        }
        if let Some(v) = env("CODEBOX_ROOT_HOST_ID") {
            self.root_host_id = Some(num("CODEBOX_ROOT_HOST_ID", v)?);
        }
        if let Some(v) = env("CODEBOX_MCP_CONFIG") {
            self.mcp_config = Some(v.into());
        }
        if let Some(v) = env("CODEBOX_TOOLS") {
            self.tools = Some(
                v.parse()
                    .map_err(|e: tool_set::UnknownToolSet| Error::BadEnv {
                        var: "CODEBOX_TOOLS".into(),
                        value: v.clone(),
                        reason: e.to_string(),
                    })?,
            );
        }
        if let Some(v) = env("CODEBOX_ALLOWED_TOOLS") {
            self.allowed_tools = Some(list(v));
        }
        if let Some(v) = env("CODEBOX_MAX_TOOL_CALLS") {
            self.max_tool_calls = Some(num("CODEBOX_MAX_TOOL_CALLS", v)?);
        }
        if let Some(v) = env("CODEBOX_MAX_TOOL_CALLS_IN_FLIGHT") {
            self.max_tool_calls_in_flight = Some(num("CODEBOX_MAX_TOOL_CALLS_IN_FLIGHT", v)?);
        }
        if let Some(v) = env("CODEBOX_MAX_TOOL_CALL_RECORDS") {
            self.max_tool_call_records = Some(num("CODEBOX_MAX_TOOL_CALL_RECORDS", v)?);
        }
        if let Some(v) = env("CODEBOX_TOOL_ANSWER_QUEUE") {
            self.tool_answer_queue = Some(v);
        }
        if let Some(v) = env("CODEBOX_TOOL_REQUEST_MEMORY") {
            self.tool_request_memory = Some(v);
        }
        if let Some(v) = env("CODEBOX_TOOL_CALL_TIMEOUT") {
            self.tool_call_timeout = Some(v);
        }
        if let Some(v) = env("CODEBOX_UPSTREAM_CONNECT_TIMEOUT") {
            self.upstream_connect_timeout = Some(v);
        }
        if let Some(v) = env("CODEBOX_UPSTREAM_WAIT") {
            self.upstream_wait = Some(v);
        }
        if let Some(v) = env("CODEBOX_STATE_DIR") {
            self.state_dir = Some(v.into());
        }
        if let Some(v) = env("CODEBOX_NETWORK_ALLOW") {
            // A shorthand for deployments configured by environment: proxy mode with
            // these hosts allowed (the rest of [network] as the file has it).
            let mut n = self.network.clone().unwrap_or_default();
            n.mode = Some(crate::egress::NetworkMode::Proxy);
            n.enabled = None;
            n.allow = list(v);
            self.network = Some(n);
        }
        if let Some(v) = env("CODEBOX_SKILLS_DIR") {
            self.skills_dir = Some(v.into());
        }
        if let Some(v) = env("CODEBOX_SKILLS_SHARED") {
            self.skills_shared = Some(v.into());
        }
        if let Some(v) = env("CODEBOX_SESSION_TTL") {
            self.session_ttl = Some(v);
        }
        if let Some(v) = env("CODEBOX_SESSION_QUOTA") {
            self.session_quota = Some(v);
        }
        if let Some(v) = env("CODEBOX_SESSION_MAX_ENTRIES") {
            self.session_max_entries = Some(num("CODEBOX_SESSION_MAX_ENTRIES", v)?);
        }
        if let Some(v) = env("CODEBOX_MAX_SESSIONS") {
            self.max_sessions = Some(num("CODEBOX_MAX_SESSIONS", v)?);
        }
        if let Some(v) = env("CODEBOX_RATE_PER_MINUTE") {
            self.rate_per_minute = Some(num("CODEBOX_RATE_PER_MINUTE", v)?);
        }
        if let Some(v) = env("CODEBOX_RATE_CONCURRENT") {
            self.rate_concurrent = Some(num("CODEBOX_RATE_CONCURRENT", v)?);
        }
        if let Some(v) = env("CODEBOX_PII") {
            self.pii.mode = Some(v.parse().map_err(|e: crate::pii::Error| Error::BadEnv {
                var: "CODEBOX_PII".into(),
                value: v.clone(),
                reason: e.to_string(),
            })?);
        }
        if let Some(v) = env("CODEBOX_AUDIT_LOG") {
            let mut audit: crate::audit::AuditConfig =
                toml::from_str(&format!("path = {}", toml_string(&v))).map_err(|e| {
                    Error::BadEnv {
                        var: "CODEBOX_AUDIT_LOG".into(),
                        value: v.clone(),
                        reason: e.message().to_string(),
                    }
                })?;
            if let Some(old) = &self.audit {
                audit = crate::audit::AuditConfig {
                    path: audit.path,
                    ..old.clone()
                };
            }
            self.audit = Some(audit);
        }
        if let Some(v) = env("CODEBOX_HTTP_CLIENTS") {
            for pair in list(v.clone()) {
                let (name, token) = pair.split_once('=').ok_or_else(|| Error::BadEnv {
                    var: "CODEBOX_HTTP_CLIENTS".into(),
                    value: "(hidden)".into(),
                    reason: "expected name=token pairs separated by commas".into(),
                })?;
                self.http
                    .clients
                    .insert(name.trim().to_string(), token.trim().to_string());
            }
        }
        self.sessions.apply_env(env).map_err(|e| Error::BadEnv {
            var: "CODEBOX_SESSIONS_*".into(),
            value: "(see the message)".into(),
            reason: e.to_string(),
        })?;
        if let Some(v) = env("CODEBOX_METRICS_ADDR") {
            self.metrics.addr = Some(v);
        }
        if let Some(v) = env("CODEBOX_HTTP_ADDR") {
            self.http.addr = Some(v);
        }
        if let Some(v) = env("CODEBOX_HTTP_TOKEN") {
            self.http.token = Some(v);
        }
        if let Some(v) = env("CODEBOX_HTTP_ALLOWED_ORIGINS") {
            self.http.allowed_origins = Some(list(v));
        }
        if let Some(v) = env("CODEBOX_HTTP_ALLOWED_HOSTS") {
            self.http.allowed_hosts = Some(list(v));
        }
        if let Some(v) = env("CODEBOX_HTTP_HEADER_TIMEOUT") {
            self.http.header_timeout = Some(v);
        }
        if let Some(v) = env("CODEBOX_HTTP_BODY_TIMEOUT") {
            self.http.body_timeout = Some(v);
        }
        if let Some(v) = env("CODEBOX_HTTP_IDLE_TIMEOUT") {
            self.http.idle_timeout = Some(v);
        }
        if let Some(v) = env("CODEBOX_HTTP_MAX_CONNECTIONS") {
            self.http.max_connections = Some(num("CODEBOX_HTTP_MAX_CONNECTIONS", v)?);
        }
        if let Some(v) = env("CODEBOX_HTTP_MAX_CONNECTIONS_PER_PEER") {
            self.http.max_connections_per_peer =
                Some(num("CODEBOX_HTTP_MAX_CONNECTIONS_PER_PEER", v)?);
        }
        if let Some(v) = env("CODEBOX_HTTP_TRUSTED_PROXIES") {
            self.http.trusted_proxies = Some(list(v));
        }
        Ok(())
    }

    /// The HTTP token with `env:VAR` resolved.
    pub fn http_token(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<String>> {
        resolve_secret("http.token", self.http.token.as_deref(), env)
    }

    /// Every HTTP client and its token (`token` is the client "default").
    pub fn http_clients(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        if let Some(t) = self.http_token(env)? {
            out.push(("default".to_string(), t));
        }
        for (name, secret) in &self.http.clients {
            let key = format!("http.clients.{name}");
            if let Some(t) = resolve_secret(&key, Some(secret), env)? {
                if t.is_empty() {
                    return Err(Error::Invalid {
                        path: PathBuf::from("(config)"),
                        message: format!("{key}: the token is empty"),
                    });
                }
                out.push((name.clone(), t));
            }
        }
        Ok(out)
    }
}

/// A TOML basic string holding `s`.
fn toml_string(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialise")
}

/// The environment variables codebox took secrets from (`env:VAR`: the snapshot key,
/// egress credentials, index tokens). Processes codebox starts with its own environment
/// (upstream MCP servers: `upstream/process.rs`) are started without them: a secret
/// given to codebox is not given to every server it talks to.
static SECRET_VARS: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Notes `var` as holding a secret (see [`secret_vars`]).
pub fn note_secret_var(var: &str) {
    SECRET_VARS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(var.to_string());
}

/// Every variable noted by [`note_secret_var`] so far.
pub fn secret_vars() -> Vec<String> {
    SECRET_VARS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .cloned()
        .collect()
}

/// `env:VAR` → the variable's value (and VAR noted as a secret's); anything else as
/// written.
pub fn resolve_secret(
    key: &str,
    value: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<String>> {
    match value {
        None => Ok(None),
        Some(v) => match v.strip_prefix("env:") {
            Some(var) => {
                note_secret_var(var);
                env(var).map(Some).ok_or_else(|| Error::MissingSecret {
                    key: key.into(),
                    var: var.into(),
                })
            }
            None => Ok(Some(v.to_string())),
        },
    }
}

/// A fixed environment, as the lookup the functions above take (for tests).
#[cfg(test)]
pub(crate) fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

/// The process environment, as the lookup the functions above take.
pub fn process_env(var: &str) -> Option<String> {
    std::env::var(var).ok()
}

pub mod reference;
pub mod tool_set;

#[cfg(test)]
mod tests;
