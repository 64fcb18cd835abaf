//! The upstream servers' states as the model reads them: `list_servers`, the
//! `upstreams` of `health`, and the notes `search_tools` adds while a server is not
//! ready — the same words a call to one of its tools gets (`upstream::ServerStatus::note`).

use std::collections::HashMap;

use crate::proxy::{IndexedUpstreams, ToolBackend};
use crate::upstream::{ServerState, Upstreams};

/// `list_servers`: a line per server, and the structured list.
pub(super) fn list(upstreams: &Upstreams) -> (String, Vec<serde_json::Value>) {
    let mut text = String::new();
    let mut servers = Vec::new();
    for s in upstreams.servers() {
        let note = s.note();
        text.push_str(&format!("{} ({}): {} tools", s.name, s.state, s.tool_count));
        if let Some(note) = &note {
            text.push_str(" — ");
            text.push_str(note);
        }
        text.push('\n');
        servers.push(serde_json::json!({
            "name": s.name,
            "module": s.ident,
            "status": s.state.to_string(),
            "tool_count": s.tool_count,
            "last_error": s.last_error,
            "attempts": s.attempts,
            "next_attempt_in_ms": s.next_attempt_in.map(|d| d.as_millis() as u64),
            "note": note,
        }));
    }
    if servers.is_empty() {
        text.push_str("no upstream servers are configured\n");
    }
    (text, servers)
}

/// Adds `server_status` to each tool whose server is not ready (its last known tools
/// stay listed while it reconnects).
pub(super) fn mark_down_servers(backend: &IndexedUpstreams, tools: &mut [serde_json::Value]) {
    let down: HashMap<String, String> = backend
        .upstreams()
        .servers()
        .into_iter()
        .filter(|s| s.state != ServerState::Ready)
        .map(|s| (s.name, s.state.to_string()))
        .collect();
    if down.is_empty() {
        return;
    }
    let catalog = backend.catalog();
    for t in tools {
        let server = t["name"]
            .as_str()
            .and_then(|n| catalog.get(n))
            .map(|c| c.server.as_str());
        if let Some(state) = server.and_then(|s| down.get(s)) {
            t["server_status"] = serde_json::json!(state);
        }
    }
}

/// A search's answer while some servers are not ready: their tools may be missing from
/// it, so it says which servers and why (`servers_not_ready`, and a line each).
pub(super) fn add_not_ready(
    upstreams: &Upstreams,
    text: &mut String,
    value: &mut serde_json::Value,
) {
    let not_ready: Vec<serde_json::Value> = upstreams
        .servers()
        .into_iter()
        .filter_map(|s| {
            let note = s.note()?;
            text.push_str(&format!("note: {note}\n"));
            Some(serde_json::json!({
                "server": s.name,
                "status": s.state.to_string(),
                "tool_count": s.tool_count,
                "note": note,
            }))
        })
        .collect();
    if !not_ready.is_empty() {
        value["servers_not_ready"] = serde_json::json!(not_ready);
    }
}
