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
//! Layout: `config` (the TOML section), `pattern` (host names and patterns), `address`
//! (public or not; `allow_private`), `policy` (decisions, narrowing, limits, credentials),
//! `resolve`, `ca` and `tls` (certificates and TLS configurations), `engine` (shared part,
//! runs, accept loop), `head` (the first request), `connect` (resolve, check, connect),
//! `tunnel` (CONNECT), `intercept` (TLS termination), `plain` (absolute-form HTTP),
//! `forward` (request and response rewriting), `redact`, `limits`, `record`.

mod address;
mod ca;
pub mod config;
mod connect;
mod credentials;
mod engine;
mod forward;
mod head;
mod intercept;
mod limits;
mod pattern;
mod plain;
pub mod policy;
pub mod record;
mod redact;
pub mod resolve;
mod tls;
mod tunnel;

pub use config::{CredentialSection, NetworkMode, NetworkSection};
pub use engine::{Egress, EgressOptions, EgressRun};
pub use policy::{EgressPolicy, Limits, Narrowing};
pub use record::{ConnectionKind, ConnectionRecord, EgressReport};
pub use redact::{Redactor, Secrets, REDACTED};
pub use resolve::{Resolve, StaticResolver, SystemResolver};

/// The proxy's port inside every sandbox's network namespace (one per namespace, so a
/// fixed port is fine).
pub const PROXY_PORT: u16 = 3128;
