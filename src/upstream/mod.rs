//! Upstream MCP servers: the servers of a `.mcp.json`, connected as an MCP client, whose
//! tools code in the sandbox can call.
//!
//! - [`config`]: `.mcp.json` in Claude Code's format, `${VAR}` expansion
//! - [`naming`]: the exposed names `<server>__<tool>` and the way back
//! - [`catalog`]: the snapshot of every connected server's tools
//! - [`process`]: a stdio server's process group, its stderr, stopping it
//! - [`connection`]: one rmcp client connection (stdio or streamable HTTP)
//! - [`supervisor`]: one task per server: connect, refresh on list changes, reconnect
//!   with backoff, publish the catalog
//! - [`manager`]: [`Upstreams`], the handle the MCP server and the sandbox proxy use
//!
//! While a server is down (failed, or reconnecting after its connection was lost) its
//! last known tools stay in the catalog, and a call to one of them fails at once with
//! [`UpstreamError::Unavailable`], which says why ("upstream server "memory" is
//! reconnecting: ...").

pub mod catalog;
pub mod config;
pub mod connection;
pub mod frame_id;
pub mod manager;
pub mod naming;
pub mod process;
pub mod stdio_transport;
pub mod supervisor;

pub use catalog::{Catalog, CatalogTool};
pub use config::{ServerConfig, TransportConfig};
pub use manager::{ServerState, ServerStatus, UpstreamError, UpstreamOptions, Upstreams};

pub(crate) use crate::error_chain::error_chain;
