//! Name resolution on the supervisor, behind a trait so tests can map names to loopback.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;

/// What a resolver returns: the addresses of a name, in the order to try them.
pub type Resolving = Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send>>;

/// Resolves a host name (never an IP literal: the engine does not ask for those).
pub trait Resolve: Send + Sync + 'static {
    /// The addresses of `host` with `port` filled in.
    fn resolve(&self, host: &str, port: u16) -> Resolving;
}

/// The system's resolver (`getaddrinfo` on tokio's blocking pool).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> Resolving {
        let host = host.to_string();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect();
            Ok(addrs)
        })
    }
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
