//! The proxy over a real socketpair, with an in-process backend that echoes its arguments
//! (the upstream side is tested against real servers in tests/upstream.rs and tests/proxy.rs).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::*;
use crate::upstream::catalog::CatalogTool;

struct Echo {
    calls: AtomicU32,
}

impl ToolBackend for Echo {
    fn catalog(&self) -> Arc<Catalog> {
        let tool = |name: &str| {
            let (server, tool) = name.split_once("__").unwrap();
            CatalogTool {
                name: name.into(),
                server: server.into(),
                tool: tool.into(),
                server_ident: server.into(),
                tool_ident: tool.into(),
                title: None,
                description: Some(format!("The {tool} tool.")),
                input_schema: json!({"type": "object"}),
                output_schema: None,
            }
        };
        Arc::new(Catalog {
            version: 1,
            tools: vec![
                tool("fs__read"),
                tool("fs__big"),
                tool("mem__slow"),
                tool("mem__fail"),
            ],
        })
    }

    fn index(&self) -> Arc<crate::catalog::SearchIndex> {
        Arc::new(crate::catalog::SearchIndex::build(&self.catalog()))
    }

    fn call(
        &self,
        name: String,
        arguments: Option<serde_json::Map<String, Value>>,
        timeout: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<CallToolResult, CallError>> + Send + 'static>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            match name.as_str() {
                "mem__slow" => {
                    tokio::time::sleep(timeout + Duration::from_millis(50)).await;
                    Err(CallError::Timeout(format!("no answer within {timeout:?}")))
                }
                "mem__fail" => Ok(CallToolResult::error(vec![ContentBlock::text(
                    "no such entity",
                )])),
                "fs__big" => Ok(CallToolResult::success(vec![ContentBlock::text(
                    "x".repeat(3000),
                )])),
                _ => Ok(CallToolResult::structured(json!({"echo": arguments}))),
            }
        })
    }
}

struct Harness {
    session: Arc<ProxySession>,
    backend: Arc<Echo>,
    sandbox: BufReader<UnixStream>,
    serving: tokio::task::JoinHandle<()>,
}

fn harness(allow: &[&str], limits: ProxyLimits) -> Harness {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    theirs.set_nonblocking(true).unwrap();
    let backend = Arc::new(Echo {
        calls: AtomicU32::new(0),
    });
    let session = ProxySession::new(backend.clone(), AllowList::new(allow).unwrap(), limits);
    let serving = tokio::spawn(session.clone().serve(UnixStream::from_std(ours).unwrap()));
    Harness {
        session,
        backend,
        sandbox: BufReader::new(UnixStream::from_std(theirs).unwrap()),
        serving,
    }
}

impl Harness {
    async fn send(&mut self, line: &[u8]) {
        let s = self.sandbox.get_mut();
        s.write_all(line).await.unwrap();
        s.write_all(b"\n").await.unwrap();
    }

    async fn rpc(&mut self, id: u64, method: &str, params: Value) -> Value {
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send(msg.to_string().as_bytes()).await;
        self.next().await
    }

    async fn next(&mut self) -> Value {
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(10), self.sandbox.read_line(&mut line))
            .await
            .expect("an answer in time")
            .unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }
}

#[tokio::test]
async fn calls_are_answered_and_recorded() {
    let mut h = harness(&["fs__*", "mem__fail"], ProxyLimits::default());
    let r = h
        .rpc(
            1,
            "tools/call",
            json!({"name": "fs__read", "arguments": {"path": "/a", "n": [1, {"x": 2}]}}),
        )
        .await;
    assert_eq!(r["id"], 1);
    assert_eq!(
        r["result"]["structuredContent"]["echo"],
        json!({"path": "/a", "n": [1, {"x": 2}]})
    );
    let r = h
        .rpc(
            2,
            "tools/call",
            json!({"name": "mem__fail", "arguments": {}}),
        )
        .await;
    assert_eq!(r["result"]["isError"], true);
    let calls = h.session.report().tool_calls;
    assert_eq!(calls.len(), 2);
    assert!(
        calls[0].ok && calls[0].bytes_in > 10 && calls[0].bytes_out > 10,
        "{calls:?}"
    );
    assert!(!calls[1].ok);
    assert_eq!(calls[1].error.as_deref(), Some("no such entity"));
}

#[tokio::test]
async fn denied_and_unknown_tools_never_reach_the_backend() {
    let mut h = harness(&["fs__read"], ProxyLimits::default());
    let r = h.rpc(1, "tools/call", json!({"name": "mem__fail"})).await;
    assert_eq!(r["error"]["code"], code::DENIED);
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("allowed_tools"));
    let mut open = harness(&["*"], ProxyLimits::default());
    let r = open.rpc(2, "tools/call", json!({"name": "fs__nope"})).await;
    assert_eq!(r["error"]["code"], code::UNKNOWN_TOOL);
    assert_eq!(h.backend.calls.load(Ordering::SeqCst), 0);
    assert_eq!(open.backend.calls.load(Ordering::SeqCst), 0);
    let rec = &h.session.report().tool_calls[0];
    assert!(!rec.ok && rec.error.as_deref().unwrap().contains("allowed_tools"));
    // An empty allowlist allows nothing.
    let mut none = harness(&[], ProxyLimits::default());
    let r = none.rpc(3, "tools/call", json!({"name": "fs__read"})).await;
    assert_eq!(r["error"]["code"], code::DENIED);
}

#[tokio::test]
async fn limits_on_calls_bytes_and_time() {
    let limits = ProxyLimits {
        max_calls: 2,
        call_timeout: Duration::from_millis(100),
        ..ProxyLimits::default()
    };
    let mut h = harness(&["*"], limits);
    assert!(h
        .rpc(1, "tools/call", json!({"name": "fs__read"}))
        .await
        .get("result")
        .is_some());
    let r = h.rpc(2, "tools/call", json!({"name": "mem__slow"})).await;
    assert_eq!(r["error"]["code"], code::TIMEOUT, "{r}");
    let r = h.rpc(3, "tools/call", json!({"name": "fs__read"})).await;
    assert_eq!(r["error"]["code"], code::LIMIT);
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("2 tool calls"));

    let mut small = harness(
        &["*"],
        ProxyLimits {
            max_result_bytes: 1000,
            ..ProxyLimits::default()
        },
    );
    let r = small.rpc(1, "tools/call", json!({"name": "fs__big"})).await;
    assert_eq!(r["error"]["code"], code::LIMIT);
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the limit is 1000 bytes"),
        "{r}"
    );
    let mut budget = harness(
        &["*"],
        ProxyLimits {
            max_bytes: 2000,
            ..ProxyLimits::default()
        },
    );
    let r = budget
        .rpc(1, "tools/call", json!({"name": "fs__big"}))
        .await;
    assert_eq!(r["error"]["code"], code::LIMIT);
}

#[tokio::test]
async fn concurrent_calls_answer_in_completion_order() {
    let limits = ProxyLimits {
        call_timeout: Duration::from_millis(300),
        ..ProxyLimits::default()
    };
    let mut h = harness(&["*"], limits);
    h.send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "mem__slow"}})
            .to_string()
            .as_bytes(),
    )
    .await;
    h.send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "fs__read"}})
            .to_string()
            .as_bytes(),
    )
    .await;
    assert_eq!(h.next().await["id"], 2);
    assert_eq!(h.next().await["id"], 1);
}

#[tokio::test]
async fn bad_requests_get_errors_and_the_channel_stays_open() {
    let mut h = harness(&["*"], ProxyLimits::default());
    let r = h.rpc(1, "tools/list_everything", json!({})).await;
    assert_eq!(r["error"]["code"], code::METHOD_NOT_FOUND);
    let r = h.rpc(2, "tools/call", json!({"name": 5})).await;
    assert_eq!(r["error"]["code"], code::INVALID_PARAMS);
    let r = h
        .rpc(
            3,
            "tools/call",
            json!({"name": "fs__read", "arguments": [1]}),
        )
        .await;
    assert_eq!(r["error"]["code"], code::INVALID_PARAMS);
    h.send(b"[1, 2]").await;
    assert_eq!(h.next().await["error"]["code"], code::INVALID_REQUEST);
    // A notification gets no answer; the next request does.
    h.send(br#"{"jsonrpc":"2.0","method":"notifications/whatever"}"#)
        .await;
    let r = h.rpc(4, "tools/search", json!({"query": "read"})).await;
    assert_eq!(r["result"]["tools"][0]["name"], "fs__read");
    let r = h.rpc(5, "tools/get", json!({"name": "fs__read"})).await;
    assert_eq!(r["result"]["input_schema"], json!({"type": "object"}));
    assert!(h.session.report().channel_error.is_none());
}

#[tokio::test]
async fn garbage_closes_the_channel_with_an_error_in_the_report() {
    let mut h = harness(&["*"], ProxyLimits::default());
    h.send(b"this is not json").await;
    let r = h.next().await;
    assert_eq!(r["error"]["code"], code::PARSE_ERROR);
    assert!(r["id"].is_null());
    let mut rest = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut h.sandbox, &mut rest)
        .await
        .unwrap();
    assert_eq!(rest, "", "the channel is closed after the error");
    h.serving.await.unwrap();
    assert!(h
        .session
        .report()
        .channel_error
        .unwrap()
        .contains("not JSON"));
}

#[tokio::test]
async fn oversized_frames_close_the_channel() {
    let mut h = harness(
        &["*"],
        ProxyLimits {
            max_request_bytes: 1024,
            ..ProxyLimits::default()
        },
    );
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"fs__read","arguments":{{"x":"{}"}}}}}}"#,
        "y".repeat(5000)
    );
    h.send(big.as_bytes()).await;
    let r = h.next().await;
    assert_eq!(r["error"]["code"], code::PARSE_ERROR);
    h.serving.await.unwrap();
    assert!(h
        .session
        .report()
        .channel_error
        .unwrap()
        .contains("larger than 1024 bytes"));
    assert_eq!(h.backend.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_sandbox_closing_fd3_ends_the_session_and_aborts_calls() {
    let limits = ProxyLimits {
        call_timeout: Duration::from_secs(30),
        ..ProxyLimits::default()
    };
    let h = harness(&["*"], limits);
    let Harness {
        mut sandbox,
        serving,
        ..
    } = h;
    sandbox
        .get_mut()
        .write_all(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"mem__slow"}}"#,
        )
        .await
        .unwrap();
    sandbox.get_mut().write_all(b"\n").await.unwrap();
    drop(sandbox);
    tokio::time::timeout(Duration::from_secs(5), serving)
        .await
        .expect("the session ends at once")
        .unwrap();
}
