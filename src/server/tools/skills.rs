//! The skills tools: reusable code the agent saves once and imports from later programs
//! (`from skills import <name>`, `import * as s from "/skills/<name>/skill.ts"`). Each
//! client has its own skills, plus the operator's read-only shared set
//! (`crate::skills::ClientSkills`); the store validates names and sizes and writes
//! atomically; a save is compiled in a throw-away sandbox first (`skill_check`); saves
//! and deletes, also refused ones, are audited.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, ErrorData as McpError, RoleServer};
use serde::Deserialize;

use crate::server::tools::skill_check::CheckFor;
use crate::server::{tool_error, CodeboxServer};
use crate::skills::{ClientSkills, NewSkill, SkillLanguage};

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
    pub code: String,
    /// Markdown notes.
    pub usage: Option<String>,
}

/// Arguments of `list_skills`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSkillsParams {
    /// Words that must all match.
    pub query: Option<String>,
}

/// Arguments of `get_skill` and `delete_skill`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillNameParams {
    pub name: String,
}

impl CodeboxServer {
    /// Runs `f` on the skills of the calling client; a missing store or a store error is
    /// a tool error the model can read.
    fn with_skills(
        &self,
        f: impl FnOnce(&ClientSkills) -> Result<CallToolResult, crate::skills::Error>,
    ) -> Result<CallToolResult, McpError> {
        match &self.state.skills {
            Some(skills) => {
                Ok(self.for_model(f(skills).unwrap_or_else(|e| tool_error(e.to_string()))))
            }
            None => Ok(tool_error(self.skills_unavailable())),
        }
    }

    /// What `list_skills` lists for `client`, as `codebox.list_skills()` gets it.
    pub(in crate::server) fn skills_value(
        &self,
        client: &str,
        query: Option<&str>,
    ) -> Result<serde_json::Value, String> {
        let Some(skills) = &self.state.skills else {
            return Err(self.skills_unavailable());
        };
        let list = skills.list(client, query).map_err(|e| e.to_string())?;
        Ok(serde_json::json!({ "skills": list }))
    }

    fn skills_unavailable(&self) -> String {
        self.state
            .skills_error
            .clone()
            .unwrap_or_else(|| "skills are unavailable".into())
    }

    /// `save_skill` once its arguments hold real values: cheap checks, the syntax check,
    /// the save, and an audit record whatever the outcome.
    /// For `client`, asked by the tool or by running code (`asker`).
    pub(in crate::server) async fn save_checked(
        &self,
        p: SaveSkillParams,
        client: &str,
        ct: tokio_util::sync::CancellationToken,
        asker: CheckFor,
    ) -> CallToolResult {
        let Some(skills) = &self.state.skills else {
            return tool_error(self.skills_unavailable());
        };
        let client = client.to_string();
        let refuse = |e: crate::skills::Error, language: Option<&str>| {
            self.audit_skill(
                &client,
                "save",
                &p.name,
                language,
                Some(&p.code),
                outcome_of(&e),
            );
            tool_error(e.to_string())
        };
        let language: SkillLanguage = match p.language.parse() {
            Ok(l) => l,
            Err(e) => return refuse(e, None),
        };
        let lang = Some(language.as_str());
        // A save the audit log cannot record is refused, as an execution would be.
        if let Some(why) = self.audit_refusal() {
            return tool_error(why);
        }
        // Cheap refusals first: a shared name, a bad name, sizes.
        if let Err(e) = skills
            .check_writable(&client, &p.name, "replace")
            .and_then(|()| {
                crate::skills::SkillStore::check_new(
                    &p.name,
                    &p.description,
                    &p.code,
                    p.usage.as_deref(),
                )
            })
        {
            return refuse(e, lang);
        }
        match self
            .check_skill_syntax(&client, &p.name, language, &p.code, ct, asker)
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(message)) => {
                let e = crate::skills::Error::Syntax {
                    name: p.name.clone(),
                    language,
                    message,
                };
                return refuse(e, lang);
            }
            Err(why) => {
                self.audit_skill(&client, "save", &p.name, lang, Some(&p.code), "error");
                return tool_error(format!(
                    "skill {:?} was not saved: its syntax could not be checked: {why}; retry",
                    p.name
                ));
            }
        }
        // Writing fsyncs and may copy the shared skills into the client's view: off the
        // async workers.
        let new = NewSkill {
            name: p.name.clone(),
            description: p.description.clone(),
            language,
            code: p.code.clone(),
            usage: p.usage.clone(),
        };
        let (state, owner) = (self.state.clone(), client.clone());
        let saved = tokio::task::spawn_blocking(move || match &state.skills {
            Some(skills) => skills.save(&owner, new),
            None => Err(crate::skills::Error::Invalid {
                field: "store",
                why: "skills are unavailable".into(),
            }),
        })
        .await;
        let skill = match saved {
            Ok(Ok(skill)) => skill,
            Ok(Err(e)) => return refuse(e, lang),
            Err(e) => {
                tracing::error!(error = %e, "saving a skill panicked");
                self.audit_skill(&client, "save", &p.name, lang, Some(&p.code), "error");
                return tool_error(format!("skill {:?} was not saved: internal error", p.name));
            }
        };
        self.audit_skill(&client, "save", &skill.name, lang, Some(&p.code), "ok");
        let mut r = CallToolResult::structured(serde_json::json!({
            "name": skill.name,
            "language": skill.language,
            "import": skill.import,
        }));
        r.content = vec![ContentBlock::text(format!(
            "saved skill {}; import it with: {}",
            skill.name, skill.import
        ))];
        r
    }
}

/// The audit outcome of a skills error.
fn outcome_of(e: &crate::skills::Error) -> &'static str {
    use crate::skills::Error;
    match e {
        Error::ReadOnly { .. } => "read_only",
        Error::NotFound { .. } | Error::NoSuchFile { .. } => "not_found",
        Error::Io { .. } | Error::Corrupt { .. } => "error",
        _ => "invalid",
    }
}

#[tool_router(router = skills_router, vis = "pub(in crate::server)")]
impl CodeboxServer {
    #[tool(
        name = "save_skill",
        description = "Save code as your skill (replacing yours of that name) for later \
                       programs to import; syntax-checked."
    )]
    async fn save_skill(
        &self,
        Parameters(p): Parameters<SaveSkillParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        // The model may hold tokens of values it saw tokenized: the skill gets the values.
        let p = SaveSkillParams {
            description: self.pii_restored(&p.description),
            code: self.pii_restored(&p.code),
            usage: p.usage.as_deref().map(|u| self.pii_restored(u)),
            ..p
        };
        let client = self.client_of(&ctx);
        let result = self
            .save_checked(p, &client, ctx.ct.clone(), CheckFor::Tool)
            .await;
        Ok(self.for_model(result))
    }

    #[tool(
        name = "list_skills",
        description = "Your skills and the shared ones, without code."
    )]
    async fn list_skills(
        &self,
        Parameters(p): Parameters<ListSkillsParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let client = self.client_of(&ctx);
        self.with_skills(|skills| {
            let list = skills.list(&client, p.query.as_deref())?;
            let mut text = String::new();
            for s in &list {
                text.push_str(&format!(
                    "{} ({}, {}): {}\n",
                    s.summary.name, s.summary.language, s.origin, s.summary.description
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
        description = "One skill: code, usage, import line."
    )]
    async fn get_skill(
        &self,
        Parameters(p): Parameters<SkillNameParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let client = self.client_of(&ctx);
        self.with_skills(|skills| {
            let (skill, origin) = skills.get(&client, &p.name)?;
            let mut value = serde_json::to_value(&skill).unwrap_or_default();
            value["origin"] = serde_json::json!(origin);
            Ok(CallToolResult::structured(value))
        })
    }

    #[tool(name = "delete_skill", description = "Delete one of your skills.")]
    async fn delete_skill(
        &self,
        Parameters(p): Parameters<SkillNameParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let client = self.client_of(&ctx);
        if let Some(why) = self.audit_refusal() {
            return Ok(tool_error(why));
        }
        self.with_skills(|skills| {
            let language = skills
                .get(&client, &p.name)
                .ok()
                .map(|(s, _)| s.language.as_str());
            match skills.delete(&client, &p.name) {
                Ok(()) => {
                    self.audit_skill(&client, "delete", &p.name, language, None, "ok");
                    Ok(CallToolResult::success(vec![ContentBlock::text(format!(
                        "deleted skill {}",
                        p.name
                    ))]))
                }
                Err(e) => {
                    self.audit_skill(&client, "delete", &p.name, language, None, outcome_of(&e));
                    Err(e)
                }
            }
        })
    }
}
