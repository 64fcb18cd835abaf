//! `CONNECT host:port`: decided, connected, answered `200`, then either an opaque tunnel
//! (bytes both ways, counted against the budget) or, for a host with credentials, TLS
//! interception ([`crate::egress::interception::intercept`]).

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::connect;
use super::engine::Conn;
use super::head::{write_refusal, Prefixed};
use super::limits::Metered;
use super::record::ConnectionKind;
use crate::egress::interception::intercept;
use crate::egress::rules::pattern::Target;

/// The answer to a CONNECT the proxy serves.
pub const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

pub async fn serve_connect(
    conn: &Conn,
    mut client: Metered<TcpStream>,
    target: Target,
    early: Bytes,
) {
    let credentials: Vec<_> = conn
        .shared()
        .policy
        .credentials_for(&target, true)
        .into_iter()
        .cloned()
        .collect();
    let kind = if credentials.is_empty() {
        ConnectionKind::Connect
    } else {
        ConnectionKind::Intercept
    };
    let mut rec = conn.record(kind, Some(&target));
    let dialed = match connect::open(conn, &target, &mut rec).await {
        Ok(d) => d,
        Err(refusal) => {
            write_refusal(&mut client, &refusal).await;
            return;
        }
    };
    let mut upstream = Metered::counted(
        dialed.stream,
        conn.run.budget.clone(),
        rec.meter.clone(),
        conn.activity.clone(),
    );
    if !credentials.is_empty() {
        intercept::serve(
            conn,
            client,
            early,
            target,
            upstream,
            dialed.addr,
            credentials,
            rec,
        )
        .await;
        return;
    }
    if let Err(err) = client.write_all(ESTABLISHED).await {
        tracing::debug!(?err, "egress: client left before the tunnel opened");
        rec.reason("client closed before the tunnel opened");
        return;
    }
    let mut client = Prefixed::new(early, client);
    if let Err(err) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        tracing::debug!(?err, target = %target, "egress: tunnel ended with an error");
        if rec.meter.limit_hit.get().is_none() {
            rec.reason(format!("tunnel ended: {err}"));
        }
    }
}
