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
pub mod resources;
pub mod schema;
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
use crate::proxy::{AllowList, IndexedUpstreams, ProxyLimits, ProxySession, ToolBackend};
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
    backend: Arc<IndexedUpstreams>,
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
    /// The whole program. Only what it prints comes back.
    pub code: String,
    /// Wall-clock limit in ms (default 30000).
    pub timeout_ms: Option<u64>,
    /// Text files to create in /workspace first: {"path": "content"}; at most 100, 1 MiB.
    pub files: Option<BTreeMap<String, String>>,
    /// Upstream tools the code may call: names or globs like "filesystem__*" (default all; [] none).
    pub allowed_tools: Option<Vec<String>>,
}

/// Arguments of `search_tools`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchParams {
    /// What you need, in words, e.g. "read a file" ("" lists all).
    pub query: String,
    /// "name", "summary" (default: + description, TypeScript signature) or "full" (+ schemas, Python signature).
    pub detail: Option<String>,
    /// Only this server's tools.
    pub server: Option<String>,
    /// Page size, 1-100 (default 10).
    pub limit: Option<usize>,
    /// next_cursor of the previous page.
    pub cursor: Option<String>,
}

/// Arguments of `get_tool`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetToolParams {
    /// The tool's name, "<server>__<tool>".
    pub name: String,
}

const PYTHON_DESCRIPTION: &str = "Run a Python 3.11 program (standard library only, no \
network) in a fresh isolated sandbox; returns stdout, stderr and the exit status. The working \
directory /workspace and /tmp are scratch space. Call upstream MCP tools from the code: \
`from servers.<server> import <tool>` (typed, keyword arguments) or \
`codebox.call_tool(\"<server>__<tool>\", {...})`; find them with search_tools. Keep large \
data in the program and print only what you need. Failures come back with isError and the \
traceback.";

const TYPESCRIPT_DESCRIPTION: &str = "Run a TypeScript program (Deno 2, top-level await, no \
network, no npm) in a fresh isolated sandbox; returns stdout, stderr and the exit status. The \
working directory /workspace and /tmp are scratch space. Call upstream MCP tools from the \
code: `import { readTextFile } from \"/servers/<server>/index.ts\"` (typed, camelCase) or \
`callMCPTool(\"<server>__<tool>\", {...})` from \"/servers/client.ts\"; find them with \
search_tools. Keep large data in the program and print only what you need. Failures come back \
with isError and the stack.";

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
                backend: Arc::new(IndexedUpstreams::new(upstreams)),
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
        output_schema = schema::execution_output_schema()
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
        output_schema = schema::execution_output_schema()
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
        description = "codebox's state: version, uptime, isolation layers, executions, queue, \
                       upstream servers."
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
            "context_tokens": {
                "upstream_tools_list": crate::tokens::catalog_tokens(&s.backend.catalog()),
                "codebox_tools_list": crate::tokens::tools_list_tokens(
                    &Self::tool_definitions()
                        .iter()
                        .filter_map(|t| serde_json::to_value(t).ok())
                        .collect::<Vec<_>>(),
                ),
            },
        });
        Ok(CallToolResult::structured(value))
    }

    #[tool(
        name = "search_tools",
        description = "Search the upstream MCP tools callable from execute_python and \
                       execute_typescript code, best match first. Start with detail \
                       \"summary\", then get_tool or detail \"full\" for the ones you use."
    )]
    async fn search_tools(
        &self,
        Parameters(p): Parameters<SearchParams>,
    ) -> Result<CallToolResult, McpError> {
        let detail = match p.detail.as_deref().map(str::parse).transpose() {
            Ok(d) => d.unwrap_or(crate::catalog::Detail::Summary),
            Err(e) => return Ok(tool_error(format!("invalid arguments: {e}"))),
        };
        let query = crate::catalog::SearchQuery {
            text: p.query,
            server: p.server,
            detail,
            limit: p.limit.unwrap_or(crate::catalog::DEFAULT_LIMIT),
            cursor: p.cursor,
        };
        let allowed = &self.state.settings.allowed_tools;
        let page = match self
            .state
            .backend
            .index()
            .search(&query, &|n| allowed.allows(n))
        {
            Ok(page) => page,
            Err(e) => return Ok(tool_error(format!("invalid arguments: {e}"))),
        };
        let mut text = format!("{} of {} matching tools", page.tools.len(), page.total);
        if let Some(c) = &page.next_cursor {
            text.push_str(&format!(" (more with cursor {c:?})"));
        }
        text.push('\n');
        for t in &page.tools {
            text.push_str(t["name"].as_str().unwrap_or(""));
            if let Some(d) = t.get("description").and_then(|d| d.as_str()) {
                text.push_str(": ");
                text.push_str(d);
            }
            text.push('\n');
        }
        let value = serde_json::json!({
            "tools": page.tools,
            "next_cursor": page.next_cursor,
            "total": page.total,
        });
        let mut result = CallToolResult::structured(value);
        result.content = vec![ContentBlock::text(text)];
        Ok(result)
    }

    #[tool(
        name = "get_tool",
        description = "One upstream tool in full: description, input and output schema, its \
                       TypeScript and Python signatures, and an example call."
    )]
    async fn get_tool(
        &self,
        Parameters(p): Parameters<GetToolParams>,
    ) -> Result<CallToolResult, McpError> {
        if !self.state.settings.allowed_tools.allows(&p.name) {
            return Ok(tool_error(format!(
                "tool {:?} is not allowed on this server",
                p.name
            )));
        }
        match self.state.backend.index().get(&p.name) {
            Some(tool) => Ok(CallToolResult::structured(tool)),
            None => Ok(tool_error(format!(
                "no tool named {:?}; find tools with search_tools",
                p.name
            ))),
        }
    }

    #[tool(
        name = "list_servers",
        description = "The upstream MCP servers callable from sandboxed code: name, status \
                       and tool count."
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
    /// The wrapper tree of the current catalog (`None` without upstream tools).
    fn wrapper_dir(&self) -> Option<Arc<wrappers::WrapperDir>> {
        match self
            .state
            .wrappers
            .for_catalog(&self.state.backend.catalog())
        {
            Ok(dir) => dir,
            Err(e) => {
                tracing::error!(error = ?e, "generating the tool wrappers failed");
                None
            }
        }
    }

    /// The upstream servers as `list_servers` and `health` report them.
    fn server_list(&self) -> Vec<serde_json::Value> {
        self.state
            .backend
            .upstreams()
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
        let wrappers = match s.wrappers.for_catalog(&s.backend.catalog()) {
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
        let backend: Arc<dyn ToolBackend> = s.backend.clone();
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
                runtime::boot_frame_with_files(&params.code, &files),
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

    /// codebox's own tool definitions, as its `tools/list` sends them (no server needed).
    pub fn tool_definitions() -> Vec<rmcp::model::Tool> {
        Self::tool_router().list_all()
    }
}

fn tool_error(message: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message)])
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
                .enable_resources()
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

    async fn list_resources(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, McpError> {
        let items = match self.wrapper_dir() {
            Some(dir) => resources::list(dir.path()),
            None => Vec::new(),
        };
        Ok(rmcp::model::ListResourcesResult::with_all_items(items))
    }

    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, McpError> {
        let dir = self.wrapper_dir();
        let text = match &dir {
            Some(dir) => resources::read(dir.path(), &request.uri),
            None => Err(format!(
                "unknown resource {:?}: no upstream tools",
                request.uri
            )),
        };
        match text {
            Ok(text) => {
                Ok(
                    rmcp::model::ReadResourceResult::new(vec![
                        rmcp::model::ResourceContents::text(text, request.uri.clone())
                            .with_mime_type("text/x-typescript"),
                    ])
                    .into(),
                )
            }
            Err(why) => Err(McpError::resource_not_found(why, None)),
        }
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
