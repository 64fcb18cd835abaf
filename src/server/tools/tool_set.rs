//! The `tools` setting applied to codebox's tool router: what `minimal` removes from
//! `tools/list` and the execute tools' schemas, and the answer to a hidden tool's call.
//! The setting itself is [`crate::config::tool_set`].

pub use crate::config::tool_set::{ToolSet, UnknownToolSet, MINIMAL_TOOLS};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::ErrorData as McpError;

use crate::server::CodeboxServer;

/// Execute arguments `tools = "minimal"` does not list (a call may still pass them):
/// what an operator sets for the model more often than a model asks for.
pub const MINIMAL_HIDDEN_ARGUMENTS: [&str; 3] = ["allowed_tools", "pii", "output_budget"];

/// What the minimal execute tools add to their descriptions: skills and health from code.
const PYTHON_FROM_CODE: &str =
    " From code: codebox.save_skill(name, code, description), list_skills(), health().";
const TYPESCRIPT_FROM_CODE: &str =
    " saveSkill, listSkills, health from \"/opt/codebox/deno/codebox.ts\".";

impl ToolSet {
    /// Leaves in `router` only the tools of this set, described for it.
    pub(in crate::server) fn apply(self, router: &mut ToolRouter<CodeboxServer>) {
        if self == ToolSet::Full {
            return;
        }
        router.map.retain(|name, _| self.offers(name));
        for (name, from_code) in [
            ("execute_python", PYTHON_FROM_CODE),
            ("execute_typescript", TYPESCRIPT_FROM_CODE),
        ] {
            let Some(route) = router.map.get_mut(name) else {
                continue;
            };
            let tool = &mut route.attr;
            if let Some(d) = &tool.description {
                tool.description = Some(format!("{d}{from_code}").into());
            }
            let mut schema = (*tool.input_schema).clone();
            if let Some(serde_json::Value::Object(props)) = schema.get_mut("properties") {
                for hidden in MINIMAL_HIDDEN_ARGUMENTS {
                    props.remove(hidden);
                }
            }
            tool.input_schema = std::sync::Arc::new(schema);
        }
    }
}

/// The answer to a call of one of codebox's tools that this tool set hides.
pub(in crate::server) fn hidden_tool(name: &str, set: ToolSet) -> McpError {
    McpError::invalid_params(
        format!(
            "tool {name:?} is not offered: this server runs with tools = \"{set}\" \
             (codebox.toml `tools`, CODEBOX_TOOLS, serve --tools); skills and health are \
             reachable from code (codebox.save_skill, codebox.list_skills, codebox.health) \
             and as resources"
        ),
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(set: ToolSet) -> Vec<String> {
        let mut router = CodeboxServer::all_tools();
        set.apply(&mut router);
        let mut names: Vec<String> = router
            .list_all()
            .into_iter()
            .map(|t| t.name.to_string())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_setting_parses_and_prints_as_written() {
        for set in [ToolSet::Full, ToolSet::Minimal] {
            assert_eq!(set.to_string().parse::<ToolSet>().unwrap(), set);
        }
        assert_eq!(ToolSet::default(), ToolSet::Full);
        let e = "small".parse::<ToolSet>().unwrap_err().to_string();
        assert!(e.contains("\"small\"") && e.contains("minimal"), "{e}");
    }

    #[test]
    fn minimal_offers_the_execute_tools_and_search_only() {
        assert_eq!(names(ToolSet::Minimal), MINIMAL_TOOLS.map(String::from));
        let full = names(ToolSet::Full);
        // pause_session, resume_session and fork_session: with a snapshot store only.
        assert_eq!(full.len(), 14, "{full:?}");
        let mut router = CodeboxServer::all_tools();
        crate::server::tools::sessions::without_persistence(&mut router);
        assert_eq!(router.list_all().len(), 11);
        for t in &full {
            assert!(ToolSet::Full.offers(t));
            assert_eq!(
                ToolSet::Minimal.offers(t),
                MINIMAL_TOOLS.contains(&t.as_str())
            );
        }
    }

    #[test]
    fn minimal_execute_tools_say_how_to_reach_skills_from_code() {
        let mut router = CodeboxServer::all_tools();
        ToolSet::Minimal.apply(&mut router);
        for (name, says) in [
            ("execute_python", "codebox.save_skill("),
            ("execute_typescript", "saveSkill"),
        ] {
            let t = router.get(name).unwrap();
            let d = t.description.as_deref().unwrap();
            assert!(d.contains(says) && d.contains("health"), "{d}");
            let props = t.input_schema["properties"].as_object().unwrap();
            for hidden in MINIMAL_HIDDEN_ARGUMENTS {
                assert!(!props.contains_key(hidden), "{name}: {hidden}");
            }
            assert!(props.contains_key("code") && props.contains_key("session"));
        }
    }

    #[test]
    fn a_hidden_tool_is_refused_naming_the_setting() {
        let e = hidden_tool("save_skill", ToolSet::Minimal);
        assert!(
            e.message.contains("tools = \"minimal\"") && e.message.contains("CODEBOX_TOOLS"),
            "{}",
            e.message
        );
        assert!(e.message.contains("codebox.save_skill"), "{}", e.message);
    }
}
