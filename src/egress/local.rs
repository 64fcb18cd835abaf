//! The addresses of the supervisor's own host: a connection to one of them reaches the
//! host's own services (anything listening on `0.0.0.0` or `::`) however public the
//! address looks, so the proxy treats them as non-public (see `policy::check_address`).
//!
//! Read with `getifaddrs` (every interface of the supervisor's network namespace) and
//! kept for a second, so a burst of connections costs one listing.

use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a listing is reused.
const FRESH: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot list this host's addresses")]
    List(#[source] nix::Error),
}

/// The host's interface addresses, listed at most once per [`FRESH`].
#[derive(Debug, Default)]
pub struct HostAddresses {
    cached: Mutex<Option<(Instant, Vec<IpAddr>)>>,
}

impl HostAddresses {
    /// Every address of every interface, as of at most a second ago.
    pub fn current(&self) -> Result<Vec<IpAddr>, Error> {
        let mut cached = self.cached.lock().expect("host addresses lock");
        if let Some((at, addrs)) = cached.as_ref() {
            if at.elapsed() < FRESH {
                return Ok(addrs.clone());
            }
        }
        let addrs = list().inspect_err(|err| {
            tracing::error!(?err, "egress: cannot list this host's addresses");
        })?;
        *cached = Some((Instant::now(), addrs.clone()));
        Ok(addrs)
    }
}

fn list() -> Result<Vec<IpAddr>, Error> {
    let mut out = Vec::new();
    for ifa in nix::ifaddrs::getifaddrs().map_err(Error::List)? {
        let Some(addr) = ifa.address else { continue };
        let ip = if let Some(v4) = addr.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_among_them_and_the_listing_is_reused() {
        let h = HostAddresses::default();
        let first = h.current().unwrap();
        assert!(
            first.contains(&IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)),
            "{first:?}"
        );
        let at = h.cached.lock().unwrap().as_ref().unwrap().0;
        assert_eq!(h.current().unwrap(), first);
        assert_eq!(h.cached.lock().unwrap().as_ref().unwrap().0, at, "reused");
    }
}
