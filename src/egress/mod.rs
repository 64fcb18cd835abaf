//! The egress proxy: the one way out of a sandbox in `proxy` network mode.
//!
//! Each sandbox's network namespace has only `lo`, and in it a listening socket on
//! 127.0.0.1:[`PROXY_PORT`] that the supervisor holds; landlock lets the program connect
//! nowhere else. This module serves that socket: an HTTP/1.1 forward proxy (CONNECT and
//! absolute-form requests) that decides per connection whether the program may reach a
//! host ([`EgressPolicy`]: deny, allow, a request's narrowing), resolves the name on the
//! supervisor and refuses non-public addresses unless `allow_private` names them, connects
//! to exactly an address it checked, records every connection ([`EgressReport`]), bounds
//! each execution's connections, bytes and time, and adds credentials at the boundary
//! (terminating TLS with a certificate of the per-installation CA) so that secrets never
//! enter the sandbox.
//!
//! # What it protects against, and what not
//!
//! Protects (given the kernel keeps the program on this one socket):
//! - reaching a host the policy does not allow, whatever the program writes: the decision
//!   is on the CONNECT target or the absolute URL, never on a `Host` header; names are
//!   normalised (case, trailing dot, IDNA) before matching, and numeric-looking names that
//!   resolvers read as IPv4 addresses are refused;
//! - SSRF into the host's networks: names resolve on the supervisor and every address is
//!   checked (loopback, RFC 1918, CGNAT, link-local and the metadata address, ULA,
//!   multicast, reserved, IPv4 embedded in mapped/NAT64/6to4 addresses, and every address
//!   of the supervisor's own interfaces, public or not); the proxy
//!   connects to an address it checked, so DNS rebinding gains nothing;
//! - request smuggling through the proxy: hyper parses, and the proxy re-frames every
//!   forwarded request (framing and hop-by-hop headers are dropped);
//! - a secret in the sandbox: it exists only in the supervisor and on the wire to its host
//!   (verified TLS, or plain HTTP only where `allow_plain_http` says so); responses from
//!   that host are redacted (headers and bodies, streaming), compressed ones refused, and
//!   byte ranges are not requested; records, logs, errors and `health` never hold it;
//! - one execution starving others: each connection is its own task with head, idle and
//!   connect timeouts, and each execution has its own connection, concurrency and byte
//!   budgets.
//!
//! Does not protect against:
//! - what an allowed host does with what the program sends it (exfiltration to an allowed
//!   host is allowed traffic); a tunnel is opaque, the proxy sees only its size;
//! - an allowed host that reflects the secret transformed (encoded, split across
//!   responses by the host's own logic, reversed): redaction finds the configured values
//!   and their URL encoding, nothing cleverer; credentials should go only to hosts that
//!   do not echo requests;
//! - a credentialed host that redirects elsewhere: the client's next connection is
//!   checked like any other, but whatever that host put in the URL is the program's;
//! - timing and size side channels, and anything a host with `allow_private` access
//!   exposes;
//! - a program that trusts the codebox CA for other purposes: the CA certificate is
//!   public to sandboxes, its key never leaves `<state_dir>/egress-ca` (0600).
//!
//! Layout: `config` (the TOML section), `pattern` (host names and patterns), `address`
//! (public or not; `allow_private`), `local` (the host's own addresses), `policy`
//! (decisions, narrowing, limits), `credentials`, `resolve`, `ca` and `tls` (certificates
//! and TLS configurations), `engine` (shared part,
//! runs, accept loop), `head` (the first request), `connect` (resolve, check, connect),
//! `tunnel` (CONNECT), `intercept` (TLS termination), `plain` (absolute-form HTTP),
//! `forward` (request and response rewriting), `redact`, `limits`, `record`, `why` (the
//! answer a client that hides refusals can ask for).

pub mod config;
mod connect;
mod engine;
mod forward;
pub mod head;
pub mod interception;
mod limits;
mod local;
mod plain;
pub mod record;
pub mod rules;
pub mod secrets;
mod tunnel;

pub use config::Error as ConfigError;
pub use config::{CredentialSection, NetworkMode, NetworkSection};
pub use engine::Error as EgressError;
pub use engine::{Egress, EgressOptions, EgressRun};
pub use interception::ca::Error as CaError;
pub use interception::tls::Error as TlsError;
pub use record::{ConnectionKind, ConnectionRecord, EgressReport};
pub use rules::policy::Error as PolicyError;
pub use rules::policy::{EgressPolicy, Limits, Narrowing};
pub use rules::resolve::{Resolve, StaticResolver, SystemResolver};
pub use rules::why::WHY_HOST;
pub use secrets::redact::{Redactor, Secrets, REDACTED};

/// The proxy's port inside every sandbox's network namespace (one per namespace, so a
/// fixed port is fine).
pub const PROXY_PORT: u16 = crate::runtime::EGRESS_PORT;

#[cfg(test)]
mod tests {
    use super::*;

    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>(_: &T) {}

    /// The integrator keeps an `Egress` in an `Arc` across tasks and finishes runs from
    /// spawned tasks.
    #[test]
    fn types_cross_tasks() {
        send_sync::<Egress>();
        send_sync::<EgressRun>();
        send_sync::<EgressPolicy>();
        send_sync::<Narrowing>();
        send_sync::<EgressReport>();
        fn finish_is_send(run: EgressRun) {
            send(&run.finish());
        }
        let _ = finish_is_send;
    }
}
