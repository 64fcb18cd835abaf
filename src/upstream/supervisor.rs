//! One task per upstream server, and the state they share.
//!
//! A supervisor connects its server (within the connect timeout), publishes its tools,
//! lists them again on `notifications/tools/list_changed`, and when the connection is
//! lost reconnects. A server's last known tools stay in the catalog while it is down
//! (its status says why: reconnecting, failed), so code and clients keep seeing them and
//! a call gets "server X is reconnecting" rather than "no tool named"; they leave only at
//! shutdown, or when a reconnected server lists other tools. Failed attempts are retried
//! with exponential backoff (`backoff_initial` doubling up to `backoff_max`); a connection
//! that stayed up for `backoff_max` or longer resets the backoff and is reconnected at
//! once.
//!
//! An HTTP upstream that goes away does not end the rmcp session by itself (the client
//! keeps its session and fails each request), so a call that fails in the transport
//! marks the connection suspect: the supervisor pings the server and, without an answer,
//! treats the connection as lost.
//!
//! Locks: the catalog lock may be taken before a slot's lock, never the other way round.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rmcp::model::Tool;
use rmcp::model::{ClientRequest, PingRequest};
use rmcp::service::{Peer, RoleClient};
use tokio::sync::{oneshot, watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::catalog::{Catalog, CatalogServer, CatalogTool};
use super::config::ServerConfig;
use super::connection::{self, Connected, Connection};
use super::manager::{ServerState, ServerStatus, UpstreamOptions};
use super::naming;

/// What every supervisor and the handle share.
#[derive(Debug)]
pub struct Shared {
    pub slots: Vec<Slot>,
    catalog: Mutex<Arc<Catalog>>,
    /// The catalog's version: bumped when the tools change.
    version: watch::Sender<u64>,
    /// Bumped whenever any server's state changes (a call waiting for its server).
    states: watch::Sender<u64>,
}

/// One configured server.
#[derive(Debug)]
pub struct Slot {
    pub config: ServerConfig,
    pub ident: String,
    state: Mutex<SlotState>,
}

#[derive(Debug)]
struct SlotState {
    state: ServerState,
    last_error: Option<String>,
    attempts: u32,
    pid: Option<u32>,
    /// Set while Ready.
    live: Option<Live>,
    /// The tools of the last connection, kept while the server is down.
    tools: Vec<CatalogTool>,
    /// When the state last changed.
    since: Instant,
    /// When the next attempt starts, while one is scheduled.
    next_attempt: Option<Instant>,
}

/// What a call needs from a ready server.
#[derive(Debug, Clone)]
pub struct Live {
    pub peer: Peer<RoleClient>,
    pub lost: CancellationToken,
    /// Notified by a call that failed in the transport: the supervisor checks the server.
    pub suspect: Arc<Notify>,
}

/// A server that cannot take a call now, and why.
#[derive(Debug)]
pub struct Down {
    pub state: ServerState,
    pub last_error: Option<String>,
    pub attempts: u32,
    /// How long the server has been in this state.
    pub for_: Duration,
    /// When the next attempt starts, if one is scheduled and not under way.
    pub next_in: Option<Duration>,
}

impl Shared {
    pub fn new(servers: Vec<ServerConfig>) -> Shared {
        let names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
        let idents = naming::server_idents(&names);
        let slots = servers
            .into_iter()
            .zip(idents)
            .map(|(config, ident)| Slot {
                config,
                ident,
                state: Mutex::new(SlotState {
                    state: ServerState::Connecting,
                    last_error: None,
                    attempts: 0,
                    pid: None,
                    live: None,
                    tools: Vec::new(),
                    since: Instant::now(),
                    next_attempt: None,
                }),
            })
            .collect::<Vec<Slot>>();
        let servers = slots
            .iter()
            .map(|s| CatalogServer {
                name: s.config.name.clone(),
                ident: s.ident.clone(),
            })
            .collect();
        Shared {
            slots,
            catalog: Mutex::new(Arc::new(Catalog {
                version: 0,
                tools: Vec::new(),
                servers,
            })),
            version: watch::Sender::new(0),
            states: watch::Sender::new(0),
        }
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        lock(&self.catalog).clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    pub fn slot_by_ident(&self, ident: &str) -> Option<&Slot> {
        self.slots.iter().find(|s| s.ident == ident)
    }

    /// Server states: the value changes whenever any server's state does.
    pub fn subscribe_states(&self) -> watch::Receiver<u64> {
        self.states.subscribe()
    }

    /// After a server's state changed: wakes whoever waits for one.
    fn state_changed(&self) {
        self.states.send_modify(|n| *n += 1);
    }

    /// Rebuilds the catalog from every server's known tools and bumps the version when
    /// they changed (a server going down keeps its tools: nothing to regenerate), then
    /// wakes whoever waits for a state change: a waiter that sees a server ready finds
    /// its tools in the catalog.
    fn publish(&self) {
        self.rebuild_catalog();
        self.state_changed();
    }

    fn rebuild_catalog(&self) {
        let mut catalog = lock(&self.catalog);
        let tools: Vec<CatalogTool> = self
            .slots
            .iter()
            .flat_map(|slot| lock(&slot.state).tools.clone())
            .collect();
        if tools == catalog.tools {
            return;
        }
        let version = catalog.version + 1;
        *catalog = Arc::new(Catalog {
            version,
            tools,
            servers: catalog.servers.clone(),
        });
        self.version.send_replace(version);
        tracing::debug!(
            version,
            tools = catalog.tools.len(),
            "upstream catalog updated"
        );
    }
}

impl Slot {
    pub fn status(&self) -> ServerStatus {
        let s = lock(&self.state);
        ServerStatus {
            name: self.config.name.clone(),
            ident: self.ident.clone(),
            transport: self.config.transport.kind(),
            state: s.state,
            tool_count: s.tools.len(),
            last_error: s.last_error.clone(),
            attempts: s.attempts,
            pid: s.pid,
            state_for: s.since.elapsed(),
            next_attempt_in: s
                .next_attempt
                .map(|at| at.saturating_duration_since(Instant::now())),
        }
    }

    /// The upstream's own name of the tool exposed as `name`.
    pub fn upstream_tool(&self, name: &str) -> Option<String> {
        lock(&self.state)
            .tools
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.tool.clone())
    }

    /// The exposed names of the server's known tools.
    pub fn tool_names(&self) -> Vec<String> {
        lock(&self.state)
            .tools
            .iter()
            .map(|t| t.name.clone())
            .collect()
    }

    /// The live connection, or why there is none.
    pub fn live(&self) -> Result<Live, Down> {
        let s = lock(&self.state);
        match (&s.live, s.state) {
            (Some(live), ServerState::Ready) => Ok(live.clone()),
            _ => Err(Down {
                state: s.state,
                last_error: s.last_error.clone(),
                attempts: s.attempts,
                for_: s.since.elapsed(),
                next_in: s
                    .next_attempt
                    .map(|at| at.saturating_duration_since(Instant::now())),
            }),
        }
    }

    fn begin_attempt(&self) -> u32 {
        let mut s = lock(&self.state);
        s.attempts += 1;
        s.next_attempt = None;
        let state = if s.attempts == 1 {
            ServerState::Connecting
        } else {
            ServerState::Reconnecting
        };
        // "Connecting for" counts from the first attempt, not from the configuration.
        if s.state != state || s.attempts == 1 {
            s.since = Instant::now();
        }
        s.state = state;
        s.attempts
    }

    /// The next attempt starts after `delay`.
    fn retry_in(&self, delay: Duration) {
        lock(&self.state).next_attempt = Some(Instant::now() + delay);
    }

    fn ready(&self, connection: &Connection, tools: Vec<Tool>, suspect: Arc<Notify>) -> usize {
        let mut s = lock(&self.state);
        s.state = ServerState::Ready;
        s.since = Instant::now();
        s.next_attempt = None;
        s.last_error = None;
        s.pid = connection.pid();
        s.tools = self.catalog_tools(tools);
        s.live = Some(Live {
            peer: connection.peer().clone(),
            lost: connection.lost().clone(),
            suspect,
        });
        s.tools.len()
    }

    fn set_tools(&self, tools: Vec<Tool>) -> usize {
        let tools = self.catalog_tools(tools);
        let count = tools.len();
        lock(&self.state).tools = tools;
        count
    }

    /// The server cannot take calls; its last known tools stay listed.
    fn down(&self, state: ServerState, error: Option<String>) {
        let mut s = lock(&self.state);
        if s.state != state {
            s.since = Instant::now();
        }
        s.state = state;
        s.live = None;
        s.pid = None;
        if error.is_some() {
            s.last_error = error;
        }
    }

    /// Shut down: the tools leave the catalog.
    fn shut_down(&self) {
        self.down(ServerState::Failed, Some("shut down".into()));
        lock(&self.state).tools.clear();
    }

    /// The upstream tools as catalog entries, named for this server.
    fn catalog_tools(&self, tools: Vec<Tool>) -> Vec<CatalogTool> {
        super::catalog::tools_of(&self.config.name, &self.ident, tools)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs server `index` until `stop`; `first` is told when the first attempt is over.
pub async fn supervise(
    shared: Arc<Shared>,
    index: usize,
    options: UpstreamOptions,
    stop: CancellationToken,
    first: oneshot::Sender<()>,
) {
    let slot = &shared.slots[index];
    let server = slot.config.name.as_str();
    let mut first = Some(first);
    let mut backoff = options.backoff_initial;
    loop {
        // Stopped before this attempt (also before the first: `start_gated` runs this
        // once its gate opens or the upstreams stop): a server is never started only to
        // be stopped again.
        if stop.is_cancelled() {
            break;
        }
        let attempt = slot.begin_attempt();
        let started = Instant::now();
        let result = connection::connect(&slot.config, &options, &stop).await;
        let delay = match result {
            Err(connection::Error::Cancelled) => break,
            Err(connection::Error::Unusable { reason }) => {
                // Never tried again: only a new configuration can fix it.
                slot.down(ServerState::Failed, Some(reason));
                shared.publish();
                if let Some(first) = first.take() {
                    let _ = first.send(());
                }
                stop.cancelled().await;
                break;
            }
            Err(err) => {
                let error = err.describe();
                tracing::warn!(server, attempt, error, retry_in = ?backoff, "cannot connect to MCP server");
                slot.down(ServerState::Failed, Some(error));
                backoff
            }
            Ok(connected) => {
                let tools = connected.tools.len();
                tracing::info!(server, attempt, tools, elapsed = ?started.elapsed(), "MCP server connected");
                let up_since = Instant::now();
                if !serve(&shared, slot, connected, &options, &stop, &mut first).await {
                    break;
                }
                if up_since.elapsed() >= options.backoff_max {
                    backoff = options.backoff_initial;
                    Duration::ZERO
                } else {
                    backoff
                }
            }
        };
        slot.retry_in(delay);
        shared.state_changed();
        if let Some(first) = first.take() {
            let _ = first.send(());
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.cancelled() => break,
        }
        if !delay.is_zero() {
            backoff = (backoff * 2).min(options.backoff_max);
        }
    }
    slot.shut_down();
    shared.publish();
}

/// Serves one live connection until it is lost (returns true) or `stop` (false).
async fn serve(
    shared: &Shared,
    slot: &Slot,
    connected: Connected,
    options: &UpstreamOptions,
    stop: &CancellationToken,
    first: &mut Option<oneshot::Sender<()>>,
) -> bool {
    let server = slot.config.name.as_str();
    let Connected {
        mut connection,
        tools,
        mut list_changed,
    } = connected;
    let suspect = Arc::new(Notify::new());
    slot.ready(&connection, tools, suspect.clone());
    shared.publish();
    if let Some(first) = first.take() {
        let _ = first.send(());
    }
    let lost = connection.lost().clone();
    let why = loop {
        tokio::select! {
            _ = stop.cancelled() => {
                slot.shut_down();
                shared.publish();
                connection.close().await;
                return false;
            }
            _ = lost.cancelled() => break "the connection closed".to_string(),
            _ = suspect.notified() => {
                let alive = tokio::select! {
                    r = ping(&connection, options.connect_timeout) => r,
                    _ = stop.cancelled() => continue,
                };
                if let Err(why) = alive {
                    break why;
                }
            }
            Some(()) = list_changed.recv() => {
                let listed = tokio::select! {
                    r = tokio::time::timeout(options.connect_timeout, connection.peer().list_all_tools()) => r,
                    _ = stop.cancelled() => continue,
                };
                match listed {
                    Ok(Ok(tools)) => {
                        let count = slot.set_tools(tools);
                        tracing::info!(server, tools = count, "MCP server's tools changed");
                        shared.publish();
                    }
                    Ok(Err(err)) => tracing::warn!(server, ?err, "listing tools after list_changed failed; keeping the old list"),
                    Err(_) => tracing::warn!(server, timeout = ?options.connect_timeout, "listing tools after list_changed timed out; keeping the old list"),
                }
            }
        }
    };
    // Lost: calls fail fast from now on (the tools stay listed), then reap the process
    // and add how it ended to the reason.
    slot.down(
        ServerState::Reconnecting,
        Some(format!("connection lost: {why}")),
    );
    shared.publish();
    let exit = connection.close().await;
    let error = format!(
        "connection lost: {why}{}",
        connection::context(exit.as_deref(), &connection.stderr_tail())
    );
    tracing::warn!(server, error, "MCP server connection lost; reconnecting");
    slot.down(ServerState::Reconnecting, Some(error));
    true
}

/// Whether the server still answers: any response, even an error (a server on a
/// protocol version without ping), means it does.
async fn ping(connection: &Connection, timeout: Duration) -> Result<(), String> {
    let request = ClientRequest::PingRequest(PingRequest::default());
    match tokio::time::timeout(timeout, connection.peer().send_request(request)).await {
        Ok(Ok(_)) | Ok(Err(rmcp::ServiceError::McpError(_))) => Ok(()),
        Ok(Err(err)) => Err(format!("no answer to ping: {}", super::error_chain(&err))),
        Err(_) => Err(format!("no answer to ping within {timeout:?}")),
    }
}
