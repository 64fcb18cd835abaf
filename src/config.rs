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
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub profile: Option<String>,
    pub rootfs: Option<PathBuf>,
    pub concurrency: Option<usize>,
    /// Sandboxes kept started and waiting, per language, at least (0: no warm pool).
    pub pool_size: Option<usize>,
    /// ... and at most, as the pool follows demand (default 8, at least `pool_size`).
    pub pool_max: Option<usize>,
    /// How long the pool keeps sandboxes above what demand wants now before it kills
    /// them (default 60s).
    pub pool_shrink_after: Option<String>,
    pub queue: Option<usize>,
    pub max_timeout: Option<String>,
    /// Bytes of `files` one call may bring, all files together (default 10M; an MCP
    /// message is at most 16 MiB, base64 included).
    pub max_files_size: Option<String>,
    pub root_host_id: Option<u32>,
    /// The `.mcp.json` naming the upstream MCP servers (default `./.mcp.json`).
    pub mcp_config: Option<PathBuf>,
    /// Upstream tools sandboxed code may call (names and `server__*` globs).
    pub allowed_tools: Option<Vec<String>>,
    /// Which of codebox's own tools `tools/list` offers: `full` (default) or `minimal`
    /// (the execute tools and `search_tools`; see `server::tool_set`).
    pub tools: Option<crate::server::ToolSet>,
    /// Requests (calls, searches, gets, anything) one execution may send to the proxy.
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
    /// Wall-clock limit of one upstream tool call.
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
    #[serde(default)]
    pub pii: PiiConfig,
    /// The audit log (default: none).
    pub audit: Option<crate::audit::AuditConfig>,
    /// `[approval]`: which sandboxed calls wait for the user's approval (default: none).
    #[serde(default)]
    pub approval: crate::approval::ApprovalSection,
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
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonConfig {
    pub preload: Option<Vec<String>>,
    /// Fork Python sandboxes from a zygote (`sandbox::zygote`; default on).
    pub zygote: Option<bool>,
}

/// `[pii]`: personal data in what goes back to the model.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PiiConfig {
    /// off (default), output or strict.
    pub mode: Option<crate::pii::PiiMode>,
    /// Extra detectors: `{ label = "EMPLOYEE_ID", regex = "E-[0-9]{6}" }`.
    #[serde(default)]
    pub custom: Vec<crate::pii::CustomPattern>,
}

/// `[metrics]` of `codebox.toml`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Where to serve `GET /metrics` without a token (e.g. "0.0.0.0:9464"); none by
    /// default (`/metrics` on the HTTP listener is there either way).
    pub addr: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    pub addr: Option<String>,
    /// This server's name among replicas behind one balancer (`--replica`).
    pub replica: Option<String>,
    /// The bearer token, or `env:VAR` (one client, named "default").
    pub token: Option<String>,
    /// More clients, each with its own token (or `env:VAR`): `{ alice = "env:ALICE_TOKEN" }`.
    /// Rate limits and sessions are per client.
    #[serde(default)]
    pub clients: std::collections::BTreeMap<String, String>,
    pub allowed_origins: Option<Vec<String>>,
    pub allowed_hosts: Option<Vec<String>>,
    /// Durations such as "10s": see [`crate::server::http_conn::ConnLimits`].
    pub header_timeout: Option<String>,
    pub body_timeout: Option<String>,
    pub idle_timeout: Option<String>,
    pub max_connections: Option<usize>,
    pub max_connections_per_peer: Option<usize>,
    /// Balancers (addresses and networks, `10.0.0.0/8`) that put a PROXY protocol v2
    /// header before each connection, naming the client: per-client caps and logs then
    /// use that client. From these addresses the header is required; from any other it
    /// is refused. Needs bearer tokens (clients behind a balancer are not the local
    /// user). See [`crate::server::proxy_protocol`].
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
            self.tools = Some(v.parse().map_err(
                |e: crate::server::tool_set::UnknownToolSet| Error::BadEnv {
                    var: "CODEBOX_TOOLS".into(),
                    value: v.clone(),
                    reason: e.to_string(),
                },
            )?);
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

/// `env:VAR` → the variable's value; anything else as written.
pub fn resolve_secret(
    key: &str,
    value: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<String>> {
    match value {
        None => Ok(None),
        Some(v) => match v.strip_prefix("env:") {
            Some(var) => env(var).map(Some).ok_or_else(|| Error::MissingSecret {
                key: key.into(),
                var: var.into(),
            }),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Editors count characters: the column of an error after text with multi-byte
    /// characters on its line is counted in characters, not bytes.
    #[test]
    fn error_columns_count_characters() {
        let e = Config::parse("profile = \"é€\" x\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1, column 16:"), "{e}");
        let e = Config::parse("# ünïcödé\nconcurrency = \"é\"\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2, column 15:"), "{e}");
    }

    #[test]
    fn full_file_parses() {
        let c = Config::parse(
            "profile = \"network\"\nconcurrency = 3\n[http]\naddr = \"0.0.0.0:9\"\ntoken = \"env:T\"\nallowed_hosts = [\"a\"]\n",
            Path::new("c.toml"),
        )
        .unwrap();
        assert_eq!(c.profile.as_deref(), Some("network"));
        assert_eq!(c.concurrency, Some(3));
        assert_eq!(c.http.allowed_hosts, Some(vec!["a".to_string()]));
        assert_eq!(
            c.http_token(&env_of(&[("T", "s3")])).unwrap().as_deref(),
            Some("s3")
        );
    }

    #[test]
    fn the_zygote_switch_parses_from_the_file_and_the_environment() {
        let c = Config::parse("[python]\nzygote = false\n", Path::new("c.toml")).unwrap();
        assert_eq!(c.python.zygote, Some(false));
        let mut c = Config::default();
        c.apply_env(&|k| (k == "CODEBOX_ZYGOTE").then(|| "on".to_string()))
            .unwrap();
        assert_eq!(c.python.zygote, Some(true));
        let err = c
            .apply_env(&|k| (k == "CODEBOX_ZYGOTE").then(|| "maybe".to_string()))
            .unwrap_err();
        assert!(err.to_string().contains("CODEBOX_ZYGOTE"), "{err}");
        assert!(Config::parse("[python]\nzygote = 1\n", Path::new("c.toml")).is_err());
    }

    #[test]
    fn python_preload_parses_and_unknown_keys_are_refused() {
        let c = Config::parse("[python]\npreload = [\"numpy\"]\n", Path::new("c.toml")).unwrap();
        assert_eq!(c.python.preload, Some(vec!["numpy".to_string()]));
        let c = Config::parse("", Path::new("c.toml")).unwrap();
        assert_eq!(c.python.preload, None);
        assert!(Config::parse("[python]\npreloads = []\n", Path::new("c.toml")).is_err());
    }

    #[test]
    fn network_section_parses_and_the_environment_can_allow_hosts() {
        let text = "[network]\nmode = \"proxy\"\nallow = [\"api.example.com\"]\n\
                    [[network.credentials]]\nhost = \"api.example.com\"\nbearer = \"env:API_TOKEN\"\n";
        let mut c = Config::parse(text, Path::new("c.toml")).unwrap();
        let n = c.network.clone().unwrap();
        assert_eq!(n.mode, Some(crate::egress::NetworkMode::Proxy));
        assert_eq!(n.credentials.len(), 1);
        c.apply_env(&env_of(&[
            ("CODEBOX_NETWORK_ALLOW", "a.example, *.b.example:443"),
            ("CODEBOX_STATE_DIR", "/srv/codebox"),
        ]))
        .unwrap();
        let n = c.network.unwrap();
        assert_eq!(n.allow, ["a.example", "*.b.example:443"]);
        assert_eq!(n.credentials.len(), 1, "the rest of [network] stays");
        assert_eq!(c.state_dir.as_deref(), Some(Path::new("/srv/codebox")));
        let e = Config::parse("[network]\nalow = []\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("alow"), "{e}");
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = Config::parse("concurency = 3\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("concurency") && e.contains("c.toml"), "{e}");
        let e = Config::parse("[http]\ntokn = \"x\"\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("tokn"), "{e}");
    }

    #[test]
    fn the_metrics_address_comes_from_the_file_or_the_environment() {
        let mut c = Config::parse("[metrics]\naddr = \"0.0.0.0:9464\"\n", Path::new("c")).unwrap();
        assert_eq!(c.metrics.addr.as_deref(), Some("0.0.0.0:9464"));
        c.apply_env(&env_of(&[("CODEBOX_METRICS_ADDR", "127.0.0.1:9")]))
            .unwrap();
        assert_eq!(c.metrics.addr.as_deref(), Some("127.0.0.1:9"));
        let e = Config::parse("[metrics]\nport = 1\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("port"), "{e}");
    }

    #[test]
    fn environment_overrides_the_file() {
        let mut c = Config::parse(
            "queue = 1\n[http]\naddr = \"127.0.0.1:1\"\n",
            Path::new("c"),
        )
        .unwrap();
        c.apply_env(&env_of(&[
            ("CODEBOX_QUEUE", "7"),
            ("CODEBOX_HTTP_ADDR", "127.0.0.1:2"),
            ("CODEBOX_HTTP_ALLOWED_ORIGINS", "http://a:*, http://b:*"),
        ]))
        .unwrap();
        assert_eq!(c.queue, Some(7));
        assert_eq!(c.http.addr.as_deref(), Some("127.0.0.1:2"));
        assert_eq!(c.http.allowed_origins.as_ref().unwrap().len(), 2);
        let e = c
            .apply_env(&env_of(&[("CODEBOX_QUEUE", "many")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("CODEBOX_QUEUE"), "{e}");
    }

    #[test]
    fn pool_bounds_from_file_and_environment() {
        let mut c = Config::parse(
            "pool_size = 1\npool_max = 6\npool_shrink_after = \"30s\"\n",
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(
            (c.pool_size, c.pool_max, c.pool_shrink_after.as_deref()),
            (Some(1), Some(6), Some("30s"))
        );
        c.apply_env(&env_of(&[
            ("CODEBOX_POOL_MAX", "12"),
            ("CODEBOX_POOL_SHRINK_AFTER", "2m"),
        ]))
        .unwrap();
        assert_eq!(
            (c.pool_max, c.pool_shrink_after.as_deref()),
            (Some(12), Some("2m"))
        );
        for bad in ["-1", "eight", ""] {
            let e = c
                .apply_env(&env_of(&[("CODEBOX_POOL_MAX", bad)]))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("CODEBOX_POOL_MAX") && e.contains("not a number"),
                "{e}"
            );
        }
        // A wrong type is pointed at (line and column), like every other key's.
        let e = Config::parse("pool_max = \"8\"\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 1, column 12") && e.contains("expected usize"),
            "{e}"
        );
        let e = Config::parse("pool_maximum = 8\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("pool_maximum"), "{e}");
    }

    #[test]
    fn connection_limits_from_file_and_environment() {
        let mut c = Config::parse(
            "[http]\nheader_timeout = \"2s\"\nmax_connections = 9\nmax_connections_per_peer = 3\n",
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(c.http.header_timeout.as_deref(), Some("2s"));
        c.apply_env(&env_of(&[
            ("CODEBOX_HTTP_BODY_TIMEOUT", "5s"),
            ("CODEBOX_HTTP_IDLE_TIMEOUT", "1m"),
            ("CODEBOX_HTTP_MAX_CONNECTIONS", "10"),
        ]))
        .unwrap();
        assert_eq!(c.http.body_timeout.as_deref(), Some("5s"));
        assert_eq!(c.http.idle_timeout.as_deref(), Some("1m"));
        assert_eq!(c.http.max_connections, Some(10));
        assert_eq!(c.http.max_connections_per_peer, Some(3));
        let e = c
            .apply_env(&env_of(&[("CODEBOX_HTTP_MAX_CONNECTIONS_PER_PEER", "x")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("CODEBOX_HTTP_MAX_CONNECTIONS_PER_PEER"), "{e}");
        assert!(Config::parse("[http]\nmax_conections = 1\n", Path::new("c")).is_err());
        let mut c = Config::parse(
            "[http]\ntrusted_proxies = [\"10.0.0.0/8\"]\n",
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(c.http.trusted_proxies, Some(vec!["10.0.0.0/8".to_string()]));
        c.apply_env(&env_of(&[(
            "CODEBOX_HTTP_TRUSTED_PROXIES",
            "127.0.0.2, fd00::/8",
        )]))
        .unwrap();
        assert_eq!(
            c.http.trusted_proxies,
            Some(vec!["127.0.0.2".to_string(), "fd00::/8".to_string()])
        );
    }

    #[test]
    fn tool_settings_from_file_and_environment() {
        let c = Config::parse(
            "allowed_tools = [\"time__*\"]\nmax_tool_calls = 5\ntool_call_timeout = \"2s\"\n",
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(c.allowed_tools, Some(vec!["time__*".to_string()]));
        assert_eq!(
            (c.max_tool_calls, c.tool_call_timeout.as_deref()),
            (Some(5), Some("2s"))
        );
        let mut c = Config::default();
        let env = |k: &str| match k {
            "CODEBOX_ALLOWED_TOOLS" => Some("a__*, b__c".to_string()),
            "CODEBOX_MAX_TOOL_CALLS" => Some("7".to_string()),
            _ => None,
        };
        c.apply_env(&env).unwrap();
        assert_eq!(
            c.allowed_tools,
            Some(vec!["a__*".to_string(), "b__c".to_string()])
        );
        assert_eq!(c.max_tool_calls, Some(7));
        let c = Config::parse(
            "max_tool_calls_in_flight = 4\nmax_tool_call_records = 20\ntool_answer_queue = \"1MiB\"\n",
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(
            (c.max_tool_calls_in_flight, c.max_tool_call_records),
            (Some(4), Some(20))
        );
        assert_eq!(c.tool_answer_queue.as_deref(), Some("1MiB"));
        let mut c = Config::default();
        c.apply_env(&env_of(&[("CODEBOX_TOOL_REQUEST_MEMORY", "128MiB")]))
            .unwrap();
        assert_eq!(c.tool_request_memory.as_deref(), Some("128MiB"));
        let mut c = Config::default();
        c.apply_env(&env_of(&[
            ("CODEBOX_MAX_TOOL_CALLS_IN_FLIGHT", "8"),
            ("CODEBOX_MAX_TOOL_CALL_RECORDS", "50"),
        ]))
        .unwrap();
        assert_eq!(
            (c.max_tool_calls_in_flight, c.max_tool_call_records),
            (Some(8), Some(50))
        );
        let e = Config::default()
            .apply_env(&env_of(&[("CODEBOX_MAX_TOOL_CALLS_IN_FLIGHT", "-1")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("CODEBOX_MAX_TOOL_CALLS_IN_FLIGHT"), "{e}");
    }

    #[test]
    fn the_tool_set_from_file_and_environment() {
        use crate::server::ToolSet;
        let mut c = Config::parse("tools = \"minimal\"\n", Path::new("c")).unwrap();
        assert_eq!(c.tools, Some(ToolSet::Minimal));
        c.apply_env(&env_of(&[("CODEBOX_TOOLS", "full")])).unwrap();
        assert_eq!(c.tools, Some(ToolSet::Full));
        assert_eq!(Config::default().tools, None);
        let e = Config::parse("tools = \"tiny\"\n", Path::new("c"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("tiny") || e.contains("minimal"), "{e}");
        let e = Config::default()
            .apply_env(&env_of(&[("CODEBOX_TOOLS", "tiny")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("CODEBOX_TOOLS") && e.contains("minimal"), "{e}");
    }

    #[test]
    fn mcp_config_from_file_and_environment() {
        let mut c =
            Config::parse("mcp_config = \"/etc/codebox/mcp.json\"\n", Path::new("c")).unwrap();
        assert_eq!(c.mcp_config, Some(PathBuf::from("/etc/codebox/mcp.json")));
        c.apply_env(&env_of(&[("CODEBOX_MCP_CONFIG", "/srv/.mcp.json")]))
            .unwrap();
        assert_eq!(c.mcp_config, Some(PathBuf::from("/srv/.mcp.json")));
        let e = Config::parse("mcp_confg = \"x\"\n", Path::new("c"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("mcp_confg"), "{e}");
        assert_eq!(Config::default().mcp_config, None);
    }

    #[test]
    fn missing_secret_names_the_variable() {
        let c = Config::parse("[http]\ntoken = \"env:NOPE\"\n", Path::new("c")).unwrap();
        let e = c.http_token(&env_of(&[])).unwrap_err().to_string();
        assert!(e.contains("NOPE") && e.contains("http.token"), "{e}");
    }

    #[test]
    fn search_order_and_explicit_paths() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir_all(home.join(".config/codebox")).unwrap();
        std::fs::write(home.join(".config/codebox/config.toml"), "queue = 5\n").unwrap();
        let h = home.to_str().unwrap().to_string();
        let (c, from) = Config::load(None, &env_of(&[("HOME", &h)])).unwrap();
        assert_eq!(c.queue, Some(5));
        assert!(from.unwrap().ends_with("config.toml"));
        let explicit = dir.path().join("x.toml");
        std::fs::write(&explicit, "queue = 9\n").unwrap();
        let e = explicit.to_str().unwrap().to_string();
        let (c, _) = Config::load(None, &env_of(&[("HOME", &h), ("CODEBOX_CONFIG", &e)])).unwrap();
        assert_eq!(c.queue, Some(9));
        assert!(Config::load(Some(Path::new("/nonexistent/c.toml")), &env_of(&[])).is_err());
    }

    #[test]
    fn relative_roots_are_relative_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "[network]\nmode = \"none\"\nextra_roots = [\"ca.pem\"]\n[packages]\nextra_roots = [\"mirror/ca.pem\", \"/abs.pem\"]\n",
        )
        .unwrap();
        let (c, _) = Config::load(Some(&file), &env_of(&[])).unwrap();
        assert_eq!(c.network.unwrap().extra_roots, [dir.path().join("ca.pem")]);
        assert_eq!(
            c.packages.extra_roots,
            [dir.path().join("mirror/ca.pem"), PathBuf::from("/abs.pem")]
        );
    }
}
