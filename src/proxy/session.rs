//! One execution's proxy endpoint: reads requests from fd 3, answers them, records calls.
//!
//! Reading and writing are separate tasks joined by a queue, and what the proxy holds for
//! the sandbox is bounded twice:
//! - a request holds a permit ([`ProxyLimits::max_in_flight`]) from *before* its line is
//!   read until its answer is queued, plus its share of
//!   [`ProxyLimits::max_in_flight_bytes`] (its line's size);
//! - a queued answer holds its size of [`ProxyLimits::max_queued_reply_bytes`] until it
//!   is written to the socket; queuing waits while that budget is spent.
//!
//! So answers the sandbox does not read fill the socket buffer, then the queue's budget;
//! then the handlers wait with their permits, the reader stops reading fd 3, and the
//! sandbox's own writes block in the kernel. Below that budget the proxy keeps reading,
//! so a client that writes many requests before reading any answer (the TypeScript
//! client's synchronous writes under `Promise.all`) does not deadlock against it.
//! Requests run concurrently; when the channel ends (the program closed fd 3 or exited)
//! or the session is dropped, calls still in flight are aborted.
//!
//! The reader looks at each line through a zero-copy envelope (`id`, `method`, `params`
//! as borrowed raw JSON): a request past [`ProxyLimits::max_calls`] is refused without
//! its params ever being parsed. The methods themselves are in `methods.rs`.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use super::{
    clip, code, AllowList, CallObserver, OwnMethod, OwnMethods, ProxyLimits, ProxyReport, Redactor,
    ToolBackend, ToolCallRecord, MAX_MESSAGE_ECHO, MAX_NAME_ECHO, MAX_VALUE_BYTES,
};
use crate::line_reader::read_line_capped;

/// Longest request id (its JSON text) the proxy echoes back; a longer one, or one that
/// is not a number or a string, makes the message an invalid request.
pub const MAX_ID_BYTES: usize = 64;

/// Queue slots beyond the answers, for the supervisor's own lines (`codebox/run`, the
/// closing parse error).
const CONTROL_SLOTS: usize = 4;

/// How long an answer may wait for room in the queue before the report says that the
/// program does not read its answers.
const HELD_BACK_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// What parsing one container (an object's map node, an array) into a `Value` may take
/// beyond its text, in bytes: a B-tree leaf of 11 entries is about 640.
const CONTAINER_COST: usize = 640;
/// What one parsed value may take beyond its text: a `Value` and its slot's growth.
const VALUE_COST: usize = 64;

/// What parsing the JSON `raw` into a `serde_json::Value` may take, in bytes: its text
/// plus a bound per container and per value (`{"a":0}` costs 8 bytes of text and some
/// 700 parsed, so a budget of text alone would let 16 MiB of them take a gigabyte).
pub(crate) fn parse_cost(raw: &str) -> usize {
    let (mut containers, mut values) = (0usize, 1usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in raw.as_bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => containers += 1,
            b',' => values += 1,
            _ => {}
        }
    }
    raw.len() + containers * CONTAINER_COST + (values + containers) * VALUE_COST
}

/// Capacity the line buffer keeps between lines.
const LINE_KEEP: usize = 64 * 1024;

/// The request-bytes budget is counted in units of this many bytes.
const BYTE_UNIT: usize = 1024;

/// The proxy of one execution.
pub struct ProxySession {
    pub(super) backend: Arc<dyn ToolBackend>,
    allow: Mutex<AllowList>,
    pub(super) limits: ProxyLimits,
    pub(super) state: Mutex<State>,
    hooks: Mutex<Hooks>,
}

/// What the server attaches to a session besides its backend and limits.
#[derive(Default)]
struct Hooks {
    redactor: Option<(Arc<dyn Redactor>, bool)>,
    observer: Option<CallObserver>,
    /// codebox's own methods (`codebox/save_skill`, ...), for the execution's client.
    own: Option<Arc<dyn OwnMethods>>,
    /// The execution's approval gate (`crate::approval`): asked before a call goes up.
    approval: Option<Arc<crate::approval::Gate>>,
    /// Where `codebox/done` notifications from the sandbox go (keep-alive sessions).
    control: Option<mpsc::UnboundedSender<Value>>,
    /// `codebox/done` notifications the supervisor waits for: one per run. Others are
    /// dropped, so a sandbox cannot fill the control queue while nobody drains it.
    awaited_done: u32,
    /// Where the one-shot runtime's `codebox/exit {status}` goes: the program has ended,
    /// its output is closed, and only the process's teardown is left.
    exit_notice: Option<oneshot::Sender<i32>>,
    /// The writer of the channel being served, for [`ProxySession::send_line`].
    writer: Option<mpsc::Sender<Outgoing>>,
}

#[derive(Default)]
pub(super) struct State {
    /// Bytes through `tools/call` so far.
    pub(super) bytes: u64,
    pub(super) report: ProxyReport,
    /// Output files being received (`codebox/file`); into the report at `take_report`.
    files: Option<crate::output::files::Assembler>,
}

/// A line for the sandbox (newline included) and its share of the queue's byte budget,
/// given back once the line is in the socket.
type Outgoing = (Vec<u8>, Option<OwnedSemaphorePermit>);

/// What one request holds while it is handled, until its answer is queued.
struct Permits {
    _request: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
}

/// The queue of answers: a line waits for its share of the byte budget before it joins.
#[derive(Clone)]
struct Replies {
    tx: mpsc::Sender<Outgoing>,
    budget: Arc<Semaphore>,
    units: usize,
    /// For the note in the report when the budget stays spent.
    session: Arc<ProxySession>,
}

impl Replies {
    /// Queues `line` once the budget has room for it (a line larger than the whole
    /// budget waits for all of it); false when the writer is gone.
    async fn send(&self, line: Vec<u8>) -> bool {
        let units = line.len().div_ceil(BYTE_UNIT).clamp(1, self.units) as u32;
        let acquire = self.budget.clone().acquire_many_owned(units);
        tokio::pin!(acquire);
        let share = match tokio::time::timeout(HELD_BACK_AFTER, &mut acquire).await {
            Ok(share) => share,
            Err(_) => {
                // The program does not read its answers: say so, since its run will now
                // most likely end at its timeout with its own write to fd 3 blocked.
                self.session.note_held_back();
                acquire.await
            }
        };
        let Ok(share) = share else {
            return false;
        };
        self.tx.send((line, Some(share))).await.is_ok()
    }
}

/// A JSON-RPC error to send back.
pub(super) struct RpcError {
    pub(super) code: i64,
    pub(super) message: String,
}

pub(super) fn err(code: i64, message: impl Into<String>) -> RpcError {
    RpcError {
        code,
        message: message.into(),
    }
}

/// A line's top level, borrowed from the line: nothing in it is copied or parsed yet.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<&'a RawValue>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

/// What one line is.
enum Frame<'a> {
    /// Only whitespace: skipped.
    Blank,
    /// Not JSON: the channel is closed.
    NotJson(String),
    /// A method without an id: no answer.
    Notification {
        method: &'a str,
        params: Option<&'a RawValue>,
    },
    /// JSON, but not a request this proxy can answer; `id` is raw JSON (`null` when it
    /// could not be taken from the message).
    Invalid { id: &'a str, message: &'static str },
    Request {
        id: &'a str,
        method: &'a str,
        params: Option<&'a RawValue>,
    },
}

fn parse_frame(line: &[u8]) -> Frame<'_> {
    // Serde would also read a struct from an array (`[1, 2]` as id 1, method 2).
    let object = line.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let env = match serde_json::from_slice::<Envelope>(line) {
        Ok(env) if object => env,
        Ok(_) => {
            return Frame::Invalid {
                id: "null",
                message: "Invalid Request: expected an object {jsonrpc, id, method, params}",
            }
        }
        Err(_) if line.iter().all(u8::is_ascii_whitespace) => return Frame::Blank,
        Err(e) => {
            return match serde_json::from_slice::<serde::de::IgnoredAny>(line) {
                Ok(_) => Frame::Invalid {
                    id: "null",
                    message: "Invalid Request: expected an object {jsonrpc, id, method, params}",
                },
                Err(_) => Frame::NotJson(e.to_string()),
            }
        }
    };
    // Method names are plain strings; a borrowed &str refuses escapes, so nothing is
    // copied however long the method is.
    let method = env
        .method
        .and_then(|raw| serde_json::from_str::<&str>(raw.get()).ok());
    let id = match env.id {
        None => None,
        Some(raw) => {
            let text = raw.get();
            let scalar = matches!(text.as_bytes()[0], b'"' | b'-' | b'0'..=b'9');
            if !scalar || text.len() > MAX_ID_BYTES {
                return Frame::Invalid {
                    id: "null",
                    message:
                        "Invalid Request: the id must be a number or a string of at most 64 bytes",
                };
            }
            Some(text)
        }
    };
    match (id, method) {
        (Some(id), Some(method)) => Frame::Request {
            id,
            method,
            params: env.params,
        },
        (None, Some(method)) => Frame::Notification {
            method,
            params: env.params,
        },
        (id, None) => Frame::Invalid {
            id: id.unwrap_or("null"),
            message:
                "Invalid Request: expected {jsonrpc, id, method, params} with a plain string method",
        },
    }
}

impl ProxySession {
    pub fn new(backend: Arc<dyn ToolBackend>, allow: AllowList, limits: ProxyLimits) -> Arc<Self> {
        Arc::new(ProxySession {
            backend,
            allow: Mutex::new(allow),
            limits,
            state: Mutex::new(State::default()),
            hooks: Mutex::new(Hooks::default()),
        })
    }

    /// Replaces the allowlist (each run of a keep-alive session brings its own).
    pub fn set_allow(&self, allow: AllowList) {
        *self.allow.lock().expect("proxy allowlist") = allow;
    }

    pub(super) fn allows(&self, name: &str) -> bool {
        self.allow.lock().expect("proxy allowlist").allows(name)
    }

    /// Restores tokens in arguments and tokenizes records (and, `strict`, results).
    pub fn set_redactor(&self, redactor: Arc<dyn Redactor>, strict: bool) {
        self.hooks().redactor = Some((redactor, strict));
    }

    pub(super) fn redactor(&self) -> Option<(Arc<dyn Redactor>, bool)> {
        self.hooks().redactor.clone()
    }

    /// Serves codebox's own methods ([`OwnMethod`]) with `own`; without it they are
    /// answered "not available".
    pub fn set_own_methods(&self, own: Arc<dyn OwnMethods>) {
        self.hooks().own = Some(own);
    }

    pub(super) fn own_methods(&self) -> Option<Arc<dyn OwnMethods>> {
        self.hooks().own.clone()
    }

    /// Asks `gate` before every `tools/call` goes upstream (each run of a keep-alive
    /// session brings its own).
    pub fn set_approval(&self, gate: Arc<crate::approval::Gate>) {
        self.hooks().approval = Some(gate);
    }

    pub(super) fn approval(&self) -> Option<Arc<crate::approval::Gate>> {
        self.hooks().approval.clone()
    }

    /// Calls `observer` with every `tools/call` the report keeps a record of.
    pub fn set_observer(&self, observer: CallObserver) {
        self.hooks().observer = Some(observer);
    }

    /// Sends every `codebox/done` notification from the sandbox that the supervisor waits
    /// for (the first run's, then one per [`ProxySession::send_line`]) to `control`.
    pub fn set_control(&self, control: mpsc::UnboundedSender<Value>) {
        let mut hooks = self.hooks();
        hooks.control = Some(control);
        hooks.awaited_done = 1;
    }

    /// Sends the status of the first `codebox/exit` notification from the sandbox to
    /// `notice` (a one-shot run: its program ended and closed its output).
    pub fn set_exit_notice(&self, notice: oneshot::Sender<i32>) {
        self.hooks().exit_notice = Some(notice);
    }

    /// Writes one line (without its newline) to the sandbox, between the answers, and
    /// waits for one more `codebox/done`; false when the channel is not being served or
    /// its queue is full (the sandbox does not read it).
    pub fn send_line(&self, mut line: Vec<u8>) -> bool {
        line.push(b'\n');
        let mut hooks = self.hooks();
        let sent = match &hooks.writer {
            Some(tx) => tx.try_send((line, None)).is_ok(),
            None => false,
        };
        if sent && hooks.control.is_some() {
            hooks.awaited_done += 1;
        }
        sent
    }

    fn hooks(&self) -> std::sync::MutexGuard<'_, Hooks> {
        self.hooks.lock().expect("proxy hooks")
    }

    /// What happened on the channel so far.
    /// What happened so far, without the output files (see [`Self::take_report`]).
    pub fn report(&self) -> ProxyReport {
        self.state.lock().expect("proxy state").report.clone()
    }

    /// What happened since the last call, output files included, and the per-execution
    /// counters start again (one run of a keep-alive session).
    pub fn take_report(&self) -> ProxyReport {
        let mut st = self.state.lock().expect("proxy state");
        st.bytes = 0;
        let mut report = std::mem::take(&mut st.report);
        if let Some(files) = st.files.take() {
            report.out_files = files.finish();
        }
        report
    }

    /// Notes in the report (once) that answers went unread and the reader was held back.
    fn note_held_back(&self) {
        let bytes = self.limits.max_queued_reply_bytes;
        let mut st = self.state.lock().expect("proxy state");
        if st.report.channel_error.is_none() {
            tracing::info!(bytes, "a sandbox does not read its answers on fd 3");
            st.report.channel_error = Some(format!(
                "the program left more than {bytes} bytes of answers unread on fd 3, so the proxy stopped reading its requests until they are read"
            ));
        }
    }

    /// Counts one answered message; false when it is past [`ProxyLimits::max_calls`].
    fn admit(&self, method: &str) -> bool {
        let mut st = self.state.lock().expect("proxy state");
        if st.report.requests >= u64::from(self.limits.max_calls) {
            if method == "tools/call" {
                // Not handled, so no record: counted with the records left out.
                let dropped = st
                    .report
                    .tool_calls_dropped
                    .get_or_insert_with(Default::default);
                dropped.count += 1;
                *dropped.by_outcome.entry("limit".into()).or_default() += 1;
            }
            return false;
        }
        st.report.requests += 1;
        true
    }

    /// Keeps `record` in the report (and tells the observer) while fewer than
    /// [`ProxyLimits::max_call_records`] are kept; counts it otherwise.
    pub(super) fn record(&self, record: ToolCallRecord) {
        {
            let mut st = self.state.lock().expect("proxy state");
            if st.report.tool_calls.len() >= self.limits.max_call_records {
                let dropped = st
                    .report
                    .tool_calls_dropped
                    .get_or_insert_with(Default::default);
                dropped.count += 1;
                let outcome = record.error_kind.unwrap_or("ok");
                *dropped.by_outcome.entry(outcome.into()).or_default() += 1;
                return;
            }
            st.report.tool_calls.push(record.clone());
        }
        let observer = self.hooks().observer.clone();
        if let Some(observe) = observer {
            observe(&record);
        }
    }

    /// Serves the channel until the sandbox closes it or sends a malformed frame.
    pub async fn serve(self: Arc<Self>, stream: UnixStream) {
        let (read, write) = stream.into_split();
        let in_flight = self.limits.max_in_flight.max(1);
        let reply_units = units_of(self.limits.max_queued_reply_bytes);
        // Every queued answer holds at least one unit, so the budget bounds the count too.
        let (tx, rx) = mpsc::channel::<Outgoing>(reply_units + CONTROL_SLOTS);
        self.hooks().writer = Some(tx.clone());
        let writer = tokio::spawn(write_lines(write, rx));
        let replies = Replies {
            tx,
            budget: Arc::new(Semaphore::new(reply_units)),
            units: reply_units,
            session: self.clone(),
        };
        let requests = Arc::new(Semaphore::new(in_flight));
        let byte_units = units_of(self.limits.max_in_flight_bytes);
        let bytes = Arc::new(Semaphore::new(byte_units));
        let mut calls = JoinSet::new();
        let mut reader = BufReader::new(read);
        let mut line = Vec::new();
        let mut spare: Option<OwnedSemaphorePermit> = None;
        loop {
            // No permit, no read: this is where a sandbox that does not read its answers
            // is held back.
            let permit = match spare.take() {
                Some(p) => p,
                None => match requests.clone().acquire_owned().await {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            line.clear();
            // One huge line must not keep its buffer for the session's whole life.
            line.shrink_to(LINE_KEEP);
            let read =
                read_line_capped(&mut reader, &mut line, self.limits.max_request_bytes).await;
            let closing = match read {
                Ok(None) | Err(_) => break,
                Ok(Some(true)) => Some(format!(
                    "a message larger than {} bytes",
                    self.limits.max_request_bytes
                )),
                Ok(Some(false)) => match parse_frame(&line) {
                    Frame::Blank => {
                        spare = Some(permit);
                        None
                    }
                    Frame::NotJson(e) => Some(format!("a message that is not JSON ({e})")),
                    Frame::Notification { method, params } => {
                        self.notify(method, params);
                        spare = Some(permit);
                        None
                    }
                    Frame::Invalid { id, message } => {
                        // Counted like any answered message; refused or not, the answer is
                        // the same.
                        self.admit("");
                        let reply = error_line(id, code::INVALID_REQUEST, message);
                        if !replies.send(reply).await {
                            break;
                        }
                        drop(permit);
                        None
                    }
                    Frame::Request { id, method, .. } if !self.admit(method) => {
                        let why = format!(
                            "this execution reached its limit of {} tool calls (every request counts)",
                            self.limits.max_calls
                        );
                        let reply = error_line(id, code::LIMIT, &why);
                        if !replies.send(reply).await {
                            break;
                        }
                        drop(permit);
                        None
                    }
                    Frame::Request { id, method, params } => {
                        let known = matches!(method, "tools/call" | "tools/search" | "tools/get")
                            || OwnMethod::from_wire(method).is_some();
                        // An unknown method's params are never looked at, nor kept.
                        let params = params.filter(|_| known);
                        let cost = params.map_or(0, |raw| parse_cost(raw.get()));
                        if cost > self.limits.max_in_flight_bytes {
                            let why = format!(
                                "the params would take about {} MiB of memory to parse; the proxy handles at most {} MiB of requests at once",
                                cost >> 20,
                                self.limits.max_in_flight_bytes >> 20
                            );
                            if !replies
                                .send(error_line(id, code::INVALID_PARAMS, &why))
                                .await
                            {
                                break;
                            }
                            drop(permit);
                            continue;
                        }
                        let units = u32::try_from(units_of(cost).min(byte_units))
                            .expect("units_of stays within a semaphore's range");
                        let Ok(held) = bytes.clone().acquire_many_owned(units).await else {
                            break;
                        };
                        let params = match params {
                            // Valid JSON already (the envelope parsed), within the budget.
                            Some(raw) => serde_json::from_str(raw.get()).unwrap_or(Value::Null),
                            None if known => json!({}),
                            None => Value::Null,
                        };
                        // Only the clipped form of an unknown method is kept (for its error).
                        let (id, method) =
                            (id.to_string(), clip(method, MAX_NAME_ECHO).into_owned());
                        let session = self.clone();
                        let replies = replies.clone();
                        let held = Permits {
                            _request: permit,
                            _bytes: Some(held),
                        };
                        calls.spawn(async move {
                            let reply = session.handle(&id, &method, params).await;
                            replies.send(reply).await;
                            drop(held);
                        });
                        None
                    }
                },
            };
            if let Some(why) = closing {
                let why = format!("the proxy closed the tool channel: the sandbox sent {why}");
                tracing::warn!(why = %clip(&why, MAX_MESSAGE_ECHO), "malformed frame on fd 3");
                let _ = replies
                    .tx
                    .try_send((error_line("null", code::PARSE_ERROR, &why), None));
                self.state.lock().expect("proxy state").report.channel_error = Some(why);
                break;
            }
            // Reap finished calls as we go, so the set stays small.
            while calls.try_join_next().is_some() {}
        }
        // The channel ended: nobody will read answers to calls still running.
        calls.shutdown().await;
        self.hooks().writer = None;
        drop(replies);
        let _ = writer.await;
    }

    /// A notification: only a `codebox/done` the supervisor waits for, the first
    /// `codebox/exit` of a one-shot run, or a `codebox/value` (into the report), goes
    /// anywhere.
    fn notify(&self, method: &str, params: Option<&RawValue>) {
        #[derive(Deserialize)]
        struct Done<'a> {
            #[serde(borrow, default)]
            status: Option<&'a str>,
        }
        #[derive(Deserialize)]
        struct ValueNotice<'a> {
            #[serde(borrow)]
            repr: Cow<'a, str>,
        }
        if method == crate::runtime::FILE_METHOD || method == crate::runtime::FILES_METHOD {
            if let Some(params) = params {
                self.out_file(method, params);
            }
            return;
        }
        if method == crate::runtime::VALUE_METHOD {
            if let Some(value) =
                params.and_then(|p| serde_json::from_str::<ValueNotice>(p.get()).ok())
            {
                let repr = clip(&value.repr, MAX_VALUE_BYTES).into_owned();
                self.state.lock().expect("proxy state").report.value = Some(repr);
                return;
            }
        }
        if method == crate::runtime::EXIT_METHOD {
            let exit = params.and_then(|p| crate::runtime::parse_exit(p.get()));
            if let (Some(exit), Some(notice)) = (exit, self.hooks().exit_notice.take()) {
                tracing::debug!(
                    status = exit.status,
                    layers = ?exit.report.as_ref().map(|r| &r.layers),
                    end = exit.report.as_ref().and_then(|r| r.end.as_deref()),
                    "the runtime reported the end of the run"
                );
                self.state.lock().expect("proxy state").report.runtime = exit.report;
                let _ = notice.send(exit.status & 0xff);
                return;
            }
        }
        if method == "codebox/done" {
            let mut hooks = self.hooks();
            if hooks.awaited_done > 0 {
                if let Some(control) = &hooks.control {
                    let status = params
                        .and_then(|p| serde_json::from_str::<Done>(p.get()).ok())
                        .and_then(|d| d.status)
                        .map(|s| clip(s, 32).into_owned());
                    let _ = control.send(json!({"method": method, "status": status}));
                    hooks.awaited_done -= 1;
                    return;
                }
            }
        }
        tracing::debug!(
            method = %clip(method, MAX_NAME_ECHO),
            "ignoring a notification on fd 3"
        );
    }

    /// One `codebox/file` chunk or the `codebox/files` summary, into the assembler; a
    /// malformed one is dropped (the program could write such lines itself: they only
    /// ever make its own result).
    fn out_file(&self, method: &str, params: &RawValue) {
        #[derive(Deserialize)]
        struct Chunk<'a> {
            #[serde(borrow)]
            path: Cow<'a, str>,
            offset: u64,
            #[serde(borrow)]
            base64: Cow<'a, str>,
        }
        #[derive(Deserialize)]
        struct Summary {
            #[serde(default)]
            skipped: Vec<crate::output::files::Skipped>,
            #[serde(default)]
            omitted: u64,
        }
        use base64::Engine as _;
        let mut st = self.state.lock().expect("proxy state");
        let limits = self.limits.out_files;
        let files = st
            .files
            .get_or_insert_with(|| crate::output::files::Assembler::new(limits));
        if method == crate::runtime::FILE_METHOD {
            match serde_json::from_str::<Chunk>(params.get()) {
                Ok(c) => {
                    match base64::engine::general_purpose::STANDARD.decode(c.base64.as_bytes()) {
                        Ok(data) => files.chunk(&c.path, c.offset, data),
                        Err(e) => tracing::debug!(error = %e, "an output file chunk is not base64"),
                    }
                }
                Err(e) => tracing::debug!(error = %e, "a malformed output file chunk"),
            }
        } else {
            match serde_json::from_str::<Summary>(params.get()) {
                Ok(s) => files.summary(s.skipped, s.omitted),
                Err(e) => tracing::debug!(error = %e, "a malformed output files summary"),
            }
        }
    }

    /// Answers one request.
    async fn handle(&self, id: &str, method: &str, params: Value) -> Vec<u8> {
        let result = match method {
            "tools/call" => self.call(params).await,
            "tools/search" => self.search(params).await,
            "tools/get" => self.get(params).await,
            other => match OwnMethod::from_wire(other) {
                Some(own) => self.own(own, params).await,
                None => Err(err(
                    code::METHOD_NOT_FOUND,
                    // Clipped by the reader already.
                    format!("unknown method {other:?}: use tools/call, tools/search or tools/get"),
                )),
            },
        };
        match result {
            Ok(body) => {
                let mut out = Vec::with_capacity(body.len() + id.len() + 40);
                out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
                out.extend_from_slice(id.as_bytes());
                out.extend_from_slice(br#","result":"#);
                out.extend_from_slice(&body);
                out.extend_from_slice(b"}\n");
                out
            }
            Err(e) => error_line(id, e.code, &e.message),
        }
    }
}

/// A byte budget in units of [`BYTE_UNIT`] (at least one, at most a semaphore's maximum).
fn units_of(bytes: usize) -> usize {
    bytes
        .div_ceil(BYTE_UNIT)
        .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize))
}

/// Writes the queued lines; a line's share of the budget is given back once it is
/// written.
async fn write_lines(mut write: OwnedWriteHalf, mut rx: mpsc::Receiver<Outgoing>) {
    while let Some((line, held)) = rx.recv().await {
        let written = write.write_all(&line).await.is_ok();
        drop(held);
        if !written {
            break;
        }
    }
    let _ = write.shutdown().await;
}

/// An error answer (newline included); `id` is raw JSON, `message` is clipped.
pub(super) fn error_line(id: &str, code: i64, message: &str) -> Vec<u8> {
    let message =
        serde_json::to_string(&clip(message, MAX_MESSAGE_ECHO)).expect("strings serialise");
    let mut line =
        format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":{code},"message":{message}}}}}"#)
            .into_bytes();
    line.push(b'\n');
    line
}

/// The shown form of a client-chosen name: clipped.
pub(super) fn shown(name: &str) -> Cow<'_, str> {
    clip(name, MAX_NAME_ECHO)
}
