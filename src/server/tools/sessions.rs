//! The session tools besides the execute tools' `session` argument: closing one at once
//! (instead of waiting for its idle TTL), and, when the operator keeps paused sessions
//! (`[sessions] snapshot_key`), pausing one and resuming it.

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, ErrorData as McpError, RoleServer};
use serde::Deserialize;
use serde_json::json;

use crate::server::{tool_error, CodeboxServer};

/// The tools a server without a snapshot store does not offer.
pub const PERSISTENCE_TOOLS: [&str; 3] = ["pause_session", "resume_session", "fork_session"];

/// Removes the pause and resume tools (the server keeps no paused sessions).
pub fn without_persistence(router: &mut ToolRouter<CodeboxServer>) {
    for name in PERSISTENCE_TOOLS {
        router.map.remove(name);
    }
}

/// Arguments of `close_session`, `pause_session`, `resume_session` and `fork_session`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CloseSessionParams {
    pub session: String,
}

#[tool_router(router = sessions_router, vis = "pub(in crate::server)")]
impl CodeboxServer {
    #[tool(
        name = "close_session",
        description = "End a session now: its interpreters stop, its /workspace is deleted."
    )]
    async fn close_session(
        &self,
        Parameters(p): Parameters<CloseSessionParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let client = self.client_of(&ctx);
        match self.state.sessions.close(&p.session, &client).await {
            Ok(()) => Ok(CallToolResult::success(vec![ContentBlock::text(
                "session closed; its workspace is deleted",
            )])),
            Err(e) => Ok(tool_error(e.to_string())),
        }
    }

    #[tool(
        name = "pause_session",
        description = "Save a session to disk and free it: its /workspace files are kept (the interpreter is not: variables are lost). Its next call, or resume_session, resumes it, also after a server restart."
    )]
    async fn pause_session(
        &self,
        Parameters(p): Parameters<CloseSessionParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let client = self.client_of(&ctx);
        match self.state.sessions.pause(&p.session, &client).await {
            Ok(info) => {
                let text = format!(
                    "session paused (state: {}): its /workspace ({} entries, {} bytes of data) is saved and its interpreter stopped; its next call or resume_session resumes it with its files (a new interpreter), until it expires in {} s",
                    info.state.as_str(),
                    info.workspace.entries,
                    info.workspace.data_bytes,
                    info.expires_unix.saturating_sub(crate::snapshot::store::unix_now()),
                );
                let mut r = CallToolResult::structured(json!({
                    "session": p.session,
                    "paused": true,
                    "state": info.state.as_str(),
                    "generation": info.generation,
                    "snapshot_bytes": info.bytes,
                    "workspace": info.workspace,
                    "expires_unix": info.expires_unix,
                }));
                r.content = vec![ContentBlock::text(text)];
                Ok(r)
            }
            Err(e) => Ok(tool_error(e.to_string())),
        }
    }

    #[tool(
        name = "resume_session",
        description = "Resume a paused session now (its next call also does): its /workspace files are back, in a new interpreter."
    )]
    async fn resume_session(
        &self,
        Parameters(p): Parameters<CloseSessionParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let client = self.client_of(&ctx);
        let sessions = &self.state.sessions;
        match sessions
            .get_or_resume(&p.session, &client, || self.new_vault())
            .await
        {
            Ok(session) => {
                let resumed = session.take_resumed();
                let usage = crate::session::disk::usage(session.workspace()).ok();
                let state = crate::session::persist::backend_state().as_str();
                let text = if resumed {
                    super::render::resumed_line(state)
                } else {
                    "the session is open (it was not paused)\n".to_string()
                };
                let mut r = CallToolResult::structured(json!({
                    "session": p.session,
                    "resumed": resumed,
                    "state": if resumed { Some(state) } else { None },
                    "workspace_bytes": usage.as_ref().map(|u| u.bytes),
                    "workspace_entries": usage.as_ref().map(|u| u.entries),
                }));
                r.content = vec![ContentBlock::text(text.trim_end().to_string())];
                Ok(r)
            }
            Err(e) => Ok(tool_error(e.to_string())),
        }
    }

    #[tool(
        name = "fork_session",
        description = "Copy a session (open or paused) into a new session: its /workspace files as they are now. The two then diverge; the copy's first call starts it with a new interpreter."
    )]
    async fn fork_session(
        &self,
        Parameters(p): Parameters<CloseSessionParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let client = self.client_of(&ctx);
        match self.state.sessions.fork(&p.session, &client).await {
            Ok((id, info)) => {
                let text = format!(
                    "forked: session {id} holds a copy of the files of {} ({} entries, {} bytes of data); pass it as session to use it (its first call starts a new interpreter, state: {})",
                    p.session,
                    info.workspace.entries,
                    info.workspace.data_bytes,
                    info.state.as_str(),
                );
                let mut r = CallToolResult::structured(json!({
                    "session": id,
                    "forked_from": p.session,
                    "state": info.state.as_str(),
                    "snapshot_bytes": info.bytes,
                    "workspace": info.workspace,
                }));
                r.content = vec![ContentBlock::text(text)];
                Ok(r)
            }
            Err(e) => Ok(tool_error(e.to_string())),
        }
    }
}
