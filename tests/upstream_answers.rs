//! Answers an upstream server should not send: over the size limit, not UTF-8, not
//! JSON-RPC, for an id nobody asked for, or oversized without any id. Each must fail its
//! call at once with the reason (the limit, by name and size) instead of running into the
//! call timeout, and the server must stay usable (or, without an id, be reconnected).
//!
//! The server is `tests/upstream/hostile_server.py` (raw JSON-RPC, no SDK).

#[path = "upstream/support.rs"]
#[allow(dead_code)]
mod support;

use std::time::{Duration, Instant};

use codebox::upstream::{
    ServerConfig, ServerState, TransportConfig, UpstreamError, UpstreamOptions, Upstreams,
};
use serde_json::json;

use support::*;

const LIMIT: usize = 1 << 20;
/// A bad answer must fail well within this (the call timeout is a minute).
const FAST: Duration = Duration::from_secs(10);

fn small_limit() -> UpstreamOptions {
    UpstreamOptions {
        max_message_bytes: LIMIT,
        ..options()
    }
}

async fn call(
    u: &Upstreams,
    tool: &str,
    a: serde_json::Value,
) -> (Result<String, String>, Duration) {
    let started = Instant::now();
    let r = u
        .call(&format!("hostile__{tool}"), args(a), CALL)
        .await
        .map(|r| text(&r))
        .map_err(|e| {
            assert!(
                !matches!(e, UpstreamError::Timeout { .. }),
                "{tool}: ran into the timeout: {e}"
            );
            e.to_string()
        });
    (r, started.elapsed())
}

async fn bad(u: &Upstreams, tool: &str, a: serde_json::Value, expect: &str) {
    let (r, took) = call(u, tool, a.clone()).await;
    let e = r.expect_err(&format!("{tool} {a} must fail"));
    assert!(e.contains(expect), "{tool} {a}: {e}");
    assert!(e.contains("hostile"), "names the server: {e}");
    assert!(took < FAST, "{tool}: failed only after {took:?}");
}

async fn echo_works(u: &Upstreams, what: &str) {
    let (r, _) = call(u, "echo", json!({"text": what})).await;
    assert_eq!(r.unwrap(), what);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_answers_fail_their_call_at_once_and_the_server_stays() {
    let Some(fx) = fixtures("bad_answers_fail_their_call_at_once_and_the_server_stays") else {
        return;
    };
    let u = Upstreams::connect(vec![fx.hostile()], small_limit()).await;
    let first = status(&u, "hostile");
    assert_eq!(first.state, ServerState::Ready, "{first:?}");
    let pid = first.pid.unwrap();
    let limit = "over the limit of 1 MiB (1048576 bytes)";

    // Just under the limit passes; the text alone at the limit puts the line just over.
    for id_last in [false, true] {
        let (r, _) = call(&u, "big", json!({"bytes": LIMIT - 200, "id_last": id_last})).await;
        assert_eq!(r.unwrap().len(), LIMIT - 200);
        bad(
            &u,
            "big",
            json!({"bytes": LIMIT, "id_last": id_last}),
            limit,
        )
        .await;
        echo_works(&u, "after big").await;
    }
    // Far over: skipped without being buffered, still at once.
    bad(
        &u,
        "big",
        json!({"bytes": 40 * LIMIT, "id_last": true}),
        limit,
    )
    .await;
    echo_works(&u, "after huge").await;

    bad(&u, "bad_utf8", json!({}), "not valid UTF-8 (at byte").await;
    echo_works(&u, "after utf-8").await;
    bad(&u, "not_jsonrpc", json!({}), "not a valid JSON-RPC message").await;
    echo_works(&u, "after json-rpc").await;
    let (r, _) = call(&u, "unknown_id", json!({})).await;
    assert_eq!(r.unwrap(), "for you");

    // Several at once, each failed by its own id.
    let calls = (0..4).map(|i| {
        let u = u.clone();
        async move {
            let size = if i % 2 == 0 { LIMIT + 10 } else { 100 };
            (
                i,
                call(&u, "big", json!({"bytes": size, "id_last": true}))
                    .await
                    .0,
            )
        }
    });
    for (i, r) in futures_join(calls).await {
        match i % 2 {
            0 => assert!(r.unwrap_err().contains(limit)),
            _ => assert_eq!(r.unwrap().len(), 100),
        }
    }

    let s = status(&u, "hostile");
    assert_eq!(
        (s.state, s.pid, s.attempts),
        (ServerState::Ready, Some(pid), 1),
        "{s:?}"
    );
    shutdown_and_check(&u, &[pid]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_oversized_answer_without_an_id_fails_at_once_and_the_server_is_reconnected() {
    let Some(fx) =
        fixtures("an_oversized_answer_without_an_id_fails_at_once_and_the_server_is_reconnected")
    else {
        return;
    };
    let mut config = fx.hostile();
    set_env(&mut config, "HOSTILE_BANNER", "1");
    let u = Upstreams::connect(vec![config], small_limit()).await;
    let first = status(&u, "hostile");
    assert_eq!(
        first.state,
        ServerState::Ready,
        "a banner line is skipped: {first:?}"
    );
    let pid = first.pid.unwrap();
    bad(
        &u,
        "big_noid",
        json!({"bytes": 2 * LIMIT}),
        "over the limit of 1 MiB",
    )
    .await;
    wait_until(&u, "the server is reconnected", |u| {
        let s = status(u, "hostile");
        s.state == ServerState::Ready && s.pid != Some(pid)
    })
    .await;
    echo_works(&u, "back").await;
    let s = status(&u, "hostile");
    shutdown_and_check(&u, &[pid, s.pid.unwrap()]).await;
}

/// hostile_server.py over streamable HTTP, stopped on drop.
struct HttpHostile(std::process::Child);

impl HttpHostile {
    fn start(fx: &Fixtures) -> (HttpHostile, ServerConfig) {
        let script = fx.tmp.path().join("hostile_http.py");
        std::fs::write(&script, include_str!("upstream/hostile_server.py")).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new(&fx.python)
            .arg(&script)
            .args(["--http", &port.to_string()])
            .spawn()
            .unwrap();
        let deadline = Instant::now() + PATIENCE;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the HTTP server did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        let config = ServerConfig {
            name: "hostile".into(),
            transport: TransportConfig::Http {
                url: format!("http://127.0.0.1:{port}/mcp").parse().unwrap(),
                headers: Default::default(),
            },
        };
        (HttpHostile(child), config)
    }
}

impl Drop for HttpHostile {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_http_answers_fail_at_once_naming_the_limit() {
    let Some(fx) = fixtures("oversized_http_answers_fail_at_once_naming_the_limit") else {
        return;
    };
    let (_server, config) = HttpHostile::start(&fx);
    let u = Upstreams::connect(vec![config], small_limit()).await;
    let first = status(&u, "hostile");
    assert_eq!(first.state, ServerState::Ready, "{first:?}");
    // A JSON body: rmcp reads at most 16 MiB of it, whatever max_message_bytes says.
    let (r, _) = call(&u, "big", json!({"bytes": 1000})).await;
    assert_eq!(r.unwrap().len(), 1000);
    let (r, _) = call(&u, "big", json!({"bytes": 2 * LIMIT})).await;
    assert_eq!(r.unwrap().len(), 2 * LIMIT);
    bad(
        &u,
        "big",
        json!({"bytes": 17 << 20}),
        "HTTP response body over the limit of 16 MiB (16777216 bytes)",
    )
    .await;
    echo_works(&u, "after a big body").await;
    // An SSE event over max_message_bytes ends the connection: the call fails at once
    // and the server is reconnected.
    let (r, _) = call(&u, "big", json!({"bytes": 1000, "sse": true})).await;
    assert_eq!(r.unwrap().len(), 1000);
    bad(
        &u,
        "big",
        json!({"bytes": 2 * LIMIT, "sse": true}),
        "went away",
    )
    .await;
    wait_until(&u, "the server is back", |u| {
        status(u, "hostile").state == ServerState::Ready
    })
    .await;
    echo_works(&u, "after a big event").await;
    u.shutdown().await;
}

/// Runs futures concurrently (tokio::spawn needs 'static; these borrow nothing).
async fn futures_join<F: std::future::Future + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

/// A call that waited for its server to connect and then ran out of time says so: the
/// call's own timeout and how much of it went to waiting, not only the remainder.
#[tokio::test(flavor = "multi_thread")]
async fn a_timeout_after_waiting_for_the_server_names_the_calls_timeout_and_the_wait() {
    let Some(fx) = fixtures("a_timeout_after_waiting_for_the_server") else {
        return;
    };
    let mut server = fx.hostile();
    set_env(&mut server, "HOSTILE_DELAY_S", "1");
    let waiting = UpstreamOptions {
        call_wait: Duration::from_secs(20),
        ..options()
    };
    let u = Upstreams::start(vec![server], waiting);
    // `big_noid` never answers (its answer has no id).
    let timeout = Duration::from_millis(2500);
    let e = u
        .call("hostile__big_noid", args(json!({"bytes": 10})), timeout)
        .await
        .unwrap_err();
    assert!(matches!(e, UpstreamError::Timeout { .. }), "{e}");
    let message = e.to_string();
    assert!(message.contains("within 2.5s"), "{message}");
    assert!(message.contains("waiting for the server"), "{message}");
    u.shutdown().await;
}
