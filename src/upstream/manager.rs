//! [`Upstreams`]: every configured upstream server behind one cloneable handle.
//!
//! `start` connects to all servers at once and returns when each has connected or failed
//! its first attempt (each bounded by the connect timeout); supervisors keep retrying in
//! the background. `call` goes to the server named by the exposed name's prefix; a server
//! that is not ready fails the call at once, and a connection that dies during a call
//! fails it at once too. Dropping the last handle stops everything as `shutdown` does,
//! without waiting.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult};
use rmcp::service::ServiceError;
use serde::Serialize;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::catalog::Catalog;
use super::config::ServerConfig;
use super::connection;
use super::naming;
use super::stdio_transport::transport_failure;
use super::supervisor::{self, Shared};

/// Timeouts and backoff for the upstream connections.
#[derive(Debug, Clone)]
pub struct UpstreamOptions {
    /// Spawn (or HTTP connect), `initialize` and the first `tools/list` of one server.
    pub connect_timeout: Duration,
    /// The first retry delay; it doubles on every failure up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// How long a stdio server's process group gets between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// How long a tool call waits for its server while it connects or reconnects
    /// (never longer than the call's own timeout) before failing with the server's state.
    pub call_wait: Duration,
    /// The largest message taken from a server (a stdio line, an SSE event). Over stdio
    /// a larger one is skipped without being buffered and the call it answered fails at
    /// once with an error naming this limit (see `stdio_transport`); over HTTP a larger
    /// SSE event ends rmcp's session (the call fails at once, the server is reconnected),
    /// and a JSON response body is bounded by rmcp itself at 16 MiB.
    pub max_message_bytes: usize,
}

impl Default for UpstreamOptions {
    fn default() -> Self {
        UpstreamOptions {
            connect_timeout: Duration::from_secs(30),
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
            kill_grace: Duration::from_secs(2),
            call_wait: Duration::from_secs(10),
            // Tool results are often sent twice (text and structuredContent): a 10 MB file
            // read is over 20 MB of JSON.
            max_message_bytes: 64 << 20,
        }
    }
}

/// Where a server is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerState {
    /// The first attempt is under way.
    Connecting,
    Ready,
    /// The last attempt failed (or the manager shut down); a retry is scheduled.
    Failed,
    /// The connection was lost, or a retry is under way.
    Reconnecting,
}

impl std::fmt::Display for ServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ServerState::Connecting => "connecting",
            ServerState::Ready => "ready",
            ServerState::Failed => "failed",
            ServerState::Reconnecting => "reconnecting",
        })
    }
}

/// One server as `list_servers` and `health` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerStatus {
    /// As configured in `.mcp.json`.
    pub name: String,
    /// The prefix of its tools' exposed names.
    pub ident: String,
    /// `stdio` or `http`.
    pub transport: &'static str,
    pub state: ServerState,
    /// Tools in the catalog: while down, those of the last connection.
    pub tool_count: usize,
    /// Why the last attempt failed or the last connection was lost.
    pub last_error: Option<String>,
    /// Connection attempts so far.
    pub attempts: u32,
    /// The stdio server's pid (and process group id) while ready.
    pub pid: Option<u32>,
    /// How long it has been in `state`.
    pub state_for: Duration,
    /// When its next attempt starts, while one is scheduled.
    pub next_attempt_in: Option<Duration>,
}

impl ServerStatus {
    /// What a call to one of its tools would be told now (`None` when it is ready).
    pub fn note(&self) -> Option<String> {
        (self.state != ServerState::Ready).then(|| {
            unavailable_text(
                &self.name,
                &self.state,
                &self.attempts,
                &self.state_for,
                &self.next_attempt_in,
                &self.last_error,
                &Duration::ZERO,
            )
        })
    }
}

/// Why a call to an upstream tool failed. Messages are complete on one line: they go back
/// to the code that made the call.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("no upstream tool {name:?}")]
    UnknownTool { name: String },
    #[error(
        "no upstream tool {name:?}: server {server:?} lists {listed} (a sandbox started \
         before the server's tools were known has wrappers of the old list: run again)"
    )]
    NotListed {
        name: String,
        server: String,
        listed: String,
    },
    #[error("{}", unavailable_text(.server, .state, .attempts, .for_, .next_in, .last_error, .waited))]
    Unavailable {
        server: String,
        state: ServerState,
        last_error: Option<String>,
        attempts: u32,
        /// How long the server has been in `state`.
        for_: Duration,
        /// When its next attempt starts, if one is scheduled.
        next_in: Option<Duration>,
        /// How long the call waited for it.
        waited: Duration,
    },
    #[error(
        "upstream server {server:?} went away during the call to {tool:?}; it is being reconnected"
    )]
    ConnectionLost { server: String, tool: String },
    #[error(
        "upstream tool {tool:?} of {server:?} did not answer within {timeout:?}{} (the call was cancelled)",
        waited_text(.waited)
    )]
    Timeout {
        server: String,
        tool: String,
        /// The call's own timeout.
        timeout: Duration,
        /// How much of it went to waiting for the server to connect.
        waited: Duration,
    },
    #[error("upstream server {server:?} refused the call to {tool:?}: {message} (JSON-RPC error {code})")]
    Rpc {
        server: String,
        tool: String,
        code: i32,
        message: String,
        data: Option<serde_json::Value>,
    },
    #[error("upstream server {server:?}: the call to {tool:?} failed: {message}")]
    Transport {
        server: String,
        tool: String,
        message: String,
    },
    #[error("upstream server {server:?}: the answer to the call to {tool:?} could not be taken: {reason}")]
    BadAnswer {
        server: String,
        tool: String,
        reason: String,
    },
    #[error("upstream server {server:?} answered the call to {tool:?} with {what}, which codebox does not support")]
    Unsupported {
        server: String,
        tool: String,
        what: &'static str,
    },
    #[error("the upstream servers are shut down")]
    ShutDown,
}

/// `server "time" is reconnecting (attempt 3, next in 2 s): <why>; retry`: the state,
/// what is known about it, and what the code can do.
fn unavailable_text(
    server: &str,
    state: &ServerState,
    attempts: &u32,
    for_: &Duration,
    next_in: &Option<Duration>,
    last_error: &Option<String>,
    waited: &Duration,
) -> String {
    let secs = |d: &Duration| {
        let s = d.as_secs_f64();
        if s < 10.0 {
            format!("{s:.1} s")
        } else {
            format!("{s:.0} s")
        }
    };
    let next = match next_in {
        Some(n) => format!("next in {}", secs(n)),
        None => "under way".to_string(),
    };
    let why = last_error
        .as_deref()
        .map(|e| format!(": {e}"))
        .unwrap_or_default();
    let waited = if waited.as_millis() >= 100 {
        format!(" (this call waited {})", secs(waited))
    } else {
        String::new()
    };
    match state {
        // An entry of the MCP server config codebox cannot start: never tried.
        ServerState::Failed if *attempts <= 1 && next_in.is_none() => format!(
            "server {server:?} is not started{why}; the MCP server config needs fixing"
        ),
        ServerState::Connecting => format!(
            "server {server:?} is still connecting (for {}){waited}; retry shortly",
            secs(for_)
        ),
        ServerState::Reconnecting => format!(
            "server {server:?} is reconnecting (attempt {attempts}, {next}){why}{waited}; retry shortly"
        ),
        ServerState::Failed => format!(
            "server {server:?} is down (attempt {attempts} failed, {next}){why}{waited}; retry later, \
             or see list_servers"
        ),
        ServerState::Ready => format!("server {server:?} is ready{waited}; retry"),
    }
}

/// `, 1.2 s of it waiting for the server to connect`, when the wait was noticeable.
fn waited_text(waited: &Duration) -> String {
    if waited.as_millis() >= 100 {
        format!(
            ", {:.1} s of it waiting for the server to connect",
            waited.as_secs_f64()
        )
    } else {
        String::new()
    }
}

/// A tool name the server does not list: say what it does list (`tools`, exposed names).
pub(crate) fn not_listed(name: &str, server: &str, tools: &[String]) -> UpstreamError {
    const SHOWN: usize = 20;
    let mut list = tools
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if tools.len() > SHOWN {
        list.push_str(&format!(", … ({} in all)", tools.len()));
    }
    UpstreamError::NotListed {
        name: name.to_string(),
        server: server.to_string(),
        listed: if tools.is_empty() {
            "no tools".to_string()
        } else {
            format!("only {list}")
        },
    }
}

/// The handle: cheap to clone, all clones share the servers.
#[derive(Debug, Clone)]
pub struct Upstreams {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    stop: CancellationToken,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Told when each server's first attempt is over.
    firsts: tokio::sync::Mutex<Vec<oneshot::Receiver<()>>>,
    /// How long a call waits for a server that is connecting or reconnecting.
    call_wait: Duration,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The supervisors stop their servers (SIGTERM, grace, SIGKILL) on their own.
        self.stop.cancel();
    }
}

impl Upstreams {
    /// Starts a supervisor per server and returns at once: the servers connect in the
    /// background (`servers()` says how far each is; `subscribe` sees their tools
    /// arrive). [`Upstreams::first_attempts`] waits for the first attempts.
    pub fn start(servers: Vec<ServerConfig>, options: UpstreamOptions) -> Upstreams {
        let open = CancellationToken::new();
        open.cancel();
        Upstreams::start_gated(servers, options, open)
    }

    /// [`Upstreams::start`], but no server is started before `gate` is cancelled: `serve`
    /// opens it once its first client's `initialize` is answered (or after a short
    /// bound), so the servers' own start-up does not take CPU from that answer.
    pub fn start_gated(
        servers: Vec<ServerConfig>,
        options: UpstreamOptions,
        gate: CancellationToken,
    ) -> Upstreams {
        let shared = Arc::new(Shared::new(servers));
        let stop = CancellationToken::new();
        let mut tasks = Vec::new();
        let mut firsts = Vec::new();
        for index in 0..shared.slots.len() {
            let (tx, rx) = oneshot::channel();
            firsts.push(rx);
            let (shared, options, stop) = (shared.clone(), options.clone(), stop.clone());
            let gate = gate.clone();
            tasks.push(tokio::spawn(async move {
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => {}
                    _ = gate.cancelled() => {}
                }
                supervisor::supervise(shared, index, options, stop, tx).await
            }));
        }
        Upstreams {
            inner: Arc::new(Inner {
                shared,
                stop,
                tasks: Mutex::new(tasks),
                firsts: tokio::sync::Mutex::new(firsts),
                call_wait: options.call_wait,
            }),
        }
    }

    /// [`Upstreams::start`], then [`Upstreams::first_attempts`].
    pub async fn connect(servers: Vec<ServerConfig>, options: UpstreamOptions) -> Upstreams {
        let upstreams = Upstreams::start(servers, options);
        upstreams.first_attempts().await;
        upstreams
    }

    /// Returns once every server has connected or failed its first attempt (each bounded
    /// by the connect timeout).
    pub async fn first_attempts(&self) {
        let firsts = std::mem::take(&mut *self.inner.firsts.lock().await);
        for first in firsts {
            // An error means the supervisor ended, which also ends its first attempt.
            let _ = first.await;
        }
    }

    /// No upstream servers.
    pub fn empty() -> Upstreams {
        Upstreams {
            inner: Arc::new(Inner {
                shared: Arc::new(Shared::new(Vec::new())),
                stop: CancellationToken::new(),
                tasks: Mutex::new(Vec::new()),
                firsts: tokio::sync::Mutex::new(Vec::new()),
                call_wait: Duration::ZERO,
            }),
        }
    }

    /// The current catalog.
    pub fn catalog(&self) -> Arc<Catalog> {
        self.inner.shared.catalog()
    }

    /// The catalog version: changes whenever any server's tools enter, leave or change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.shared.subscribe()
    }

    /// Waits until no server of `only` (every configured server when `None`) is still
    /// making its first connection — each is ready, or its first attempt failed — for as
    /// long as the configured `upstream_wait` (`call_wait`) allows, counted from the start
    /// of that first attempt. A search or a listing right after start-up thus sees the
    /// tools of servers that come up within the bound rather than "0 matching tools, still
    /// connecting", and a server that hangs in its first attempt delays only the requests
    /// of its first `upstream_wait`, not every one after.
    pub async fn wait_first_attempts(&self, only: Option<&str>) {
        let bound = self.inner.call_wait;
        let started = tokio::time::Instant::now();
        let mut states = self.inner.shared.subscribe_states();
        loop {
            // The longest any such server may still be waited for.
            let mut wait = Duration::ZERO;
            for slot in self.inner.shared.slots.iter() {
                if only.is_some_and(|name| slot.config.name != name && slot.ident != name) {
                    continue;
                }
                let status = slot.status();
                if status.state != ServerState::Connecting {
                    continue;
                }
                // Not started yet (the first client's `initialize` opens the gate): the
                // whole bound is ahead of it.
                let left = if status.attempts == 0 {
                    bound
                } else {
                    bound.saturating_sub(status.state_for)
                };
                wait = wait.max(left);
            }
            let wait = wait.min(bound.saturating_sub(started.elapsed()));
            if wait.is_zero() || self.inner.stop.is_cancelled() {
                return;
            }
            tokio::select! {
                changed = states.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(wait) => return,
                _ = self.inner.stop.cancelled() => return,
            }
        }
    }

    /// Every configured server, in configuration order.
    pub fn servers(&self) -> Vec<ServerStatus> {
        self.inner.shared.slots.iter().map(|s| s.status()).collect()
    }

    /// Calls the upstream tool exposed as `name`. On timeout the call is abandoned and
    /// `notifications/cancelled` goes upstream.
    pub async fn call(
        &self,
        name: &str,
        arguments: Option<serde_json::Map<String, serde_json::Value>>,
        timeout: Duration,
    ) -> Result<CallToolResult, UpstreamError> {
        if self.inner.stop.is_cancelled() {
            return Err(UpstreamError::ShutDown);
        }
        let unknown = || UpstreamError::UnknownTool {
            name: name.to_string(),
        };
        let (server_ident, _) = naming::split(name).ok_or_else(unknown)?;
        let slot = self
            .inner
            .shared
            .slot_by_ident(server_ident)
            .ok_or_else(unknown)?;
        let started = tokio::time::Instant::now();
        let answer = self.call_on(slot, name, arguments, timeout, started).await;
        crate::metrics::global().upstream_call(
            &slot.config.name,
            crate::metrics::labels::UpstreamOutcome::of(&answer),
            started.elapsed(),
        );
        answer
    }

    /// [`Self::call`] to the server of `slot`, from `started`.
    async fn call_on(
        &self,
        slot: &supervisor::Slot,
        name: &str,
        arguments: Option<serde_json::Map<String, serde_json::Value>>,
        timeout: Duration,
        started: tokio::time::Instant,
    ) -> Result<CallToolResult, UpstreamError> {
        let server = slot.config.name.clone();
        let live = self
            .wait_live(slot, timeout.min(self.inner.call_wait))
            .await?;
        let waited = started.elapsed();
        let left = timeout.saturating_sub(waited);
        let tool = slot
            .upstream_tool(name)
            .ok_or_else(|| not_listed(name, &server, &slot.tool_names()))?;
        if left.is_zero() {
            // The server came up just as the time ran out: nothing is sent (a request
            // cancelled at once may still run upstream).
            return Err(UpstreamError::Timeout {
                server,
                tool,
                timeout,
                waited,
            });
        }
        let mut params = CallToolRequestParams::new(tool.clone());
        if let Some(arguments) = arguments {
            params = params.with_arguments(arguments);
        }
        let result = tokio::select! {
            biased;
            r = tokio::time::timeout(left, live.peer.call_tool_once(params)) => r,
            _ = live.lost.cancelled() => {
                tracing::warn!(server, tool, "upstream connection lost during a call");
                return Err(UpstreamError::ConnectionLost { server, tool });
            }
        };
        let outcome = match result {
            Err(_) => Err(UpstreamError::Timeout {
                server,
                tool,
                timeout,
                waited,
            }),
            Ok(Ok(CallToolResponse::Complete(result))) => return Ok(result),
            Ok(Ok(CallToolResponse::InputRequired(_))) => Err(UpstreamError::Unsupported {
                server,
                tool,
                what: "a request for input",
            }),
            Ok(Ok(CallToolResponse::Task(_))) => Err(UpstreamError::Unsupported {
                server,
                tool,
                what: "a task",
            }),
            Ok(Ok(_)) => Err(UpstreamError::Unsupported {
                server,
                tool,
                what: "an unknown kind of result",
            }),
            Ok(Err(ServiceError::McpError(e))) if transport_failure(&e).is_some() => {
                Err(UpstreamError::BadAnswer {
                    server,
                    tool,
                    reason: e.message.to_string(),
                })
            }
            Ok(Err(ServiceError::McpError(e))) => Err(UpstreamError::Rpc {
                server,
                tool,
                code: e.code.0,
                message: e.message.to_string(),
                data: e.data,
            }),
            Ok(Err(ServiceError::TransportClosed)) => {
                Err(UpstreamError::ConnectionLost { server, tool })
            }
            Ok(Err(e)) => match connection::http_body_limit(&e) {
                Some(limit) => Err(UpstreamError::BadAnswer {
                    server,
                    tool,
                    reason: format!(
                        "the server sent an HTTP response body over the limit of {} for one \
                         upstream message; it was dropped",
                        super::stdio_transport::size(limit)
                    ),
                }),
                None => {
                    // Maybe the server is gone without the transport noticing (HTTP).
                    live.suspect.notify_one();
                    Err(UpstreamError::Transport {
                        server,
                        tool,
                        message: super::error_chain(&e),
                    })
                }
            },
        };
        if let Err(err) = &outcome {
            tracing::warn!(%err, "upstream tool call failed");
        }
        outcome
    }

    /// The server's live connection; while it connects or reconnects (or its next
    /// attempt is due within the bound) the call waits for it, at most `bound`.
    async fn wait_live(
        &self,
        slot: &supervisor::Slot,
        bound: Duration,
    ) -> Result<supervisor::Live, UpstreamError> {
        let started = tokio::time::Instant::now();
        let deadline = started + bound;
        let mut states = self.inner.shared.subscribe_states();
        let mut first_attempt = None;
        loop {
            let down = match slot.live() {
                Ok(live) => return Ok(live),
                Err(down) => down,
            };
            let first_attempt = *first_attempt.get_or_insert(down.attempts);
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            // Wait through an attempt under way, or one due within the bound; once an
            // attempt made while waiting failed, the server is down: say so at once.
            let due_in_time = down.next_in.is_none_or(|n| n < left);
            let worth_waiting = match down.state {
                ServerState::Connecting | ServerState::Reconnecting => due_in_time,
                ServerState::Ready => true,
                ServerState::Failed => {
                    down.attempts == first_attempt && down.next_in.is_some() && due_in_time
                }
            };
            if !worth_waiting || left.is_zero() || self.inner.stop.is_cancelled() {
                return Err(UpstreamError::Unavailable {
                    server: slot.config.name.clone(),
                    state: down.state,
                    last_error: down.last_error,
                    attempts: down.attempts,
                    for_: down.for_,
                    next_in: down.next_in,
                    waited: started.elapsed(),
                });
            }
            tokio::select! {
                changed = states.changed() => if changed.is_err() { return Err(UpstreamError::ShutDown) },
                _ = tokio::time::sleep(left) => {}
                _ = self.inner.stop.cancelled() => return Err(UpstreamError::ShutDown),
            }
        }
    }

    /// Closes every client, stops every stdio server's process group (SIGTERM, grace,
    /// SIGKILL) and waits until they are gone. Calls fail with `ShutDown` afterwards.
    pub async fn shutdown(&self) {
        self.inner.stop.cancel();
        let tasks =
            std::mem::take(&mut *self.inner.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        for task in tasks {
            if let Err(err) = task.await {
                tracing::error!(?err, "upstream supervisor task failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::config::TransportConfig;

    fn failing(name: &str) -> ServerConfig {
        ServerConfig {
            name: name.into(),
            transport: TransportConfig::Stdio {
                command: "/nonexistent/mcp-server".into(),
                args: vec![],
                env: Default::default(),
            },
        }
    }

    #[tokio::test]
    async fn empty_has_nothing() {
        let u = Upstreams::empty();
        assert!(u.catalog().tools.is_empty());
        assert!(u.servers().is_empty());
        let e = u
            .call("a__b", None, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(e, UpstreamError::UnknownTool { .. }), "{e}");
        u.shutdown().await;
    }

    #[tokio::test]
    async fn a_failed_server_is_reported_and_refuses_calls_at_once() {
        let options = UpstreamOptions {
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_millis(200),
            ..UpstreamOptions::default()
        };
        let u = Upstreams::connect(vec![failing("my-srv")], options).await;
        let status = &u.servers()[0];
        assert_eq!(status.ident, "my_srv");
        assert_ne!(status.state, ServerState::Ready);
        let error = status.last_error.clone().unwrap();
        assert!(error.contains("/nonexistent/mcp-server"), "{error}");
        let e = u
            .call("my_srv__anything", None, Duration::from_secs(60))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("my-srv") && e.contains("nonexistent"), "{e}");
        // Retried in the background.
        let mut rx = u.subscribe();
        for _ in 0..200 {
            if u.servers()[0].attempts >= 3 {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), rx.changed()).await;
        }
        assert!(u.servers()[0].attempts >= 3, "{:?}", u.servers());
        u.shutdown().await;
        let e = u
            .call("my_srv__x", None, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(e, UpstreamError::ShutDown), "{e}");
    }

    /// A server that is never let start (the first `initialize` never came) is not
    /// started by the shutdown either: the process would only be killed again, and
    /// `serve` would wait for it.
    #[tokio::test]
    async fn shutdown_before_the_gate_opens_starts_no_server() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("started");
        let server = ServerConfig {
            name: "m".into(),
            transport: TransportConfig::Stdio {
                command: "/bin/sh".into(),
                args: vec![
                    "-c".into(),
                    format!("touch '{}'; exec sleep 30", marker.display()),
                ],
                env: Default::default(),
            },
        };
        let gate = CancellationToken::new();
        let u = Upstreams::start_gated(vec![server], UpstreamOptions::default(), gate.clone());
        tokio::time::sleep(Duration::from_millis(50)).await;
        u.shutdown().await;
        // Opening the gate after the shutdown starts nothing either.
        gate.cancel();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!marker.exists(), "the server was started during shutdown");
        let status = &u.servers()[0];
        assert_eq!(status.attempts, 0, "{status:?}");
        assert_eq!(
            status.last_error.as_deref(),
            Some("shut down"),
            "{status:?}"
        );
    }
}
