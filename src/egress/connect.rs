//! From a decided host to a connected socket: the policy's verdict, resolution on the
//! supervisor, the address check, and a connection to exactly an address that was
//! checked (never a second resolution, so DNS rebinding gains nothing), trying them in
//! order within the connect timeout.

use std::net::SocketAddr;
use std::sync::Arc;

use http::StatusCode;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::engine::{Conn, Run};
use super::head::Refusal;
use super::limits::human_duration;
use super::record::PendingRecord;
use crate::egress::rules::address::canonical;
use crate::egress::rules::pattern::{Host, Target};
use crate::egress::rules::policy::Verdict;
use crate::metrics::labels::EgressDecision;

/// A connection to a checked address.
pub struct Dialed {
    pub stream: TcpStream,
    pub addr: SocketAddr,
}

/// Counts the connection, decides, resolves, checks and connects. The record is filled in
/// (allowed, rule, address, or why not); a refusal is what the client is told, and is
/// kept for the run's `why` answers (see `why.rs`). The decision is counted in
/// `/metrics`.
pub async fn open(
    conn: &Conn,
    target: &Target,
    rec: &mut PendingRecord,
) -> Result<Dialed, Refusal> {
    let (opened, decision) = open_checked(conn, target, rec).await;
    crate::metrics::global().egress(decision);
    if let Err(refusal) = &opened {
        conn.run.refusals.note(&target.to_string(), refusal);
    }
    opened
}

async fn open_checked(
    conn: &Conn,
    target: &Target,
    rec: &mut PendingRecord,
) -> (Result<Dialed, Refusal>, EgressDecision) {
    let run = &conn.run;
    let shown = target.to_string();
    if let Err(limit) = run.budget.open_connection() {
        rec.deny(format!("limit {limit} reached"), None);
        return (Err(Refusal::limit(&shown, &limit)), EgressDecision::Limit);
    }
    let allow_rule = match run.shared.policy.decide(target, &run.narrowing) {
        Verdict::Allowed { rule } => rule,
        Verdict::Denied { reason, rule } => {
            tracing::info!(target = %shown, reason = %reason, "egress denied");
            let refusal = Refusal::denied(&shown, &reason);
            rec.deny(reason, rule);
            return (Err(refusal), EgressDecision::Denied);
        }
    };
    rec.record.rule = Some(allow_rule.clone());
    let mut allowed = EgressDecision::Allowed;
    if let Some(rule) = run.shared.policy.approval_rule(target) {
        if let Err(reason) = approved(conn, &shown, &rule).await {
            tracing::info!(target = %shown, reason = %reason, "egress not approved");
            let refusal = Refusal::denied(&shown, &reason);
            rec.deny(reason, Some(format!("approve {rule}")));
            return (Err(refusal), EgressDecision::NotApproved);
        }
        rec.record.rule = Some(format!("{allow_rule} + approve {rule}"));
        allowed = EgressDecision::Approved;
    }
    let deadline = Instant::now() + run.shared.policy.limits().connect_timeout;
    let timeout_text = human_duration(run.shared.policy.limits().connect_timeout);

    let resolved: Vec<SocketAddr> = match &target.host {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, target.port)],
        Host::Name(name) => {
            let lookup = resolve_in_slot(run, name, target.port);
            match tokio::time::timeout_at(deadline, lookup).await {
                Ok(Ok(addrs)) if !addrs.is_empty() => addrs,
                Ok(Ok(_)) => {
                    return unreachable(fail(
                        rec,
                        StatusCode::BAD_GATEWAY,
                        &shown,
                        "cannot resolve: no addresses".into(),
                    ))
                }
                Ok(Err(e)) => {
                    tracing::info!(target = %shown, err = %e, "egress: cannot resolve");
                    return unreachable(fail(
                        rec,
                        StatusCode::BAD_GATEWAY,
                        &shown,
                        "cannot resolve".into(),
                    ));
                }
                Err(_) => {
                    return unreachable(fail(
                        rec,
                        StatusCode::GATEWAY_TIMEOUT,
                        &shown,
                        format!("cannot resolve within {timeout_text}"),
                    ))
                }
            }
        }
    };

    let host_addresses = match run.shared.host_addresses.current() {
        Ok(a) => a,
        Err(e) => {
            let refusal = Refusal::denied(&shown, &e.to_string());
            rec.deny(e.to_string(), None);
            return (Err(refusal), EgressDecision::AddressRefused);
        }
    };
    let mut permitted: Vec<(SocketAddr, Option<String>)> = Vec::new();
    let mut first_refusal = None;
    for addr in resolved.into_iter().map(canonical) {
        if permitted.iter().any(|(a, _)| *a == addr) {
            continue;
        }
        match run.shared.policy.check_address(addr, &host_addresses) {
            Ok(private_rule) => permitted.push((addr, private_rule)),
            Err(reason) => {
                tracing::info!(target = %shown, addr = %addr, reason = %reason, "egress: address refused");
                first_refusal.get_or_insert(reason);
            }
        }
    }
    if permitted.is_empty() {
        let reason = first_refusal.unwrap_or_else(|| "no address".into());
        let refusal = Refusal::denied(&shown, &reason);
        rec.deny(reason, None);
        // No rule decided this: the lack of an `allow_private` rule did.
        rec.record.rule = None;
        return (Err(refusal), EgressDecision::AddressRefused);
    }

    let mut last_err = None;
    for (addr, private_rule) in permitted {
        match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                rec.record.allowed = true;
                rec.record.address = Some(addr.to_string());
                if let Some(p) = private_rule {
                    rec.record.rule = Some(format!("{allow_rule} + allow_private {p}"));
                }
                return (Ok(Dialed { stream, addr }), allowed);
            }
            Ok(Err(e)) => {
                tracing::info!(target = %shown, addr = %addr, err = %e, "egress: connect failed");
                last_err = Some(format!("cannot connect to {addr}: {e}"));
            }
            Err(_) => {
                tracing::info!(target = %shown, addr = %addr, "egress: connect timed out");
                rec.record.address = Some(addr.to_string());
                return unreachable(fail(
                    rec,
                    StatusCode::GATEWAY_TIMEOUT,
                    &shown,
                    format!("connect timed out after {timeout_text}"),
                ));
            }
        }
    }
    unreachable(fail(
        rec,
        StatusCode::BAD_GATEWAY,
        &shown,
        last_err.unwrap_or_default(),
    ))
}

/// An allowed target that could not be resolved or connected to.
fn unreachable(refusal: Refusal) -> (Result<Dialed, Refusal>, EgressDecision) {
    (Err(refusal), EgressDecision::Unreachable)
}

/// The user's approval of `shown` (`host:port`) through the execution's gate. The wait
/// is activity (the idle timeout would otherwise close the connection while the user
/// reads the question); the run's end drops the wait with the connection.
async fn approved(conn: &Conn, shown: &str, rule: &str) -> Result<(), String> {
    let Some(gate) = conn.run.approval.clone() else {
        return Err(format!(
            "approval required by [network] approve rule \"{rule}\", and nobody can be asked here"
        ));
    };
    let wait = gate.host(shown, rule);
    tokio::pin!(wait);
    loop {
        tokio::select! {
            decided = &mut wait => return decided,
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => conn.activity.touch(),
        }
    }
}

/// Resolves `name` in one of the run's lookup slots
/// ([`crate::egress::rules::resolve::MAX_RESOLUTIONS_PER_RUN`]). The lookup runs in a task of its own
/// that keeps the slot until the lookup ends (or the run does), also when the caller's
/// deadline passed first: a run cannot have more lookups in flight than it has slots,
/// however many of them time out.
async fn resolve_in_slot(
    run: &Arc<Run>,
    name: &str,
    port: u16,
) -> std::io::Result<Vec<SocketAddr>> {
    let slot = run
        .resolutions
        .clone()
        .acquire_owned()
        .await
        .map_err(std::io::Error::other)?;
    let lookup = run.shared.resolver.resolve(name, port);
    let ended = run.cancel.clone();
    let task = tokio::spawn(async move {
        let _slot = slot;
        tokio::select! {
            got = lookup => got,
            _ = ended.cancelled() => Err(std::io::Error::other("the run ended")),
        }
    });
    task.await.map_err(std::io::Error::other)?
}

/// Reconnects to an address checked before (a kept-alive upstream that went away).
pub async fn reconnect(conn: &Conn, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let timeout = conn.run.shared.policy.limits().connect_timeout;
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// A failure after the policy allowed the host: the record stays allowed, with the reason.
fn fail(rec: &mut PendingRecord, status: StatusCode, shown: &str, reason: String) -> Refusal {
    rec.record.allowed = true;
    let refusal = Refusal::failed(status, shown, &reason);
    rec.reason(reason);
    refusal
}
