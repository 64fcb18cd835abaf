//! TLS interception of a CONNECT to a host with credentials.
//!
//! Before the CONNECT is answered the proxy has its own verified TLS connection upstream
//! (system roots + extra roots, SNI = the host, HTTP/1.1), so a bad certificate is a clear
//! 502 on the CONNECT. Then it answers 200, completes the program's TLS handshake with a
//! leaf certificate for the host issued by the codebox CA (HTTP/1.1 only), and serves each
//! request with hyper: the request goes to the CONNECT target whatever its `Host` or
//! absolute URL says, with the credentials set ([`crate::egress::forward`]), and the response comes
//! back with every secret redacted. A kept-alive upstream connection that closed is
//! reopened to the same checked address.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls_pki_types::ServerName;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::egress::connect;
use crate::egress::engine::Conn;
use crate::egress::forward::{
    prepare_request, prepare_response, refusal_response, send_upstream, ProxyBody,
};
use crate::egress::head::{write_refusal, Prefixed, Refusal};
use crate::egress::interception::tls;
use crate::egress::limits::{human_duration, Metered};
use crate::egress::record::PendingRecord;
use crate::egress::rules::pattern::Target;
use crate::egress::rules::policy::Credential;
use crate::egress::tunnel::ESTABLISHED;

/// The largest response head accepted from an upstream.
pub const MAX_UPSTREAM_HEAD: usize = 256 << 10;

type Upstream = TlsStream<Metered<TcpStream>>;

/// Opens the proxy's own TLS connection over `tcp` to `target`; a failure is the status
/// to answer (504 for a timeout, else 502) and the reason.
async fn upstream_tls(
    conn: &Conn,
    target: &Target,
    tcp: Metered<TcpStream>,
) -> Result<Upstream, (StatusCode, String)> {
    let bad = |why: String| (StatusCode::BAD_GATEWAY, why);
    let name = ServerName::try_from(target.host_for_tls())
        .map_err(|e| bad(format!("invalid server name: {e}")))?;
    let connector = TlsConnector::from(conn.shared().client_tls.clone());
    let timeout = conn.shared().policy.limits().connect_timeout;
    match tokio::time::timeout(timeout, connector.connect(name, tcp)).await {
        Err(_) => Err((
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "upstream TLS handshake timed out after {}",
                human_duration(timeout)
            ),
        )),
        Ok(Ok(tls)) => Ok(tls),
        Ok(Err(e)) => Err(bad(
            match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                Some(rustls::Error::InvalidCertificate(why)) => {
                    format!("upstream certificate invalid: {why:?}")
                }
                Some(other) => format!("upstream TLS handshake failed: {other}"),
                None => format!("upstream TLS handshake failed: {e}"),
            },
        )),
    }
}

/// An HTTP/1 client connection over `tls`, its driver stopped with the client connection.
async fn http_client(conn: &Conn, tls: Upstream) -> Result<SendRequest<Incoming>, String> {
    let (sender, driver) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(MAX_UPSTREAM_HEAD)
        .max_header_size(MAX_UPSTREAM_HEAD)
        .handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("upstream HTTP handshake failed: {e}"))?;
    let stop = conn.cancel.clone();
    tokio::spawn(async move {
        tokio::select! {
            r = driver => if let Err(err) = r { tracing::debug!(?err, "egress: upstream connection ended") },
            _ = stop.cancelled() => {}
        }
    });
    Ok(sender)
}

#[allow(clippy::too_many_arguments)]
pub async fn serve(
    conn: &Conn,
    mut client: Metered<TcpStream>,
    early: Bytes,
    target: Target,
    upstream: Metered<TcpStream>,
    addr: SocketAddr,
    credentials: Vec<Credential>,
    mut rec: PendingRecord,
) {
    let shown = target.to_string();
    let tls_up = match upstream_tls(conn, &target, upstream).await {
        Ok(t) => t,
        Err((status, reason)) => {
            tracing::warn!(target = %shown, reason = %reason, "egress: upstream TLS failed");
            let refusal = Refusal::failed(status, &shown, &reason);
            rec.reason(reason);
            write_refusal(&mut client, &refusal).await;
            return;
        }
    };
    let Some(ca) = conn.shared().ca.as_ref() else {
        tracing::error!("egress: credentials without a CA");
        return;
    };
    let config = match ca
        .leaf(&target.host_for_tls())
        .map_err(|e| e.to_string())
        .and_then(|leaf| tls::intercept_config(leaf).map_err(|e| e.to_string()))
    {
        Ok(c) => c,
        Err(err) => {
            tracing::error!(%err, target = %shown, "egress: cannot make a leaf certificate");
            let refusal = Refusal::failed(
                StatusCode::BAD_GATEWAY,
                &shown,
                "the proxy cannot make a certificate for this host",
            );
            rec.reason("cannot make a leaf certificate");
            write_refusal(&mut client, &refusal).await;
            return;
        }
    };
    if client.write_all(ESTABLISHED).await.is_err() {
        rec.reason("client closed before the tunnel opened");
        return;
    }
    let head_timeout = conn.shared().policy.limits().head_timeout;
    let accept = TlsAcceptor::from(config).accept(Prefixed::new(early, client));
    let tls_client = match tokio::time::timeout(head_timeout, accept).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            tracing::info!(err = %e, target = %shown, "egress: client TLS handshake failed");
            rec.reason(format!("client TLS handshake failed: {e}"));
            return;
        }
        Err(_) => {
            rec.reason(format!(
                "client TLS handshake not complete within {}",
                human_duration(head_timeout)
            ));
            return;
        }
    };
    let sender = match http_client(conn, tls_up).await {
        Ok(s) => s,
        Err(reason) => {
            rec.reason(reason);
            return;
        }
    };
    let state = Arc::new(Intercepted {
        conn: conn.clone(),
        target,
        addr,
        credentials,
        sender: tokio::sync::Mutex::new(sender),
        rec: Mutex::new(rec),
    });
    let service = hyper::service::service_fn(move |req| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(state.forward(req).await) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(head_timeout)
        .max_buf_size(conn.shared().policy.limits().max_head_bytes.max(8192))
        .max_header_size(conn.shared().policy.limits().max_head_bytes)
        .serve_connection(TokioIo::new(tls_client), service)
        .await;
    if let Err(err) = served {
        tracing::debug!(?err, target = %shown, "egress: intercepted connection ended with an error");
    }
}

/// One intercepted connection's state, shared by its requests.
struct Intercepted {
    conn: Conn,
    target: Target,
    addr: SocketAddr,
    credentials: Vec<Credential>,
    sender: tokio::sync::Mutex<SendRequest<Incoming>>,
    rec: Mutex<PendingRecord>,
}

impl Intercepted {
    async fn forward(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        {
            let mut rec = self.rec.lock().expect("record lock");
            *rec.record.requests.get_or_insert(0) += 1;
            rec.record.credential_added = true;
        }
        let creds: Vec<&Credential> = self.credentials.iter().collect();
        let req = match prepare_request(req, &self.target, 443, &creds) {
            Ok(r) => r,
            Err(refusal) => return refusal_response(&refusal),
        };
        let shown = self.target.to_string();
        let mut sender = self.sender.lock().await;
        if sender.ready().await.is_err() {
            match self.reopen().await {
                Ok(s) => *sender = s,
                Err(refusal) => {
                    tracing::info!(target = %shown, reason = %refusal.message, "egress: cannot reopen the upstream");
                    return refusal_response(&refusal);
                }
            }
        }
        let resp = match send_upstream(&mut sender, req, &self.rec, &shown).await {
            Ok(r) => r,
            Err(refused) => return refused,
        };
        match prepare_response(resp, &self.target, Some(&self.conn.shared().secrets)) {
            Ok(r) => r,
            Err(refusal) => {
                self.rec
                    .lock()
                    .expect("record lock")
                    .reason(refusal.message.clone());
                refusal_response(&refusal)
            }
        }
    }

    /// A new upstream connection to the address checked at the CONNECT; it is one more
    /// connection of the run (`max_connections`), like any other.
    async fn reopen(&self) -> Result<SendRequest<Incoming>, Refusal> {
        let shown = self.target.to_string();
        if let Err(limit) = self.conn.run.budget.open_connection() {
            self.rec
                .lock()
                .expect("record lock")
                .reason(format!("limit {limit} reached"));
            return Err(Refusal::limit(&shown, &limit));
        }
        let failed = |reason: String| Refusal::failed(StatusCode::BAD_GATEWAY, &shown, &reason);
        let tcp = connect::reconnect(&self.conn, self.addr)
            .await
            .map_err(|e| failed(format!("cannot reconnect to {}: {e}", self.addr)))?;
        let meter = self.rec.lock().expect("record lock").meter.clone();
        let metered = Metered::counted(
            tcp,
            self.conn.run.budget.clone(),
            meter,
            self.conn.activity.clone(),
        );
        let tls = upstream_tls(&self.conn, &self.target, metered)
            .await
            .map_err(|(status, reason)| Refusal::failed(status, &shown, &reason))?;
        http_client(&self.conn, tls).await.map_err(failed)
    }
}
