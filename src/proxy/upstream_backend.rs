//! The production backend: tool calls go to the upstream MCP servers.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::CallToolResult;

use super::{CallError, ToolBackend};
use crate::upstream::catalog::Catalog;
use crate::upstream::{UpstreamError, Upstreams};

impl ToolBackend for Upstreams {
    fn catalog(&self) -> Arc<Catalog> {
        Upstreams::catalog(self)
    }

    fn call(
        &self,
        name: String,
        arguments: Option<serde_json::Map<String, serde_json::Value>>,
        timeout: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<CallToolResult, CallError>> + Send + 'static>> {
        let upstreams = self.clone();
        Box::pin(async move {
            upstreams
                .call(&name, arguments, timeout)
                .await
                .map_err(|e| match e {
                    UpstreamError::Timeout { .. } => CallError::Timeout(e.to_string()),
                    other => CallError::Failed(other.to_string()),
                })
        })
    }
}
