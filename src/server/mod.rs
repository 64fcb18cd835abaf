//! The MCP server codebox exposes (rmcp): `execute_python`, `execute_typescript` and
//! `health`, over stdio.
//!
//! Each execution: admission (a slot or a queue place, else "busy, retry"), a sandbox
//! from the spawner with the server's profile, the code over fd 3, output streamed as
//! progress notifications when the request carries a progress token, cancellation
//! (`notifications/cancelled`) killing the sandbox, and the result as structuredContent
//! plus a short text. A program that fails is a tool result with `isError: true`, not a
//! protocol error.

// MCP logging (notifications/message, logging/setLevel) is deprecated by SEP-2577 in the
// newest protocol revision but still part of 2025-11-25, which codebox serves.
#![allow(deprecated)]

pub mod admission;
pub mod framing;
pub mod http;
pub mod stdio_guard;
pub mod wrappers;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, LoggingLevel, LoggingMessageNotificationParam,
    ProgressNotificationParam, ServerCapabilities, ServerConfig, SetLevelRequestParams,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData as McpError, RoleServer, ServerHandler};
use serde::Deserialize;

use crate::doctor;
use crate::execution::{self, ExecutionResult};
use crate::profile::Profile;
use crate::proxy::{AllowList, ProxyLimits, ProxySession, ToolBackend};
use crate::runtime::{self, Language};
use crate::spawner::{SpawnSpec, SpawnerClient, Stream};
use crate::upstream::Upstreams;

use admission::Admission;

/// Server settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The profile every execution runs with.
    pub profile: Profile,
    /// Executions running at once.
    pub concurrency: usize,
    /// Executions waiting for a slot before "busy" is answered.
    pub queue: usize,
    /// No request may ask for more.
    pub max_timeout: Duration,
    /// The upstream tools sandboxed code may call; a request's `allowed_tools` can only
    /// narrow it.
    pub allowed_tools: AllowList,
    /// Per-execution limits of the tool channel.
    pub proxy_limits: ProxyLimits,
}

#[derive(Debug, Default)]
struct Counters {
    run: AtomicU64,
    failed: AtomicU64,
}

struct State {
    spawner: SpawnerClient,
    settings: Settings,
    admission: Admission,
    started: Instant,
    counters: Counters,
    /// The host's layers, checked at start-up (before any thread existed).
    layers: Vec<doctor::Check>,
    log_level: std::sync::Mutex<LoggingLevel>,
    upstreams: Upstreams,
    wrappers: wrappers::Wrappers,
}

/// The MCP server.
#[derive(Clone)]
pub struct CodeboxServer {
    state: Arc<State>,
    tool_router: ToolRouter<Self>,
}

/// Arguments of `execute_python` and `execute_typescript`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteParams {
    /// The complete program. Print what you want to see: only stdout and stderr come back.
    pub code: String,
    /// Wall-clock limit in milliseconds (default: the server's profile, usually 30000).
    pub timeout_ms: Option<u64>,
    /// Small text files to place in /workspace (the working directory) before the run:
    /// relative path → content, e.g. {"data.csv": "a,b\n1,2\n"}. At most 100 files and
    /// 1 MiB together.
    pub files: Option<BTreeMap<String, String>>,
    /// Upstream tools the program may call, as `server__tool` names or globs such as
    /// `filesystem__*` (default: every tool the server allows; [] allows none).
    pub allowed_tools: Option<Vec<String>>,
}

const PYTHON_DESCRIPTION: &str = "Run a Python 3.11 program in a fresh, isolated Linux sandbox \
and return its stdout, stderr and exit status. The standard library is available; there is no \
network and no pip. Files: /tmp and /workspace (the working directory) are writable scratch \
space, gone after the run; pass small input files with `files`. The tools of the upstream MCP \
servers (see list_servers) are callable from the code: `from servers.<server> import <tool>` \
(typed functions with keyword arguments), or `import codebox; codebox.call_tool(\"<server>__<tool>\", \
{...})`; find tools with `codebox.search_tools(\"words\")`. Keep large tool results inside the \
program and print only what you need to see. A program that raises or exits non-zero is \
reported with isError and the traceback in stderr.";

const TYPESCRIPT_DESCRIPTION: &str = "Run a TypeScript program (Deno 2, ES modules, top-level \
await) in a fresh, isolated Linux sandbox and return its stdout, stderr and exit status. No \
network and no npm packages. /tmp and /workspace (the working directory) are writable \
scratch space, gone after the run; pass small input files with `files`. The tools of the \
upstream MCP servers (see list_servers) are callable: `import { readTextFile } from \
\"/servers/filesystem/index.ts\"` (typed, camelCase per tool), or `import { callMCPTool, \
searchTools } from \"/servers/client.ts\"` then `await callMCPTool(\"<server>__<tool>\", {...})`. \
Keep large tool results inside the program and print only what you need to see. An uncaught \
exception is reported with isError and the stack in stderr.";

#[tool_router]
impl CodeboxServer {
    pub fn new(
        spawner: SpawnerClient,
        settings: Settings,
        layers: Vec<doctor::Check>,
        upstreams: Upstreams,
    ) -> Self {
        let admission = Admission::new(settings.concurrency, settings.queue);
        CodeboxServer {
            state: Arc::new(State {
                spawner,
                settings,
                admission,
                started: Instant::now(),
                counters: Counters::default(),
                layers,
                log_level: std::sync::Mutex::new(LoggingLevel::Info),
                upstreams,
                wrappers: wrappers::Wrappers::new(std::env::temp_dir()),
            }),
            tool_router: Self::tool_router(),
        }
    }

    /// Refuses new executions from now on; running ones finish (graceful shutdown).
    pub fn stop_admitting(&self) {
        self.state.admission.close();
    }

    /// Executions running now.
    pub fn running(&self) -> usize {
        self.state.admission.running()
    }

    #[tool(
        name = "execute_python",
        description = PYTHON_DESCRIPTION,
        output_schema = rmcp::handler::server::common::schema_for_output::<ExecutionResult>()
    )]
    async fn execute_python(
        &self,
        Parameters(params): Parameters<ExecuteParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        self.execute(Language::Python, params, ctx).await
    }

    #[tool(
        name = "execute_typescript",
        description = TYPESCRIPT_DESCRIPTION,
        output_schema = rmcp::handler::server::common::schema_for_output::<ExecutionResult>()
    )]
    async fn execute_typescript(
        &self,
        Parameters(params): Parameters<ExecuteParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        self.execute(Language::TypeScript, params, ctx).await
    }

    #[tool(
        name = "health",
        description = "codebox's own state: version, uptime, the sandbox isolation layers in \
                       force on this host, executions run/failed/running and the queue depth."
    )]
    async fn health(&self) -> Result<CallToolResult, McpError> {
        let s = &self.state;
        let layers: Vec<serde_json::Value> = s
            .layers
            .iter()
            .map(|c| serde_json::json!({"layer": c.layer, "status": c.status, "detail": c.detail}))
            .collect();
        let value = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_s": s.started.elapsed().as_secs(),
            "profile": s.settings.profile.name,
            "layers": layers,
            "executions": {
                "run": s.counters.run.load(Ordering::Relaxed),
                "failed": s.counters.failed.load(Ordering::Relaxed),
                "running": s.admission.running(),
            },
            "queue_depth": s.admission.waiting(),
            "concurrency": s.settings.concurrency,
            "upstreams": self.server_list(),
        });
        Ok(CallToolResult::structured(value))
    }

    #[tool(
        name = "list_servers",
        description = "The upstream MCP servers whose tools sandboxed code can call: name, \
                       status (ready, connecting, reconnecting, failed) and tool count. In \
                       execute_python use `from servers.<name> import <tool>` or \
                       `codebox.call_tool(\"<server>__<tool>\", {...})`; in \
                       execute_typescript `import { <toolInCamelCase> } from \
                       \"/servers/<name>/index.ts\"`. Find tools with codebox.search_tools."
    )]
    async fn list_servers(&self) -> Result<CallToolResult, McpError> {
        let servers = self.server_list();
        let mut text = String::new();
        for s in &servers {
            text.push_str(&format!(
                "{} ({}): {} tools\n",
                s["name"].as_str().unwrap_or(""),
                s["status"].as_str().unwrap_or(""),
                s["tool_count"]
            ));
        }
        if servers.is_empty() {
            text.push_str("no upstream servers are configured\n");
        }
        let mut result = CallToolResult::structured(serde_json::json!({ "servers": servers }));
        result.content = vec![ContentBlock::text(text)];
        Ok(result)
    }
}

impl CodeboxServer {
    /// The upstream servers as `list_servers` and `health` report them.
    fn server_list(&self) -> Vec<serde_json::Value> {
        self.state
            .upstreams
            .servers()
            .into_iter()
            .map(|s| {
                serde_json::json!({
                    "name": s.name,
                    "status": s.state.to_string(),
                    "tool_count": s.tool_count,
                    "last_error": s.last_error,
                })
            })
            .collect()
    }

    /// The files and limits of a call, or why they are refused.
    fn checked_arguments(
        &self,
        files: Option<BTreeMap<String, String>>,
        timeout_ms: Option<u64>,
        allowed_tools: Option<&[String]>,
        code: &str,
    ) -> Result<(BTreeMap<String, String>, crate::sandbox::Limits, AllowList), String> {
        if code.len() > runtime::MAX_CODE_BYTES {
            return Err(format!(
                "code is {} bytes; the limit is {} bytes",
                code.len(),
                runtime::MAX_CODE_BYTES
            ));
        }
        let files = files.unwrap_or_default();
        runtime::validate_files(&files).map_err(|e| e.to_string())?;
        let mut limits = self.state.settings.profile.limits.clone();
        if let Some(ms) = timeout_ms {
            let max = self.state.settings.max_timeout;
            if ms == 0 || Duration::from_millis(ms) > max {
                return Err(format!(
                    "timeout_ms must be between 1 and {}",
                    max.as_millis()
                ));
            }
            limits.timeout = Duration::from_millis(ms);
        }
        let allow = match allowed_tools {
            None => self.state.settings.allowed_tools.clone(),
            Some(asked) => self
                .state
                .settings
                .allowed_tools
                .clone()
                .narrowed_by(&AllowList::new(asked).map_err(|e| e.to_string())?),
        };
        Ok((files, limits, allow))
    }

    async fn execute(
        &self,
        language: Language,
        params: ExecuteParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let s = &self.state;
        // Arguments that parse but are out of range are tool execution errors, not
        // protocol errors (MCP 2025-11-25, "Error Handling"): the model reads them and
        // can correct the call.
        let checked = self.checked_arguments(
            params.files,
            params.timeout_ms,
            params.allowed_tools.as_deref(),
            &params.code,
        );
        let (files, limits, allow) = match checked {
            Ok(checked) => checked,
            Err(why) => {
                tracing::info!(%why, "tool call refused: invalid arguments");
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "invalid arguments: {why}"
                ))]));
            }
        };
        let _slot = match s.admission.enter().await {
            Ok(slot) => slot,
            Err(busy) => {
                return Ok(CallToolResult::error(vec![ContentBlock::text(
                    busy.to_string(),
                )]))
            }
        };
        // The wrappers of the current catalog, held until the sandbox is gone.
        let wrappers = match s.wrappers.for_catalog(&s.upstreams.catalog()) {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = ?e, "generating the tool wrappers failed");
                None
            }
        };
        let spec = SpawnSpec {
            language,
            profile: s.settings.profile.name.clone(),
            limits: limits.clone(),
            workspace: None,
            servers: wrappers.as_ref().map(|w| w.path().to_path_buf()),
        };
        let backend: Arc<dyn ToolBackend> = Arc::new(s.upstreams.clone());
        let proxy = ProxySession::new(backend, allow, s.settings.proxy_limits.clone());
        let sandbox = match s.spawner.spawn(spec).await {
            Ok(sb) => sb,
            Err(e) => {
                tracing::error!(?e, "spawning a sandbox failed");
                s.counters.failed.fetch_add(1, Ordering::Relaxed);
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "the sandbox could not be created: {e}"
                ))]));
            }
        };

        // Stream output as progress notifications, at most every 100 ms per stream.
        let progress = ctx.meta.get_progress_token();
        let peer = ctx.peer.clone();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Stream, Vec<u8>)>();
        let forwarder = progress.map(|token| {
            tokio::spawn(async move {
                let mut n = 0u64;
                let mut pending = String::new();
                let mut last = Instant::now() - Duration::from_secs(1);
                loop {
                    let item = tokio::time::timeout(Duration::from_millis(100), rx.recv()).await;
                    let done = matches!(item, Ok(None));
                    if let Ok(Some((stream, chunk))) = item {
                        let prefix = if stream == Stream::Stderr {
                            "[stderr] "
                        } else {
                            ""
                        };
                        pending.push_str(prefix);
                        pending.push_str(&String::from_utf8_lossy(&chunk));
                    }
                    if !pending.is_empty() && (done || last.elapsed() >= Duration::from_millis(100))
                    {
                        n += 1;
                        let param = ProgressNotificationParam::new(token.clone(), n as f64)
                            .with_message(std::mem::take(&mut pending));
                        let _ = peer.notify_progress(param).await;
                        last = Instant::now();
                    }
                    if done {
                        break;
                    }
                }
            })
        });
        let stream_output = forwarder.is_some();
        let cancel = ctx.ct.clone();
        let serve_proxy = proxy.clone();
        let outcome = sandbox
            .run_with_channel(
                &runtime::boot_frame_with_files(&params.code, &files),
                Some(Box::new(move |stream| Box::pin(serve_proxy.serve(stream)))),
                (limits.stdout_cap, limits.stderr_cap),
                limits.timeout,
                async move { cancel.cancelled().await },
                |stream, chunk| {
                    if stream_output {
                        let _ = tx.send((stream, chunk.to_vec()));
                    }
                },
            )
            .await;
        drop(tx);
        if let Some(f) = forwarder {
            let _ = f.await;
        }
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                s.counters.failed.fetch_add(1, Ordering::Relaxed);
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "the sandbox failed: {e}"
                ))]));
            }
        };
        drop(wrappers);
        let mut result = execution::result_from(language, None, true, outcome);
        let report = proxy.report();
        result.tool_calls = report.tool_calls;
        result.tool_channel_error = report.channel_error;
        s.counters.run.fetch_add(1, Ordering::Relaxed);
        if result.failed() {
            s.counters.failed.fetch_add(1, Ordering::Relaxed);
        }
        let level = if result.failed() {
            LoggingLevel::Notice
        } else {
            LoggingLevel::Info
        };
        self.log(
            &ctx.peer,
            level,
            serde_json::json!({
                "event": "execution",
                "language": language,
                "exit_code": result.exit_code,
                "signal": result.signal,
                "timed_out": result.timed_out,
                "duration_ms": result.duration_ms,
            }),
        )
        .await;
        Ok(render(&result))
    }

    /// Sends a log message to the client if its `logging/setLevel` lets it through.
    async fn log(
        &self,
        peer: &rmcp::Peer<RoleServer>,
        level: LoggingLevel,
        data: serde_json::Value,
    ) {
        let threshold = *self.state.log_level.lock().expect("log level lock");
        if severity(level) >= severity(threshold) {
            let param = LoggingMessageNotificationParam::new(level, data).with_logger("codebox");
            let _ = peer.notify_logging_message(param).await;
        }
    }
}

/// RFC 5424 order, least severe first.
fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// structuredContent plus a short text a model reads first.
fn render(r: &ExecutionResult) -> CallToolResult {
    let mut text = String::new();
    let how = if r.timed_out {
        "timed out (killed)".to_string()
    } else if r.oom_killed {
        "killed: out of memory".to_string()
    } else if r.seccomp_violation {
        "killed by the seccomp policy".to_string()
    } else if let Some(code) = r.exit_code {
        format!("exit {code}")
    } else {
        format!("killed by signal {}", r.signal.unwrap_or(0))
    };
    text.push_str(&format!("{how} in {:.0} ms\n", r.duration_ms));
    if !r.stdout.is_empty() {
        text.push_str(&r.stdout);
        if !r.stdout.ends_with('\n') {
            text.push('\n');
        }
    }
    if r.stdout_truncated {
        text.push_str(&format!(
            "[stdout truncated: {} bytes in total]\n",
            r.stdout_total_bytes
        ));
    }
    if !r.stderr.is_empty() {
        text.push_str("--- stderr ---\n");
        text.push_str(&r.stderr);
    }
    let value = serde_json::to_value(r).unwrap_or_default();
    let mut result = if r.failed() {
        CallToolResult::structured_error(value)
    } else {
        CallToolResult::structured(value)
    };
    result.content = vec![ContentBlock::text(text)];
    result
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for CodeboxServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_logging()
                .build(),
        )
        .with_server_info(rmcp::model::Implementation::new(
            "codebox",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(
            "Run Python or TypeScript in throw-away sandboxes with execute_python / \
             execute_typescript. Write one complete program per call and print only what \
             matters: the data stays in the sandbox, only stdout/stderr come back.",
        )
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        *self.state.log_level.lock().expect("log level lock") = request.level;
        Ok(())
    }
}
