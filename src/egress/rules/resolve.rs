//! Name resolution on the supervisor, behind a trait so tests can map names to loopback.
//!
//! The system resolver is `getaddrinfo` on tokio's blocking pool: each lookup holds a
//! thread until the C resolver gives up, tens of seconds for a name server that never
//! answers, however soon the proxy stopped waiting. So lookups are bounded twice: per run
//! ([`MAX_RESOLUTIONS_PER_RUN`], held by `connect.rs` until the lookup really ends) and
//! per process ([`MAX_SYSTEM_RESOLUTIONS`], held by the blocking thread itself), so no
//! program can fill the blocking pool the rest of the server depends on.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::ToSocketAddrs;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;

use tokio::sync::Semaphore;

/// Lookups one run may have in flight; one that timed out for the program keeps its slot
/// until it really ends.
pub const MAX_RESOLUTIONS_PER_RUN: usize = 4;

/// What a resolver returns: the addresses of a name, in the order to try them.
pub type Resolving = Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send>>;

/// Resolves a host name (never an IP literal: the engine does not ask for those).
pub trait Resolve: Send + Sync + 'static {
    /// The addresses of `host` with `port` filled in.
    fn resolve(&self, host: &str, port: u16) -> Resolving;
}

/// System lookups in flight at once in this process (each holds a blocking-pool thread).
pub const MAX_SYSTEM_RESOLUTIONS: usize = 32;

static SYSTEM_SLOTS: Semaphore = Semaphore::const_new(MAX_SYSTEM_RESOLUTIONS);

/// The system's resolver (`getaddrinfo` on tokio's blocking pool, at most
/// [`MAX_SYSTEM_RESOLUTIONS`] at once).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> Resolving {
        let host = host.to_string();
        Box::pin(on_blocking_pool(&SYSTEM_SLOTS, move || {
            Ok((host.as_str(), port).to_socket_addrs()?.collect())
        }))
    }
}

/// Runs `lookup` on the blocking pool once `slots` has room; the slot is held by the
/// blocking thread until `lookup` returns, whether or not anyone still waits for it.
async fn on_blocking_pool(
    slots: &'static Semaphore,
    lookup: impl FnOnce() -> io::Result<Vec<SocketAddr>> + Send + 'static,
) -> io::Result<Vec<SocketAddr>> {
    let slot = slots.acquire().await.map_err(io::Error::other)?;
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        lookup()
    })
    .await
    .map_err(io::Error::other)?
}

/// A fixed map of names to addresses (tests and benches); other names do not resolve.
#[derive(Debug, Clone, Default)]
pub struct StaticResolver {
    names: HashMap<String, Vec<IpAddr>>,
}

impl StaticResolver {
    pub fn new() -> StaticResolver {
        StaticResolver::default()
    }

    /// Maps `name` (already normalised: lower case, no trailing dot) to `addrs`.
    pub fn with(mut self, name: &str, addrs: &[IpAddr]) -> StaticResolver {
        self.names.insert(name.to_string(), addrs.to_vec());
        self
    }
}

impl Resolve for StaticResolver {
    fn resolve(&self, host: &str, port: u16) -> Resolving {
        let found = self.names.get(host).cloned();
        Box::pin(async move {
            match found {
                Some(ips) => Ok(ips
                    .into_iter()
                    .map(|ip| SocketAddr::new(ip, port))
                    .collect()),
                None => Err(io::Error::new(io::ErrorKind::NotFound, "name not known")),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A lookup the waiter gave up on keeps its slot until it returns.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slot_is_held_until_the_lookup_returns() {
        static SLOTS: Semaphore = Semaphore::const_new(1);
        let (release, released) = mpsc::channel::<()>();
        let stuck = on_blocking_pool(&SLOTS, move || {
            let _ = released.recv();
            Ok(Vec::new())
        });
        assert!(tokio::time::timeout(Duration::from_millis(50), stuck)
            .await
            .is_err());
        // The waiter is gone; the lookup still runs and holds the only slot.
        let next = tokio::spawn(on_blocking_pool(&SLOTS, || Ok(Vec::new())));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !next.is_finished(),
            "a second lookup started beside the stuck one"
        );
        release.send(()).unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), next).await;
        assert!(matches!(&got, Ok(Ok(Ok(v))) if v.is_empty()), "{got:?}");
    }

    #[tokio::test]
    async fn the_system_resolver_reads_the_hosts_file() {
        let addrs = SystemResolver.resolve("localhost", 80).await.unwrap();
        assert!(addrs.iter().any(|a| a.ip().is_loopback()), "{addrs:?}");
    }
}
