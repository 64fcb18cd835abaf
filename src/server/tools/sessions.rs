//! The session tools besides the execute tools' `session` argument: closing one at once
//! (instead of waiting for its idle TTL) and listing the caller's own.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, ErrorData as McpError, RoleServer};
use serde::Deserialize;

use crate::server::{tool_error, CodeboxServer};

/// Arguments of `close_session`.
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
}
