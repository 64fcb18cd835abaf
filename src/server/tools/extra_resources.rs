//! Skills and session workspaces as MCP resources:
//!
//! - `codebox://skills/<name>/SKILL.md` and `.../skill.py|skill.ts`: the caller's own
//!   skills and the shared ones (another client's skills are unknown);
//! - `codebox://sessions/<id>/workspace/<path>`: the files of the caller's own sessions
//!   (text files, read without following symlinks; another client's session is unknown);
//! - `codebox://health`: what the `health` tool shows (JSON), and `codebox://sessions`:
//!   the caller's own open sessions (JSON: id, idle seconds, workspace usage), so a
//!   client with `tools = "minimal"` reaches them without the tools. The sessions listing
//!   holds ids and numbers only, nothing a program or a user wrote, and is not tokenized
//!   (a tokenized id could not be used); health is, like the tool's result.
//!
//! When PII handling is on, everything listed reaches the model tokenized: a workspace
//! path in a URI and a name becomes `[EMAIL_1].txt` (the session's token map, so reading
//! that URI restores the path), a skill's description is tokenized with the
//! connection's map; file contents read through a resource are tokenized too.

use rmcp::model::Resource;

use crate::pii::PiiMode;
use crate::server::CodeboxServer;
use crate::session::disk;

pub const SKILLS_PREFIX: &str = "codebox://skills/";
pub const SESSIONS_PREFIX: &str = "codebox://sessions/";
pub const HEALTH_URI: &str = "codebox://health";
pub const SESSIONS_URI: &str = "codebox://sessions";
pub const TASKS_URI: &str = "codebox://tasks";
/// Largest workspace file read for a resource (what is served must also fit in one
/// message once escaped: see `render::fits_wire`).
const MAX_RESOURCE_BYTES: u64 = crate::server::tools::render::WIRE_BUDGET as u64;
/// Largest workspace file served as blob pages.
const MAX_BLOB_BYTES: u64 = 64 << 20;
/// Bytes of one blob page (base64 makes it 4/3 of that on the wire, within one message).
pub const BLOB_PAGE_BYTES: usize = 512 * 1024;

/// A resource's contents: text, or one page of a binary file as base64.
pub(in crate::server) enum ResourceBody {
    Text(String),
    Blob { base64: String },
}

/// Workspace entries listed per session.
const MAX_LISTED: usize = 200;
/// Serialized bytes of the skills and workspace files one `resources/list` lists: 200
/// workspace paths of 4 KiB each made a 1.6 MB answer, more than a client accepts in one
/// message (see `render::WIRE_BUDGET`); the rest of the budget is the servers' wrappers'.
const LIST_BUDGET: usize = crate::server::tools::render::WIRE_BUDGET / 2;

/// The resources listed so far, and what they take on the wire.
#[derive(Default)]
struct Listing {
    items: Vec<Resource>,
    bytes: usize,
    left_out: usize,
}

impl Listing {
    /// Adds `r` if it fits in [`LIST_BUDGET`]; counts it as left out otherwise.
    fn push(&mut self, r: Resource) {
        let size = serde_json::to_vec(&r).map_or(usize::MAX, |v| v.len() + 1);
        if self.left_out == 0 && self.bytes.saturating_add(size) <= LIST_BUDGET {
            self.bytes += size;
            self.items.push(r);
        } else {
            self.left_out += 1;
        }
    }
}

impl CodeboxServer {
    /// The caller's skills' files and the caller's workspace files.
    pub(in crate::server) fn extra_resources(&self, client: &str) -> Vec<Resource> {
        let pii = self.state.settings.pii_mode != PiiMode::Off;
        let mut out = Listing::default();
        for (uri, what) in [
            (HEALTH_URI, "codebox's state, as the health tool shows it"),
            (
                SESSIONS_URI,
                "your open sessions: id, idle seconds, workspace usage",
            ),
            (
                TASKS_URI,
                "your executions running or kept as tasks: id, status, output so far",
            ),
        ] {
            let mut r = Resource::new(uri, uri.trim_start_matches("codebox://"));
            r.description = Some(what.into());
            r.mime_type = Some("application/json".into());
            out.push(r);
        }
        if let Some(store) = &self.state.skills {
            for skill in store.list(client, None).unwrap_or_default() {
                let name = &skill.summary.name;
                let description = self.pii_text(&skill.summary.description);
                for file in store.files(client, name).unwrap_or_default() {
                    let mut r = Resource::new(
                        format!("{SKILLS_PREFIX}{name}/{file}"),
                        format!("skill {name}: {file}"),
                    );
                    r.description = Some(description.clone());
                    out.push(r);
                }
            }
        }
        for session in self.state.sessions.of_owner(client) {
            let (entries, _) = crate::workspace::list_at(session.workspace());
            for e in entries
                .into_iter()
                .filter(|e| e.kind == crate::workspace::Kind::File)
                .take(MAX_LISTED)
            {
                let path = match pii {
                    true => session.vault.tokenize(&e.path),
                    false => e.path.clone(),
                };
                let mut r = Resource::new(
                    format!("{SESSIONS_PREFIX}{}/workspace/{path}", session.id()),
                    path,
                );
                r.size = e.size;
                out.push(r);
            }
        }
        if out.left_out > 0 {
            tracing::info!(
                listed = out.items.len(),
                left_out = out.left_out,
                budget = LIST_BUDGET,
                "resources/list left out skills or workspace files to fit in one message"
            );
        }
        out.items
    }

    /// Reads a skills or sessions resource: `None` when `uri` is neither.
    pub(in crate::server) fn read_extra_resource(
        &self,
        uri: &str,
        client: &str,
    ) -> Option<Result<ResourceBody, String>> {
        if uri == HEALTH_URI {
            let mut health = self.health_value();
            if self.pii_on() {
                self.vault().tokenize_json(&mut health);
            }
            return Some(Ok(ResourceBody::Text(health.to_string())));
        }
        if uri == SESSIONS_URI {
            return Some(Ok(ResourceBody::Text(
                self.sessions_value(client).to_string(),
            )));
        }
        if uri == TASKS_URI {
            let tasks: Vec<serde_json::Value> = self
                .tasks_of(client)
                .into_iter()
                .map(|t| {
                    serde_json::json!({
                        "taskId": t.task.task_id,
                        "status": t.task.status,
                        "statusMessage": t.task.status_message,
                        "createdAt": t.task.created_at,
                        "lastUpdatedAt": t.task.last_updated_at,
                    })
                })
                .collect();
            return Some(Ok(ResourceBody::Text(
                serde_json::json!({ "tasks": tasks }).to_string(),
            )));
        }
        if uri.starts_with(SESSIONS_PREFIX) {
            return Some(self.read_workspace_resource(uri, client));
        }
        self.read_text_resource(uri, client)
            .map(|read| read.map(ResourceBody::Text))
    }

    /// The open sessions of `client`, for `codebox://sessions`.
    fn sessions_value(&self, client: &str) -> serde_json::Value {
        let sessions: Vec<serde_json::Value> = self
            .state
            .sessions
            .of_owner(client)
            .iter()
            .map(|session| {
                let usage = disk::usage(session.workspace()).ok();
                serde_json::json!({
                    "id": session.id(),
                    "idle_s": session.idle_for().as_secs(),
                    "workspace_bytes": usage.as_ref().map(|u| u.bytes),
                    "workspace_entries": usage.as_ref().map(|u| u.entries),
                })
            })
            .collect();
        let mut value = serde_json::json!({
            "sessions": sessions,
            "idle_ttl_s": self.state.settings.sessions.idle_ttl.as_secs(),
        });
        // With a snapshot store: the client's paused sessions and its bounds.
        if let Some(serde_json::Value::Object(paused)) = self.state.sessions.paused_of(client) {
            value.as_object_mut().expect("an object").extend(paused);
        }
        value
    }

    /// A session workspace file: text as text; other bytes as base64 blobs in pages of
    /// [`BLOB_PAGE_BYTES`] (`?page=N`, default 1), never when PII handling is on (bytes
    /// cannot be tokenized).
    fn read_workspace_resource(&self, uri: &str, client: &str) -> Result<ResourceBody, String> {
        let (base, page) = match uri.rsplit_once("?page=") {
            Some((b, n)) => (
                b,
                Some(
                    n.parse::<usize>()
                        .ok()
                        .filter(|n| *n >= 1)
                        .ok_or_else(|| format!("{uri:?}: a page is a number from 1"))?,
                ),
            ),
            None => (uri, None),
        };
        let (session, path) = self.workspace_path(base, client)?;
        let bytes = disk::read_file(session.workspace(), &path, MAX_BLOB_BYTES)
            .map_err(|e| format!("cannot read {path:?} in the session's workspace: {e}"))?;
        let text_sized = bytes.len() as u64 <= MAX_RESOURCE_BYTES;
        if text_sized && std::str::from_utf8(&bytes).is_ok() {
            // Text: tokenized and redacted as text, whole.
            if page.is_some_and(|p| p > 1) {
                return Err(format!("{uri:?}: a text file has one page"));
            }
            return match self.read_text_resource(base, client) {
                Some(read) => read.map(ResourceBody::Text),
                None => Err(format!("unknown resource {uri:?}")),
            };
        }
        if self.state.settings.pii_mode != PiiMode::Off {
            return Err(format!(
                "{base:?} is binary or larger than one message, and personal data cannot be tokenized in pages of bytes: read what you need from code"
            ));
        }
        // Configured egress secrets never leave, whatever the form.
        let bytes = match &self.state.settings.egress {
            Some(egress) if !egress.secrets().is_empty() => egress.secrets().redact_all(&bytes),
            _ => bytes,
        };
        let pages = bytes.len().div_ceil(BLOB_PAGE_BYTES).max(1);
        let page = page.unwrap_or(1);
        if page > pages {
            return Err(format!("{uri:?}: there are {pages} pages"));
        }
        let chunk = bytes
            .chunks(BLOB_PAGE_BYTES)
            .nth(page - 1)
            .unwrap_or_default();
        use base64::Engine as _;
        Ok(ResourceBody::Blob {
            base64: base64::engine::general_purpose::STANDARD.encode(chunk),
        })
    }

    /// The session and on-disk path a workspace URI names (tokens restored).
    fn workspace_path(
        &self,
        uri: &str,
        client: &str,
    ) -> Result<(std::sync::Arc<crate::session::Session>, String), String> {
        let rest = uri.strip_prefix(SESSIONS_PREFIX).unwrap_or_default();
        let Some((id, path)) = rest
            .split_once('/')
            .and_then(|(id, p)| p.strip_prefix("workspace/").map(|p| (id, p)))
        else {
            return Err(format!("unknown resource {uri:?}"));
        };
        let session = self
            .state
            .sessions
            .get(id, client)
            .map_err(|e| e.to_string())?;
        let path = match self.state.settings.pii_mode {
            PiiMode::Off => path.to_string(),
            _ => session.vault.restore(&percent_decoded(path)),
        };
        Ok((session, path))
    }

    /// A skills or sessions resource as text.
    fn read_text_resource(&self, uri: &str, client: &str) -> Option<Result<String, String>> {
        if let Some(rest) = uri.strip_prefix(SKILLS_PREFIX) {
            let Some((name, file)) = rest.split_once('/') else {
                return Some(Err(format!("unknown resource {uri:?}")));
            };
            let Some(store) = &self.state.skills else {
                return Some(Err("skills are unavailable".into()));
            };
            return Some(
                store
                    .read_file(client, name, file)
                    .map(|text| self.pii_text(&text))
                    .map_err(|e| e.to_string()),
            );
        }
        let rest = uri.strip_prefix(SESSIONS_PREFIX)?;
        let Some((id, path)) = rest
            .split_once('/')
            .and_then(|(id, p)| p.strip_prefix("workspace/").map(|p| (id, p)))
        else {
            return Some(Err(format!(
                "unknown resource {uri:?}: expected codebox://sessions/<id>/workspace/<path>"
            )));
        };
        let session = match self.state.sessions.get(id, client) {
            Ok(s) => s,
            Err(e) => return Some(Err(e.to_string())),
        };
        let pii = self.state.settings.pii_mode != PiiMode::Off;
        // The path as listed (tokens when PII handling is on) and as on disk.
        let shown = path;
        let restored;
        let path = if pii {
            restored = session.vault.restore(&percent_decoded(path));
            restored.as_str()
        } else {
            path
        };
        let bytes = match disk::read_file(session.workspace(), path, MAX_RESOURCE_BYTES) {
            Ok(b) => b,
            Err(e) => {
                return Some(Err(format!(
                    "cannot read {shown:?} in the session's workspace: {}",
                    if pii {
                        session.vault.tokenize(&e.to_string())
                    } else {
                        e.to_string()
                    }
                )))
            }
        };
        let text = match String::from_utf8(bytes) {
            Ok(t) => t,
            Err(e) => {
                return Some(Err(format!(
                    "{shown:?} is not UTF-8 text ({} bytes)",
                    e.into_bytes().len()
                )))
            }
        };
        let text = match self.state.settings.pii_mode {
            PiiMode::Off => text,
            _ => session.vault.tokenize(&text),
        };
        // Configured egress secrets never leave, whatever the PII mode.
        let text = crate::server::wiring::egress::without_secrets(&self.state.settings, text);
        Some(crate::server::tools::render::fits_wire(&text, &format!("{path:?}")).map(|()| text))
    }
}

/// `text` with `%XX` escapes decoded when it holds an escaped bracket (clients may
/// escape the brackets of a token in a URI); left as it is otherwise and when the
/// escapes do not decode to UTF-8.
fn percent_decoded(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    if !lower.contains("%5b") && !lower.contains("%5d") {
        return text.to_string();
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Long workspace paths (and control bytes, escaped six-fold) stop the listing at its
    /// budget; what fits is listed in order.
    #[test]
    fn the_listing_stays_within_its_budget() {
        let mut l = Listing::default();
        let long = format!("{}\u{1}", "d/".repeat(2000));
        for i in 0..200 {
            l.push(Resource::new(
                format!("{SESSIONS_PREFIX}s/workspace/{long}{i}"),
                long.clone(),
            ));
        }
        assert!(l.left_out > 0 && !l.items.is_empty(), "{}", l.left_out);
        assert_eq!(l.items.len() + l.left_out, 200);
        let wire = serde_json::to_vec(&l.items).unwrap().len();
        assert!(wire <= LIST_BUDGET, "{wire}");
        // Small entries all fit.
        let mut l = Listing::default();
        for i in 0..200 {
            l.push(Resource::new(
                format!("{SKILLS_PREFIX}s{i}/SKILL.md"),
                "x".to_string(),
            ));
        }
        assert_eq!((l.items.len(), l.left_out), (200, 0));
    }

    #[test]
    fn percent_escapes_decode() {
        assert_eq!(super::percent_decoded("%5BEMAIL_1%5D.txt"), "[EMAIL_1].txt");
        assert_eq!(super::percent_decoded("a%zz%5b"), "a%zz[");
        assert_eq!(super::percent_decoded("100%41"), "100%41");
        assert_eq!(super::percent_decoded("plain"), "plain");
        assert_eq!(super::percent_decoded("%ff%5B"), "%ff%5B");
    }
}
