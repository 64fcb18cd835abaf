//! How an execution asks its client's user: an [`Asker`] per execution, chosen by the
//! server from the request (`server::approval_glue::asker_for`).
//!
//! - [`PeerAsker`]: a 2025-11-25 stateful connection whose client declared the
//!   `elicitation` capability (form mode): `elicitation/create` through rmcp's peer.
//! - [`NoAsker`]: nobody can be asked ([`AskError::NoElicitation`]); the configured
//!   fallback applies.
//!
//! 2026-07-28 clients (stateless) cannot receive server→client requests; they get
//! [`NoAsker`] until an asker that answers through `input_required` results exists.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use rmcp::model::{
    CancelledNotificationParam, ClientResult, ElicitRequest, ElicitRequestParams, ElicitResult,
    RequestId, ServerRequest,
};
use rmcp::service::{Peer, PeerRequestOptions, ServiceError};
use rmcp::RoleServer;

/// How an execution asks its client's user. One per execution, chosen by the server from
/// the request (see `asker_for`).
pub trait Asker: Send + Sync + 'static {
    fn ask(
        &self,
        request: ElicitRequestParams,
        wait: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<ElicitResult, AskError>> + Send>>;
}

#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// The client cannot ask its user (no elicitation capability, or a connection that
    /// cannot carry a server→client request).
    #[error("the client cannot ask the user ({0})")]
    NoElicitation(String),
    /// No answer within the wait.
    #[error("no answer within {} s", .0.as_secs())]
    TimedOut(Duration),
    /// The request failed (the connection ended, the client answered with an error).
    #[error("asking the user failed: {0}")]
    Failed(String),
}

/// Nobody to ask: every question ends in the fallback.
#[derive(Debug, Clone)]
pub struct NoAsker {
    why: String,
}

impl NoAsker {
    /// `why` says what the client lacks, e.g. "no elicitation capability".
    pub fn new(why: impl Into<String>) -> NoAsker {
        NoAsker { why: why.into() }
    }
}

impl Asker for NoAsker {
    fn ask(
        &self,
        _request: ElicitRequestParams,
        _wait: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<ElicitResult, AskError>> + Send>> {
        let why = self.why.clone();
        Box::pin(async move { Err(AskError::NoElicitation(why)) })
    }
}

/// `elicitation/create` on a stateful (2025-11-25) connection whose client declared form
/// elicitation. Build it only for such a peer (`asker_for` checks).
#[derive(Clone)]
pub struct PeerAsker {
    peer: Peer<RoleServer>,
}

impl PeerAsker {
    pub fn new(peer: Peer<RoleServer>) -> PeerAsker {
        PeerAsker { peer }
    }
}

impl Asker for PeerAsker {
    fn ask(
        &self,
        request: ElicitRequestParams,
        wait: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<ElicitResult, AskError>> + Send>> {
        let peer = self.peer.clone();
        Box::pin(async move {
            let request = ServerRequest::ElicitRequest(ElicitRequest::new(request));
            let handle = peer
                .send_request_with_option(request, PeerRequestOptions::with_timeout(wait))
                .await
                .map_err(failed)?;
            // A question abandoned (the execution ended, the call was dropped) is
            // withdrawn from the client; one that times out rmcp withdraws itself.
            let mut withdraw = Withdraw(Some((peer.clone(), handle.id.clone())));
            let answer = handle.await_response().await;
            withdraw.0 = None;
            match answer {
                Ok(ClientResult::ElicitResult(result)) => Ok(result),
                Ok(_) => Err(AskError::Failed(
                    "the client answered elicitation/create with another result".into(),
                )),
                Err(ServiceError::Timeout { .. }) => Err(AskError::TimedOut(wait)),
                Err(e) => Err(failed(e)),
            }
        })
    }
}

fn failed(e: ServiceError) -> AskError {
    tracing::warn!(error = %e, "approval: elicitation/create failed");
    AskError::Failed(crate::proxy::clip(&e.to_string(), 512).into_owned())
}

/// Sends `notifications/cancelled` for a question still open when it is dropped.
struct Withdraw(Option<(Peer<RoleServer>, RequestId)>);

impl Drop for Withdraw {
    fn drop(&mut self) {
        let Some((peer, id)) = self.0.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let why = Some("the execution ended before the user answered".to_string());
            if let Err(e) = peer
                .notify_cancelled(CancelledNotificationParam::new(Some(id), why))
                .await
            {
                tracing::debug!(error = %e, "approval: cannot withdraw an abandoned question");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_asker_says_why() {
        let q = crate::approval::message::host_question("a:1", "r");
        let e = NoAsker::new("no elicitation capability")
            .ask(q, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(e, AskError::NoElicitation(_)));
        assert_eq!(
            e.to_string(),
            "the client cannot ask the user (no elicitation capability)"
        );
    }
}
