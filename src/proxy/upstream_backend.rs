//! The production backend: tool calls go to the upstream MCP servers, searches to an
//! index of their catalog rebuilt whenever the catalog version moves.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::CallToolResult;

use super::{CallError, ToolBackend};
use crate::catalog::SearchIndex;
use crate::upstream::catalog::Catalog;
use crate::upstream::{UpstreamError, Upstreams};

/// The upstreams with a search index of their current catalog.
pub struct IndexedUpstreams {
    upstreams: Upstreams,
    index: Mutex<Option<Arc<SearchIndex>>>,
}

impl IndexedUpstreams {
    pub fn new(upstreams: Upstreams) -> IndexedUpstreams {
        IndexedUpstreams {
            upstreams,
            index: Mutex::new(None),
        }
    }

    pub fn upstreams(&self) -> &Upstreams {
        &self.upstreams
    }
}

impl ToolBackend for IndexedUpstreams {
    fn catalog(&self) -> Arc<Catalog> {
        self.upstreams.catalog()
    }

    fn index(&self) -> Arc<SearchIndex> {
        let catalog = self.upstreams.catalog();
        let mut cached = self.index.lock().expect("index lock");
        match cached.as_ref() {
            Some(index) if index.version() == catalog.version => index.clone(),
            _ => {
                let started = std::time::Instant::now();
                let index = Arc::new(SearchIndex::build(&catalog));
                tracing::debug!(
                    version = catalog.version,
                    tools = catalog.tools.len(),
                    elapsed_us = started.elapsed().as_micros() as u64,
                    "rebuilt the tool search index"
                );
                *cached = Some(index.clone());
                index
            }
        }
    }

    fn call(
        &self,
        name: String,
        arguments: Option<serde_json::Map<String, serde_json::Value>>,
        timeout: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<CallToolResult, CallError>> + Send + 'static>> {
        let upstreams = self.upstreams.clone();
        Box::pin(async move {
            upstreams
                .call(&name, arguments, timeout)
                .await
                .map_err(call_error)
        })
    }

    fn first_attempts(
        &self,
        server: Option<String>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        let upstreams = self.upstreams.clone();
        Box::pin(async move { upstreams.wait_first_attempts(server.as_deref()).await })
    }
}

/// An upstream call's error as the proxy takes it.
pub(super) fn call_error(e: UpstreamError) -> CallError {
    match e {
        UpstreamError::Timeout { .. } => CallError::Timeout(e.to_string()),
        // Its list names tools this execution's allowlist may hide: the proxy filters it.
        UpstreamError::NotListed { server, .. } => CallError::NotListed { server },
        other => CallError::Failed(other.to_string()),
    }
}
