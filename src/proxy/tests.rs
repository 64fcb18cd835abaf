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
                annotations: None,
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
            ..Default::default()
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

/// A server that is connected and lists `gh__get_issue` and `gh__delete_repo`; a name
/// with its prefix that it does not list is answered as `Upstreams` answers it.
struct Listed;

impl ToolBackend for Listed {
    fn catalog(&self) -> Arc<Catalog> {
        let tool = |tool: &str| CatalogTool {
            name: format!("gh__{tool}"),
            server: "github".into(),
            tool: tool.into(),
            server_ident: "gh".into(),
            tool_ident: tool.into(),
            title: None,
            description: None,
            input_schema: json!({"type": "object"}),
            output_schema: None,
            annotations: None,
        };
        Arc::new(Catalog {
            version: 1,
            tools: vec![tool("get_issue"), tool("delete_repo")],
            servers: vec![crate::upstream::catalog::CatalogServer {
                name: "github".into(),
                ident: "gh".into(),
            }],
        })
    }

    fn index(&self) -> Arc<crate::catalog::SearchIndex> {
        Arc::new(crate::catalog::SearchIndex::build(&self.catalog()))
    }

    fn call(
        &self,
        name: String,
        _arguments: Option<serde_json::Map<String, Value>>,
        _timeout: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<CallToolResult, CallError>> + Send + 'static>> {
        let listed: Vec<String> = self
            .catalog()
            .tools
            .iter()
            .map(|t| t.name.clone())
            .collect();
        Box::pin(async move {
            let e = crate::upstream::manager::not_listed(&name, "github", &listed);
            Err(super::upstream_backend::call_error(e))
        })
    }
}

/// A name the server does not list is answered with what it lists, but only what this
/// execution may call: `tools/search` shows nothing else, and neither may the error.
#[tokio::test]
async fn an_unlisted_name_shows_only_the_tools_the_allowlist_lets_through() {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    theirs.set_nonblocking(true).unwrap();
    let allow = AllowList::new(&["gh__get_*"]).unwrap();
    let session = ProxySession::new(Arc::new(Listed), allow, ProxyLimits::default());
    tokio::spawn(session.clone().serve(UnixStream::from_std(ours).unwrap()));
    let mut h = Harness {
        session,
        backend: Arc::new(Echo {
            calls: AtomicU32::new(0),
        }),
        sandbox: BufReader::new(UnixStream::from_std(theirs).unwrap()),
        serving: tokio::spawn(async {}),
    };
    let r = h
        .rpc(
            1,
            "tools/search",
            json!({"query": "repo issue", "detail": "name"}),
        )
        .await;
    assert!(!r.to_string().contains("delete_repo"), "{r}");
    let r = h
        .rpc(2, "tools/call", json!({"name": "gh__get_issues"}))
        .await;
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains("gh__get_issue"), "{message}");
    assert!(!message.contains("delete_repo"), "{message}");
    assert_eq!(r["error"]["code"], code::UNKNOWN_TOOL, "{r}");
    let record = &h.session.report().tool_calls[0];
    assert_eq!(record.error_kind, Some("unknown_tool"), "{record:?}");
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

/// Reads answers until one has `id`; returns it and how many others came first.
async fn answer_to(h: &mut Harness, id: Value) -> (Value, usize) {
    let mut others = 0;
    loop {
        let r = h.next().await;
        if r["id"] == id {
            return (r, others);
        }
        others += 1;
    }
}

#[tokio::test]
async fn junk_of_every_kind_is_answered_briefly_and_counted() {
    let mut h = harness(&["*"], ProxyLimits::default());
    let huge = "m".repeat(100_000);
    let junk = [
        json!({"jsonrpc": "2.0", "id": "j1", "method": format!("tools/{huge}")}),
        json!({"jsonrpc": "2.0", "id": "x".repeat(1000), "method": "tools/get"}),
        json!({"jsonrpc": "2.0", "id": {"an": "object"}, "method": "tools/get"}),
        json!({"jsonrpc": "2.0", "id": "j2", "method": 5}),
        json!({"jsonrpc": "2.0", "method": "codebox/done", "params": {"status": "ok"}}),
        json!({"jsonrpc": "2.0", "method": format!("notifications/{huge}")}),
        json!([1, 2, 3]),
        json!({"jsonrpc": "2.0", "id": "j3", "method": "tools/search", "params": {"query": huge}}),
    ];
    for j in &junk {
        h.send(j.to_string().as_bytes()).await;
    }
    h.send(b"   ").await;
    let r = h.rpc(1, "tools/search", json!({"query": "read"})).await;
    let r = if r["id"] == 1 {
        r
    } else {
        answer_to(&mut h, json!(1)).await.0
    };
    assert_eq!(r["result"]["tools"][0]["name"], "fs__read", "{r}");
    let report = h.session.report();
    // Six answered junk messages and the search; notifications and blank lines are free.
    assert_eq!(report.requests, 7);
    assert!(report.channel_error.is_none());
}

#[tokio::test]
async fn long_ids_and_methods_are_not_echoed() {
    let mut h = harness(&["*"], ProxyLimits::default());
    h.send(
        json!({"jsonrpc": "2.0", "id": "i".repeat(100), "method": "tools/get"})
            .to_string()
            .as_bytes(),
    )
    .await;
    let r = h.next().await;
    assert_eq!(r["error"]["code"], code::INVALID_REQUEST);
    assert!(r["id"].is_null());
    let r = h
        .rpc(2, &format!("tools/{}", "m".repeat(1 << 20)), json!({}))
        .await;
    assert_eq!(r["error"]["code"], code::METHOD_NOT_FOUND);
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.len() < 600, "{}", message.len());
    assert!(message.contains("…[truncated, 1048582 bytes]"), "{message}");
}

#[tokio::test]
async fn a_sandbox_that_never_reads_is_held_back_by_the_socket() {
    let limits = ProxyLimits {
        max_in_flight: 4,
        max_queued_reply_bytes: 64 * 1024,
        ..ProxyLimits::default()
    };
    let mut h = harness(&["*"], limits);
    let name = "nope__".to_string() + &"x".repeat(200);
    let one = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/get", "params": {"name": name}})
        .to_string()
        + "\n";
    let chunk = one.repeat(256).into_bytes();
    // Write without reading until a write blocks: the proxy stopped reading fd 3.
    let mut written = 0usize;
    let blocked = loop {
        let w = h.sandbox.get_mut().write_all(&chunk);
        match tokio::time::timeout(Duration::from_millis(500), w).await {
            Ok(r) => {
                r.unwrap();
                written += chunk.len();
                assert!(written < 256 << 20, "the proxy never stopped reading");
            }
            Err(_) => break written,
        }
    };
    let handled = h.session.report().requests;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        h.session.report().requests,
        handled,
        "nothing more is read while the answers are not"
    );
    // What the proxy answered is bounded by the socket buffers and its queue budget,
    // not by what the sandbox wrote.
    let answered = handled as usize * one.len();
    assert!(
        answered < 4 << 20,
        "{handled} requests handled after {blocked} bytes written"
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let note = h.session.report().channel_error.unwrap();
    assert!(note.contains("answers unread on fd 3"), "{note}");
    // Reading the answers lets the reader go on.
    for _ in 0..(handled as usize).min(2000) {
        h.next().await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(h.session.report().requests > handled);
}

#[tokio::test]
async fn every_kind_of_request_counts_and_past_the_limit_none_reaches_the_backend() {
    let limits = ProxyLimits {
        max_calls: 5,
        ..ProxyLimits::default()
    };
    let mut h = harness(&["fs__read"], limits);
    let r = h.rpc(1, "tools/search", json!({"query": "read"})).await;
    assert!(r.get("result").is_some());
    let r = h.rpc(2, "tools/get", json!({"name": "fs__read"})).await;
    assert!(r.get("result").is_some());
    let r = h.rpc(3, "tools/call", json!({"name": "mem__fail"})).await;
    assert_eq!(r["error"]["code"], code::DENIED);
    let r = h.rpc(4, "nothing/here", json!({})).await;
    assert_eq!(r["error"]["code"], code::METHOD_NOT_FOUND);
    h.send(br#"{"jsonrpc":"2.0","id":5}"#).await;
    assert_eq!(h.next().await["error"]["code"], code::INVALID_REQUEST);
    for (id, method) in [
        (6, "tools/call"),
        (7, "tools/search"),
        (8, "tools/get"),
        (9, "x"),
    ] {
        let r = h
            .rpc(id, method, json!({"name": "fs__read", "query": "read"}))
            .await;
        assert_eq!(r["error"]["code"], code::LIMIT, "{method}: {r}");
        assert!(r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limit of 5 tool calls"));
    }
    assert_eq!(h.backend.calls.load(Ordering::SeqCst), 0);
    let report = h.session.report();
    assert_eq!(report.requests, 5);
    // The denied call has its record; the refused tools/call is counted, not listed.
    assert_eq!(report.tool_calls.len(), 1);
    let dropped = report.tool_calls_dropped.unwrap();
    assert_eq!(dropped.count, 1);
    assert_eq!(dropped.by_outcome["limit"], 1);
}

#[tokio::test]
async fn records_are_capped_clipped_and_observed_once_each() {
    let limits = ProxyLimits {
        max_call_records: 3,
        ..ProxyLimits::default()
    };
    let mut h = harness(&["*"], limits);
    let seen = Arc::new(AtomicU32::new(0));
    let counter = seen.clone();
    h.session.set_observer(Arc::new(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    }));
    let long = format!("fs__{}", "n".repeat(1 << 20));
    for id in 0..10 {
        let name = if id % 2 == 0 {
            long.as_str()
        } else {
            "fs__read"
        };
        let r = h.rpc(id, "tools/call", json!({"name": name})).await;
        if id % 2 == 0 {
            let message = r["error"]["message"].as_str().unwrap();
            assert!(message.len() < 600, "{}", message.len());
            assert!(message.contains("…[truncated, 1048580 bytes]"), "{message}");
        }
    }
    let report = h.session.report();
    assert_eq!(report.tool_calls.len(), 3);
    assert_eq!(seen.load(Ordering::SeqCst), 3);
    let first = &report.tool_calls[0];
    assert!(first.name.len() < 400 && first.name.ends_with("…[truncated, 1048580 bytes]"));
    assert!(first.error.as_ref().unwrap().len() < 1200);
    let dropped = report.tool_calls_dropped.unwrap();
    assert_eq!(dropped.count, 7);
    assert_eq!(dropped.by_outcome["unknown_tool"], 3);
    assert_eq!(dropped.by_outcome["ok"], 4);
    // A keep-alive session's next run starts again.
    let _ = h.session.take_report();
    assert!(h.session.report().tool_calls_dropped.is_none());
}

#[tokio::test]
async fn only_an_awaited_codebox_done_reaches_the_control_queue() {
    let mut h = harness(&["*"], ProxyLimits::default());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    h.session.set_control(tx);
    let done = json!({"jsonrpc": "2.0", "method": "codebox/done", "params": {"status": "ok", "junk": "j".repeat(100_000)}});
    for _ in 0..100 {
        h.send(done.to_string().as_bytes()).await;
        h.send(br#"{"jsonrpc":"2.0","method":"codebox/other","params":{}}"#)
            .await;
    }
    // A request after them proves they were all read.
    h.rpc(1, "tools/search", json!({"query": "x"})).await;
    let note = rx.try_recv().unwrap();
    assert_eq!(note, json!({"method": "codebox/done", "status": "ok"}));
    assert!(rx.try_recv().is_err(), "one awaited, one passed on");
    assert!(h.session.send_line(b"{}".to_vec()));
    assert_eq!(h.next().await, json!({}));
    h.send(done.to_string().as_bytes()).await;
    h.rpc(2, "tools/search", json!({"query": "x"})).await;
    assert!(rx.try_recv().is_ok());
}

#[tokio::test]
async fn the_last_codebox_value_lands_in_the_report_cut_to_its_bound() {
    let mut h = harness(&["*"], ProxyLimits::default());
    let value =
        |repr: &str| json!({"jsonrpc": "2.0", "method": "codebox/value", "params": {"repr": repr}});
    h.send(value("1").to_string().as_bytes()).await;
    // Malformed ones are ignored, never an error.
    h.send(br#"{"jsonrpc":"2.0","method":"codebox/value","params":{"repr":7}}"#)
        .await;
    h.send(br#"{"jsonrpc":"2.0","method":"codebox/value"}"#)
        .await;
    h.rpc(1, "tools/search", json!({"query": "x"})).await;
    assert_eq!(h.session.report().value.as_deref(), Some("1"));
    h.send(
        value(&"v".repeat(MAX_VALUE_BYTES + 10))
            .to_string()
            .as_bytes(),
    )
    .await;
    h.rpc(2, "tools/search", json!({"query": "x"})).await;
    let kept = h.session.take_report().value.unwrap();
    assert!(kept.len() < MAX_VALUE_BYTES + 100);
    assert!(kept.ends_with(&format!("…[truncated, {} bytes]", MAX_VALUE_BYTES + 10)));
    // A keep-alive session's next run starts without one.
    assert_eq!(h.session.report().value, None);
}

#[test]
fn clip_cuts_at_a_character_boundary_with_a_marker() {
    assert_eq!(clip("short", 10), "short");
    let s = "é".repeat(10);
    let c = clip(&s, 5);
    assert_eq!(c, "éé…[truncated, 20 bytes]");
}

#[test]
fn parse_cost_counts_what_parsing_takes_not_only_the_text() {
    use super::session::parse_cost;
    let text = format!("{{\"x\":\"{}\"}}", "y".repeat(1 << 20));
    assert!(
        parse_cost(&text) < (1 << 20) + 4096,
        "one big string is its text"
    );
    // Brackets and commas inside strings are text.
    assert!(parse_cost(r#""{[,,,]}\"{""#) < 200);
    let objects = format!("[{}]", vec![r#"{"a":0}"#; 1000].join(","));
    assert!(
        parse_cost(&objects) > 1000 * 640,
        "{}",
        parse_cost(&objects)
    );
}

#[tokio::test]
async fn params_that_would_parse_into_a_flood_of_values_are_refused() {
    let limits = ProxyLimits {
        max_in_flight_bytes: 16 << 20,
        ..ProxyLimits::default()
    };
    let mut h = harness(&["*"], limits);
    let many = vec![json!({"a": 0}); 200_000];
    let r = h
        .rpc(
            1,
            "tools/call",
            json!({"name": "fs__read", "arguments": {"x": many}}),
        )
        .await;
    assert_eq!(r["error"]["code"], code::INVALID_PARAMS, "{r}");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("would take about"));
    assert_eq!(h.backend.calls.load(Ordering::SeqCst), 0);
    // A large string is fine, and so is the next request.
    let big = "z".repeat(8 << 20);
    let r = h
        .rpc(
            2,
            "tools/call",
            json!({"name": "fs__read", "arguments": {"x": big}}),
        )
        .await;
    assert_eq!(
        r["result"]["structuredContent"]["echo"]["x"]
            .as_str()
            .unwrap()
            .len(),
        8 << 20
    );
}

#[path = "approval_tests.rs"]
mod approval_tests;
