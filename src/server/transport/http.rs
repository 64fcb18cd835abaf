//! MCP over streamable HTTP (rmcp's `StreamableHttpService` on axum), at `/mcp`.
//!
//! - `Host` is validated against loopback names plus the bound address (DNS-rebinding
//!   protection, by rmcp), and `Origin`, when present, must be one of the allowed
//!   origins: anything else gets 403.
//! - A bearer token is required whenever the listener is not on loopback (and whenever
//!   one is configured); it is compared in constant time, and a missing or wrong one
//!   gets 401. Each token names a client (`http.token` is "default", `[http.clients]`
//!   names more): the request carries that [`ClientName`] to the tools, which key rate
//!   limits and sessions by it.
//! - Every MCP session gets its own server value (`CodeboxServer::for_new_connection`):
//!   shared state, its own PII token map. A session belongs to the client whose token
//!   created it (see [`crate::server::session_owners`]): any other client presenting its
//!   `Mcp-Session-Id` gets the answer an unknown session gets (404), on POST, GET and
//!   DELETE alike. A DELETE that ends a session answers 200 (the SDKs log 202 as a
//!   failure).
//! - `GET /healthz` answers without auth, for load balancers and service managers: the
//!   process is up (liveness).
//! - `GET /readyz`: 200 once executions can run as configured, else 503 (also while
//!   draining after SIGTERM), for probes without a secret: `{"ready", "draining"}`. The
//!   pool's and each upstream's state only with a valid token (when tokens are
//!   configured) and `/mcp`'s Host check.
//! - With a replica name (see [`crate::replica`]) every answer carries
//!   `Codebox-Replica`, and MCP session ids start with the name.
//! - `GET /metrics` (bearer auth when tokens are configured, and `/mcp`'s Host check;
//!   other methods 405): the Prometheus exposition ([`crate::server::wiring::metrics`]).
//! - A POST body goes through [`framing::check`](crate::server::transport::framing::check) before rmcp sees
//!   it: one that is not a JSON-RPC message gets 400 with the JSON-RPC error (with the
//!   request's id when readable), one over 16 MiB 413, one that does not arrive within
//!   the body timeout 408. Bodies are parsed (here, then by rmcp) under one budget of
//!   estimated parse memory, [`PARSE_BUDGET`]: a request waits while others use it.
//! - Connections (caps, header and idle timeouts, PROXY headers from trusted balancers)
//!   are [`crate::server::transport::http_conn`]'s. The client address a balancer declares only counts
//!   connections and names them in logs: nothing here depends on the peer's address.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::server::client::ClientName;
use crate::server::CodeboxServer;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "{addr} is not a loopback address: a bearer token is required (set CODEBOX_HTTP_TOKEN)"
    )]
    TokenRequired { addr: SocketAddr },
    #[error("http.trusted_proxies is set: clients reach codebox through a balancer, so a bearer token is required, also on loopback (set CODEBOX_HTTP_TOKEN)")]
    TokenRequiredBehindBalancer,
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the bound address of {addr}")]
    LocalAddr {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// After shutdown is asked for, how long POST responses may take to be written out.
pub const ANSWERS_OUT_BOUND: std::time::Duration = std::time::Duration::from_secs(5);

/// HTTP listener settings.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    pub addr: SocketAddr,
    /// Clients and their bearer tokens; required when any is set, and mandatory off
    /// loopback.
    pub clients: Vec<(String, String)>,
    /// Browser origins allowed to call (e.g. `http://localhost:*`).
    pub allowed_origins: Vec<String>,
    /// Extra `Host` names accepted besides loopback (public deployments).
    pub allowed_hosts: Vec<String>,
    /// Connection caps and timeouts.
    pub limits: crate::server::transport::http_conn::ConnLimits,
}

/// Serves until `shutdown` resolves; calls `on_listening` with the bound address.
pub async fn serve(
    server: CodeboxServer,
    options: HttpOptions,
    on_listening: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    if !options.addr.ip().is_loopback() && options.clients.is_empty() {
        return Err(Error::TokenRequired { addr: options.addr });
    }
    // Tokenless HTTP is for the local user; behind a balancer the caller is anyone the
    // balancer serves, whatever address its PROXY header declares.
    if !options.limits.trusted_proxies.is_empty() && options.clients.is_empty() {
        return Err(Error::TokenRequiredBehindBalancer);
    }
    let listener = tokio::net::TcpListener::bind(options.addr)
        .await
        .map_err(|source| Error::Bind {
            addr: options.addr,
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| Error::LocalAddr {
        addr: options.addr,
        source,
    })?;
    let ct = CancellationToken::new();
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    if !bound.ip().is_unspecified() {
        hosts.push(bound.ip().to_string());
    }
    hosts.extend(options.allowed_hosts.iter().cloned());
    let readyz_hosts: Arc<Vec<String>> = Arc::new(hosts.clone());
    let config = StreamableHttpServerConfig::default()
        .with_cancellation_token(ct.child_token())
        .with_allowed_hosts(hosts)
        .with_allowed_origins(options.allowed_origins.clone())
        .enforce_origin_validation()
        .with_max_request_body_bytes(crate::server::transport::framing::MAX_MESSAGE_BYTES)
        .with_sse_keep_alive(Some(options.limits.sse_keep_alive()));
    let sessions = Arc::new(
        crate::server::transport::replica_sessions::ReplicaSessions::new(server.replica().cloned()),
    );
    let readyz_server = server.clone();
    let replica_header = server.replica().map(|r| {
        axum::http::HeaderValue::from_str(r.as_str()).expect("a DNS label is a header value")
    });
    let metrics_server = server.clone();
    let metrics_hosts = readyz_hosts.clone();
    let service = StreamableHttpService::new(
        move || Ok(server.for_new_connection()),
        sessions.clone(),
        config,
    );
    let tokens = tokens_of(&options.clients);
    // Its own router: a POST is answered 405, not taken for a JSON-RPC body.
    let metrics = Router::new()
        .route(
            "/metrics",
            get(move |request: Request| {
                let (server, hosts) = (metrics_server.clone(), metrics_hosts.clone());
                async move {
                    match host_allowed(&request, &hosts) {
                        true => crate::server::wiring::metrics::answer(&server, request.headers()),
                        false => forbidden_host("/metrics", &request),
                    }
                }
            }),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            tokens.clone(),
            require_bearer,
        ));
    let owners = crate::server::session_owners::Owners::new(sessions);
    let posts = crate::server::transport::http_answers::PostsInFlight::default();
    let mcp = with_body_check(
        Router::new().nest_service("/mcp", service),
        options.limits.body_timeout,
    )
    .layer(axum::middleware::from_fn_with_state(
        owners,
        crate::server::session_owners::enforce,
    ))
    .layer(axum::middleware::from_fn_with_state(
        posts.clone(),
        crate::server::transport::http_answers::count_posts,
    ));
    // The last layer runs first: no body is read before the token is checked.
    let mcp = with_bearer(mcp, tokens.clone());
    let readyz_state = Readyz {
        server: readyz_server,
        hosts: readyz_hosts,
        tokens: tokens.clone(),
    };
    let mut app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz).with_state(readyz_state))
        .merge(metrics)
        .merge(mcp);
    if let Some(name) = replica_header {
        // Every answer names the replica that gave it (see crate::replica).
        app = app.layer(axum::middleware::map_response(
            move |mut response: Response| {
                let name = name.clone();
                async move {
                    response
                        .headers_mut()
                        .insert(crate::replica::RESPONSE_HEADER, name);
                    response
                }
            },
        ));
    }
    on_listening(bound);
    // On shutdown no connection is accepted and every connection closes once its
    // response in flight is done; sessions (and the SSE streams of calls still running)
    // stay until the caller stops waiting for this future.
    // Answers already produced are written before the listener closes (bounded): a
    // client whose answer stream broke would try to resume it against a closed port.
    let shutdown = async move {
        shutdown.await;
        if !posts.wait_idle(ANSWERS_OUT_BOUND).await {
            tracing::warn!(
                unfinished = posts.count(),
                bound_s = ANSWERS_OUT_BOUND.as_secs(),
                "closing with POST responses still being written"
            );
        }
    };
    crate::server::transport::http_conn::serve(listener, app, options.limits.clone(), shutdown)
        .await;
    ct.cancel();
    Ok(())
}

/// 403 for a request to `path` whose Host is not allowed (see [`host_allowed`]).
fn forbidden_host(path: &str, request: &Request) -> Response {
    tracing::warn!(
        path,
        host = ?request.headers().get(header::HOST),
        "a Host header that is not allowed (possible DNS rebinding)"
    );
    (
        StatusCode::FORBIDDEN,
        "Forbidden: Host header is not allowed\n",
    )
        .into_response()
}

async fn healthz() -> impl IntoResponse {
    (StatusCode::OK, "ok\n")
}

/// 200 once executions can run as configured (sandbox checks passed, pool warm), else
/// 503; the body says the state of each part and which upstreams are ready, pending or
/// failed. Behind the bearer check: it names the upstream servers.
/// What `/readyz` needs.
#[derive(Clone)]
struct Readyz {
    server: CodeboxServer,
    /// The `Host` names `/mcp` accepts.
    hosts: Arc<Vec<String>>,
    tokens: Tokens,
}

/// `GET /readyz`: 200 when ready, else 503 (also while draining). Anyone gets the status
/// and `{"ready", "draining"}`, so a kubelet or balancer probes it without a secret and
/// whatever `Host` it sends. The detail (the pool's and each upstream's state) goes only
/// to a caller with a valid token (when tokens are configured) and an allowed `Host`: a
/// page the user's browser loaded from a name rebound to this address must not read it.
async fn readyz(State(r): State<Readyz>, request: Request) -> Response {
    let (ready, value) = r.server.readiness();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let trusted = host_allowed(&request, &r.hosts)
        && (r.tokens.is_empty() || client_of(&r.tokens, request.headers()).is_some());
    if trusted {
        return (status, axum::Json(value)).into_response();
    }
    let minimal = serde_json::json!({"ready": ready, "draining": value["draining"]});
    (status, axum::Json(minimal)).into_response()
}

/// The token digests of `clients` (name, token), for [`with_bearer`].
pub fn tokens_of(clients: &[(String, String)]) -> Tokens {
    Arc::new(
        clients
            .iter()
            .map(|(name, t)| (Sha256::digest(t.as_bytes()), ClientName(name.clone())))
            .collect(),
    )
}

/// `router` behind the bearer check: 401 unless a request carries one of `tokens` (none
/// configured: every request passes); the request then carries its client's name.
/// Applied last, so it runs before any layer below it reads the body.
pub fn with_bearer(router: Router, tokens: Tokens) -> Router {
    router.layer(axum::middleware::from_fn_with_state(tokens, require_bearer))
}

/// `router` behind the body check: a POST body must arrive within `body_timeout` and be
/// one JSON-RPC message of a sane size ([`framing::check`](crate::server::transport::framing::check)), else
/// 400/408/413 with its JSON-RPC error; what passes reaches `router` unchanged.
pub fn with_body_check(router: Router, body_timeout: std::time::Duration) -> Router {
    router.layer(axum::middleware::from_fn_with_state(
        BodyCheck {
            timeout: body_timeout,
            parsing: Arc::new(tokio::sync::Semaphore::new(PARSE_BUDGET >> 10)),
        },
        require_json_body,
    ))
}

/// Whether the request names one of `allowed` as its host (the `Host` header, else the
/// URI's authority), as rmcp checks it for `/mcp`: `/readyz` is not behind rmcp, and
/// without tokens a page the user's browser loaded from a name rebound to this address
/// could otherwise read it. An allowed entry without a port allows every port.
fn host_allowed(request: &Request, allowed: &[String]) -> bool {
    use axum::http::uri::Authority;
    let normal = |host: &str| host.trim_matches(['[', ']']).to_ascii_lowercase();
    let authority = match request.headers().get(header::HOST) {
        Some(value) => match value
            .to_str()
            .ok()
            .and_then(|v| v.parse::<Authority>().ok())
        {
            Some(a) => a,
            None => return false,
        },
        None => match request.uri().authority() {
            Some(a) => a.clone(),
            None => return false,
        },
    };
    let (host, port) = (normal(authority.host()), authority.port_u16());
    allowed.iter().any(|entry| {
        let entry = entry.trim();
        let (allowed_host, allowed_port) = match entry.parse::<Authority>() {
            Ok(a) => (normal(a.host()), a.port_u16()),
            Err(_) => (normal(entry), None),
        };
        allowed_host == host && allowed_port.is_none_or(|p| Some(p) == port)
    })
}

/// The digest of every client's token, and the client it names.
pub type Tokens = Arc<Vec<(sha2::digest::Output<Sha256>, ClientName)>>;

/// 401 unless the request carries a configured bearer token; the request then carries
/// the client's name.
async fn require_bearer(State(tokens): State<Tokens>, mut req: Request, next: Next) -> Response {
    if tokens.is_empty() {
        return next.run(req).await;
    }
    match client_of(&tokens, req.headers()) {
        Some(name) => {
            req.extensions_mut().insert(name);
            next.run(req).await
        }
        None => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "a valid bearer token is required\n",
        )
            .into_response(),
    }
}

/// The client whose bearer token the request carries, if any.
fn client_of(tokens: &Tokens, headers: &axum::http::HeaderMap) -> Option<ClientName> {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| Sha256::digest(t.as_bytes()))?;
    // Every digest is compared, so the time taken does not say which client matched.
    tokens
        .iter()
        .fold(None, |found, (d, name)| match constant_time_eq(&given, d) {
            true => Some(name.clone()),
            false => found,
        })
}

/// Estimated memory (see [`crate::proxy::parse_cost`]) the POST bodies being parsed at
/// once may take: each message is parsed here and again by rmcp, and one of 16 MiB took
/// 1.9 GB before per-message costs were bounded; four messages at the per-message bound
/// ([`crate::server::transport::framing::MAX_PARSE_COST`]) fill it.
pub const PARSE_BUDGET: usize = 256 * 1024 * 1024;

/// The body checks' settings.
#[derive(Clone)]
struct BodyCheck {
    timeout: std::time::Duration,
    /// [`PARSE_BUDGET`] in KiB.
    parsing: Arc<tokio::sync::Semaphore>,
}

/// 400/413 with a JSON-RPC error body unless a POST body is a JSON-RPC message of a sane
/// size (see [`framing::check`](crate::server::transport::framing::check)).
async fn require_json_body(
    State(BodyCheck {
        timeout: body_timeout,
        parsing,
    }): State<BodyCheck>,
    req: Request,
    next: Next,
) -> Response {
    use crate::server::transport::framing::{
        check_declared, too_large, Refusal, MAX_MESSAGE_BYTES, PARSE_ERROR,
    };
    if req.method() != axum::http::Method::POST {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let refuse = |status: StatusCode, refusal: Refusal| {
        tracing::warn!(code = refusal.code, why = %refusal.message, %status, "malformed JSON-RPC message over HTTP");
        (status, axum::Json(refusal.to_json())).into_response()
    };
    let parse_error = |message: String| Refusal {
        code: PARSE_ERROR,
        id: serde_json::Value::Null,
        message,
        notification: false,
    };
    let read = tokio::time::timeout(body_timeout, axum::body::to_bytes(body, MAX_MESSAGE_BYTES));
    let bytes = match read.await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return refuse(StatusCode::PAYLOAD_TOO_LARGE, parse_error(too_large())),
        Err(_) => {
            let why = format!(
                "Parse error: the request body did not arrive within {} s",
                body_timeout.as_secs_f64()
            );
            let mut answer = refuse(StatusCode::REQUEST_TIMEOUT, parse_error(why));
            // The rest of the body may still trickle in: do not keep reading it.
            answer.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            return answer;
        }
    };
    if crate::server::transport::framing::is_blank(&bytes) {
        return refuse(
            StatusCode::BAD_REQUEST,
            parse_error("Parse error: the body is empty".into()),
        );
    }
    // Held while the body is parsed here and by rmcp (which answers with a stream as
    // soon as it has the message, so this is not held while a call runs).
    let cost = std::str::from_utf8(&bytes)
        .map_or(bytes.len(), crate::proxy::parse_cost)
        .min(crate::server::transport::framing::MAX_PARSE_COST);
    let units = u32::try_from(cost.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
    let Ok(_parsing) = parsing.acquire_many_owned(units).await else {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            parse_error("Parse error: the server is stopping".into()),
        );
    };
    let declared = parts
        .headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok());
    if let Err(refusal) = check_declared(&bytes, declared) {
        return refuse(StatusCode::BAD_REQUEST, refusal);
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

/// Compares two digests without an early exit (digests: the length leaks nothing).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readyz_takes_only_allowed_hosts() {
        let allowed: Vec<String> = ["localhost", "127.0.0.1", "::1", "example.org:8443"]
            .map(String::from)
            .to_vec();
        let with_host = |host: Option<&str>, uri: &str| {
            let mut request = Request::builder().uri(uri);
            if let Some(host) = host {
                request = request.header(header::HOST, host);
            }
            host_allowed(&request.body(axum::body::Body::empty()).unwrap(), &allowed)
        };
        assert!(with_host(Some("127.0.0.1:8080"), "/readyz"));
        assert!(with_host(Some("LOCALHOST"), "/readyz"));
        assert!(with_host(Some("[::1]:9"), "/readyz"));
        assert!(with_host(Some("example.org:8443"), "/readyz"));
        assert!(with_host(None, "http://localhost:1/readyz"));
        // A rebound name, another port than the one allowed, garbage, nothing.
        assert!(!with_host(Some("evil.example:8080"), "/readyz"));
        assert!(!with_host(Some("example.org:8080"), "/readyz"));
        assert!(!with_host(Some("local host"), "/readyz"));
        assert!(!with_host(None, "/readyz"));
    }

    #[test]
    fn constant_time_eq_compares_whole_digests() {
        let a = Sha256::digest(b"secret");
        let b = Sha256::digest(b"secret");
        let c = Sha256::digest(b"secreT");
        assert!(constant_time_eq(&a, &b));
        assert!(!constant_time_eq(&a, &c));
        assert!(!constant_time_eq(&a[..31], &b));
    }
}
