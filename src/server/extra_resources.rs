//! Skills and session workspaces as MCP resources:
//!
//! - `codebox://skills/<name>/SKILL.md` and `.../skill.py|skill.ts`: every saved skill;
//! - `codebox://sessions/<id>/workspace/<path>`: the files of the caller's own sessions
//!   (text files, read without following symlinks; another client's session is unknown;
//!   personal data tokenized when PII handling is on).

use rmcp::model::Resource;

use super::CodeboxServer;
use crate::pii::PiiMode;
use crate::session::disk;

pub const SKILLS_PREFIX: &str = "codebox://skills/";
pub const SESSIONS_PREFIX: &str = "codebox://sessions/";
/// Largest workspace file read for a resource (what is served must also fit in one
/// message once escaped: see `render::fits_wire`).
const MAX_RESOURCE_BYTES: u64 = super::render::WIRE_BUDGET as u64;
/// Workspace entries listed per session.
const MAX_LISTED: usize = 200;

impl CodeboxServer {
    /// The skills' files and the caller's workspace files.
    pub(super) fn extra_resources(&self, client: &str) -> Vec<Resource> {
        let mut out = Vec::new();
        if let Some(store) = &self.state.skills {
            for skill in store.list(None).unwrap_or_default() {
                for file in store.files(&skill.name).unwrap_or_default() {
                    let mut r = Resource::new(
                        format!("{SKILLS_PREFIX}{}/{file}", skill.name),
                        format!("skill {}: {file}", skill.name),
                    );
                    r.description = Some(skill.description.clone());
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
                let mut r = Resource::new(
                    format!("{SESSIONS_PREFIX}{}/workspace/{}", session.id(), e.path),
                    e.path.clone(),
                );
                r.size = e.size;
                out.push(r);
            }
        }
        out
    }

    /// Reads a skills or sessions resource: `None` when `uri` is neither.
    pub(super) fn read_extra_resource(
        &self,
        uri: &str,
        client: &str,
    ) -> Option<Result<String, String>> {
        if let Some(rest) = uri.strip_prefix(SKILLS_PREFIX) {
            let Some((name, file)) = rest.split_once('/') else {
                return Some(Err(format!("unknown resource {uri:?}")));
            };
            let Some(store) = &self.state.skills else {
                return Some(Err("skills are unavailable".into()));
            };
            return Some(store.read_file(name, file).map_err(|e| e.to_string()));
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
        let bytes = match disk::read_file(session.workspace(), path, MAX_RESOURCE_BYTES) {
            Ok(b) => b,
            Err(e) => {
                return Some(Err(format!(
                    "cannot read {path:?} in the session's workspace: {e}"
                )))
            }
        };
        let text = match String::from_utf8(bytes) {
            Ok(t) => t,
            Err(e) => {
                return Some(Err(format!(
                    "{path:?} is not UTF-8 text ({} bytes); read it from code instead",
                    e.into_bytes().len()
                )))
            }
        };
        let text = match self.state.settings.pii_mode {
            PiiMode::Off => text,
            _ => session.vault.tokenize(&text),
        };
        Some(super::render::fits_wire(&text, &format!("{path:?}")).map(|()| text))
    }
}
