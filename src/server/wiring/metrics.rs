//! `/metrics` of the server: the state it reads at a scrape ([`crate::metrics::Snapshot`],
//! from the same sources as `health`), the answer, and the plain listener of `--metrics
//! ADDR`.
//!
//! The plain listener serves `GET /metrics`, `GET /healthz` and `GET /readyz` (status and
//! `{"ready", "draining"}` only, as anyone gets it on the MCP listener) and nothing else
//! (404 for other paths, 405 for other methods), without a token: it is for a Prometheus
//! inside the cluster or on the host, which scrapes a pod's address, and for the
//! kubelet's probes, which then need no path through a balancer's PROXY protocol (see
//! `docs/src/operations/kubernetes-deployment.md`). What it shows is counts and states, languages, and the
//! configured upstream servers' names; no client, token, session, code or host name (see
//! [`crate::metrics`]). Its connections are bounded like the MCP listener's
//! ([`crate::server::transport::http_conn`]: caps, header and idle timeouts), but it never takes a PROXY
//! header: `trusted_proxies` is for the MCP listener a balancer forwards to.

use std::future::Future;
use std::net::SocketAddr;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::metrics::{Format, PoolFigures, Snapshot};
use crate::server::transport::http_conn::ConnLimits;
use crate::server::CodeboxServer;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen for metrics on {addr}")]
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

impl CodeboxServer {
    /// The server's state for a scrape.
    pub fn metrics_snapshot(&self) -> Snapshot {
        let s = &self.state;
        let (sessions_open, session_interpreters) = s.sessions.counts();
        let paused = s.sessions.store_totals().unwrap_or_default();
        let pool = match &s.pool {
            Some(pool) => pool
                .stats()
                .into_iter()
                .map(|(language, st)| PoolFigures {
                    language,
                    floor: st.floor,
                    ceiling: st.ceiling,
                    target: st.target,
                    arrival_rate_per_s: st.arrival_rate_per_s,
                    ready_seconds: st.ready_ms.map(|ms| ms / 1000.0),
                    shrunk: st.shrunk,
                    warm: st.idle,
                    starting: st.starting,
                    handed_out: st.handed_out,
                    missed: st.missed,
                    died_idle: st.died_idle,
                    spawn_failures: st.spawn_failures,
                    idle_memory_bytes: st.idle_memory_bytes,
                })
                .collect(),
            None => Vec::new(),
        };
        Snapshot {
            slots: s.settings.concurrency,
            queue_depth: s.admission.waiting(),
            draining: s.admission.is_closed(),
            pool,
            upstreams: s
                .backend
                .upstreams()
                .servers()
                .into_iter()
                .map(|st| (st.name, st.state))
                .collect(),
            sessions_open,
            session_interpreters,
            sessions_paused: paused.paused,
            sessions_paused_bytes: paused.bytes,
            tasks_running: s.tasks.running(),
        }
    }
}

/// The exposition for a request with these headers (`Accept` picks the format).
pub fn answer(server: &CodeboxServer, headers: &HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = Format::negotiate(accept);
    match crate::metrics::global().render(&server.metrics_snapshot(), format) {
        Ok(body) => ([(header::CONTENT_TYPE, format.content_type())], body).into_response(),
        Err(e) => {
            tracing::error!(err = %e, "cannot encode the metrics");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the metrics could not be encoded; the server log says why\n",
            )
                .into_response()
        }
    }
}

/// The plain metrics listener, bound (so a bad address fails start-up, not later).
pub struct MetricsListener {
    listener: tokio::net::TcpListener,
    pub bound: SocketAddr,
}

impl MetricsListener {
    pub async fn bind(addr: SocketAddr) -> Result<MetricsListener, Error> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| Error::LocalAddr { addr, source })?;
        Ok(MetricsListener { listener, bound })
    }

    /// Serves `GET /metrics` until `shutdown` resolves.
    pub async fn serve(
        self,
        server: CodeboxServer,
        limits: ConnLimits,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) {
        let ready = server.clone();
        let app = Router::new()
            .route(
                "/metrics",
                get(move |headers: HeaderMap| async move { answer(&server, &headers) }),
            )
            .route("/healthz", get(|| async { (StatusCode::OK, "ok\n") }))
            .route(
                "/readyz",
                get(move || async move {
                    let (ok, value) = ready.readiness();
                    let status = match ok {
                        true => StatusCode::OK,
                        false => StatusCode::SERVICE_UNAVAILABLE,
                    };
                    let minimal = serde_json::json!({"ready": ok, "draining": value["draining"]});
                    (status, axum::Json(minimal))
                }),
            );
        // Scraped and probed directly, never through a balancer.
        let limits = ConnLimits {
            trusted_proxies: Default::default(),
            ..limits
        };
        crate::server::transport::http_conn::serve(self.listener, app, limits, shutdown).await;
    }
}
