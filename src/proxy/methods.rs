//! The methods of the channel: `tools/call`, `tools/search`, `tools/get`, and codebox's
//! own (`codebox/save_skill`, `codebox/list_skills`, `codebox/health`), which go to the
//! server's [`OwnMethods`](super::OwnMethods).
//!
//! They run once the reader has admitted the request (counted against
//! [`ProxyLimits::max_calls`](super::ProxyLimits::max_calls)); whatever they echo of the
//! request (a name, a cursor) is clipped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::session::{err, shown, RpcError};
use super::{
    clip, code, CallError, OwnMethod, ProxySession, Redactor, ToolCallRecord, MAX_MESSAGE_ECHO,
};
use crate::catalog::{Detail, SearchQuery, DEFAULT_LIMIT};

/// Longest `tools/search` query, in bytes.
pub const MAX_QUERY_BYTES: usize = 4096;

impl ProxySession {
    /// `tools/call`: allowlist, catalog, limits, the upstream call, the record.
    pub(super) async fn call(&self, params: Value) -> Result<Vec<u8>, RpcError> {
        let needs_name = || err(code::INVALID_PARAMS, "tools/call needs a string \"name\"");
        let Value::Object(mut params) = params else {
            return Err(needs_name());
        };
        let name = match params.remove("name") {
            Some(Value::String(name)) => name,
            _ => return Err(needs_name()),
        };
        let redactor = self.redactor();
        let arguments = match params.remove("arguments") {
            None | Some(Value::Null) => None,
            Some(mut args @ Value::Object(_)) => {
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
        let error = error.map(|text| {
            let text = clip(&text, MAX_MESSAGE_ECHO);
            match &redactor {
                Some((r, _)) => r.tokenize(&text),
                None => text.into_owned(),
            }
        });
        let record = ToolCallRecord {
            name: shown(&name).into_owned(),
            ok,
            duration_ms: started.elapsed().as_secs_f64() * 1000.0,
            bytes_in,
            bytes_out,
            error,
            error_kind,
        };
        tracing::debug!(
            tool = %record.name,
            ok,
            duration_ms = record.duration_ms,
            bytes_in,
            bytes_out,
            "proxied tool call"
        );
        self.record(record);
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
        let catalog = self.backend.catalog();
        // A tool the catalog does not list may belong to a server that is not ready (its
        // module calls by name): the backend waits for it or says its state.
        let listed = catalog.get(name);
        if listed.is_none() && (name.len() > MAX_UNLISTED_NAME || catalog.server_of(name).is_none())
        {
            return Err(unknown(name));
        }
        // What the user is asked about: the name that will be called (allowed, listed or
        // with a configured server's prefix) and these very arguments, sent only after.
        let gate = self.approval();
        let facts = gate.as_ref().map(|_| {
            let upstream = listed.map(|t| (t.server.clone(), t.tool.clone()));
            // Unlisted (its server is not ready): the call waits for the server and then
            // reaches whatever tool it lists by that name, so its hint is unknown.
            (upstream, listed.map(|t| t.destructive()))
        });
        drop(catalog);
        if let (Some(gate), Some((upstream, destructive))) = (gate, facts) {
            let upstream = upstream.as_ref().map(|(s, t)| (s.as_str(), t.as_str()));
            gate.tool(name, upstream, destructive, arguments.as_ref())
                .await
                .map_err(|why| err(code::APPROVAL, why))?;
        }
        {
            let mut st = self.state.lock().expect("proxy state");
            if st.bytes + bytes_in > self.limits.max_bytes {
                return Err(err(
                    code::LIMIT,
                    format!(
                        "this execution reached its limit of {} bytes through tool calls",
                        self.limits.max_bytes
                    ),
                ));
            }
            st.bytes += bytes_in;
        }
        // From here on `name` is a catalog name or starts with a configured server's
        // prefix; it is bounded by the frame's limits.
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
            CallError::NotListed { server } => {
                err(code::UNKNOWN_TOOL, self.not_listed(name, &server))
            }
        })?;
        let is_error = result.is_error.unwrap_or(false);
        let error_text = is_error.then(|| {
            result
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
                .flat_map(|t| t.chars().chain(std::iter::once('\n')))
                .take(500)
                .collect::<String>()
                .trim_end_matches('\n')
                .to_string()
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

    /// Why `name` is not a tool of `server`, naming the tools it lists that this
    /// execution may call (never the ones its allowlist hides).
    fn not_listed(&self, name: &str, server: &str) -> String {
        let visible: Vec<String> = self
            .backend
            .catalog()
            .tools
            .iter()
            .filter(|t| t.server == server && self.allows(&t.name))
            .map(|t| t.name.clone())
            .collect();
        crate::upstream::manager::not_listed(name, server, &visible).to_string()
    }

    /// `tools/search`: over the tools this execution may call.
    pub(super) async fn search(&self, params: Value) -> Result<Vec<u8>, RpcError> {
        let query = search_query(&params).map_err(|m| err(code::INVALID_PARAMS, m))?;
        // A server still making its first connection is waited for (bounded).
        self.backend.first_attempts(query.server.clone()).await;
        let page = self
            .backend
            .index()
            .search(&query, &|name| self.allows(name))
            .map_err(|e| err(code::INVALID_PARAMS, e.to_string()))?;
        let value =
            json!({"tools": page.tools, "next_cursor": page.next_cursor, "total": page.total});
        Ok(serde_json::to_vec(&value).expect("JSON values serialise"))
    }

    /// `tools/get`: one tool's full definition.
    pub(super) async fn get(&self, params: Value) -> Result<Vec<u8>, RpcError> {
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| err(code::INVALID_PARAMS, "tools/get needs a string \"name\""))?;
        if !self.allows(name) {
            return Err(denied(name));
        }
        let mut tool = self.backend.index().get(name);
        if tool.is_none() {
            // Its server may still be making its first connection (bounded wait).
            let server = crate::upstream::naming::split(name).map(|(s, _)| s.to_string());
            self.backend.first_attempts(server).await;
            tool = self.backend.index().get(name);
        }
        let tool = tool.ok_or_else(|| unknown(name))?;
        Ok(serde_json::to_vec(&tool).expect("JSON values serialise"))
    }
}

impl ProxySession {
    /// One of codebox's own methods: tokens in the params restored (as for `tools/call`),
    /// the server's answer tokenized in strict mode (the sandbox never sees raw values).
    pub(super) async fn own(
        &self,
        method: OwnMethod,
        mut params: Value,
    ) -> Result<Vec<u8>, RpcError> {
        let Some(own) = self.own_methods() else {
            return Err(err(
                code::METHOD_NOT_FOUND,
                format!("{} is not available in this sandbox", method.wire()),
            ));
        };
        if !params.is_object() {
            return Err(err(
                code::INVALID_PARAMS,
                format!("{} params must be an object", method.wire()),
            ));
        }
        let redactor = self.redactor();
        if let Some((r, _)) = &redactor {
            r.restore_json(&mut params);
        }
        let mut value = own.call(method, params).await.map_err(|why| {
            let why = match &redactor {
                Some((r, true)) => r.tokenize(&why),
                _ => why,
            };
            err(code::CODEBOX, why)
        })?;
        if let Some((r, true)) = &redactor {
            r.tokenize_json(&mut value);
        }
        Ok(serde_json::to_vec(&value).expect("JSON values serialise"))
    }
}

/// `tools/search` params `{query, detail?, server?, limit?, cursor?}` as a query.
pub fn search_query(params: &Value) -> Result<SearchQuery, String> {
    let text = params
        .get("query")
        .and_then(Value::as_str)
        .ok_or("tools/search needs a string \"query\"")?;
    if text.len() > MAX_QUERY_BYTES {
        return Err(format!(
            "the query is {} bytes; at most {MAX_QUERY_BYTES} are searched",
            text.len()
        ));
    }
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
        code::APPROVAL => "approval",
        _ => "invalid",
    }
}

fn denied(name: &str) -> RpcError {
    err(
        code::DENIED,
        format!(
            "tool {:?} is not in this execution's allowed_tools",
            shown(name)
        ),
    )
}

/// The longest name of a tool the catalog does not list that is still sent to its
/// server's connection (exposed names are far shorter).
const MAX_UNLISTED_NAME: usize = 256;

fn unknown(name: &str) -> RpcError {
    err(
        code::UNKNOWN_TOOL,
        format!(
            "no tool named {:?}; find tools with tools/search",
            shown(name)
        ),
    )
}
