//! The rmcp transport between codebox and a stdio server: newline-delimited JSON-RPC
//! over the child's pipes, with every message from the server bounded and every bad one
//! answered at once.
//!
//! rmcp's own line transport drops a line it cannot take (over its length cap, not UTF-8,
//! not JSON-RPC) with a log line, so the call it answered waits for its timeout and then
//! reports that the server "did not answer". Here:
//!
//! - a line longer than `limit` bytes is never buffered: its bytes are streamed to
//!   nothing, watched by an [`IdScanner`] for the message's `id`;
//! - a line that is oversized, not UTF-8, not JSON or not a JSON-RPC message fails the
//!   request it answers at once (a synthetic JSON-RPC error with [`TRANSPORT_ERROR`] and
//!   the reason: the limit, the byte where UTF-8 breaks, the parse error);
//! - when such a line has no readable `id` but starts like a message (`{`) and is
//!   oversized or not UTF-8, it fails every request in flight with the reason and ends
//!   the connection (the supervisor reconnects); any other line without an id (not JSON
//!   at all, or not starting with `{`) is logged and skipped, since servers print
//!   banners and logs to stdout;
//! - a response to no request in flight is logged and dropped;
//! - a line whose parse would take more memory than [`parse_limit`] allows (a 16 MB
//!   answer of `[0,0,…]` took the supervisor to a 1 GB peak) is not parsed: it fails the
//!   request it answers like an oversized one.
//!
//! The line buffer gives its memory back after a large message, so a connection that
//! once carried 50 MB does not keep 50 MB.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use rmcp::model::{ClientNotification, ErrorCode, ErrorData, JsonRpcMessage, RequestId};
use rmcp::service::{RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use super::frame_id::IdScanner;

/// The JSON-RPC error code of the errors this transport makes up for a request whose
/// answer it could not take (the server never sent it). `data` is
/// `{"codebox": "transport"}`.
pub const TRANSPORT_ERROR: i32 = -32099;

/// Read size from the pipe.
const READ_BUFFER: usize = 256 << 10;
/// A line buffer grown past this is given back after its line.
const KEEP_BUFFER: usize = 1 << 20;
/// How much of a skipped line is quoted in the log.
const LOG_PREFIX: usize = 200;

/// The most memory parsing one line from the server may take (estimated by
/// [`crate::proxy::parse_cost`]) for a line limit of `limit` bytes: four times the limit
/// (text costs its size; an answer of many small values several times it), at least
/// 64 MiB.
pub fn parse_limit(limit: usize) -> usize {
    limit.saturating_mul(4).max(64 << 20)
}

/// Whether `error` was made up by this transport, and its reason.
pub fn transport_failure(error: &ErrorData) -> Option<&str> {
    let ours = error.code.0 == TRANSPORT_ERROR
        && error
            .data
            .as_ref()
            .and_then(|d| d.get("codebox"))
            .and_then(|v| v.as_str())
            == Some("transport");
    ours.then_some(error.message.as_ref())
}

/// A size in bytes as people read it: `64 MiB (67108864 bytes)`.
pub fn size(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{} MiB ({bytes} bytes)", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes % (1 << 10) == 0 {
        format!("{} KiB ({bytes} bytes)", bytes >> 10)
    } else {
        format!("{bytes} bytes")
    }
}

type Writer<W> = Arc<tokio::sync::Mutex<Option<W>>>;

pub struct StdioTransport<R, W> {
    server: String,
    read: BufReader<R>,
    limit: usize,
    /// See [`parse_limit`].
    cost_limit: usize,
    line: Vec<u8>,
    /// Set while the rest of an oversized line is skipped.
    skip: Option<Skip>,
    /// Made-up answers waiting to be handed to rmcp.
    queued: VecDeque<RxJsonRpcMessage<RoleClient>>,
    /// After `queued`, end the connection.
    ending: bool,
    write: Writer<W>,
    /// Requests sent and not answered (nor cancelled) yet.
    pending: Arc<Mutex<HashSet<RequestId>>>,
}

struct Skip {
    scanner: IdScanner,
    bytes: usize,
    /// The request it answers was already failed.
    reported: bool,
}

/// What one bounded read gave.
enum Read {
    Line,
    /// An oversized line whose `id` just became known (the skip goes on).
    OversizedId(RequestId),
    /// The end of an oversized line.
    OversizedEnd {
        id: Option<RequestId>,
        bytes: usize,
        reported: bool,
        /// It began with `{`.
        object: bool,
    },
    Eof,
    Io(std::io::Error),
}

impl<R, W> StdioTransport<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    /// `limit`: the longest line taken from the server, newline excluded.
    pub fn new(server: &str, read: R, write: W, limit: usize) -> Self {
        StdioTransport {
            server: server.to_string(),
            read: BufReader::with_capacity(READ_BUFFER, read),
            limit,
            cost_limit: parse_limit(limit),
            line: Vec::new(),
            skip: None,
            queued: VecDeque::new(),
            ending: false,
            write: Arc::new(tokio::sync::Mutex::new(Some(write))),
            pending: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    /// Reads until a whole line is in `self.line`, or an oversized line's `id` or end is
    /// seen. Cancel-safe: all progress is kept in `self` between awaits.
    async fn read_line(&mut self) -> Read {
        loop {
            let available = match self.read.fill_buf().await {
                Ok(a) => a,
                Err(e) => return Read::Io(e),
            };
            if available.is_empty() {
                return Read::Eof;
            }
            let newline = find_newline(available);
            let take = newline.map_or(available.len(), |i| i + 1);
            let chunk = &available[..take];
            if let Some(skip) = &mut self.skip {
                let had_id = skip.scanner.id().is_some();
                skip.scanner.feed(chunk);
                skip.bytes += take;
                self.read.consume(take);
                if newline.is_some() {
                    let mut skip = self.skip.take().expect("skipping");
                    skip.scanner.finish();
                    return Read::OversizedEnd {
                        id: skip.scanner.id().cloned(),
                        bytes: skip.bytes,
                        reported: skip.reported,
                        object: skip.scanner.object(),
                    };
                }
                if let (false, Some(id)) = (had_id, skip.scanner.id()) {
                    skip.reported = true;
                    return Read::OversizedId(id.clone());
                }
                continue;
            }
            // The newline itself does not count towards the limit.
            let content = take - usize::from(newline.is_some());
            if self.line.len() + content > self.limit {
                let mut scanner = IdScanner::new();
                scanner.feed(&self.line);
                scanner.feed(chunk);
                let bytes = self.line.len() + take;
                self.release_line();
                self.read.consume(take);
                if newline.is_some() {
                    scanner.finish();
                    return Read::OversizedEnd {
                        id: scanner.id().cloned(),
                        bytes,
                        reported: false,
                        object: scanner.object(),
                    };
                }
                let id = scanner.id().cloned();
                self.skip = Some(Skip {
                    scanner,
                    bytes,
                    reported: id.is_some(),
                });
                match id {
                    Some(id) => return Read::OversizedId(id),
                    None => continue,
                }
            }
            self.line.extend_from_slice(chunk);
            self.read.consume(take);
            if newline.is_some() {
                return Read::Line;
            }
        }
    }

    /// Empties the line buffer, giving a large one's memory back.
    fn release_line(&mut self) {
        if self.line.capacity() > KEEP_BUFFER {
            self.line = Vec::new();
        } else {
            self.line.clear();
        }
    }

    fn take_pending(&self, id: &RequestId) -> bool {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id)
    }

    /// Fails request `id` with `reason` if it is in flight.
    fn fail(&mut self, id: &RequestId, reason: &str) {
        if self.take_pending(id) {
            tracing::warn!(server = %self.server, %id, reason, "failing an upstream request: its answer cannot be taken");
            self.queued.push_back(failure(id.clone(), reason));
        } else {
            tracing::warn!(server = %self.server, %id, reason, "dropping an unusable upstream message for no request in flight");
        }
    }

    /// Fails every request in flight with `reason` and ends the connection.
    fn fail_all(&mut self, reason: &str) {
        let ids: Vec<RequestId> = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        tracing::warn!(server = %self.server, in_flight = ids.len(), reason, "unusable message without an id from an upstream server; ending the connection");
        for id in ids {
            self.queued.push_back(failure(id, reason));
        }
        self.ending = true;
    }

    fn oversized(&self, bytes: Option<usize>) -> String {
        let size_now = match bytes {
            Some(b) => format!("a message of {b} bytes,"),
            None => "a message".to_string(),
        };
        format!(
            "the server sent {size_now} over the limit of {} for one upstream message; it was dropped",
            size(self.limit)
        )
    }

    /// Handles the whole line in `self.line`: a message for rmcp, or `None`.
    fn take_line(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let mut body: &[u8] = self.line.strip_suffix(b"\n").unwrap_or(&self.line);
        body = body.strip_suffix(b"\r").unwrap_or(body);
        body = body.strip_prefix(b"\xef\xbb\xbf").unwrap_or(body);
        if body.iter().all(u8::is_ascii_whitespace) {
            self.release_line();
            return None;
        }
        let cost = std::str::from_utf8(body).map_or(0, crate::proxy::parse_cost);
        let outcome = if cost > self.cost_limit {
            Err(Unusable {
                id: IdScanner::scan(body),
                reason: format!(
                    "the server sent a message that would take about {} MiB of memory to parse, over the limit of {} for one upstream message; it was dropped",
                    cost >> 20,
                    size(self.cost_limit)
                ),
                fatal: body.trim_ascii_start().starts_with(b"{"),
                prefix: String::from_utf8_lossy(&body[..body.len().min(LOG_PREFIX)]).into_owned(),
            })
        } else {
            match serde_json::from_slice::<RxJsonRpcMessage<RoleClient>>(body) {
                Ok(message) => Ok(message),
                Err(e) => Err(self.why_unusable(body, &e)),
            }
        };
        self.release_line();
        match outcome {
            Ok(message) => {
                let id = match &message {
                    JsonRpcMessage::Response(r) => Some(&r.id),
                    JsonRpcMessage::Error(e) => e.id.as_ref(),
                    _ => None,
                };
                match id {
                    Some(id) if !self.take_pending(id) => {
                        tracing::warn!(server = %self.server, %id, "dropping an upstream response to no request in flight");
                        None
                    }
                    _ => Some(message),
                }
            }
            Err(Unusable {
                id,
                reason,
                fatal,
                prefix,
            }) => {
                match (id, fatal) {
                    (Some(id), _) => self.fail(&id, &reason),
                    (None, true) => self.fail_all(&reason),
                    (None, false) => {
                        tracing::warn!(server = %self.server, reason, line = prefix, "skipping a line from an upstream server that is not a JSON-RPC message")
                    }
                }
                None
            }
        }
    }

    fn why_unusable(&self, body: &[u8], e: &serde_json::Error) -> Unusable {
        let id = IdScanner::scan(body);
        let prefix = String::from_utf8_lossy(&body[..body.len().min(LOG_PREFIX)]).into_owned();
        if let Err(utf8) = std::str::from_utf8(body) {
            return Unusable {
                id,
                reason: format!(
                    "the server sent a message that is not valid UTF-8 (at byte {})",
                    utf8.valid_up_to()
                ),
                fatal: body.trim_ascii_start().starts_with(b"{"),
                prefix,
            };
        }
        let (what, fatal) = match e.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                ("that is not JSON", false)
            }
            _ => ("that is not a valid JSON-RPC message", false),
        };
        Unusable {
            id,
            reason: format!("the server sent a message {what}: {e}"),
            fatal,
            prefix,
        }
    }
}

struct Unusable {
    id: Option<RequestId>,
    reason: String,
    /// Without an id, end the connection (else skip the line): it looks like a message.
    fatal: bool,
    prefix: String,
}

fn failure(id: RequestId, reason: &str) -> RxJsonRpcMessage<RoleClient> {
    JsonRpcMessage::error(
        ErrorData::new(
            ErrorCode(TRANSPORT_ERROR),
            reason.to_string(),
            Some(serde_json::json!({"codebox": "transport"})),
        ),
        Some(id),
    )
}

fn find_newline(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&b| b == b'\n')
}

impl<R, W> Transport<RoleClient> for StdioTransport<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            match &item {
                JsonRpcMessage::Request(r) => {
                    pending.insert(r.id.clone());
                }
                JsonRpcMessage::Notification(n) => {
                    if let ClientNotification::CancelledNotification(c) = &n.notification {
                        if let Some(id) = &c.params.request_id {
                            pending.remove(id);
                        }
                    }
                }
                _ => {}
            }
        }
        let write = self.write.clone();
        async move {
            let mut bytes = serde_json::to_vec(&item).map_err(std::io::Error::other)?;
            bytes.push(b'\n');
            let mut write = write.lock().await;
            let Some(w) = write.as_mut() else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "the transport is closed",
                ));
            };
            w.write_all(&bytes).await?;
            w.flush().await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            if let Some(message) = self.queued.pop_front() {
                return Some(message);
            }
            if self.ending {
                return None;
            }
            match self.read_line().await {
                Read::Line => {
                    if let Some(message) = self.take_line() {
                        return Some(message);
                    }
                }
                Read::OversizedId(id) => {
                    let reason = self.oversized(None);
                    self.fail(&id, &reason);
                }
                Read::OversizedEnd {
                    id,
                    bytes,
                    reported,
                    object,
                } => {
                    let reason = self.oversized(Some(bytes.saturating_sub(1)));
                    match (id, reported, object) {
                        (Some(_), true, _) => {}
                        (Some(id), false, _) => self.fail(&id, &reason),
                        (None, _, true) => self.fail_all(&reason),
                        (None, _, false) => {
                            tracing::warn!(server = %self.server, reason, "skipping an oversized line from an upstream server that is not a JSON-RPC message")
                        }
                    }
                }
                Read::Eof => return None,
                Read::Io(e) => {
                    tracing::warn!(server = %self.server, ?e, "reading from an upstream server failed");
                    return None;
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        let mut write = self.write.lock().await;
        if let Some(mut w) = write.take() {
            let _ = w.shutdown().await;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "stdio_transport_tests.rs"]
mod tests;
