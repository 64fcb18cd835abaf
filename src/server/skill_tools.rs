//! The skills tools: reusable code the agent saves once and imports from later programs
//! (`from skills import <name>`, `import * as s from "/skills/<name>/skill.ts"`). The
//! store (`crate::skills`) validates names and sizes and writes atomically; these tools
//! turn its answers into tool results.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::{tool, tool_router, ErrorData as McpError};
use serde::Deserialize;

use super::{tool_error, CodeboxServer};
use crate::skills::{NewSkill, SkillStore};

/// Arguments of `save_skill`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SaveSkillParams {
    /// Lowercase identifier.
    pub name: String,
    /// One line.
    pub description: String,
    /// "python" or "typescript".
    pub language: String,
    /// The module to import later.
    pub code: String,
    /// Markdown usage notes.
    pub usage: Option<String>,
}

/// Arguments of `list_skills`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSkillsParams {
    /// Words that must all appear in the name or description.
    pub query: Option<String>,
}

/// Arguments of `get_skill` and `delete_skill`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillNameParams {
    pub name: String,
}

impl CodeboxServer {
    /// Runs `f` on the store; a missing store or a store error is a tool error the model
    /// can read.
    fn with_store(
        &self,
        f: impl FnOnce(&SkillStore) -> Result<CallToolResult, crate::skills::Error>,
    ) -> Result<CallToolResult, McpError> {
        let Some(store) = &self.state.skills else {
            let why = self.state.skills_error.clone();
            return Ok(tool_error(
                why.unwrap_or_else(|| "skills are unavailable".into()),
            ));
        };
        Ok(f(store).unwrap_or_else(|e| tool_error(e.to_string())))
    }
}

#[tool_router(router = skills_router, vis = "pub(super)")]
impl CodeboxServer {
    #[tool(
        name = "save_skill",
        description = "Save reusable code as a skill (replacing one of the same name) that \
                       later programs import from /skills."
    )]
    async fn save_skill(
        &self,
        Parameters(p): Parameters<SaveSkillParams>,
    ) -> Result<CallToolResult, McpError> {
        self.with_store(|store| {
            let skill = store.save(NewSkill {
                name: p.name,
                description: p.description,
                language: p.language.parse()?,
                code: p.code,
                usage: p.usage,
            })?;
            let mut r = CallToolResult::structured(serde_json::json!({
                "name": skill.name,
                "language": skill.language,
                "import": skill.import,
            }));
            r.content = vec![ContentBlock::text(format!(
                "saved skill {}; import it with: {}",
                skill.name, skill.import
            ))];
            Ok(r)
        })
    }

    #[tool(
        name = "list_skills",
        description = "The saved skills: name, description and language (no code; use \
                       get_skill for that)."
    )]
    async fn list_skills(
        &self,
        Parameters(p): Parameters<ListSkillsParams>,
    ) -> Result<CallToolResult, McpError> {
        self.with_store(|store| {
            let list = store.list(p.query.as_deref())?;
            let mut text = String::new();
            for s in &list {
                text.push_str(&format!(
                    "{} ({}): {}\n",
                    s.name,
                    s.language.as_str(),
                    s.description
                ));
            }
            if list.is_empty() {
                text.push_str("no skills match\n");
            }
            let mut r = CallToolResult::structured(serde_json::json!({ "skills": list }));
            r.content = vec![ContentBlock::text(text)];
            Ok(r)
        })
    }

    #[tool(
        name = "get_skill",
        description = "One saved skill: description, usage, code and how to import it."
    )]
    async fn get_skill(
        &self,
        Parameters(p): Parameters<SkillNameParams>,
    ) -> Result<CallToolResult, McpError> {
        self.with_store(|store| {
            let skill = store.get(&p.name)?;
            Ok(CallToolResult::structured(
                serde_json::to_value(&skill).unwrap_or_default(),
            ))
        })
    }

    #[tool(name = "delete_skill", description = "Delete a saved skill.")]
    async fn delete_skill(
        &self,
        Parameters(p): Parameters<SkillNameParams>,
    ) -> Result<CallToolResult, McpError> {
        self.with_store(|store| {
            store.delete(&p.name)?;
            Ok(CallToolResult::success(vec![ContentBlock::text(format!(
                "deleted skill {}",
                p.name
            ))]))
        })
    }
}
