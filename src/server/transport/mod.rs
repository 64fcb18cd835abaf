//! The MCP transport: stdio (its guard and framing), streamable HTTP (the listener,
//! connection limits, PROXY protocol, answers and refusals written before rmcp sees a
//! request), the replicas' session routing, the protocol revisions' input rounds, and
//! the client's log notifications. Nothing here knows what a tool does.

pub(crate) mod client_log;
pub mod framing;
pub mod http;
pub(crate) mod http_answers;
pub mod http_conn;
pub(crate) mod http_refuse;
pub(crate) mod input_rounds;
pub mod input_route;
pub(crate) mod listen;
pub mod proxy_protocol;
pub mod replica_sessions;
pub mod stdio_guard;
