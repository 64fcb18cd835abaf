//! TLS at the boundary: the per-run certificate authority, the client and server sides
//! of a connection, and the interception that lets credentials be added to a request.

pub(crate) mod ca;
pub(crate) mod intercept;
pub(crate) mod tls;
