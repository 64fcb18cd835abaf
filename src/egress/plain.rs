//! Plain HTTP in absolute form (`GET http://host/path`), served by hyper on the client
//! connection. Every request is decided on its own: a kept-alive connection that asks for
//! another host gets a new upstream connection (and a new record), checked again. The
//! decision is on the URL's authority; the forwarded `Host` is set from it.
//!
//! Credentials go over plain HTTP only where `allow_plain_http` says so; otherwise a
//! request to a host with credentials is refused (the program should use https://).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};

use super::connect;
use super::engine::Conn;
use super::forward::{
    prepare_request, prepare_response, refusal_response, send_upstream, ProxyBody,
};
use super::head::Refusal;
use super::limits::Metered;
use super::record::{ConnectionKind, PendingRecord};
use crate::egress::interception::intercept::MAX_UPSTREAM_HEAD;
use crate::egress::rules::pattern::{clip, Target};
use crate::egress::rules::policy::Credential;

pub async fn serve<S>(conn: &Conn, io: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let state = Arc::new(Plain {
        conn: conn.clone(),
        current: tokio::sync::Mutex::new(None),
    });
    let limits = conn.shared().policy.limits().clone();
    let service = hyper::service::service_fn(move |req| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(state.handle(req).await) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.head_timeout)
        .max_buf_size(limits.max_head_bytes.max(8192))
        .max_header_size(limits.max_head_bytes)
        .serve_connection(TokioIo::new(io), service)
        .await;
    if let Err(err) = served {
        tracing::debug!(?err, "egress: plain HTTP connection ended with an error");
    }
}

/// The upstream connection a plain-HTTP client connection is using.
struct Current {
    target: Target,
    sender: SendRequest<Incoming>,
    credentials: Vec<Credential>,
    rec: Arc<Mutex<PendingRecord>>,
}

struct Plain {
    conn: Conn,
    current: tokio::sync::Mutex<Option<Current>>,
}

impl Plain {
    async fn handle(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        let target = match target_of(&req) {
            Ok(t) if crate::egress::rules::why::is_why_host(&t) => {
                self.conn.asked_the_proxy();
                return crate::egress::rules::why::answer(&self.conn.run.refusals, req.uri());
            }
            Ok(t) => t,
            Err(refusal) => {
                let mut rec = self.conn.record(ConnectionKind::Invalid, None);
                rec.record.host = req.uri().host().map(clip).unwrap_or_default();
                rec.deny(refusal.message.clone(), None);
                crate::metrics::global().egress(crate::metrics::labels::EgressDecision::Invalid);
                return refusal_response(&refusal);
            }
        };
        let mut current = self.current.lock().await;
        let reusable = match current.as_mut() {
            Some(c) if c.target == target => c.sender.ready().await.is_ok(),
            _ => false,
        };
        if !reusable {
            // The previous upstream's record is complete once its connection is dropped.
            *current = None;
            match self.open(&target).await {
                Ok(c) => *current = Some(c),
                Err(refusal) => return refusal_response(&refusal),
            }
        }
        let cur = current.as_mut().expect("set above");
        {
            let mut rec = cur.rec.lock().expect("record lock");
            *rec.record.requests.get_or_insert(0) += 1;
            if !cur.credentials.is_empty() {
                rec.record.credential_added = true;
            }
        }
        let creds: Vec<&Credential> = cur.credentials.iter().collect();
        let req = match prepare_request(req, &target, 80, &creds) {
            Ok(r) => r,
            Err(refusal) => return refusal_response(&refusal),
        };
        let shown = target.to_string();
        let resp = match send_upstream(&mut cur.sender, req, &cur.rec, &shown).await {
            Ok(r) => r,
            Err(refused) => return refused,
        };
        let secrets = (!cur.credentials.is_empty()).then_some(&self.conn.shared().secrets);
        match prepare_response(resp, &target, secrets) {
            Ok(r) => r,
            Err(refusal) => {
                cur.rec
                    .lock()
                    .expect("record lock")
                    .reason(refusal.message.clone());
                refusal_response(&refusal)
            }
        }
    }

    /// Decides and connects to a new upstream for this client connection.
    async fn open(&self, target: &Target) -> Result<Current, Refusal> {
        let conn = &self.conn;
        let mut rec = conn.record(ConnectionKind::Http, Some(target));
        let all = conn.shared().policy.credentials_for(target, false);
        if all.iter().any(|c| !c.allow_plain_http) {
            let reason = "this host's credentials go over https only: use an https:// URL";
            let refusal = Refusal::denied(&target.to_string(), reason);
            rec.deny(reason, None);
            return Err(refusal);
        }
        let credentials: Vec<Credential> = all.into_iter().cloned().collect();
        let dialed = connect::open(conn, target, &mut rec).await?;
        let io = Metered::counted(
            dialed.stream,
            conn.run.budget.clone(),
            rec.meter.clone(),
            conn.activity.clone(),
        );
        let (sender, driver) = match hyper::client::conn::http1::Builder::new()
            .max_buf_size(MAX_UPSTREAM_HEAD)
            .max_header_size(MAX_UPSTREAM_HEAD)
            .handshake(TokioIo::new(io))
            .await
        {
            Ok(pair) => pair,
            Err(err) => {
                let reason = format!("upstream HTTP handshake failed: {err}");
                rec.reason(reason.clone());
                return Err(Refusal::failed(
                    StatusCode::BAD_GATEWAY,
                    &target.to_string(),
                    &reason,
                ));
            }
        };
        let stop = conn.cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                r = driver => if let Err(err) = r { tracing::debug!(?err, "egress: upstream connection ended") },
                _ = stop.cancelled() => {}
            }
        });
        Ok(Current {
            target: target.clone(),
            sender,
            credentials,
            rec: Arc::new(Mutex::new(rec)),
        })
    }
}

/// The target of an absolute-form `http://` request.
fn target_of(req: &Request<Incoming>) -> Result<Target, Refusal> {
    let uri = req.uri();
    if req.method() == http::Method::CONNECT {
        return Err(Refusal::bad_request(
            "CONNECT must be the first request on a proxy connection",
        ));
    }
    match uri.scheme_str() {
        Some(s) if s.eq_ignore_ascii_case("http") => {}
        Some(_) => {
            return Err(Refusal::bad_request(
                "only http:// URLs are proxied in plain HTTP; https goes through CONNECT",
            ))
        }
        None => {
            return Err(Refusal::bad_request(
                "this is the egress proxy: send an absolute URL (GET http://host/path)",
            ))
        }
    }
    let authority = uri
        .authority()
        .ok_or_else(|| Refusal::bad_request("the URL has no host"))?;
    if authority.as_str().contains('@') {
        return Err(Refusal::bad_request(
            "user names and passwords in the URL are not forwarded",
        ));
    }
    Target::parse_authority(authority.as_str(), Some(80))
        .map_err(|e| Refusal::bad_request(e.to_string()))
}
