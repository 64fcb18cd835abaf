//! rmcp's in-memory MCP session manager, with ids that name this replica.
//!
//! A 2025-11-25 client sends `Mcp-Session-Id` with every request; when several replicas
//! stand behind one balancer, the id must say which replica holds the session, so the
//! balancer can route on it without a table of its own (see [`crate::replica`]). rmcp's
//! [`LocalSessionManager`] draws bare UUIDs; this manager makes the session the same way
//! but names it `<replica>.<uuid>`, and hands every other operation to the local one.
//! Without a replica name it is the local manager unchanged.

use std::sync::Arc;

use futures_core::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::common::server_side_http::{session_id, ServerSseMessage, SessionId};
use rmcp::transport::streamable_http_server::session::local::{
    create_local_session, LocalSessionManager, LocalSessionManagerError, LocalSessionWorker,
};
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::WorkerTransport;

use crate::replica::ReplicaName;

/// The MCP sessions of this process (`Default`: no replica name).
#[derive(Debug, Default)]
pub struct ReplicaSessions {
    local: LocalSessionManager,
    replica: Option<ReplicaName>,
}

impl ReplicaSessions {
    pub fn new(replica: Option<ReplicaName>) -> ReplicaSessions {
        ReplicaSessions {
            local: LocalSessionManager::default(),
            replica,
        }
    }

    pub fn replica(&self) -> Option<&ReplicaName> {
        self.replica.as_ref()
    }
}

// The local manager's methods are called through a generic function: there its results
// have the trait's declared bounds (`Send + Sync` streams), not its impl's narrower ones.
fn local<M: SessionManager>(m: &M) -> &M {
    m
}

impl SessionManager for ReplicaSessions {
    type Error = LocalSessionManagerError;
    type Transport = WorkerTransport<LocalSessionWorker>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let Some(replica) = &self.replica else {
            return self.local.create_session().await;
        };
        // What the local manager does, with the replica's name in front of the id.
        let id: SessionId = Arc::from(replica.qualify(&session_id()));
        let (handle, worker) = create_local_session(id.clone(), self.local.session_config.clone());
        self.local.sessions.write().await.insert(id.clone(), handle);
        Ok((id, WorkerTransport::spawn(worker)))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.local.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.local.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.local.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        local(&self.local).create_stream(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.local.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        local(&self.local).create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        local(&self.local).resume(id, last_event_id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ids_name_the_replica_and_sessions_work_as_local_ones() {
        let named = ReplicaSessions::new(Some(ReplicaName::parse("codebox-3").unwrap()));
        let (id, _transport) = named.create_session().await.unwrap();
        assert!(id.starts_with("codebox-3."), "{id}");
        assert_eq!(
            id.len(),
            "codebox-3.".len() + 36,
            "a whole UUID follows: {id}"
        );
        assert!(named.has_session(&id).await.unwrap());
        named.close_session(&id).await.unwrap();
        assert!(!named.has_session(&id).await.unwrap());

        let single = ReplicaSessions::default();
        let (bare, _t) = single.create_session().await.unwrap();
        assert!(!bare.contains('.'), "{bare}");
        assert!(single.has_session(&bare).await.unwrap());
    }
}
