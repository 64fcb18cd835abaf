//! Who is calling: the identity rate limits, sessions and the audit log are keyed by.
//!
//! - over HTTP with bearer tokens: the name of the client whose token the request carried
//!   (`http.token` is the client "default", `[http.clients]` names more); the middleware
//!   in `http.rs` puts a [`ClientName`] into the request, and rmcp hands the request's
//!   parts to the tool call;
//! - over HTTP without tokens (loopback only): the MCP session, so two connections never
//!   share sessions or token maps;
//! - over stdio: the one process at the other end.

use rmcp::service::RequestContext;
use rmcp::RoleServer;

/// The client a bearer token belongs to, set by the HTTP middleware.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientName(pub String);

/// The identity of the caller of `ctx`; `connection` names this MCP connection.
pub fn client_of(ctx: &RequestContext<RoleServer>, connection: &str) -> String {
    match ctx.extensions.get::<http::request::Parts>() {
        Some(parts) => match parts.extensions.get::<ClientName>() {
            Some(ClientName(name)) => format!("token:{name}"),
            None => format!("http:{connection}"),
        },
        None => "stdio".to_string(),
    }
}

/// A random name for a new connection (hex of 64 bits; it only tells connections apart).
pub fn new_connection_id() -> String {
    let mut raw = [0u8; 8];
    if getrandom::fill(&mut raw).is_err() {
        // Not a secret: a counter still tells connections apart.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        raw = NEXT
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .to_le_bytes();
    }
    raw.iter().map(|b| format!("{b:02x}")).collect()
}
