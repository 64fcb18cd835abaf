//! `resources/list` and `resources/read`: the wrappers (`resources.rs`), kept output,
//! output files and codebox's own resources (`extra_resources.rs`), each the caller's.

use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};

use crate::server::tools::extra_resources;
use crate::server::tools::resources;
use crate::server::CodeboxServer;

impl CodeboxServer {
    /// Why a kept output's URI cannot be read here: another replica ran the execution
    /// (see [`crate::replica`]). The answer names both, for any caller, as for sessions.
    fn kept_elsewhere(&self, uri: &str) -> Option<String> {
        use crate::replica::{elsewhere_message, placement, Placement};
        let here = self.replica()?;
        let id = crate::output::kept::execution_id(uri)?;
        match placement(Some(here), id) {
            Placement::Elsewhere { owner } => {
                tracing::info!(owner, "a read of another replica's kept output");
                let shown = crate::server::transport::framing::bounded(id).to_string();
                Some(elsewhere_message("execution", &shown, owner, here))
            }
            _ => None,
        }
    }

    /// Everything the caller may read.
    pub(in crate::server) fn resources_of(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> rmcp::model::ListResourcesResult {
        let mut items = match self.wrapper_dir() {
            Some(dir) => resources::list(dir.path()),
            None => Vec::new(),
        };
        let client = self.client_of(context);
        items.extend(self.kept_resources(&client));
        items.extend(self.extra_resources(&client));
        rmcp::model::ListResourcesResult::with_all_items(items)
    }

    /// One read by the caller.
    pub(in crate::server) fn read_resource_for(
        &self,
        uri: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, McpError> {
        let client = self.client_of(context);
        if let Some(why) = self.kept_elsewhere(uri) {
            return Err(resources::not_found(why, uri));
        }
        if let Some(read) = self.state.kept_outputs.read(&client, uri) {
            return match read {
                // The page count is in the listing and in the error past the last page.
                Ok((text, _pages)) => Ok(rmcp::model::ReadResourceResult::new(vec![
                    rmcp::model::ResourceContents::text(text, uri.to_string())
                        .with_mime_type("text/plain"),
                ])
                .into()),
                Err(why) => Err(resources::not_found(why, uri)),
            };
        }
        if let Some(read) = self.read_out_file(uri, &client) {
            return read;
        }
        if let Some(read) = self.read_extra_resource(uri, &client) {
            return match read {
                Ok(extra_resources::ResourceBody::Text(text)) => {
                    Ok(rmcp::model::ReadResourceResult::new(vec![
                        rmcp::model::ResourceContents::text(text, uri.to_string()),
                    ])
                    .into())
                }
                // The page count is in the error past the last page.
                Ok(extra_resources::ResourceBody::Blob { base64 }) => {
                    Ok(rmcp::model::ReadResourceResult::new(vec![
                        rmcp::model::ResourceContents::blob(base64, uri.to_string())
                            .with_mime_type("application/octet-stream"),
                    ])
                    .into())
                }
                Err(why) => Err(resources::not_found(why, uri)),
            };
        }
        let dir = self.wrapper_dir();
        let text = match &dir {
            Some(dir) => resources::read(dir.path(), uri),
            None => Err(format!("unknown resource {:?}: no upstream tools", uri)),
        };
        match text {
            Ok(text) => {
                Ok(
                    rmcp::model::ReadResourceResult::new(vec![
                        rmcp::model::ResourceContents::text(text, uri.to_string())
                            .with_mime_type("text/x-typescript"),
                    ])
                    .into(),
                )
            }
            Err(why) => Err(resources::not_found(why, uri)),
        }
    }
}
