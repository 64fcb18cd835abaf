//! One execution's proxy endpoint: reads requests from fd 3, answers them, records calls.
//!
//! Reading and writing are separate tasks, so a sandbox that writes a large request while
//! a large response is on its way can never deadlock against the proxy: the proxy always
//! drains what the sandbox sends. Requests run concurrently; when the channel ends (the
//! program closed fd 3 or exited) or the session is dropped, calls still in flight are
//! aborted.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::{
    code, AllowList, CallError, CallObserver, ProxyLimits, ProxyReport, Redactor, ToolBackend,
    ToolCallRecord,
};
use crate::catalog::{Detail, SearchQuery, DEFAULT_LIMIT};
use crate::line_reader::read_line_capped;

/// The proxy of one execution.
pub struct ProxySession {
    backend: Arc<dyn ToolBackend>,
    allow: Mutex<AllowList>,
    limits: ProxyLimits,
    state: Mutex<State>,
    hooks: Mutex<Hooks>,
}

/// What the server attaches to a session besides its backend and limits.
#[derive(Default)]
struct Hooks {
    redactor: Option<(Arc<dyn Redactor>, bool)>,
    observer: Option<CallObserver>,
    /// Where `codebox/*` notifications from the sandbox go (keep-alive sessions).
    control: Option<mpsc::UnboundedSender<Value>>,
    /// The writer of the channel being served, for [`ProxySession::send_line`].
    writer: Option<mpsc::UnboundedSender<Vec<u8>>>,
}

#[derive(Default)]
struct State {
    calls: u32,
    bytes: u64,
    report: ProxyReport,
}

/// A JSON-RPC error to send back.
struct RpcError {
    code: i64,
    message: String,
}

fn err(code: i64, message: impl Into<String>) -> RpcError {
    RpcError {
        code,
        message: message.into(),
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

    fn allows(&self, name: &str) -> bool {
        self.allow.lock().expect("proxy allowlist").allows(name)
    }

    /// Restores tokens in arguments and tokenizes records (and, `strict`, results).
    pub fn set_redactor(&self, redactor: Arc<dyn Redactor>, strict: bool) {
        self.hooks().redactor = Some((redactor, strict));
    }

    /// Calls `observer` with every finished `tools/call`.
    pub fn set_observer(&self, observer: CallObserver) {
        self.hooks().observer = Some(observer);
    }

    /// Sends the params of every `codebox/*` notification from the sandbox to `control`.
    pub fn set_control(&self, control: mpsc::UnboundedSender<Value>) {
        self.hooks().control = Some(control);
    }

    /// Writes one line (without its newline) to the sandbox, between the answers; false
    /// when the channel is not being served.
    pub fn send_line(&self, line: Vec<u8>) -> bool {
        match &self.hooks().writer {
            Some(tx) => tx.send(line).is_ok(),
            None => false,
        }
    }

    fn hooks(&self) -> std::sync::MutexGuard<'_, Hooks> {
        self.hooks.lock().expect("proxy hooks")
    }

    /// What happened on the channel so far.
    pub fn report(&self) -> ProxyReport {
        self.state.lock().expect("proxy state").report.clone()
    }

    /// What happened since the last call, and the per-execution counters start again
    /// (one run of a keep-alive session).
    pub fn take_report(&self) -> ProxyReport {
        let mut st = self.state.lock().expect("proxy state");
        st.calls = 0;
        st.bytes = 0;
        std::mem::take(&mut st.report)
    }

    /// Serves the channel until the sandbox closes it or sends a malformed frame.
    pub async fn serve(self: Arc<Self>, stream: UnixStream) {
        let (read, mut write) = stream.into_split();
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        self.hooks().writer = Some(tx.clone());
        let writer = tokio::spawn(async move {
            while let Some(mut line) = rx.recv().await {
                line.push(b'\n');
                if write.write_all(&line).await.is_err() {
                    break;
                }
            }
            let _ = write.shutdown().await;
        });
        let mut calls = JoinSet::new();
        let mut reader = BufReader::new(read);
        let mut line = Vec::new();
        loop {
            line.clear();
            let closing =
                match read_line_capped(&mut reader, &mut line, self.limits.max_request_bytes).await
                {
                    Ok(None) | Err(_) => break,
                    Ok(Some(true)) => Some(format!(
                        "a message larger than {} bytes",
                        self.limits.max_request_bytes
                    )),
                    Ok(Some(false)) => match serde_json::from_slice::<Value>(&line) {
                        Ok(msg) => {
                            let session = self.clone();
                            let tx = tx.clone();
                            calls.spawn(async move {
                                if let Some(reply) = session.handle(msg).await {
                                    let _ = tx.send(reply);
                                }
                            });
                            None
                        }
                        Err(e) if line.iter().all(u8::is_ascii_whitespace) => {
                            let _ = e;
                            None
                        }
                        Err(e) => Some(format!("a message that is not JSON ({e})")),
                    },
                };
            if let Some(why) = closing {
                let why = format!("the proxy closed the tool channel: the sandbox sent {why}");
                tracing::warn!(%why, "malformed frame on fd 3");
                let _ = tx.send(error_line(&Value::Null, code::PARSE_ERROR, &why));
                self.state.lock().expect("proxy state").report.channel_error = Some(why);
                break;
            }
            // Reap finished calls as we go, so the set stays small.
            while calls.try_join_next().is_some() {}
        }
        // The channel ended: nobody will read answers to calls still running.
        calls.abort_all();
        self.hooks().writer = None;
        drop(tx);
        let _ = writer.await;
    }

    /// Answers one message; `None` for notifications.
    async fn handle(&self, msg: Value) -> Option<Vec<u8>> {
        let id = msg.get("id").cloned();
        let method = msg.get("method").and_then(Value::as_str);
        let (Some(id), Some(method)) = (id, method) else {
            if let Some(method) = method {
                // A notification: nothing to answer. The session's own go to its control.
                if method.starts_with("codebox/") {
                    if let Some(control) = &self.hooks().control {
                        let mut note = msg.get("params").cloned().unwrap_or(json!({}));
                        if let Some(obj) = note.as_object_mut() {
                            obj.insert("method".into(), json!(method));
                        }
                        let _ = control.send(note);
                    }
                }
                return None;
            }
            return Some(error_line(
                msg.get("id").unwrap_or(&Value::Null),
                code::INVALID_REQUEST,
                "Invalid Request: expected {jsonrpc, id, method, params}",
            ));
        };
        let params = msg.get("params").cloned().unwrap_or(json!({}));
        let result = match method {
            "tools/call" => self.call(params).await,
            "tools/search" => self.search(params),
            "tools/get" => self.get(params),
            other => Err(err(
                code::METHOD_NOT_FOUND,
                format!("unknown method {other:?}: use tools/call, tools/search or tools/get"),
            )),
        };
        Some(match result {
            Ok(line) => {
                let mut out = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":"#).into_bytes();
                out.extend_from_slice(&line);
                out.push(b'}');
                out
            }
            Err(e) => error_line(&id, e.code, &e.message),
        })
    }

    /// `tools/call`: allowlist, catalog, limits, the upstream call, the record.
    async fn call(&self, params: Value) -> Result<Vec<u8>, RpcError> {
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| err(code::INVALID_PARAMS, "tools/call needs a string \"name\""))?
            .to_string();
        let redactor = self.hooks().redactor.clone();
        let arguments = match params.get("arguments") {
            None | Some(Value::Null) => None,
            Some(Value::Object(map)) => {
                let mut args = Value::Object(map.clone());
                if let Some((r, _)) = &redactor {
                    r.restore_json(&mut args);
                }
                match args {
                    Value::Object(map) => Some(map),
                    _ => unreachable!("restoring keeps an object an object"),
                }
            }
            Some(_) => {
                return Err(err(
                    code::INVALID_PARAMS,
                    "tools/call \"arguments\" must be an object",
                ))
            }
        };
        let bytes_in = arguments
            .as_ref()
            .map(|a| serde_json::to_vec(a).map(|v| v.len()).unwrap_or(0))
            .unwrap_or(2) as u64;
        let started = Instant::now();
        let strict = redactor.as_ref().is_some_and(|(_, strict)| *strict);
        let outcome = self
            .checked_call(
                &name,
                arguments,
                bytes_in,
                strict.then(|| redactor.clone()).flatten(),
            )
            .await;
        let (ok, bytes_out, error, error_kind) = match &outcome {
            Ok((bytes, is_error, text)) => (
                !is_error,
                bytes.len() as u64,
                text.clone(),
                is_error.then_some("tool_error"),
            ),
            Err(e) => (false, 0, Some(e.message.clone()), Some(error_kind(e.code))),
        };
        let error = match (&redactor, error) {
            (Some((r, _)), Some(text)) => Some(r.tokenize(&text)),
            (_, error) => error,
        };
        let record = ToolCallRecord {
            name: name.clone(),
            ok,
            duration_ms: started.elapsed().as_secs_f64() * 1000.0,
            bytes_in,
            bytes_out,
            error,
            error_kind,
        };
        let observer = self.hooks().observer.clone();
        if let Some(observe) = observer {
            observe(&record);
        }
        tracing::debug!(
            tool = %name,
            ok,
            duration_ms = record.duration_ms,
            bytes_in,
            bytes_out,
            "proxied tool call"
        );
        self.state
            .lock()
            .expect("proxy state")
            .report
            .tool_calls
            .push(record);
        outcome.map(|(bytes, _, _)| bytes).map_err(|mut e| {
            if strict {
                if let Some((r, _)) = &redactor {
                    e.message = r.tokenize(&e.message);
                }
            }
            e
        })
    }

    /// The call itself; returns the result JSON, whether it is an error, and its error
    /// text.
    async fn checked_call(
        &self,
        name: &str,
        arguments: Option<serde_json::Map<String, Value>>,
        bytes_in: u64,
        strict: Option<(Arc<dyn Redactor>, bool)>,
    ) -> Result<(Vec<u8>, bool, Option<String>), RpcError> {
        if !self.allows(name) {
            return Err(denied(name));
        }
        if self.backend.catalog().get(name).is_none() {
            return Err(err(
                code::UNKNOWN_TOOL,
                format!("no tool named {name:?}; find tools with tools/search"),
            ));
        }
        {
            let mut st = self.state.lock().expect("proxy state");
            if st.calls >= self.limits.max_calls {
                return Err(err(
                    code::LIMIT,
                    format!(
                        "this execution reached its limit of {} tool calls",
                        self.limits.max_calls
                    ),
                ));
            }
            if st.bytes + bytes_in > self.limits.max_bytes {
                return Err(err(
                    code::LIMIT,
                    format!(
                        "this execution reached its limit of {} bytes through tool calls",
                        self.limits.max_bytes
                    ),
                ));
            }
            st.calls += 1;
            st.bytes += bytes_in;
        }
        let timeout = self.limits.call_timeout;
        let call = self.backend.call(name.to_string(), arguments, timeout);
        // The backend enforces the timeout; this bound only guards against one that does not.
        let result = match tokio::time::timeout(timeout + Duration::from_secs(1), call).await {
            Err(_) => Err(CallError::Timeout(format!(
                "no answer within {} ms",
                timeout.as_millis()
            ))),
            Ok(r) => r,
        };
        let result = result.map_err(|e| match e {
            CallError::Timeout(m) => err(code::TIMEOUT, format!("{name}: {m}")),
            CallError::Failed(m) => err(code::UPSTREAM, format!("{name}: {m}")),
        })?;
        let is_error = result.is_error.unwrap_or(false);
        let error_text = is_error.then(|| {
            result
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                .collect::<Vec<_>>()
                .join("\n")
                .chars()
                .take(500)
                .collect::<String>()
        });
        let bytes = match strict {
            // Strict: the sandbox never sees raw values, so the result is tokenized as JSON.
            Some((r, _)) => serde_json::to_value(&result).map(|mut v| {
                r.tokenize_json(&mut v);
                v
            }),
            None => serde_json::to_value(&result),
        }
        .and_then(|v| serde_json::to_vec(&v))
        .map_err(|e| {
            err(
                code::UPSTREAM,
                format!("{name}: unserialisable result: {e}"),
            )
        })?;
        if bytes.len() > self.limits.max_result_bytes {
            return Err(err(
                code::LIMIT,
                format!(
                    "{name}: the result is {} bytes; the limit is {} bytes",
                    bytes.len(),
                    self.limits.max_result_bytes
                ),
            ));
        }
        {
            let mut st = self.state.lock().expect("proxy state");
            if st.bytes + bytes.len() as u64 > self.limits.max_bytes {
                return Err(err(
                    code::LIMIT,
                    format!(
                        "this execution reached its limit of {} bytes through tool calls",
                        self.limits.max_bytes
                    ),
                ));
            }
            st.bytes += bytes.len() as u64;
        }
        Ok((bytes, is_error, error_text))
    }

    fn search(&self, params: Value) -> Result<Vec<u8>, RpcError> {
        let query = search_query(&params).map_err(|m| err(code::INVALID_PARAMS, m))?;
        let page = self
            .backend
            .index()
            .search(&query, &|name| self.allows(name))
            .map_err(|e| err(code::INVALID_PARAMS, e.to_string()))?;
        let value =
            json!({"tools": page.tools, "next_cursor": page.next_cursor, "total": page.total});
        Ok(serde_json::to_vec(&value).expect("JSON values serialise"))
    }

    fn get(&self, params: Value) -> Result<Vec<u8>, RpcError> {
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| err(code::INVALID_PARAMS, "tools/get needs a string \"name\""))?;
        if !self.allows(name) {
            return Err(denied(name));
        }
        let tool = self.backend.index().get(name).ok_or_else(|| {
            err(
                code::UNKNOWN_TOOL,
                format!("no tool named {name:?}; find tools with tools/search"),
            )
        })?;
        Ok(serde_json::to_vec(&tool).expect("JSON values serialise"))
    }
}

/// `tools/search` params `{query, detail?, server?, limit?, cursor?}` as a query.
pub fn search_query(params: &Value) -> Result<SearchQuery, String> {
    let text = params
        .get("query")
        .and_then(Value::as_str)
        .ok_or("tools/search needs a string \"query\"")?;
    let detail = match params.get("detail") {
        None | Some(Value::Null) => Detail::Summary,
        Some(Value::String(d)) => d
            .parse()
            .map_err(|e: crate::catalog::SearchError| e.to_string())?,
        Some(_) => return Err("detail must be \"name\", \"summary\" or \"full\"".into()),
    };
    let string = |key: &str| -> Result<Option<String>, String> {
        match params.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("{key} must be a string")),
        }
    };
    let limit = match params.get("limit") {
        None | Some(Value::Null) => DEFAULT_LIMIT,
        Some(v) => v
            .as_u64()
            .map(|n| n as usize)
            .ok_or("limit must be a positive integer")?,
    };
    Ok(SearchQuery {
        text: text.to_string(),
        server: string("server")?,
        detail,
        limit,
        cursor: string("cursor")?,
    })
}

/// The audit category of a failed call.
fn error_kind(code: i64) -> &'static str {
    match code {
        code::DENIED => "denied",
        code::UNKNOWN_TOOL => "unknown_tool",
        code::LIMIT => "limit",
        code::TIMEOUT => "timeout",
        code::UPSTREAM => "upstream",
        _ => "invalid",
    }
}

fn denied(name: &str) -> RpcError {
    err(
        code::DENIED,
        format!("tool {name:?} is not in this execution's allowed_tools"),
    )
}

fn error_line(id: &Value, code: i64, message: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message},
    }))
    .expect("JSON values serialise")
}
