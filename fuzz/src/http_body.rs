//! The HTTP listener's checks in front of rmcp: the bearer token, then the body
//! (`codebox::server::transport::http::{with_bearer, with_body_check}`), exactly as `serve` layers
//! them, in front of a handler that echoes what reached it.
//!
//! Input: a byte of flags (method, token, `MCP-Protocol-Version`), then the body.
//!
//! Properties:
//! - without the right token nothing is read or passed on: 401;
//! - a POST whose body passes the JSON-RPC checks reaches the handler byte for byte;
//! - any other POST body gets 400 (413 when too large) with a JSON-RPC error whose id is
//!   the request's when it can be read;
//! - other methods pass through unread.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::routing::any;
use axum::Router;
use codebox::server::transport::framing;
use codebox::server::transport::http::{tokens_of, with_bearer, with_body_check};
use serde_json::Value;
use tower::ServiceExt;

use crate::{block_on, oracle};

const TOKEN: &str = "fuzz-token-0123456789";
const VERSIONS: [Option<&str>; 4] = [
    None,
    Some("2026-07-28"),
    Some("2025-11-25"),
    Some("2026-99-99"),
];

fn router() -> Router {
    thread_local! {
        static ROUTER: Router = {
            let echo = Router::new().route(
                "/mcp",
                any(|body: axum::body::Bytes| async move { (StatusCode::OK, body) }),
            );
            let checked = with_body_check(echo, Duration::from_secs(5));
            with_bearer(checked, tokens_of(&[("fuzz".into(), TOKEN.into())]))
        };
    }
    ROUTER.with(Router::clone)
}

pub fn run(data: &[u8]) {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let method =
        [Method::POST, Method::POST, Method::GET, Method::DELETE][usize::from(flags & 3)].clone();
    let auth = match (flags >> 2) & 3 {
        0 => None,
        1 => Some(format!("Bearer {TOKEN}x")),
        _ => Some(format!("Bearer {TOKEN}")),
    };
    let version = VERSIONS[usize::from(flags >> 4) % VERSIONS.len()];
    let mut request = Request::builder().method(method.clone()).uri("/mcp");
    if let Some(auth) = &auth {
        request = request.header("authorization", auth);
    }
    if let Some(v) = version.and_then(|v| axum::http::HeaderValue::from_str(v).ok()) {
        request = request.header("mcp-protocol-version", v);
    }
    let request = request
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
        .expect("a request");
    let (status, answer) = block_on(async {
        let response = router().oneshot(request).await.expect("infallible");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("the answer's body");
        (status, bytes)
    });

    if auth.as_deref() != Some(&format!("Bearer {TOKEN}")) {
        assert_eq!(status, StatusCode::UNAUTHORIZED, "no token, yet {status}");
        return;
    }
    if method != Method::POST {
        assert_eq!(status, StatusCode::OK, "a {method} is not checked");
        assert_eq!(&answer[..], body);
        return;
    }
    let blank = framing::is_blank(body);
    let declared = version.filter(|v| axum::http::HeaderValue::from_str(v).is_ok());
    if !blank && framing::check_declared(body, declared).is_ok() {
        assert_eq!(status, StatusCode::OK, "a good body was refused");
        assert_eq!(&answer[..], body, "the body changed on its way");
        return;
    }
    assert!(
        status == StatusCode::BAD_REQUEST || status == StatusCode::PAYLOAD_TOO_LARGE,
        "a bad body got {status}"
    );
    let error: Value = serde_json::from_slice(&answer).expect("the refusal is JSON");
    assert_eq!(error["jsonrpc"], "2.0");
    assert!(error["error"]["code"].is_i64(), "{error}");
    if let Some(id) = oracle::readable_id(body, framing::MAX_ID_BYTES) {
        assert_eq!(error["id"], id, "refused with the wrong id");
    }
}
