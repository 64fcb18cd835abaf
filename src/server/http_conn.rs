//! The HTTP accept loop: every connection is bounded in number and in time.
//!
//! `axum::serve` reads headers for as long as a client cares to send them and accepts
//! any number of connections, so twenty clients that never finish their headers (or
//! trickle them a byte at a time, or stall a body) held the server's sockets open
//! indefinitely without any token. Here each connection is served by hyper's HTTP/1
//! builder in our own loop:
//!
//! - at most [`ConnLimits::max_connections`] open at once, and
//!   [`ConnLimits::max_connections_per_peer`] from one peer (an IPv4 address, plain or
//!   IPv4-mapped, or an IPv6 /64: see [`peer_key`]); a connection over
//!   either cap is answered `503` at once (best effort, without reading it) and closed;
//! - its request headers must be complete within [`ConnLimits::header_timeout`]
//!   (hyper's header-read timeout: a deadline, so trickling does not extend it). hyper
//!   starts it whenever it waits for a request, so a kept-alive connection waiting for
//!   its next request is closed after it too (HTTP clients keep idle connections for
//!   less: httpx 5 s);
//! - a request body must be complete within [`ConnLimits::body_timeout`] (enforced where
//!   the body is read, in `http.rs`: `408` with a JSON-RPC error);
//! - a connection on which no byte moves either way for [`ConnLimits::idle_timeout`] is
//!   closed. A running execution's SSE stream is not idle: rmcp sends a keep-alive
//!   comment at least every `idle_timeout / 2` (see [`ConnLimits::sse_keep_alive`]).
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
use tokio_util::sync::CancellationToken;

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
}

impl Default for ConnLimits {
    fn default() -> ConnLimits {
        ConnLimits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 256,
            max_connections_per_peer: 64,
        }
    }
}

impl ConnLimits {
    /// How often an SSE stream sends a keep-alive comment: often enough that a stream
    /// waiting on a long execution never looks idle.
    pub fn sse_keep_alive(&self) -> Duration {
        (self.idle_timeout / 2).min(Duration::from_secs(15))
    }
}

/// Open connections per peer address, and in total.
#[derive(Default)]
struct Counts {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

/// A connection's place in [`Counts`], given back when it closes.
struct Slot {
    counts: Arc<Mutex<Counts>>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.total -= 1;
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

/// A slot for a new connection from `peer`, or why there is none.
fn admit(
    counts: &Arc<Mutex<Counts>>,
    peer: IpAddr,
    limits: &ConnLimits,
) -> Result<Slot, &'static str> {
    let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
    if c.total >= limits.max_connections {
        return Err("max_connections");
    }
    let n = c.per_peer.entry(peer).or_insert(0);
    if *n >= limits.max_connections_per_peer {
        return Err("max_connections_per_peer");
    }
    *n += 1;
    c.total += 1;
    Ok(Slot {
        counts: counts.clone(),
        peer,
    })
}

/// Accepts and serves connections with `app` until `shutdown` resolves, then closes them
/// gracefully and returns once all are gone.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let counts = Arc::new(Mutex::new(Counts::default()));
    let closing = CancellationToken::new();
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
        let slot = match admit(&counts, peer_key(peer.ip()), &limits) {
            Ok(slot) => slot,
            Err(cap) => {
                tracing::warn!(%peer, cap, "connection refused: too many open connections");
                refuse(tcp);
                continue;
            }
        };
        // TCP_NODELAY: a response is written in small pieces (headers, SSE events); with
        // Nagle's algorithm the second one waits for the client's delayed ACK, which cost
        // every call on a kept-alive connection ~40 ms.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY");
        }
        tokio::spawn(connection(
            tcp,
            peer,
            app.clone(),
            limits.clone(),
            closing.clone(),
            (slot, alive.clone()),
        ));
    }
    drop(listener);
    closing.cancel();
    drop(alive);
    let _ = all_gone.recv().await;
}

/// A best-effort `503` to a connection over a cap, without waiting on the client.
fn refuse(tcp: TcpStream) {
    const BODY: &str = "too many open connections\n";
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-type: text/plain\r\n\
         content-length: {}\r\nretry-after: 1\r\n\r\n{BODY}",
        BODY.len()
    );
    // A write on the socket itself: tokio's `try_write` answers WouldBlock until its
    // reactor has seen the new socket writable, and the 503 would be lost. The send
    // buffer of a connection just accepted has room for this; it never blocks
    // (the socket is non-blocking).
    match tcp.into_std() {
        Ok(mut std) => {
            let _ = std::io::Write::write(&mut std, answer.as_bytes());
        }
        Err(e) => tracing::debug!(error = %e, "cannot answer a refused connection"),
    }
}

/// Serves one connection until it ends, goes idle, or the server closes.
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    app: axum::Router,
    limits: ConnLimits,
    closing: CancellationToken,
    _held: (Slot, tokio::sync::mpsc::Sender<()>),
) {
    let started = Instant::now();
    let activity = Arc::new(AtomicU64::new(0));
    let io = TokioIo::new(Tracked {
        inner: tcp,
        started,
        activity: activity.clone(),
    });
    let service = hyper_util::service::TowerToHyperService::new(app);
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
                    tracing::debug!(%peer, error = %e, "HTTP connection ended with an error");
                }
                return;
            }
            _ = closing.cancelled(), if !graceful => {
                graceful = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = tick.tick() => {
                let last = Duration::from_millis(activity.load(Ordering::Relaxed));
                if started.elapsed().saturating_sub(last) >= limits.idle_timeout {
                    tracing::info!(%peer, idle_s = limits.idle_timeout.as_secs_f64(), "closing an idle HTTP connection");
                    return;
                }
            }
        }
    }
}

/// A TCP stream that notes when a byte last moved either way.
struct Tracked {
    inner: TcpStream,
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
    }

    #[test]
    fn one_host_counts_once_whatever_its_address_form() {
        let counts = Arc::new(Mutex::new(Counts::default()));
        let limits = ConnLimits {
            max_connections_per_peer: 2,
            ..ConnLimits::default()
        };
        let key = |s: &str| peer_key(s.parse().unwrap());
        // IPv4 and the same address IPv4-mapped (a dual-stack listener's form).
        let _a = admit(&counts, key("192.0.2.7"), &limits).unwrap();
        let _b = admit(&counts, key("::ffff:192.0.2.7"), &limits).unwrap();
        assert!(admit(&counts, key("::ffff:c000:207"), &limits).is_err());
        // Addresses of one IPv6 /64 are one peer; another /64 is another.
        let _c = admit(&counts, key("2001:db8:1:2::1"), &limits).unwrap();
        let _d = admit(&counts, key("2001:db8:1:2:ffff::9"), &limits).unwrap();
        assert_eq!(
            admit(&counts, key("2001:db8:1:2:abcd:1:2:3"), &limits).err(),
            Some("max_connections_per_peer")
        );
        let _e = admit(&counts, key("2001:db8:1:3::1"), &limits).unwrap();
        assert_eq!(key("::1"), key("::1"));
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
        // A second peer cannot exceed its own cap; its third connection gets 503.
        let mut a = TcpStream::connect(addr).await.unwrap();
        let _b = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        let answer = closed_within(&mut c, 5).await.expect("refused at once");
        assert!(
            answer.is_empty() || answer.starts_with(b"HTTP/1.1 503"),
            "{answer:?}"
        );
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
