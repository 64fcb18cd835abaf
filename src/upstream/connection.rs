//! One live connection to one upstream server: the rmcp client over a child process's
//! pipes or over streamable HTTP, its tool list, and how it ends.
//!
//! The rmcp service runs in a task of its own; when the transport closes (the process
//! died, the HTTP session ended) that task ends and [`Connection::lost`] fires. Calls in
//! flight at that moment fail at once (rmcp drops their responders). A
//! `notifications/tools/list_changed` from the server is passed on as a signal on the
//! channel [`connect`] returns; the manager then lists the tools again.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

// Logging is deprecated by SEP-2577, but servers still send it and it belongs in our log.
use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, Tool};
#[allow(deprecated)]
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::service::{
    ClientInitializeError, NotificationContext, Peer, RoleClient, RunningServiceCancellationToken,
    ServiceError,
};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ServiceExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::config::{ServerConfig, TransportConfig};
use super::manager::UpstreamOptions;
use super::process::{self, ServerProcess};
use super::stdio_transport::StdioTransport;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Spawn(#[from] process::Error),
    #[error("invalid header {name:?}: {reason}")]
    Header { name: String, reason: String },
    #[error("MCP initialization failed")]
    Initialize {
        #[source]
        source: Box<ClientInitializeError>,
        exit: Option<String>,
        stderr: String,
    },
    #[error("listing tools failed")]
    ListTools {
        #[source]
        source: ServiceError,
        exit: Option<String>,
        stderr: String,
    },
    #[error("no answer within {timeout:?}")]
    Timeout {
        timeout: Duration,
        exit: Option<String>,
        stderr: String,
    },
    #[error("cancelled by shutdown")]
    Cancelled,
    #[error("not started: {reason}")]
    Unusable { reason: String },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// One line for status and logs: the error, its causes, and for a stdio server how it
    /// ended and its last stderr lines.
    pub fn describe(&self) -> String {
        let mut s = super::error_chain(self);
        if let Error::Initialize { exit, stderr, .. }
        | Error::ListTools { exit, stderr, .. }
        | Error::Timeout { exit, stderr, .. } = self
        {
            s.push_str(&context(exit.as_deref(), stderr));
        }
        s
    }
}

/// ` (the server exited with status 1; its stderr: ...)` for a stdio server, or nothing.
pub fn context(exit: Option<&str>, stderr: &str) -> String {
    let mut parts = Vec::new();
    if let Some(exit) = exit {
        parts.push(format!("the server {exit}"));
    }
    if !stderr.is_empty() {
        parts.push(format!("its stderr: {stderr}"));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join("; "))
    }
}

/// A connected, initialised upstream.
pub struct Connection {
    peer: Peer<RoleClient>,
    /// Cancelled when the rmcp service ends (transport closed, or [`Connection::close`]).
    lost: CancellationToken,
    service: Option<(RunningServiceCancellationToken, JoinHandle<()>)>,
    process: Option<ServerProcess>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("lost", &self.lost.is_cancelled())
            .field("process", &self.process)
            .finish_non_exhaustive()
    }
}

/// What [`connect`] gives back.
#[derive(Debug)]
pub struct Connected {
    pub connection: Connection,
    pub tools: Vec<Tool>,
    /// One message per `notifications/tools/list_changed` (coalesced while unread).
    pub list_changed: mpsc::Receiver<()>,
}

/// Connects to `server`, initialises and lists its tools, all within the connect
/// timeout. When `stop` fires, a started process is stopped (and waited for) before this
/// returns [`Error::Cancelled`].
pub async fn connect(
    server: &ServerConfig,
    options: &UpstreamOptions,
    stop: &CancellationToken,
) -> Result<Connected> {
    let timeout = options.connect_timeout;
    let (changed_tx, list_changed) = mpsc::channel(1);
    let handler = Handler {
        server: server.name.clone(),
        list_changed: changed_tx,
    };
    let (mut process, outcome) = match &server.transport {
        TransportConfig::Stdio { command, args, env } => {
            let (process, (stdout, stdin)) =
                ServerProcess::spawn(&server.name, command, args, env, options.kill_grace)?;
            let transport =
                StdioTransport::new(&server.name, stdout, stdin, options.max_message_bytes);
            let outcome = bounded(timeout, stop, handshake(handler, transport)).await;
            (Some(process), outcome)
        }
        TransportConfig::Http { url, headers } => {
            let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .custom_headers(header_map(headers)?)
                .max_sse_event_size(options.max_message_bytes);
            let transport = StreamableHttpClientTransport::from_config(config);
            (
                None,
                bounded(timeout, stop, handshake(handler, transport)).await,
            )
        }
        TransportConfig::Unusable { reason } => {
            return Err(Error::Unusable {
                reason: reason.clone(),
            })
        }
    };
    let failure = match outcome {
        Outcome::Done(Ok((running, tools))) => {
            return Ok(Connected {
                connection: Connection::new(running, process),
                tools,
                list_changed,
            })
        }
        Outcome::Done(Err(failure)) => Some(failure),
        Outcome::TimedOut => None,
        Outcome::Stopped => {
            if let Some(process) = &mut process {
                process.terminate().await;
            }
            return Err(Error::Cancelled);
        }
    };
    let (exit, stderr) = match &mut process {
        Some(process) => (
            process.terminate().await.map(|s| describe_exit(&s)),
            process.stderr_tail(),
        ),
        None => (None, String::new()),
    };
    Err(match failure {
        Some(Failure::Initialize(source)) => Error::Initialize {
            source,
            exit,
            stderr,
        },
        Some(Failure::ListTools(source)) => Error::ListTools {
            source,
            exit,
            stderr,
        },
        None => Error::Timeout {
            timeout,
            exit,
            stderr,
        },
    })
}

enum Outcome<T> {
    Done(T),
    TimedOut,
    Stopped,
}

async fn bounded<T>(
    timeout: Duration,
    stop: &CancellationToken,
    work: impl std::future::Future<Output = T>,
) -> Outcome<T> {
    tokio::select! {
        r = tokio::time::timeout(timeout, work) => match r {
            Ok(r) => Outcome::Done(r),
            Err(_) => Outcome::TimedOut,
        },
        _ = stop.cancelled() => Outcome::Stopped,
    }
}

type Running = rmcp::service::RunningService<RoleClient, Handler>;

enum Failure {
    Initialize(Box<ClientInitializeError>),
    ListTools(ServiceError),
}

async fn handshake<T, E, A>(
    handler: Handler,
    transport: T,
) -> std::result::Result<(Running, Vec<Tool>), Failure>
where
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let running = handler
        .serve(transport)
        .await
        .map_err(|e| Failure::Initialize(Box::new(e)))?;
    match running.peer().list_all_tools().await {
        Ok(tools) => Ok((running, tools)),
        Err(e) => {
            let _ = running.cancel().await;
            Err(Failure::ListTools(e))
        }
    }
}

/// The limit an HTTP upstream's answer went over, if that is why `err` happened: rmcp
/// refuses a JSON response body over 16 MiB (its own fixed limit) before reading it all.
pub fn http_body_limit(err: &ServiceError) -> Option<usize> {
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    // ServiceError does not give its transport error as a source: start below it.
    let ServiceError::TransportSend(err) = err else {
        return None;
    };
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(StreamableHttpError::<reqwest::Error>::ResponseBodyTooLarge { max_size }) =
            e.downcast_ref()
        {
            return Some(*max_size);
        }
        source = e.source();
    }
    None
}

fn describe_exit(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        _ => format!("ended ({status})"),
    }
}

fn header_map(
    headers: &BTreeMap<String, String>,
) -> Result<HashMap<http::HeaderName, http::HeaderValue>> {
    headers
        .iter()
        .map(|(name, value)| {
            let bad = |reason: String| Error::Header {
                name: name.clone(),
                reason,
            };
            let n =
                http::HeaderName::from_bytes(name.as_bytes()).map_err(|e| bad(e.to_string()))?;
            let v = http::HeaderValue::from_str(value).map_err(|e| bad(e.to_string()))?;
            Ok((n, v))
        })
        .collect()
}

impl Connection {
    fn new(running: Running, process: Option<ServerProcess>) -> Connection {
        let peer = running.peer().clone();
        let stop = running.cancellation_token();
        let lost = CancellationToken::new();
        let fire = lost.clone();
        let task = tokio::spawn(async move {
            let reason = running.waiting().await;
            tracing::debug!(?reason, "MCP client service ended");
            fire.cancel();
        });
        Connection {
            peer,
            lost,
            service: Some((stop, task)),
            process,
        }
    }

    pub fn peer(&self) -> &Peer<RoleClient> {
        &self.peer
    }

    /// The stdio server's pid (its process group id).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(ServerProcess::pid)
    }

    /// Fires when the connection is gone.
    pub fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// The stdio server's last stderr lines (empty for HTTP).
    pub fn stderr_tail(&self) -> String {
        self.process
            .as_ref()
            .map(ServerProcess::stderr_tail)
            .unwrap_or_default()
    }

    /// Ends the client and stops the server's process group. Returns how the process
    /// ended (stdio only).
    pub async fn close(&mut self) -> Option<String> {
        if let Some((stop, task)) = self.service.take() {
            stop.cancel();
            if tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .is_err()
            {
                tracing::warn!("MCP client service did not stop within 5 s");
            }
        }
        self.lost.cancel();
        match &mut self.process {
            Some(process) => process.terminate().await.map(|s| describe_exit(&s)),
            None => None,
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Without close(): end the client too (the process stops in its own Drop).
        if let Some((stop, _task)) = self.service.take() {
            stop.cancel();
        }
    }
}

/// The client side of one connection: list changes and log messages from the server.
struct Handler {
    server: String,
    list_changed: mpsc::Sender<()>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("codebox", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(server = %self.server, "tools/list_changed");
        // Full means a refresh is already pending: that one will see this change too.
        let _ = self.list_changed.try_send(());
    }

    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let server = &self.server;
        let logger = params.logger.as_deref().unwrap_or("");
        let data = params.data.to_string();
        match params.level {
            LoggingLevel::Debug => tracing::debug!(server, logger, data, "upstream log"),
            LoggingLevel::Info | LoggingLevel::Notice => {
                tracing::info!(server, logger, data, "upstream log")
            }
            LoggingLevel::Warning => tracing::warn!(server, logger, data, "upstream log"),
            _ => tracing::error!(server, logger, data, "upstream log"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_headers_are_named() {
        let e = header_map(&[("X Bad".to_string(), "v".to_string())].into())
            .unwrap_err()
            .to_string();
        assert!(e.contains("X Bad"), "{e}");
        let e = header_map(&[("X-Ok".to_string(), "a\nb".to_string())].into())
            .unwrap_err()
            .to_string();
        assert!(e.contains("X-Ok"), "{e}");
        assert_eq!(
            header_map(&[("Authorization".to_string(), "Bearer t".to_string())].into())
                .unwrap()
                .len(),
            1
        );
    }

    #[tokio::test]
    async fn a_server_that_exits_at_once_reports_its_stderr() {
        let server = ServerConfig {
            name: "broken".into(),
            transport: TransportConfig::Stdio {
                command: "/bin/sh".into(),
                args: vec!["-c".into(), "echo 'no config' >&2; exit 3".into()],
                env: BTreeMap::new(),
            },
        };
        let stop = CancellationToken::new();
        let e = connect(&server, &UpstreamOptions::default(), &stop)
            .await
            .unwrap_err()
            .describe();
        assert!(e.contains("status 3") && e.contains("no config"), "{e}");
    }

    /// Processes whose command line holds `needle`, from /proc.
    fn processes_with(needle: &str) -> Vec<String> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains(needle))
            .collect()
    }

    #[tokio::test]
    async fn stop_during_connect_stops_the_process() {
        let marker = "1000.4242";
        let server = ServerConfig {
            name: "slow".into(),
            transport: TransportConfig::Stdio {
                command: "/bin/sleep".into(),
                args: vec![marker.into()],
                env: BTreeMap::new(),
            },
        };
        let stop = CancellationToken::new();
        let cancel = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            cancel.cancel();
        });
        let e = connect(&server, &UpstreamOptions::default(), &stop)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Cancelled), "{e}");
        // The group was signalled; give a loaded machine a moment to finish the exit.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !processes_with(marker).is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(processes_with(marker), Vec::<String>::new());
    }

    #[tokio::test]
    async fn a_silent_server_times_out() {
        let server = ServerConfig {
            name: "silent".into(),
            transport: TransportConfig::Stdio {
                command: "/bin/sleep".into(),
                args: vec!["1000".into()],
                env: BTreeMap::new(),
            },
        };
        let stop = CancellationToken::new();
        let options = UpstreamOptions {
            connect_timeout: Duration::from_millis(300),
            ..UpstreamOptions::default()
        };
        let e = connect(&server, &options, &stop)
            .await
            .unwrap_err()
            .describe();
        assert!(e.contains("no answer"), "{e}");
    }
}
