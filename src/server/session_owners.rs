//! Which client an MCP session (`Mcp-Session-Id`) over HTTP belongs to.
//!
//! rmcp gives every session its own server value, with its own PII token vault; by
//! itself it serves any request that names a live session id, whoever sends it. This
//! layer binds each new session to the client whose bearer token initialized it (the
//! id is read from the `initialize` response's header) and checks every later request
//! that names it, POST, GET and DELETE alike: another client gets exactly the answer an
//! unknown session gets (404 `Not Found: Session not found`), so it learns nothing about
//! which ids exist. Without tokens (loopback only) every caller is the same client.
//!
//! A DELETE that ends a session is answered 200 instead of rmcp's 202 (the official
//! Python SDK logs anything but 200 and 204 as a failed termination).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::SessionManager;

use super::client::ClientName;

const SESSION_HEADER: &str = "mcp-session-id";

/// Session ids and the client that created each (`None`: no tokens are configured).
#[derive(Clone)]
pub struct Owners {
    owners: Arc<Mutex<HashMap<String, Option<ClientName>>>>,
    sessions: Arc<LocalSessionManager>,
}

impl Owners {
    pub fn new(sessions: Arc<LocalSessionManager>) -> Owners {
        Owners {
            owners: Arc::default(),
            sessions,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<ClientName>>> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `client` may use session `id`: it created it.
    fn allows(&self, id: &str, client: &Option<ClientName>) -> bool {
        self.lock().get(id).is_some_and(|owner| owner == client)
    }

    /// Records a new session; now and then forgets sessions rmcp has ended (idle or
    /// closed by the server), so the map does not grow with every session ever made.
    async fn insert(&self, id: String, client: Option<ClientName>) {
        let len = {
            let mut owners = self.lock();
            owners.insert(id, client);
            owners.len()
        };
        if len >= 64 && len.is_power_of_two() {
            let ids: Vec<String> = self.lock().keys().cloned().collect();
            let mut gone = Vec::new();
            for id in ids {
                if !self
                    .sessions
                    .has_session(&id.clone().into())
                    .await
                    .unwrap_or(true)
                {
                    gone.push(id);
                }
            }
            let mut owners = self.lock();
            for id in gone {
                owners.remove(&id);
            }
        }
    }

    fn remove(&self, id: &str) {
        self.lock().remove(id);
    }
}

/// The answer rmcp gives a session id it does not know.
fn unknown_session() -> Response {
    (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response()
}

/// Checks the session a request names against its client; records new sessions.
pub async fn enforce(State(owners): State<Owners>, req: Request, next: Next) -> Response {
    let client = req.extensions().get::<ClientName>().cloned();
    let named = req
        .headers()
        .get(SESSION_HEADER)
        .map(|v| v.to_str().map(str::to_string));
    let named = match named {
        None => None,
        Some(Ok(id)) => Some(id),
        // Not visible ASCII: no session has such an id.
        Some(Err(_)) => return unknown_session(),
    };
    if let Some(id) = &named {
        if !owners.allows(id, &client) {
            tracing::info!(
                client = client.as_ref().map(|c| c.0.as_str()),
                session = %super::framing::bounded(id),
                "a request named a session that is not this client's (or does not exist)"
            );
            return unknown_session();
        }
    }
    let delete = req.method() == Method::DELETE;
    let mut response = next.run(req).await;
    match named {
        Some(id) if delete && response.status().is_success() => {
            owners.remove(&id);
            *response.status_mut() = StatusCode::OK;
        }
        Some(_) => {}
        None => {
            let created = response
                .headers()
                .get(SESSION_HEADER)
                .and_then(|v: &HeaderValue| v.to_str().ok())
                .map(str::to_string);
            if let Some(id) = created {
                owners.insert(id, client).await;
            }
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_session_is_only_its_creators() {
        let owners = Owners::new(Arc::new(LocalSessionManager::default()));
        let alice = Some(ClientName("alice".into()));
        let bob = Some(ClientName("bob".into()));
        owners.insert("s1".into(), alice.clone()).await;
        assert!(owners.allows("s1", &alice));
        assert!(!owners.allows("s1", &bob));
        assert!(!owners.allows("s1", &None));
        assert!(!owners.allows("nope", &alice));
        owners.remove("s1");
        assert!(!owners.allows("s1", &alice));
    }

    #[tokio::test]
    async fn ended_sessions_are_forgotten() {
        let owners = Owners::new(Arc::new(LocalSessionManager::default()));
        for i in 0..64 {
            owners.insert(format!("s{i}"), None).await;
        }
        // None of them is live in the (empty) session manager.
        assert!(owners.lock().len() < 64);
    }
}
