//! codebox's own capabilities for sandboxed code (`crate::proxy::OwnMethod`): a skill
//! saved, the skills listed and `health` read from a running program, for the client the
//! execution belongs to — `codebox.save_skill(...)`, `codebox.list_skills()`,
//! `codebox.health()` in Python, `saveSkill`, `listSkills`, `health` in TypeScript. With
//! `tools = "minimal"` this is how a model reaches them without the tools.
//!
//! The code is untrusted, so each method is exactly its tool's path, never more:
//! - `save_skill` goes through `save_checked` as the tool does (audit gate, name and size
//!   checks of the store, the syntax check in a throw-away sandbox, the save for this
//!   client only, an audit record whatever the outcome). The proxy restored the
//!   execution's PII tokens in the params already. One save at a time per execution, and
//!   its check takes its sandbox slot from `Admission::enter_nested`, never the queue (the
//!   execution holds a slot itself; waiting behind it could wait forever);
//! - `list_skills` is what the tool lists for this client (own and shared);
//! - `health` is the `health` tool's value, which any client may read.
//!
//! Every request counts against the execution's `max_tool_calls`, and its params are
//! bounded by the proxy's message and memory limits, as for any other request.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::proxy::{OwnMethod, OwnMethods};
use crate::server::tools::skill_check::CheckFor;
use crate::server::tools::skills::SaveSkillParams;
use crate::server::CodeboxServer;

/// The own methods of one execution.
pub(in crate::server) struct FromSandbox {
    server: CodeboxServer,
    client: String,
    /// One skill save at a time per execution (each may hold a sandbox for its check).
    saving: Arc<Semaphore>,
}

/// Params of `codebox/list_skills`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    query: Option<String>,
}

impl FromSandbox {
    pub(in crate::server) fn new(server: &CodeboxServer, client: &str) -> Arc<FromSandbox> {
        Arc::new(FromSandbox {
            server: server.clone(),
            client: client.to_string(),
            saving: Arc::new(Semaphore::new(1)),
        })
    }
}

impl OwnMethods for FromSandbox {
    fn call(
        &self,
        method: OwnMethod,
        params: Value,
    ) -> Pin<Box<dyn Future<Output = Result<Value, String>> + Send + 'static>> {
        let (server, client, saving) = (
            self.server.clone(),
            self.client.clone(),
            self.saving.clone(),
        );
        Box::pin(async move {
            match method {
                OwnMethod::SaveSkill => {
                    let p: SaveSkillParams = serde_json::from_value(params)
                        .map_err(|e| format!("codebox/save_skill: invalid params: {e}"))?;
                    let _one = saving.acquire_owned().await.map_err(|_| "closed")?;
                    // Dropped with the request when the channel ends: the check's sandbox
                    // goes with it.
                    let ct = tokio_util::sync::CancellationToken::new();
                    let r = server
                        .save_checked(p, &client, ct, CheckFor::RunningCode)
                        .await;
                    result_value(r)
                }
                OwnMethod::ListSkills => {
                    let p: ListParams = serde_json::from_value(params)
                        .map_err(|e| format!("codebox/list_skills: invalid params: {e}"))?;
                    server.skills_value(&client, p.query.as_deref())
                }
                OwnMethod::Health => Ok(server.health_value()),
            }
        })
    }
}

/// A tool result as a method's answer: its structuredContent, or its text as the error.
fn result_value(r: rmcp::model::CallToolResult) -> Result<Value, String> {
    let text = || {
        r.content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    match (r.is_error, &r.structured_content) {
        (Some(true), _) => Err(text()),
        (_, Some(v)) => Ok(v.clone()),
        (_, None) => Ok(Value::String(text())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{CallToolResult, ContentBlock};

    #[test]
    fn a_tool_error_is_the_methods_error_and_structured_content_its_answer() {
        let e = result_value(CallToolResult::error(vec![ContentBlock::text("no")]));
        assert_eq!(e, Err("no".to_string()));
        let ok = result_value(CallToolResult::structured(serde_json::json!({"name": "a"})));
        assert_eq!(ok, Ok(serde_json::json!({"name": "a"})));
    }
}
