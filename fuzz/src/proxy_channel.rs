//! The sandbox's tool channel (fd 3, `codebox::proxy::ProxySession`), served over a real
//! socketpair against an in-memory backend that echoes its arguments.
//!
//! Input: the bytes the sandboxed program writes on fd 3 (tool calls, searches, its own
//! notifications such as `codebox/file` output chunks and `codebox/value`).
//!
//! Properties:
//! - every message the proxy reads as a request is answered once, with its id (`null`
//!   for one whose id cannot be read), whether it is handled, refused or over a limit;
//!   notifications get no answer; every answer is a JSON-RPC response. A last line
//!   without a newline is the exception: the proxy reads it only at EOF, which is the
//!   program closing fd 3 (or exiting), and aborts the calls still in flight then, since
//!   nobody will read their answers; such a request gets at most one answer, with its
//!   id;
//! - a channel that ends with a malformed line is closed without answering anything that
//!   was not a request;
//! - what the report keeps is bounded: output files within their limits and with checked
//!   paths, the value and the call records capped.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use codebox::output::OutFilesLimits;
use codebox::proxy::{AllowList, CallError, ProxyLimits, ProxySession, ToolBackend};
use codebox::upstream::catalog::{Catalog, CatalogTool};
use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::{block_on, budget, oracle};

/// Answers every call at once: its arguments back, or an error for `fs__fail`.
struct Echo {
    catalog: Arc<Catalog>,
    index: Arc<codebox::catalog::SearchIndex>,
}

impl Echo {
    fn shared() -> Arc<Echo> {
        static ECHO: OnceLock<Arc<Echo>> = OnceLock::new();
        ECHO.get_or_init(|| {
            let tool = |tool: &str, schema: Value| CatalogTool {
                name: format!("fs__{tool}"),
                server: "fs".into(),
                tool: tool.into(),
                server_ident: "fs".into(),
                tool_ident: tool.into(),
                title: None,
                description: Some(format!("The {tool} tool.")),
                input_schema: schema,
                output_schema: None,
                annotations: None,
            };
            let catalog = Catalog {
                version: 1,
                tools: vec![
                    tool(
                        "read",
                        json!({"type": "object", "properties": {"path": {"type": "string"}}}),
                    ),
                    tool("fail", json!({"type": "object"})),
                ],
                ..Default::default()
            };
            let index = Arc::new(codebox::catalog::SearchIndex::build(&catalog));
            Arc::new(Echo {
                catalog: Arc::new(catalog),
                index,
            })
        })
        .clone()
    }
}

impl ToolBackend for Echo {
    fn catalog(&self) -> Arc<Catalog> {
        self.catalog.clone()
    }

    fn index(&self) -> Arc<codebox::catalog::SearchIndex> {
        self.index.clone()
    }

    fn call(
        &self,
        name: String,
        arguments: Option<serde_json::Map<String, Value>>,
        _timeout: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<CallToolResult, CallError>> + Send + 'static>> {
        Box::pin(async move {
            match name.as_str() {
                "fs__fail" => Ok(CallToolResult::error(vec![ContentBlock::text(
                    "no such file",
                )])),
                _ => Ok(CallToolResult::structured(json!({ "echo": arguments }))),
            }
        })
    }
}

/// Small limits, so that inputs of a few KB reach them.
fn limits() -> ProxyLimits {
    ProxyLimits {
        max_calls: 40,
        max_bytes: 64 * 1024,
        call_timeout: Duration::from_secs(5),
        max_request_bytes: 16 * 1024,
        max_result_bytes: 8 * 1024,
        max_in_flight: 4,
        max_in_flight_bytes: 32 * 1024,
        max_queued_reply_bytes: 64 * 1024,
        max_call_records: 8,
        out_files: OutFilesLimits {
            max_files: 3,
            max_bytes: 4096,
            ..OutFilesLimits::default()
        },
    }
}

/// What one line of the channel is, as the proxy must read it.
#[derive(Debug)]
enum Expect {
    Nothing,
    /// An answer with this id, as JSON text (`null`: none could be read). Text, not a
    /// `Value`: the proxy echoes an id as it came, and a number such as `1e9992` is valid
    /// JSON that no `f64` holds.
    Answer(String),
    /// JSON whose strings are not all UTF-8: at most one answer, with any id (the proxy
    /// reads such a line only as far as it must).
    AtMostOne,
    /// The proxy closes the channel here.
    Close,
}

/// Reads one line the way the module docs say the proxy must.
fn expect(line: &[u8], max_bytes: usize) -> Expect {
    if line.len() > max_bytes {
        return Expect::Close;
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        return Expect::Nothing;
    }
    if serde_json::from_slice::<serde::de::IgnoredAny>(line).is_err() {
        return Expect::Close;
    }
    let Ok(text) = std::str::from_utf8(line) else {
        return Expect::AtMostOne;
    };
    let Some(members) = oracle::members(text) else {
        return Expect::Answer("null".into());
    };
    if ["id", "method", "params"]
        .iter()
        .any(|k| oracle::count(&members, k) > 1)
    {
        return Expect::Answer("null".into());
    }
    let plain_method = oracle::only(&members, "method")
        .is_some_and(|m| m.get().starts_with('"') && !m.get().contains('\\'));
    match oracle::only(&members, "id") {
        None if plain_method => Expect::Nothing,
        None => Expect::Answer("null".into()),
        Some(raw) => {
            let text = raw.get();
            let scalar = matches!(text.as_bytes()[0], b'"' | b'-' | b'0'..=b'9');
            if !scalar || text.len() > codebox::proxy::MAX_ID_BYTES {
                Expect::Answer("null".into())
            } else {
                Expect::Answer(text.to_string())
            }
        }
    }
}

pub fn run(data: &[u8]) {
    let limits = limits();
    let mut wanted = Vec::new();
    // Ids of requests that may be answered or not (completed by EOF).
    let mut optional = Vec::new();
    let mut closed = false;
    // Answers to wait for before the program closes its end: those of whole lines (a
    // last line without a newline is read at the close).
    let mut before_close = Vec::new();
    let lines = split_lines(data);
    let whole = if data.ends_with(b"\n") {
        lines.len()
    } else {
        lines.len().saturating_sub(1)
    };
    for (i, line) in lines.into_iter().enumerate() {
        match expect(line, limits.max_request_bytes) {
            Expect::Nothing => {}
            Expect::Answer(id) if i < whole => {
                before_close.push(id.clone());
                wanted.push(Some(id));
            }
            Expect::Answer(id) => optional.push(id),
            Expect::AtMostOne => wanted.push(None),
            Expect::Close => {
                closed = true;
                break;
            }
        }
    }
    let ((answers, report), peak) =
        budget::peak_during(|| block_on(serve(data, limits.clone(), before_close)));
    budget::assert_within("proxy session", peak, data.len(), 64, 4 << 20);

    let mut got = Vec::new();
    for answer in &answers {
        let members = answer_members(answer)
            .unwrap_or_else(|e| panic!("an answer that is not a JSON object ({e}): {answer:?}"));
        let member = |k: &str| members.get(k).map(|v| v.get());
        assert_eq!(member("jsonrpc"), Some("\"2.0\""), "{answer:?}");
        let is_result = member("result").is_some();
        let error: Option<Value> = member("error").and_then(|e| serde_json::from_str(e).ok());
        let is_error = error.is_some_and(|e| e["code"].is_i64() && e["message"].is_string());
        assert!(
            is_result != is_error,
            "neither a result nor an error: {answer:?}"
        );
        got.push(member("id").unwrap_or("null").to_string());
    }
    // Every answer matches a distinct expected one: its id exactly, else a line that may
    // get one answer with any id (or, once the proxy closed, the closing error's null).
    let mut exact: Vec<String> = wanted.iter().flatten().cloned().collect();
    let mut any = wanted.iter().filter(|w| w.is_none()).count() + usize::from(closed);
    for key in &got {
        if let Some(at) = exact.iter().position(|w| w == key) {
            exact.remove(at);
        } else if let Some(at) = optional.iter().position(|w| w == key) {
            optional.remove(at);
        } else if any > 0 {
            any -= 1;
        } else {
            panic!("an answer with id {key} to no request (expected {wanted:?})");
        }
    }
    if !closed {
        assert!(exact.is_empty(), "requests without an answer: {exact:?}");
    }

    let files = &report.out_files;
    assert!(files.files.len() <= limits.out_files.max_files);
    let bytes: usize = files.files.iter().map(|f| f.bytes.len()).sum();
    assert!(
        bytes <= limits.out_files.max_bytes,
        "{bytes} bytes of output files"
    );
    for f in &files.files {
        assert!(
            codebox::runtime::boot::validate_path(&f.path).is_ok(),
            "an output file with a bad path: {:?}",
            f.path
        );
    }
    assert!(files.skipped.len() <= 100);
    assert!(report.tool_calls.len() <= limits.max_call_records);
    if let Some(value) = &report.value {
        assert!(value.len() <= codebox::proxy::MAX_VALUE_BYTES + 64);
    }
}

/// The members of an answer, each as its JSON text.
fn answer_members(
    answer: &[u8],
) -> serde_json::Result<std::collections::HashMap<String, Box<serde_json::value::RawValue>>> {
    serde_json::from_slice(answer)
}

/// `data` split as the proxy reads it: on `\n`, a last line without one included.
fn split_lines(data: &[u8]) -> Vec<&[u8]> {
    let mut parts: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    if data.is_empty() || data.ends_with(b"\n") {
        parts.pop();
    }
    parts
}

/// Serves one channel as a program does: writes `input`, reads answers until those with
/// the ids in `awaited` came (or the proxy closed, or a second passed: then some are
/// missing), then closes its end (the proxy aborts calls still in flight when the
/// program goes) and reads the rest.
async fn serve(
    input: &[u8],
    limits: ProxyLimits,
    mut awaited: Vec<String>,
) -> (Vec<Vec<u8>>, codebox::proxy::ProxyReport) {
    let (sandbox, proxy) = UnixStream::pair().expect("socketpair");
    let session = ProxySession::new(Echo::shared(), AllowList::all(), limits);
    let served = tokio::spawn(session.clone().serve(proxy));
    let (read, mut write) = sandbox.into_split();
    let writing = async move {
        // The proxy may close early (a malformed line): the rest is not written.
        let _ = write.write_all(input).await;
        write
    };
    let reading = async move {
        let mut reader = BufReader::new(read);
        let mut lines = Vec::new();
        let enough = async {
            while !awaited.is_empty() {
                let mut line = Vec::new();
                match reader.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let id = answer_members(&line)
                            .ok()
                            .and_then(|m| m.get("id").map(|id| id.get().to_string()))
                            .unwrap_or_default();
                        if let Some(at) = awaited.iter().position(|a| *a == id) {
                            awaited.remove(at);
                        }
                        lines.push(line);
                    }
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), enough).await;
        (reader, lines)
    };
    let (mut write, (mut reader, mut lines)) = tokio::join!(writing, reading);
    let _ = write.shutdown().await;
    drop(write);
    let mut rest = Vec::new();
    // A proxy that closed on a malformed line with input left unread resets the
    // connection: what it wrote before is still read, then the reset ends the stream.
    if let Err(e) = reader.read_to_end(&mut rest).await {
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset,
            "read answers: {e}"
        );
    }
    served.await.expect("the proxy session does not panic");
    lines.extend(rest.split(|&b| b == b'\n').map(<[u8]>::to_vec));
    let answers = lines
        .into_iter()
        .map(|mut l| {
            if l.last() == Some(&b'\n') {
                l.pop();
            }
            l
        })
        .filter(|l| !l.is_empty())
        .collect();
    (answers, session.take_report())
}
