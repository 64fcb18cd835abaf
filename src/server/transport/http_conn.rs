//! The HTTP accept loop: every connection is bounded in number and in time.
//!
//! `axum::serve` reads headers for as long as a client cares to send them and accepts
//! any number of connections, so twenty clients that never finish their headers (or
//! trickle them a byte at a time, or stall a body) held the server's sockets open
//! indefinitely without any token. Here each connection is served by hyper's HTTP/1
//! builder in our own loop:
//!
//! - at most [`ConnLimits::max_connections`] open at once, and
//!   [`ConnLimits::max_connections_per_peer`] from one client (an IPv4 address, plain or
//!   IPv4-mapped, or an IPv6 /64: see [`peer_key`]). Behind a balancer listed in
//!   [`ConnLimits::trusted_proxies`] the client is the one its PROXY protocol v2 header
//!   names ([`crate::server::transport::proxy_protocol`]), so the cap counts the balancer's clients, not the
//!   balancer; from any other address a PROXY header is refused. A connection over
//!   either cap is refused by [`crate::server::transport::http_refuse`]: its request is read (bounded) and
//!   answered `503` with `Retry-After`, so the client reads the answer instead of a
//!   broken pipe; it holds no connection slot meanwhile, and at most
//!   [`http_refuse::MAX_REFUSING`] are read at once (past that: a `503` written at once);
//! - its request headers (and before them a trusted balancer's PROXY header) must be
//!   complete within [`ConnLimits::header_timeout`] (hyper's header-read timeout: a
//!   deadline, so trickling does not extend it). hyper starts it whenever it waits for
//!   a request, so a kept-alive connection waiting for its next request is closed after
//!   it too (HTTP clients keep idle connections for less: httpx 5 s);
//! - a request body must be complete within [`ConnLimits::body_timeout`] (enforced where
//!   the body is read, in `http.rs`: `408` with a JSON-RPC error);
//! - a connection on which no byte moves either way for [`ConnLimits::idle_timeout`] is
//!   closed. A running execution's SSE stream is not idle: rmcp sends a keep-alive
//!   comment at least every `idle_timeout / 2` (see [`ConnLimits::sse_keep_alive`]).
//!
//! A connection from an untrusted address takes its per-client slot at once; one from a
//! trusted balancer after its header (a balancer is trusted to send it at once: while it
//! has not, the connection counts against `max_connections` only).
//!
//! On shutdown the loop stops accepting and every connection is closed gracefully
//! (hyper finishes the response in flight); the caller decides how long to wait.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::server::transport::http_refuse::{self, Answer};
use crate::server::transport::proxy_protocol::{self, Preamble, TrustedProxies};

/// Bounds on HTTP connections (`[http]` in the config file). The total stays well under
/// the usual 1024 open files, which the sandboxes need too; an MCP client keeps about
/// two connections per session (its POSTs and the GET stream).
#[derive(Debug, Clone, PartialEq)]
pub struct ConnLimits {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
    /// Balancers whose PROXY protocol v2 header names the client (required from them,
    /// refused from anyone else); none by default.
    pub trusted_proxies: TrustedProxies,
}

impl Default for ConnLimits {
    fn default() -> ConnLimits {
        ConnLimits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 256,
            max_connections_per_peer: 64,
            trusted_proxies: TrustedProxies::default(),
        }
    }
}

impl ConnLimits {
    /// How often an SSE stream sends a keep-alive comment: often enough that a stream
    /// waiting on a long execution never looks idle.
    pub fn sse_keep_alive(&self) -> Duration {
        (self.idle_timeout / 2).min(Duration::from_secs(15))
    }

    fn refusal_bounds(&self) -> http_refuse::Bounds {
        http_refuse::Bounds {
            header_timeout: self.header_timeout,
            body_timeout: self.body_timeout,
        }
    }
}

/// Open connections per client address, and in total.
#[derive(Default)]
struct Counts {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

fn lock(counts: &Mutex<Counts>) -> std::sync::MutexGuard<'_, Counts> {
    counts.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection's place in the total, given back when it closes.
struct TotalSlot(Arc<Mutex<Counts>>);

impl Drop for TotalSlot {
    fn drop(&mut self) {
        lock(&self.0).total -= 1;
    }
}

/// A connection's place among its client's, given back when it closes.
struct PeerSlot {
    counts: Arc<Mutex<Counts>>,
    peer: IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut c = lock(&self.counts);
        if let Some(n) = c.per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                c.per_peer.remove(&self.peer);
            }
        }
    }
}

/// The address a connection counts against for the per-peer cap: an IPv4 address
/// (also when it arrives IPv4-mapped on a dual-stack socket), or an IPv6 address's /64,
/// the smallest block a host is given (one host can use all of its 2^64 addresses, so a
/// cap per address would not bound it).
fn peer_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

/// A place in the total, if there is one.
fn admit_total(counts: &Arc<Mutex<Counts>>, limits: &ConnLimits) -> Option<TotalSlot> {
    let mut c = lock(counts);
    if c.total >= limits.max_connections {
        return None;
    }
    c.total += 1;
    Some(TotalSlot(counts.clone()))
}

/// A place among the connections of the client `ip`, if there is one.
fn admit_peer(counts: &Arc<Mutex<Counts>>, ip: IpAddr, limits: &ConnLimits) -> Option<PeerSlot> {
    let peer = peer_key(ip);
    let mut c = lock(counts);
    let n = c.per_peer.entry(peer).or_insert(0);
    if *n >= limits.max_connections_per_peer {
        return None;
    }
    *n += 1;
    Some(PeerSlot {
        counts: counts.clone(),
        peer,
    })
}

/// What every connection task shares.
struct Shared {
    app: axum::Router,
    limits: ConnLimits,
    counts: Arc<Mutex<Counts>>,
    /// Refusals that read their request ([`http_refuse::MAX_REFUSING`]).
    refusing: Arc<Semaphore>,
    closing: CancellationToken,
}

/// Accepts and serves connections with `app` until `shutdown` resolves, then closes them
/// gracefully and returns once all are gone.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let shared = Arc::new(Shared {
        app,
        limits,
        counts: Arc::default(),
        refusing: Arc::new(Semaphore::new(http_refuse::MAX_REFUSING)),
        closing: CancellationToken::new(),
    });
    // Every connection task holds a sender; all are gone when `recv` sees the end.
    let (alive, mut all_gone) = tokio::sync::mpsc::channel::<()>(1);
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // TCP_NODELAY: a response is written in small pieces (headers, SSE events); with
        // Nagle's algorithm the second one waits for the client's delayed ACK, which cost
        // every call on a kept-alive connection ~40 ms.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY");
        }
        let trusted = shared.limits.trusted_proxies.contains(peer.ip());
        let Some(total) = admit_total(&shared.counts, &shared.limits) else {
            over_cap(tcp, peer, trusted, None, "max_connections", &shared);
            continue;
        };
        // From a balancer the client is known only once its header is read.
        let peer_slot = match trusted {
            true => None,
            false => match admit_peer(&shared.counts, peer.ip(), &shared.limits) {
                Some(slot) => Some(slot),
                None => {
                    drop(total);
                    over_cap(tcp, peer, false, None, "max_connections_per_peer", &shared);
                    continue;
                }
            },
        };
        tokio::spawn(connection(
            tcp,
            peer,
            shared.clone(),
            (total, peer_slot, alive.clone()),
        ));
    }
    drop(listener);
    shared.closing.cancel();
    drop(alive);
    let _ = all_gone.recv().await;
}

/// Refuses a connection over `cap`: reads its request and answers 503 on a task of its
/// own when a refusal slot is free, else answers at once. `known`: its preamble, when
/// already read.
fn over_cap(
    tcp: TcpStream,
    tcp_peer: SocketAddr,
    trusted: bool,
    known: Option<Preamble>,
    cap: &'static str,
    shared: &Arc<Shared>,
) {
    let limit = match cap {
        "max_connections" => shared.limits.max_connections,
        _ => shared.limits.max_connections_per_peer,
    };
    let answer = Answer::over_cap(cap, limit);
    let Ok(permit) = shared.refusing.clone().try_acquire_owned() else {
        let client = known.as_ref().map_or(tcp_peer, |p| p.peer.client);
        tracing::warn!(%client, cap, "connection refused at once: too many open connections, and too many refusals under way to read its request");
        refuse_at_once(tcp, &answer);
        return;
    };
    tokio::spawn(refusal(
        tcp,
        tcp_peer,
        trusted,
        known,
        answer,
        shared.clone(),
        permit,
    ));
}

/// Reads the preamble (if not `known`) and the request of a refused connection, then
/// answers it ([`http_refuse::refuse`]); ends early on shutdown.
async fn refusal(
    mut tcp: TcpStream,
    tcp_peer: SocketAddr,
    trusted: bool,
    known: Option<Preamble>,
    answer: Answer,
    shared: Arc<Shared>,
    _permit: OwnedSemaphorePermit,
) {
    let preamble = match known {
        Some(p) => p,
        // From a balancer its header first (it names the client); anything else reads
        // the request as it comes.
        None if trusted => match preamble(&mut tcp, tcp_peer, true, &shared).await {
            Ok(p) => p,
            Err(Early::Drop) => return,
            Err(Early::Refuse(bad)) => {
                refuse_reading(tcp, Vec::new(), &bad, &shared).await;
                return;
            }
        },
        None => Preamble {
            peer: proxy_protocol::Peer {
                client: tcp_peer,
                via: None,
            },
            rest: Vec::new(),
        },
    };
    let (client, via) = (preamble.peer.client, preamble.peer.via);
    tracing::warn!(%client, via = ?via, status = answer.status, why = answer.body.trim_end(), "connection refused: too many open connections");
    refuse_reading(tcp, preamble.rest, &answer, &shared).await;
}

/// [`http_refuse::refuse`], ended early when the server closes. The caller holds a
/// refusal permit.
async fn refuse_reading(tcp: TcpStream, head: Vec<u8>, answer: &Answer, shared: &Shared) {
    let bounds = shared.limits.refusal_bounds();
    tokio::select! {
        _ = http_refuse::refuse(tcp, head, answer, bounds) => {}
        _ = shared.closing.cancelled() => {}
    }
}

/// A `503` to a connection over a cap, without reading it (best effort: the client may
/// see a reset instead). Only when [`http_refuse::MAX_REFUSING`] refusals are under way.
fn refuse_at_once(tcp: TcpStream, answer: &Answer) {
    // A write on the socket itself: tokio's `try_write` answers WouldBlock until its
    // reactor has seen the new socket writable, and the answer would be lost. The send
    // buffer of a connection just accepted has room for this; it never blocks
    // (the socket is non-blocking).
    match tcp.into_std() {
        Ok(mut std) => {
            let _ = std::io::Write::write(&mut std, &answer.to_bytes());
        }
        Err(e) => tracing::debug!(error = %e, "cannot answer a refused connection"),
    }
}

/// Why a connection ends before its request is served.
enum Early {
    /// It went away, stayed silent, or the server is closing: drop it.
    Drop,
    /// Its PROXY header is bad: answer this (400) after reading its request.
    Refuse(Answer),
}

/// The preamble of a connection (a trusted balancer's PROXY header, or the check that an
/// untrusted peer sent none) within `header_timeout`.
async fn preamble(
    tcp: &mut TcpStream,
    tcp_peer: SocketAddr,
    trusted: bool,
    shared: &Shared,
) -> Result<Preamble, Early> {
    use proxy_protocol::Error;
    let read = tokio::time::timeout(
        shared.limits.header_timeout,
        proxy_protocol::read_preamble(tcp, tcp_peer, trusted),
    );
    let outcome = tokio::select! {
        r = read => r,
        _ = shared.closing.cancelled() => return Err(Early::Drop),
    };
    match outcome {
        Ok(Ok(p)) => Ok(p),
        Err(_) => {
            tracing::debug!(%tcp_peer, "no PROXY header or request within the header timeout");
            Err(Early::Drop)
        }
        Ok(Err(e @ (Error::Truncated { .. } | Error::Read { .. }))) => {
            tracing::debug!(error = %e, "connection ended before its request");
            Err(Early::Drop)
        }
        Ok(Err(e)) => {
            tracing::warn!(%tcp_peer, error = %e, "connection refused");
            Err(Early::Refuse(Answer::bad_request(&e.to_string())))
        }
    }
}

/// Serves one connection until it ends, goes idle, or the server closes.
async fn connection(
    mut tcp: TcpStream,
    tcp_peer: SocketAddr,
    shared: Arc<Shared>,
    held: (TotalSlot, Option<PeerSlot>, tokio::sync::mpsc::Sender<()>),
) {
    let (total, peer_slot, _alive) = held;
    let trusted = peer_slot.is_none();
    let pre = match preamble(&mut tcp, tcp_peer, trusted, &shared).await {
        Ok(p) => p,
        Err(Early::Drop) => return,
        Err(Early::Refuse(answer)) => {
            // Its slots are free while its request is read for the 400.
            drop((total, peer_slot));
            match shared.refusing.clone().try_acquire_owned() {
                Ok(_permit) => refuse_reading(tcp, Vec::new(), &answer, &shared).await,
                Err(_) => refuse_at_once(tcp, &answer),
            }
            return;
        }
    };
    let (peer, via) = (pre.peer.client, pre.peer.via);
    let _peer_slot = match peer_slot {
        Some(slot) => slot,
        None => match admit_peer(&shared.counts, peer.ip(), &shared.limits) {
            Some(slot) => slot,
            None => {
                drop(total);
                over_cap(
                    tcp,
                    tcp_peer,
                    true,
                    Some(pre),
                    "max_connections_per_peer",
                    &shared,
                );
                return;
            }
        },
    };
    let _total = total;
    let limits = &shared.limits;
    let started = Instant::now();
    let activity = Arc::new(AtomicU64::new(0));
    let io = TokioIo::new(Tracked {
        inner: tcp,
        prefix: pre.rest,
        prefix_at: 0,
        started,
        activity: activity.clone(),
    });
    let service = hyper_util::service::TowerToHyperService::new(shared.app.clone());
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let check_every = (limits.idle_timeout / 4).max(Duration::from_millis(50));
    let mut tick = tokio::time::interval(check_every);
    let mut graceful = false;
    loop {
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(%peer, via = ?via, error = %e, "HTTP connection ended with an error");
                }
                return;
            }
            _ = shared.closing.cancelled(), if !graceful => {
                graceful = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = tick.tick() => {
                let last = Duration::from_millis(activity.load(Ordering::Relaxed));
                if started.elapsed().saturating_sub(last) >= limits.idle_timeout {
                    tracing::info!(%peer, via = ?via, idle_s = limits.idle_timeout.as_secs_f64(), "closing an idle HTTP connection");
                    return;
                }
            }
        }
    }
}

/// A TCP stream that notes when a byte last moved either way; its first bytes read
/// are `prefix` (what the preamble check read of the request).
struct Tracked {
    inner: TcpStream,
    prefix: Vec<u8>,
    prefix_at: usize,
    started: Instant,
    /// Milliseconds after `started` of the last read or write.
    activity: Arc<AtomicU64>,
}

impl Tracked {
    fn touch(&self) {
        self.activity
            .store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.prefix_at < self.prefix.len() {
            let n = buf.remaining().min(self.prefix.len() - self.prefix_at);
            let at = self.prefix_at;
            buf.put_slice(&self.prefix[at..at + n]);
            self.prefix_at += n;
            if self.prefix_at == self.prefix.len() {
                self.prefix = Vec::new();
                self.prefix_at = 0;
            }
            self.touch();
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both caps, as the accept loop takes them: the total first, then the client's.
    fn admit(
        counts: &Arc<Mutex<Counts>>,
        peer: IpAddr,
        limits: &ConnLimits,
    ) -> Result<(TotalSlot, PeerSlot), &'static str> {
        let total = admit_total(counts, limits).ok_or("max_connections")?;
        let slot = admit_peer(counts, peer, limits).ok_or("max_connections_per_peer")?;
        Ok((total, slot))
    }

    #[test]
    fn caps_count_per_peer_and_in_total_and_free_on_drop() {
        let counts = Arc::new(Mutex::new(Counts::default()));
        let limits = ConnLimits {
            max_connections: 3,
            max_connections_per_peer: 2,
            ..ConnLimits::default()
        };
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let a1 = admit(&counts, a, &limits).unwrap();
        let _a2 = admit(&counts, a, &limits).unwrap();
        assert_eq!(
            admit(&counts, a, &limits).err(),
            Some("max_connections_per_peer")
        );
        let _b1 = admit(&counts, b, &limits).unwrap();
        assert_eq!(admit(&counts, b, &limits).err(), Some("max_connections"));
        drop(a1);
        let _b2 = admit(&counts, b, &limits).unwrap();
        assert_eq!(lock(&counts).total, 3);
    }

    #[test]
    fn one_host_counts_once_whatever_its_address_form() {
        let counts = Arc::new(Mutex::new(Counts::default()));
        let limits = ConnLimits {
            max_connections_per_peer: 2,
            ..ConnLimits::default()
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // IPv4 and the same address IPv4-mapped (a dual-stack listener's form).
        let _a = admit(&counts, ip("192.0.2.7"), &limits).unwrap();
        let _b = admit(&counts, ip("::ffff:192.0.2.7"), &limits).unwrap();
        assert!(admit(&counts, ip("::ffff:c000:207"), &limits).is_err());
        // Addresses of one IPv6 /64 are one peer; another /64 is another.
        let _c = admit(&counts, ip("2001:db8:1:2::1"), &limits).unwrap();
        let _d = admit(&counts, ip("2001:db8:1:2:ffff::9"), &limits).unwrap();
        assert_eq!(
            admit(&counts, ip("2001:db8:1:2:abcd:1:2:3"), &limits).err(),
            Some("max_connections_per_peer")
        );
        let _e = admit(&counts, ip("2001:db8:1:3::1"), &limits).unwrap();
        assert_eq!(peer_key(ip("::1")), peer_key(ip("::1")));
    }

    /// Reads until the server closes; `None` if it is still open after `secs`.
    async fn closed_within(s: &mut TcpStream, secs: u64) -> Option<Vec<u8>> {
        use tokio::io::AsyncReadExt;
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(secs), async {
            let mut buf = [0u8; 4096];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        });
        read.await.ok().map(|_| got)
    }

    #[tokio::test]
    async fn stalled_idle_and_surplus_connections_are_closed_and_shutdown_ends() {
        use tokio::io::AsyncWriteExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "hi" }));
        let limits = ConnLimits {
            header_timeout: Duration::from_millis(300),
            body_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_millis(800),
            max_connections: 3,
            max_connections_per_peer: 2,
            ..ConnLimits::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, app, limits, async {
            let _ = stopped.await;
        }));
        // Headers that never end, trickled.
        let mut trickle = TcpStream::connect(addr).await.unwrap();
        trickle.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        for _ in 0..5 {
            let _ = trickle.write_all(b"X-A: b\r\n").await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(closed_within(&mut trickle, 10).await.is_some());
        // A second peer cannot exceed its own cap; its third connection gets 503, after
        // its request was read.
        let mut a = TcpStream::connect(addr).await.unwrap();
        let _b = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello")
            .await
            .unwrap();
        let answer = closed_within(&mut c, 5).await.expect("refused");
        assert!(answer.starts_with(b"HTTP/1.1 503"), "{answer:?}");
        // A served request works, then the connection is idle and closed.
        a.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let answer = closed_within(&mut a, 10).await.expect("closed when idle");
        assert!(answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
        // Shutdown ends the loop (the remaining connection closes gracefully).
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("shutdown ends serve")
            .unwrap();
    }

    /// A client that stops reading a response: the server's writes stall, no byte
    /// moves, and the idle timeout closes the connection (the header timeout, long
    /// here, cannot be what closes it).
    #[tokio::test]
    async fn a_client_that_stops_reading_is_closed_when_idle() {
        use tokio::io::AsyncWriteExt;
        const BIG: usize = 64 << 20;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app =
            axum::Router::new().route("/big", axum::routing::get(|| async { vec![b'x'; BIG] }));
        let limits = ConnLimits {
            header_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_millis(500),
            ..ConnLimits::default()
        };
        let server = tokio::spawn(serve(listener, app, limits, std::future::pending()));
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        // Long enough for the socket buffers to fill and the idle timeout to pass.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let got = closed_within(&mut client, 20)
            .await
            .expect("closed when idle");
        assert!(got.len() < BIG, "the whole response arrived: {}", got.len());
        server.abort();
    }

    #[test]
    fn keep_alives_come_well_within_the_idle_timeout() {
        let mut l = ConnLimits::default();
        assert_eq!(l.sse_keep_alive(), Duration::from_secs(15));
        l.idle_timeout = Duration::from_secs(4);
        assert_eq!(l.sse_keep_alive(), Duration::from_secs(2));
    }
}
