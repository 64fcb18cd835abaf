//! Who is calling: the identity rate limits, sessions and the audit log are keyed by.
//!
//! - over HTTP with bearer tokens: the name of the client whose token the request carried
//!   (`http.token` is the client "default", `[http.clients]` names more); the middleware
//!   in `http.rs` puts a [`ClientName`] into the request, and rmcp hands the request's
//!   parts to the tool call;
//! - over HTTP without tokens (loopback only), 2025-11-25: the MCP session
//!   (`http:<connection>`), so two connections never share sessions or token maps;
//! - over HTTP without tokens, 2026-07-28: [`LOOPBACK_CLIENT`]. That revision has no
//!   session, and rmcp builds a server value per request, so a per-connection name would
//!   change with every request (sessions, kept output and rate limits would never find
//!   their owner again). Unauthenticated HTTP is served on loopback only: every such
//!   stateless caller is one client, the local user. Give each caller a token
//!   (`[http.clients]`) to tell them apart;
//! - over stdio: the one process at the other end.

use rmcp::service::RequestContext;
use rmcp::RoleServer;

/// The client a bearer token belongs to, set by the HTTP middleware.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientName(pub String);

/// The identity of every unauthenticated stateless (2026-07-28) HTTP caller.
pub const LOOPBACK_CLIENT: &str = "http:loopback";

/// Who the caller of `ctx` is, and whether it has a connection of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub client: String,
    /// A 2026-07-28 HTTP request: the server value lives for this request only.
    pub stateless_http: bool,
}

/// The identity of the caller of `ctx`; `connection` names this MCP connection.
pub fn client_of(ctx: &RequestContext<RoleServer>, connection: &str) -> Caller {
    let stateless = crate::server::transport::client_log::is_stateless_request(ctx);
    identify(
        ctx.extensions.get::<http::request::Parts>(),
        stateless,
        connection,
    )
}

fn identify(parts: Option<&http::request::Parts>, stateless: bool, connection: &str) -> Caller {
    let client = match parts {
        Some(parts) => match parts.extensions.get::<ClientName>() {
            Some(ClientName(name)) => format!("token:{name}"),
            None if stateless => LOOPBACK_CLIENT.to_string(),
            None => format!("http:{connection}"),
        },
        None => "stdio".to_string(),
    };
    Caller {
        client,
        stateless_http: parts.is_some() && stateless,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(client: Option<&str>) -> http::request::Parts {
        let mut request = http::Request::new(());
        if let Some(name) = client {
            request.extensions_mut().insert(ClientName(name.into()));
        }
        request.into_parts().0
    }

    #[test]
    fn each_transport_and_revision_names_its_caller() {
        let with_token = parts(Some("alice"));
        for stateless in [false, true] {
            let c = identify(Some(&with_token), stateless, "c1");
            assert_eq!(c.client, "token:alice");
            assert_eq!(c.stateless_http, stateless);
        }
        let anonymous = parts(None);
        assert_eq!(identify(Some(&anonymous), false, "c1").client, "http:c1");
        // Stateless: the same identity whatever server value answers the request.
        assert_eq!(
            identify(Some(&anonymous), true, "c1").client,
            LOOPBACK_CLIENT
        );
        assert_eq!(
            identify(Some(&anonymous), true, "c2").client,
            LOOPBACK_CLIENT
        );
        let stdio = identify(None, true, "c1");
        assert_eq!(
            (stdio.client.as_str(), stdio.stateless_http),
            ("stdio", false)
        );
    }
}
