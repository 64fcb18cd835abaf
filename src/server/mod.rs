//! The MCP server codebox exposes (rmcp), over stdio and streamable HTTP.
//!
//! Tools: `execute_python` and `execute_typescript` (one program per call, optionally in a
//! session with a persistent workspace and a live interpreter), `search_tools`,
//! `get_tool`, `list_servers`, the skills tools (`save_skill`, `list_skills`,
//! `get_skill`, `delete_skill`), `close_session` and `health`.
//!
//! Each execution ([`execute`]): arguments checked, the client's rate limits, the
//! session, admission (a slot or a queue place, else "busy, retry"), a sandbox from the
//! spawner with the server's profile, the code over fd 3, output streamed as progress
//! notifications when the request carries a progress token, cancellation
//! (`notifications/cancelled`) killing the sandbox, and the result as structuredContent
//! plus a short text, with personal data tokenized when PII handling is on, and an audit
//! record. A program that fails is a tool result with `isError: true`, not a protocol
//! error.

// MCP logging (notifications/message, logging/setLevel) is deprecated by SEP-2577 in the
// newest protocol revision but still part of 2025-11-25, which codebox serves.
#![allow(deprecated)]

pub mod admission;
pub mod client;
mod health;
mod readiness;
pub mod rootfs_watch;
pub mod sandbox_checks;
mod session_owners;
mod settings;
pub mod tools;
pub mod transport;
mod upstream_status;
pub mod wiring;
pub use readiness::Layers;
pub use settings::Settings;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, LoggingLevel, ServerCapabilities, ServerConfig,
    SetLevelRequestParams,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData as McpError, RoleServer, ServerHandler};
use serde::Deserialize;

use crate::pii::Vault;
use crate::pool::WarmPool;
use crate::proxy::{IndexedUpstreams, ToolBackend};
use crate::ratelimit::RateLimiter;
use crate::runtime::Language;
use crate::session::Sessions;
use crate::skills::ClientSkills;
use crate::spawner::SpawnerClient;
use crate::upstream::Upstreams;

use admission::Admission;
pub use tools::reachable::reachable_by;
pub use tools::tool_set::ToolSet;

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
    /// The host's layers: checked at start-up (before any thread existed), the sandbox
    /// checks when they are in.
    layers: Arc<readiness::Layers>,
    /// Connections told when the resource list changes.
    listeners: readiness::Listeners,
    /// Opened by the first `initialize`: the upstream servers start then.
    upstreams_gate: std::sync::OnceLock<tokio_util::sync::CancellationToken>,
    log_level: std::sync::Mutex<LoggingLevel>,
    backend: Arc<IndexedUpstreams>,
    wrappers: Arc<crate::codegen::wrapper_dir::Wrappers>,
    rate: Arc<RateLimiter>,
    sessions: Sessions,
    skills: Option<ClientSkills>,
    /// Why the skills store could not be opened (reported by the skills tools).
    skills_error: Option<String>,
    /// Sandboxes started ahead of demand (`None` when `pool_size` is 0).
    pool: Option<WarmPool>,
    /// Cancelled when a shutdown's drain bound is reached: running executions are killed
    /// and answered "the server is stopping".
    stopping: tokio_util::sync::CancellationToken,
    /// Execute calls between arrival and answer.
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    /// The whole streams of results the output budget cut, as their clients' resources.
    kept_outputs: crate::output::KeptOutputs,
    /// Executions running or kept as tasks, each its client's.
    tasks: crate::tasks::ExecutionTasks,
    /// Calls of 2026-07-28 clients waiting for the answer to their question.
    parked: transport::input_rounds::ParkedCalls,
    /// The PII token maps of stateless (2026-07-28 HTTP) clients.
    client_vaults: wiring::pii_vaults::ClientVaults,
}

/// One MCP connection's own state (for a 2026-07-28 HTTP request: that request's).
struct Connection {
    /// Names the connection (the client identity of unauthenticated 2025-11-25 HTTP).
    id: String,
    /// The PII token map of executions outside a session: the connection's own, or a
    /// stateless client's from [`wiring::pii_vaults::ClientVaults`] (see [`Self::client_of`]).
    vault: std::sync::OnceLock<Arc<Vault>>,
}

/// The MCP server; one value per connection, sharing [`State`].
#[derive(Clone)]
pub struct CodeboxServer {
    state: Arc<State>,
    conn: Arc<Connection>,
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
    /// Files to create in /workspace first: {"path": "text" | {"base64": "..."}}; at
    /// most 100, `max_files_size` together.
    pub files: Option<BTreeMap<String, crate::runtime::FileContent>>,
    /// Upstream tools the code may call: names or globs like "filesystem__*" (default all; [] none).
    pub allowed_tools: Option<Vec<String>>,
    /// "new" starts a session (id in the result); an id continues it: /workspace persists.
    pub session: Option<String>,
    /// With session: keep the interpreter (variables persist); false ends it.
    pub keep_alive: Option<bool>,
    /// "output": personal data in output becomes tokens; "strict": hidden from the code too.
    pub pii: Option<String>,
    /// Hosts the code may reach through the egress proxy: narrows the server's allowlist
    /// ([] none); refused when the server has no egress.
    pub network: Option<Vec<String>>,
    /// Packages to install first: pip requirements (Python), `npm:`/`jsr:` specifiers
    /// (TypeScript, whose imports of such specifiers are added).
    pub packages: Option<Vec<String>>,
    /// Characters of stdout+stderr returned (default 20000): head and tail; the whole
    /// output is then a resource.
    pub output_budget: Option<u64>,
    /// Workspace files returned with the result, besides those under /workspace/out.
    pub outputs: Option<Vec<String>>,
}

/// Arguments of `search_tools`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchParams {
    /// e.g. "read a file"; "" lists all.
    pub query: String,
    /// "name", "summary" (default) or "full".
    pub detail: Option<String>,
    /// Only this server's tools.
    pub server: Option<String>,
    /// Default 10, at most 100.
    pub limit: Option<usize>,
    /// A result's next_cursor.
    pub cursor: Option<String>,
}

/// Arguments of `get_tool`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetToolParams {
    /// "<server>__<tool>".
    pub name: String,
}

const PYTHON_DESCRIPTION: &str = "Run a Python 3.11 program (numpy, pandas, \
matplotlib; no network) in a fresh sandbox. Returns its output, last expression's value \
and /workspace/out files. Upstream tools: \
`from servers.<server> import <tool>`; skills: `from skills import <name>`.";

const TYPESCRIPT_DESCRIPTION: &str = "execute_python for TypeScript (Deno 2; no network), \
same arguments. Upstream tools: `import { tool } from \
\"/servers/<server>/index.ts\"`; skills: \"/skills/<name>/skill.ts\".";

impl CodeboxServer {
    pub fn new(
        spawner: SpawnerClient,
        settings: Settings,
        layers: readiness::Layers,
        upstreams: Upstreams,
    ) -> anyhow::Result<Self> {
        let admission = Admission::new(settings.concurrency, settings.queue);
        let parked = transport::input_rounds::ParkedCalls::with_replica(settings.replica.clone());
        let sessions = Sessions::new(
            &settings.sessions_base,
            settings.sessions.clone(),
            settings.sandbox_ids,
        )?
        .with_replica(settings.replica.clone())
        .with_persist(settings.persist.clone())
        .map_err(|e| {
            anyhow::anyhow!(
                "[sessions]: cannot open the paused sessions' store: {}",
                crate::error_chain::error_chain(&e)
            )
        })?;
        let (skills, skills_error) = match &settings.skills_dir {
            None => (
                None,
                Some("no skills directory is configured (skills_dir)".to_string()),
            ),
            Some(dir) => match ClientSkills::open(dir, settings.skills_shared.as_deref()) {
                Ok(store) => {
                    match reachable_by(dir, settings.sandbox_ids, tools::reachable::SKILLS_DIR)
                        .and_then(|()| match &settings.skills_shared {
                            Some(shared) => reachable_by(
                                shared,
                                settings.sandbox_ids,
                                tools::reachable::SKILLS_DIR,
                            ),
                            None => Ok(()),
                        }) {
                        Ok(()) => (Some(store), None),
                        Err(why) => {
                            tracing::error!(dir = %dir.display(), %why, "skills are off");
                            (None, Some(format!("skills are unavailable: {why}")))
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(dir = %dir.display(), error = %e, "cannot open the skills store");
                    (None, Some(format!("the skills store is unavailable: {e}")))
                }
            },
        };
        let backend = Arc::new(IndexedUpstreams::new(upstreams));
        let wrappers = Arc::new(crate::codegen::wrapper_dir::Wrappers::new(
            std::env::temp_dir(),
        ));
        let pool = (!settings.pool.is_off()).then(|| {
            let skills = skills.as_ref().and_then(|k: &ClientSkills| k.shared_root());
            let templates = wiring::pool::templates(&settings, skills, &wrappers, &backend);
            WarmPool::new(spawner.clone(), settings.pool, templates)
        });
        if let Some(vms) = &settings.microvm {
            // A template per language boots in the background; calls boot cold until
            // its clones wait.
            if let Err(e) = vms.start_warm(
                &spawner,
                &settings.profile.limits,
                &settings.profile.policy,
                // A clone's jail outlives the longest run a call may have.
                settings.max_timeout.max(settings.profile.limits.timeout),
            ) {
                tracing::error!(error = %e, "the warm microVMs could not be started; every call boots");
            }
        }
        let kept_outputs = crate::output::KeptOutputs::new(settings.kept_output);
        let tasks = crate::tasks::ExecutionTasks::new(settings.tasks)
            .with_replica(settings.replica.clone());
        let settings_detector = settings.pii_detector.clone();
        let state = Arc::new(State {
            spawner,
            rate: RateLimiter::new(settings.rate),
            settings,
            admission,
            started: Instant::now(),
            counters: Counters::default(),
            layers: Arc::new(layers),
            listeners: readiness::Listeners::default(),
            upstreams_gate: std::sync::OnceLock::new(),
            log_level: std::sync::Mutex::new(LoggingLevel::Info),
            backend,
            wrappers,
            sessions,
            skills,
            skills_error,
            pool,
            stopping: tokio_util::sync::CancellationToken::new(),
            in_flight: Arc::default(),
            kept_outputs,
            tasks,
            parked,
            client_vaults: wiring::pii_vaults::ClientVaults::new(settings_detector),
        });
        wiring::pool::follow_catalog(Arc::downgrade(&state));
        // Idle sessions expire in the background.
        let weak = Arc::downgrade(&state);
        tokio::spawn(async move {
            loop {
                let period = match weak.upgrade() {
                    Some(s) => (s.settings.sessions.idle_ttl / 4)
                        .clamp(Duration::from_millis(200), Duration::from_secs(30)),
                    None => return,
                };
                tokio::time::sleep(period).await;
                let Some(s) = weak.upgrade() else { return };
                s.sessions.sweep().await;
            }
        });
        Ok(Self::with_state(state))
    }

    fn with_state(state: Arc<State>) -> Self {
        let network_mode = state.settings.profile.network_mode;
        let tools = state.settings.tools;
        let replica = state.settings.replica.is_some();
        let persist = state.sessions.persist().is_some();
        CodeboxServer {
            state,
            conn: Arc::new(Connection {
                id: client::new_connection_id(),
                vault: std::sync::OnceLock::new(),
            }),
            tool_router: {
                let mut router = Self::all_tools();
                tools.apply(&mut router);
                if !persist {
                    tools::sessions::without_persistence(&mut router);
                }
                wiring::egress::describe_network(&mut router, network_mode);
                if replica {
                    tools::schema::route_sessions_by_header(&mut router);
                }
                router
            },
        }
    }

    /// This process's name among replicas, if it has one.
    pub fn replica(&self) -> Option<&crate::replica::ReplicaName> {
        self.state.settings.replica.as_ref()
    }

    /// The server for a new connection: shared state, its own identity and token map.
    pub fn for_new_connection(&self) -> Self {
        Self::with_state(self.state.clone())
    }

    /// A fresh PII token map (for a new session).
    fn new_vault(&self) -> Arc<Vault> {
        Arc::new(Vault::new(self.state.settings.pii_detector.clone()))
    }

    /// The caller's identity. A stateless (2026-07-28 HTTP) caller's token map is its
    /// client's, so every entry point with a request calls this first.
    fn client_of(&self, ctx: &RequestContext<RoleServer>) -> String {
        let caller = client::client_of(ctx, &self.conn.id);
        if caller.stateless_http {
            let _ = (self.conn.vault).get_or_init(|| self.state.client_vaults.of(&caller.client));
        }
        caller.client
    }

    /// The PII token map of executions outside a session and of model-facing results.
    fn vault(&self) -> &Arc<Vault> {
        self.conn.vault.get_or_init(|| self.new_vault())
    }

    /// Takes the sandbox checks `serve` started before its runtime existed; checkers that
    /// do not finish are replaced from `source` (see `sandbox_checks.rs`).
    pub fn follow_sandbox_checks(
        &self,
        first: crate::doctor::deferred::PendingChecks,
        source: Arc<dyn sandbox_checks::CheckerSource>,
    ) {
        sandbox_checks::follow(
            self.state.layers.clone(),
            first,
            source,
            self.state.settings.profile.name.clone(),
        );
    }

    /// Re-checks `rootfs` (as `serve` verified it) in the background and refuses
    /// executions once it changed (see `rootfs_watch.rs`).
    pub fn watch_rootfs(
        &self,
        rootfs: crate::rootfs::Rootfs,
        stamp_dir: Option<std::path::PathBuf>,
    ) {
        rootfs_watch::start(
            self.state.layers.rootfs.clone(),
            rootfs,
            stamp_dir,
            rootfs_watch::interval(),
        );
    }

    /// Cancels `gate` when the first client's `initialize` is answered (see
    /// `Upstreams::start_gated`).
    pub fn open_on_initialize(&self, gate: tokio_util::sync::CancellationToken) {
        let _ = self.state.upstreams_gate.set(gate);
    }

    /// Whether executions can run as configured, and each part's state (`/readyz`). A
    /// draining server is not ready, so balancers stop sending it work.
    pub fn readiness(&self) -> (bool, serde_json::Value) {
        let (ready, mut value) = readiness::value(
            &self.state.layers,
            self.state.pool.as_ref(),
            self.state.backend.upstreams(),
        );
        let draining = self.state.admission.is_closed();
        if let Some(object) = value.as_object_mut() {
            object.insert("ready".into(), (ready && !draining).into());
            object.insert("draining".into(), draining.into());
            if let Some(replica) = self.replica() {
                object.insert("replica".into(), replica.as_str().into());
            }
        }
        (ready && !draining, value)
    }

    /// Refuses new executions from now on; running ones finish (graceful shutdown).
    pub fn stop_admitting(&self) {
        self.state.admission.close();
        self.state.listeners.subscriptions.close();
    }

    /// Executions running now.
    pub fn running(&self) -> usize {
        self.state.admission.running()
    }

    /// The drain bound is reached: kills every running execution; each is answered with
    /// an error result saying the server is stopping.
    pub fn kill_running(&self) {
        self.state.stopping.cancel();
    }

    /// Execute calls not yet answered (they may still wait for admission).
    pub fn unanswered(&self) -> usize {
        self.state.in_flight.load(Ordering::SeqCst)
    }
    /// Whether nothing runs and the warm pool (if any) is full with nothing starting: the
    /// state a harness measuring one call at a time waits for (`benches/warm_call_instructions.rs`).
    pub fn settled(&self) -> bool {
        self.running() == 0
            && self.unanswered() == 0
            && self.state.pool.as_ref().is_none_or(WarmPool::is_full)
            && self
                .state
                .settings
                .microvm
                .as_ref()
                .is_none_or(|vms| vms.warm_full())
    }

    /// Ends every session (killing live interpreters, removing workspaces) and empties
    /// the warm pool (its sandboxes reaped, their cgroups removed).
    pub async fn shutdown(&self) {
        // Executions were drained or killed before: what is left of tasks is their records.
        self.state.tasks.shutdown();
        if let Some(pool) = &self.state.pool {
            pool.shutdown().await;
        }
        if let Some(vms) = &self.state.settings.microvm {
            vms.shutdown().await;
        }
        self.state.sessions.shutdown().await;
    }
}

#[tool_router]
impl CodeboxServer {
    #[tool(
        name = "execute_python",
        description = PYTHON_DESCRIPTION,
        input_schema = tools::schema::execution_input_schema(true)
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
        input_schema = tools::schema::execution_input_schema(false)
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
        description = "codebox's state: version, isolation layers, load, limits, network, \
                       upstream servers."
    )]
    async fn health(&self) -> Result<CallToolResult, McpError> {
        Ok(self.for_model(CallToolResult::structured(self.health_value())))
    }

    #[tool(
        name = "search_tools",
        description = "Find upstream tools for execute_* code with signatures, best \
                       first; detail \"full\" adds schemas.",
        input_schema = tools::schema::search_input_schema()
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
        // Right after start-up the servers are still connecting: wait for their first
        // attempts (bounded by upstream_wait) rather than answer "0 matching tools".
        self.state
            .backend
            .first_attempts(query.server.clone())
            .await;
        let allowed = &self.state.settings.allowed_tools;
        let mut page = match self
            .state
            .backend
            .index()
            .search(&query, &|n| allowed.allows(n))
        {
            Ok(page) => page,
            Err(e) => return Ok(tool_error(format!("invalid arguments: {e}"))),
        };
        upstream_status::mark_down_servers(&self.state.backend, &mut page.tools);
        let mut text = format!("{} of {} matching tools", page.tools.len(), page.total);
        if let Some(c) = &page.next_cursor {
            text.push_str(&format!(" (more with cursor {c:?})"));
        }
        text.push('\n');
        for t in &page.tools {
            text.push_str(&crate::catalog::text_entry(t));
        }
        let mut value = serde_json::json!({
            "tools": page.tools,
            "next_cursor": page.next_cursor,
            "total": page.total,
        });
        upstream_status::add_not_ready(self.state.backend.upstreams(), &mut text, &mut value);
        let mut result = CallToolResult::structured(value);
        result.content = vec![ContentBlock::text(text)];
        Ok(self.for_model(result))
    }

    #[tool(
        name = "get_tool",
        description = "An upstream tool in full: schemas, signatures, an example."
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
        let mut tool = self.state.backend.index().get(&p.name);
        if tool.is_none() {
            // Its server may still be making its first connection (bounded wait).
            let server = crate::upstream::naming::split(&p.name).map(|(s, _)| s.to_string());
            self.state.backend.first_attempts(server).await;
            tool = self.state.backend.index().get(&p.name);
        }
        match tool {
            Some(tool) => Ok(self.for_model(CallToolResult::structured(tool))),
            None => Ok(tool_error(format!(
                "no tool named {:?}; find tools with search_tools",
                p.name
            ))),
        }
    }

    #[tool(
        name = "list_servers",
        description = "Upstream MCP servers: name, status, tool count."
    )]
    async fn list_servers(&self) -> Result<CallToolResult, McpError> {
        self.state.backend.first_attempts(None).await;
        let (text, servers) = upstream_status::list(self.state.backend.upstreams());
        let mut result = CallToolResult::structured(serde_json::json!({ "servers": servers }));
        result.content = vec![ContentBlock::text(text)];
        Ok(self.for_model(result))
    }
}

impl CodeboxServer {
    /// The wrapper tree of the current catalog (`None` without upstream tools).
    fn wrapper_dir(&self) -> Option<Arc<crate::codegen::wrapper_dir::WrapperDir>> {
        wiring::pool::current_wrappers(&self.state.wrappers, &self.state.backend)
    }

    /// codebox's own tool definitions, as its `tools/list` sends them by default (no
    /// server needed).
    pub fn tool_definitions() -> Vec<rmcp::model::Tool> {
        Self::tool_definitions_for(ToolSet::Full)
    }

    /// codebox's own tool definitions under the `tools` setting `set`.
    pub fn tool_definitions_for(set: ToolSet) -> Vec<rmcp::model::Tool> {
        let mut router = Self::all_tools();
        set.apply(&mut router);
        tools::sessions::without_persistence(&mut router);
        router.list_all()
    }

    /// Every tool: execution and discovery, skills, sessions; input schemas compacted.
    fn all_tools() -> ToolRouter<Self> {
        let mut router = Self::tool_router() + Self::skills_router() + Self::sessions_router();
        tools::schema::compact_input_schemas(&mut router);
        router
    }
}

fn tool_error(message: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message)])
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for CodeboxServer {
    /// The router's answer, with error texts that quote the client bounded and no result
    /// larger than a client accepts (see `tools::render::bounded_answer`).
    async fn call_tool(
        &self,
        request: rmcp::model::CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, McpError> {
        self.client_of(&context);
        let set = self.state.settings.tools;
        if !self.tool_router.has_route(&request.name) && Self::all_tools().has_route(&request.name)
        {
            return Err(tools::tool_set::hidden_tool(&request.name, set));
        }
        if let Some(language) = self.task_language(&request, &context) {
            return self.execute_as_task(language, request, context);
        }
        if let Some(language) = self.rounds_language(&request, &context) {
            return self.execute_in_rounds(language, request, context).await;
        }
        let tcc = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        tools::render::bounded_answer(self.tool_router.call(tcc).await)
    }

    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        let answer = self.negotiate_initialize(&request);
        // The upstream servers start once the first client has its answer.
        if let Some(gate) = self.state.upstreams_gate.get() {
            gate.cancel();
        }
        answer
    }

    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        tracing::info!("client initialized");
        self.state.listeners.add(context.peer);
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_logging()
                .enable_prompts()
                .enable_completions()
                .enable_resources()
                .enable_resources_list_changed()
                .enable_tasks()
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
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, McpError> {
        Ok(self.resources_of(&context))
    }

    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, McpError> {
        self.read_resource_for(&request.uri, &context)
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, McpError> {
        let task = self.tasks_get(&request.task_id, &context)?;
        Ok(rmcp::model::GetTaskResult::new(task))
    }

    async fn update_task(
        &self,
        request: rmcp::model::UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.tasks_update(&request.task_id, request.input_responses, &context)
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.tasks_cancel(&request.task_id, &context)
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.set_log_level(request.level, &context)
    }

    async fn list_prompts(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListPromptsResult, McpError> {
        Ok(tools::prompts::list())
    }

    async fn get_prompt(
        &self,
        request: rmcp::model::GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetPromptResponse, McpError> {
        self.prompt_now(request)
    }

    async fn complete(
        &self,
        request: rmcp::model::CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CompleteResult, McpError> {
        self.complete_now(request)
    }

    fn accepted_subscription_filter(
        &self,
        requested: &rmcp::model::SubscriptionFilter,
    ) -> Option<rmcp::model::SubscriptionFilter> {
        Some(transport::listen::accepted(requested))
    }

    async fn listen(
        &self,
        subscription: rmcp::service::SubscriptionContext,
    ) -> Result<(), McpError> {
        self.listen_until_closed(subscription).await
    }
}
