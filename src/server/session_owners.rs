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
//! A client holds at most [`MAX_SESSIONS_PER_CLIENT`] sessions at once: every session
//! is a server value with its own tool router and token vault that rmcp keeps for 5
//! minutes after its last request, so without a cap one token (or anyone on loopback)
//! could grow the server's memory with a loop of `initialize` requests. A session over
//! the cap is closed as soon as rmcp made it, and the `initialize` is answered 429 with
//! a JSON-RPC error saying to end (DELETE) sessions no longer used.
//!
//! A DELETE that ends a session is answered 200 instead of rmcp's 202 (the official
//! Python SDK logs anything but 200 and 204 as a failed termination).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::SessionManager;

use super::client::ClientName;
use crate::replica::{elsewhere_message, placement, Placement};
use crate::server::transport::replica_sessions::ReplicaSessions;

const SESSION_HEADER: &str = "mcp-session-id";

/// Most sessions one client (one token; everyone on loopback without tokens) holds at
/// once. An MCP client keeps one; a test suite or a pool of agents a few dozen.
pub const MAX_SESSIONS_PER_CLIENT: usize = 128;

/// Session ids and the client that created each (`None`: no tokens are configured).
#[derive(Clone)]
pub struct Owners {
    owners: Arc<Mutex<HashMap<String, Option<ClientName>>>>,
    sessions: Arc<ReplicaSessions>,
}

impl Owners {
    pub fn new(sessions: Arc<ReplicaSessions>) -> Owners {
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

    /// Records a new session of `client` unless it already holds `cap` live ones (then
    /// `false`, and the session is not recorded).
    async fn admit(&self, id: String, client: Option<ClientName>, cap: usize) -> bool {
        let held = |owners: &HashMap<String, Option<ClientName>>| -> Vec<String> {
            owners
                .iter()
                .filter(|(_, owner)| **owner == client)
                .map(|(id, _)| id.clone())
                .collect()
        };
        let mine = held(&self.lock());
        if mine.len() >= cap {
            // Some may have ended (idle, or closed by the server): forget those first.
            let mut gone = Vec::new();
            for id in mine {
                if !self.is_live(&id).await {
                    gone.push(id);
                }
            }
            let mut owners = self.lock();
            for id in gone {
                owners.remove(&id);
            }
            if held(&owners).len() >= cap {
                return false;
            }
        }
        self.insert(id, client).await;
        true
    }

    async fn is_live(&self, id: &str) -> bool {
        self.sessions
            .has_session(&id.to_string().into())
            .await
            .unwrap_or(true)
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
                if !self.is_live(&id).await {
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

/// The answer to a request naming another replica's MCP session: 404, as for any
/// session this process does not hold (a client then starts a new one), with a
/// JSON-RPC error saying why.
fn elsewhere(message: &str) -> Response {
    let error = crate::server::transport::framing::Refusal {
        code: SESSION_ELSEWHERE,
        id: serde_json::Value::Null,
        message: message.to_string(),
        notification: false,
    };
    (StatusCode::NOT_FOUND, axum::Json(error.to_json())).into_response()
}

/// The JSON-RPC error code of [`elsewhere`] (implementation-defined range).
const SESSION_ELSEWHERE: i64 = -32010;

/// The answer to an `initialize` over [`MAX_SESSIONS_PER_CLIENT`].
fn too_many_sessions() -> Response {
    let error = crate::server::transport::framing::Refusal {
        code: TOO_MANY_SESSIONS,
        id: serde_json::Value::Null,
        message: format!(
            "this client already holds {MAX_SESSIONS_PER_CLIENT} MCP sessions; end (DELETE) \
             sessions it no longer uses, or wait for idle ones to expire"
        ),
        notification: false,
    };
    (StatusCode::TOO_MANY_REQUESTS, axum::Json(error.to_json())).into_response()
}

/// The JSON-RPC error code of [`too_many_sessions`] (implementation-defined range).
const TOO_MANY_SESSIONS: i64 = -32000;

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
        let here = owners.sessions.replica();
        if let (Some(here), Placement::Elsewhere { owner }) = (here, placement(here, id)) {
            tracing::info!(
                session = %crate::server::transport::framing::bounded(id),
                owner,
                "a request named an MCP session another replica made"
            );
            return elsewhere(&elsewhere_message("MCP session", id, owner, here));
        }
        if !owners.allows(id, &client) {
            tracing::info!(
                client = client.as_ref().map(|c| c.0.as_str()),
                session = %crate::server::transport::framing::bounded(id),
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
                if !owners
                    .admit(id.clone(), client.clone(), MAX_SESSIONS_PER_CLIENT)
                    .await
                {
                    tracing::warn!(
                        client = client.as_ref().map(|c| c.0.as_str()),
                        cap = MAX_SESSIONS_PER_CLIENT,
                        "a new MCP session was refused: the client holds too many"
                    );
                    if let Err(e) = owners.sessions.close_session(&id.into()).await {
                        tracing::warn!(error = %e, "closing a refused session failed");
                    }
                    return too_many_sessions();
                }
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
        let owners = Owners::new(Arc::new(ReplicaSessions::default()));
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

    /// A client over its cap gets no new session until one of its own ends; others
    /// are not affected.
    #[tokio::test]
    async fn a_client_holds_at_most_its_cap_of_live_sessions() {
        use rmcp::transport::streamable_http_server::session::SessionManager;
        let sessions = Arc::new(ReplicaSessions::default());
        let owners = Owners::new(sessions.clone());
        let alice = Some(ClientName("alice".into()));
        let bob = Some(ClientName("bob".into()));
        let mut live = Vec::new();
        for _ in 0..3 {
            let (id, _transport) = sessions.create_session().await.unwrap();
            assert!(owners.admit(id.to_string(), alice.clone(), 3).await);
            live.push((id, _transport));
        }
        let (extra, _t) = sessions.create_session().await.unwrap();
        assert!(!owners.admit(extra.to_string(), alice.clone(), 3).await);
        assert!(!owners.allows(&extra, &alice));
        assert!(owners.admit(extra.to_string(), bob.clone(), 3).await);
        // One of alice's ends: she may open another.
        sessions.close_session(&live[0].0).await.unwrap();
        let (next, _t2) = sessions.create_session().await.unwrap();
        assert!(owners.admit(next.to_string(), alice.clone(), 3).await);
        assert!(!owners.allows(&live[0].0, &alice));
    }

    #[tokio::test]
    async fn ended_sessions_are_forgotten() {
        let owners = Owners::new(Arc::new(ReplicaSessions::default()));
        for i in 0..64 {
            owners.insert(format!("s{i}"), None).await;
        }
        // None of them is live in the (empty) session manager.
        assert!(owners.lock().len() < 64);
    }
}
