//! Per-execution budgets (connections, concurrency, bytes each way) and the metered
//! stream that enforces the byte budgets and notes activity for the idle timeout.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::egress::rules::policy::Limits;

/// Process-wide counters for `health`.
#[derive(Debug, Default)]
pub struct Counters {
    pub runs: AtomicU64,
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
    pub intercepted: AtomicU64,
    pub bytes_up: AtomicU64,
    pub bytes_down: AtomicU64,
    pub limit_hits: AtomicU64,
}

impl Counters {
    pub fn snapshot(&self) -> serde_json::Value {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "runs": get(&self.runs),
            "connections_allowed": get(&self.allowed),
            "connections_denied": get(&self.denied),
            "intercepted": get(&self.intercepted),
            "bytes_up": get(&self.bytes_up),
            "bytes_down": get(&self.bytes_down),
            "limit_hits": get(&self.limit_hits),
        })
    }
}

/// `268435456` → `256M`; sizes as a person wrote them.
pub fn human_size(n: u64) -> String {
    for (unit, shift) in [("G", 30), ("M", 20), ("K", 10)] {
        if n >= 1 << shift && n % (1 << shift) == 0 {
            return format!("{}{unit}", n >> shift);
        }
    }
    format!("{n} bytes")
}

/// `60s`, `1.5s`, `250ms`.
pub fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else if ms >= 1000 {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{ms}ms")
    }
}

/// One execution's budget: what all its connections share.
#[derive(Debug)]
pub struct Budget {
    pub limits: Limits,
    connections: AtomicU32,
    concurrent: Arc<Semaphore>,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    limit_reached: OnceLock<String>,
    counters: Arc<Counters>,
}

impl Budget {
    pub fn new(limits: Limits, counters: Arc<Counters>) -> Budget {
        Budget {
            concurrent: Arc::new(Semaphore::new(limits.max_concurrent_connections as usize)),
            limits,
            connections: AtomicU32::new(0),
            bytes_up: AtomicU64::new(0),
            bytes_down: AtomicU64::new(0),
            limit_reached: OnceLock::new(),
            counters,
        }
    }

    /// Notes that `limit` (`max_connections (64)`) was reached; the first one is reported.
    pub fn reached(&self, limit: String) {
        self.counters.limit_hits.fetch_add(1, Ordering::Relaxed);
        let _ = self.limit_reached.set(limit);
    }

    pub fn limit_reached(&self) -> Option<String> {
        self.limit_reached.get().cloned()
    }

    /// Counts one more connection; `Err` with the limit's name past `max_connections`.
    pub fn open_connection(&self) -> Result<(), String> {
        let n = self.connections.fetch_add(1, Ordering::Relaxed) + 1;
        if n > self.limits.max_connections {
            let limit = format!("max_connections ({})", self.limits.max_connections);
            self.reached(limit.clone());
            return Err(limit);
        }
        Ok(())
    }

    /// A slot among the concurrent connections; `Err` with the limit's name when all are
    /// taken.
    pub fn concurrent_slot(&self) -> Result<OwnedSemaphorePermit, String> {
        self.concurrent.clone().try_acquire_owned().map_err(|_| {
            let limit = format!(
                "max_concurrent_connections ({})",
                self.limits.max_concurrent_connections
            );
            self.reached(limit.clone());
            limit
        })
    }

    pub fn bytes_up(&self) -> u64 {
        self.bytes_up.load(Ordering::Relaxed)
    }

    pub fn bytes_down(&self) -> u64 {
        self.bytes_down.load(Ordering::Relaxed)
    }

    /// Reserves up to `want` bytes of a direction's budget (0: the budget is spent).
    fn reserve(&self, up: bool, want: usize) -> usize {
        let (counter, limit) = self.direction(up);
        let mut cur = counter.load(Ordering::Relaxed);
        loop {
            let grant = (limit.saturating_sub(cur)).min(want as u64);
            if grant == 0 {
                return 0;
            }
            match counter.compare_exchange_weak(
                cur,
                cur + grant,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return grant as usize,
                Err(now) => cur = now,
            }
        }
    }

    /// Gives back the part of a reservation that was not used.
    fn release(&self, up: bool, unused: usize) {
        if unused > 0 {
            self.direction(up)
                .0
                .fetch_sub(unused as u64, Ordering::Relaxed);
        }
    }

    fn direction(&self, up: bool) -> (&AtomicU64, u64) {
        if up {
            (&self.bytes_up, self.limits.max_bytes_up)
        } else {
            (&self.bytes_down, self.limits.max_bytes_down)
        }
    }

    fn limit_name(&self, up: bool) -> String {
        if up {
            format!("max_bytes_up ({})", human_size(self.limits.max_bytes_up))
        } else {
            format!(
                "max_bytes_down ({})",
                human_size(self.limits.max_bytes_down)
            )
        }
    }
}

/// The client connections open at once across every run of the process: each holds a
/// descriptor, and its upstream another, out of the supervisor's `RLIMIT_NOFILE`, which
/// accepts, sandboxes and the audit log share. Per-run limits alone do not bound them
/// (runs × `max_concurrent_connections`).
#[derive(Debug)]
pub struct OpenCap {
    slots: Arc<Semaphore>,
    max: usize,
}

impl OpenCap {
    /// An eighth of the soft `RLIMIT_NOFILE` (a client connection and its upstream take
    /// two; the rest stays for everything else), at least 16 and at most 16384.
    pub fn from_rlimit() -> OpenCap {
        let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map(|(soft, _)| soft)
            .unwrap_or(1024);
        OpenCap::new((soft / 8).clamp(16, 16384) as usize)
    }

    pub fn new(max: usize) -> OpenCap {
        OpenCap {
            slots: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// A slot for one client connection; `Err` with the limit's name when all are taken.
    pub fn slot(&self) -> Result<OwnedSemaphorePermit, String> {
        self.slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| format!("max_open_connections ({})", self.max))
    }

    /// (open now, the cap), for `health`.
    pub fn usage(&self) -> (usize, usize) {
        (self.max - self.slots.available_permits(), self.max)
    }
}

/// One connection's byte counts.
#[derive(Debug, Default)]
pub struct ConnMeter {
    pub up: AtomicU64,
    pub down: AtomicU64,
    /// `limit max_bytes_down (256M) reached`, once a byte budget stopped this connection.
    pub limit_hit: OnceLock<String>,
}

/// When a byte last moved on a client connection (either side), for the idle timeout.
#[derive(Debug)]
pub struct Activity {
    /// Milliseconds since `epoch`.
    last_ms: AtomicU64,
    epoch: Instant,
}

impl Default for Activity {
    fn default() -> Activity {
        Activity {
            last_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl Activity {
    pub fn touch(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.epoch + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    /// Resolves once no byte has moved either way for `idle`.
    pub async fn idle(&self, idle: Duration) {
        loop {
            let deadline = self.last() + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// A stream whose bytes are counted against the run's [`Budget`] (upstream side) or only
/// noted as activity (client side, `budget: None`). Past a budget every read or write
/// fails with the limit's name.
pub struct Metered<S> {
    inner: S,
    /// The run's budget and this connection's counts (upstream side only).
    counted: Option<(Arc<Budget>, Arc<ConnMeter>)>,
    activity: Arc<Activity>,
}

impl<S> Metered<S> {
    /// Client side: activity only.
    pub fn activity(inner: S, activity: Arc<Activity>) -> Metered<S> {
        Metered {
            inner,
            counted: None,
            activity,
        }
    }

    /// Upstream side: bytes counted against `budget` and in `meter`.
    pub fn counted(
        inner: S,
        budget: Arc<Budget>,
        meter: Arc<ConnMeter>,
        activity: Arc<Activity>,
    ) -> Metered<S> {
        Metered {
            inner,
            counted: Some((budget, meter)),
            activity,
        }
    }

    fn spent(budget: &Budget, meter: &ConnMeter, up: bool) -> io::Error {
        let limit = budget.limit_name(up);
        if meter
            .limit_hit
            .set(format!("limit {limit} reached"))
            .is_ok()
        {
            tracing::info!(limit = %limit, "egress byte limit reached; closing the connection");
            budget.reached(limit.clone());
        }
        io::Error::other(format!("limit {limit} reached"))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let Some((budget, meter)) = &this.counted else {
            let before = buf.filled().len();
            let r = Pin::new(&mut this.inner).poll_read(cx, buf);
            if buf.filled().len() > before {
                this.activity.touch();
            }
            return r;
        };
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let grant = budget.reserve(false, buf.remaining());
        if grant == 0 {
            return Poll::Ready(Err(Self::spent(budget, meter, false)));
        }
        let mut limited = ReadBuf::new(&mut buf.initialize_unfilled()[..grant]);
        let r = Pin::new(&mut this.inner).poll_read(cx, &mut limited);
        let n = limited.filled().len();
        budget.release(false, grant - n);
        if n > 0 {
            buf.advance(n);
            meter.down.fetch_add(n as u64, Ordering::Relaxed);
            budget
                .counters
                .bytes_down
                .fetch_add(n as u64, Ordering::Relaxed);
            this.activity.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let Some((budget, meter)) = &this.counted else {
            let r = Pin::new(&mut this.inner).poll_write(cx, buf);
            if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
                this.activity.touch();
            }
            return r;
        };
        if buf.is_empty() {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        let grant = budget.reserve(true, buf.len());
        if grant == 0 {
            return Poll::Ready(Err(Self::spent(budget, meter, true)));
        }
        let r = Pin::new(&mut this.inner).poll_write(cx, &buf[..grant]);
        let n = match &r {
            Poll::Ready(Ok(n)) => *n,
            _ => 0,
        };
        budget.release(true, grant - n);
        if n > 0 {
            meter.up.fetch_add(n as u64, Ordering::Relaxed);
            budget
                .counters
                .bytes_up
                .fetch_add(n as u64, Ordering::Relaxed);
            this.activity.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn budget(up: u64, down: u64) -> Arc<Budget> {
        Arc::new(Budget::new(
            Limits {
                max_bytes_up: up,
                max_bytes_down: down,
                max_connections: 2,
                max_concurrent_connections: 1,
                ..Limits::default()
            },
            Arc::default(),
        ))
    }

    #[test]
    fn sizes_and_durations_read_as_written() {
        assert_eq!(human_size(256 << 20), "256M");
        assert_eq!(human_size(64 << 10), "64K");
        assert_eq!(human_size(1 << 30), "1G");
        assert_eq!(human_size(1000), "1000 bytes");
        assert_eq!(human_duration(Duration::from_secs(60)), "60s");
        assert_eq!(human_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(human_duration(Duration::from_millis(1500)), "1.5s");
    }

    #[test]
    fn connection_limits_are_named() {
        let b = budget(10, 10);
        assert!(b.open_connection().is_ok());
        assert!(b.open_connection().is_ok());
        assert_eq!(b.open_connection(), Err("max_connections (2)".into()));
        let slot = b.concurrent_slot().unwrap();
        assert_eq!(
            b.concurrent_slot().unwrap_err(),
            "max_concurrent_connections (1)"
        );
        drop(slot);
        assert!(b.concurrent_slot().is_ok());
        assert_eq!(
            b.limit_reached().as_deref(),
            Some("max_connections (2)"),
            "the first is kept"
        );
    }

    #[test]
    fn the_open_cap_follows_the_descriptor_limit() {
        let cap = OpenCap::from_rlimit();
        let (open, max) = cap.usage();
        assert_eq!(open, 0);
        assert!((16..=16384).contains(&max), "{max}");
        let small = OpenCap::new(1);
        let held = small.slot().unwrap();
        assert_eq!(small.slot().unwrap_err(), "max_open_connections (1)");
        assert_eq!(small.usage(), (1, 1));
        drop(held);
        assert!(small.slot().is_ok());
    }

    #[tokio::test]
    async fn byte_budgets_cut_both_directions() {
        let b = budget(5, 8);
        let meter = Arc::new(ConnMeter::default());
        let (near, mut far) = tokio::io::duplex(64);
        let mut m = Metered::counted(near, b.clone(), meter.clone(), Arc::default());
        far.write_all(b"0123456789").await.unwrap();
        let mut buf = [0u8; 64];
        let n = m.read(&mut buf).await.unwrap();
        assert_eq!(n, 8, "only the budget is delivered");
        let err = m.read(&mut buf).await.unwrap_err();
        assert_eq!(err.to_string(), "limit max_bytes_down (8 bytes) reached");
        let n = m.write(b"abcdefgh").await.unwrap();
        assert_eq!(n, 5);
        assert!(m.write(b"x").await.is_err());
        assert_eq!((b.bytes_up(), b.bytes_down()), (5, 8));
        assert_eq!(meter.down.load(Ordering::Relaxed), 8);
        assert_eq!(
            meter.limit_hit.get().map(String::as_str),
            Some("limit max_bytes_down (8 bytes) reached")
        );
        assert_eq!(
            b.limit_reached().as_deref(),
            Some("max_bytes_down (8 bytes)")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn idle_waits_for_quiet() {
        let meter = Arc::new(Activity::default());
        let m2 = meter.clone();
        let toucher = tokio::spawn(async move {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                m2.touch();
            }
        });
        let start = tokio::time::Instant::now();
        meter.idle(Duration::from_millis(100)).await;
        assert!(
            start.elapsed() >= Duration::from_millis(300),
            "{:?}",
            start.elapsed()
        );
        toucher.await.unwrap();
    }
}
