//! The catalog: every tool of every connected upstream, under the names code sees.
//!
//! An upstream tool `read_text_file` of server `filesystem` is exposed as
//! `filesystem__read_text_file`. Server and tool names are sanitised to identifiers
//! (`[A-Za-z0-9_]`, not starting with a digit) where needed; `server_ident` and
//! `tool_ident` are those identifiers, `name` is `<server_ident>__<tool_ident>`, and
//! `server` / `tool` keep the upstream's own spelling for the call.

use serde::Serialize;

/// One upstream tool.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CatalogTool {
    /// The name code calls: `<server_ident>__<tool_ident>`, unique in the catalog.
    pub name: String,
    /// The server's name as configured in `.mcp.json`.
    pub server: String,
    /// The tool's name as the upstream spells it.
    pub tool: String,
    /// `server` as an identifier (Python module, TypeScript directory).
    pub server_ident: String,
    /// `tool` as an identifier (Python function, TypeScript file).
    pub tool_ident: String,
    pub title: Option<String>,
    pub description: Option<String>,
    /// The tool's `inputSchema` (a JSON Schema object).
    pub input_schema: serde_json::Value,
    /// The tool's `outputSchema`, when it declares one.
    pub output_schema: Option<serde_json::Value>,
    /// The tool's `annotations` (hints the upstream gives about itself: read-only,
    /// destructive, ...), kept for the approval gates (`crate::approval`).
    #[serde(skip)]
    pub annotations: Option<rmcp::model::ToolAnnotations>,
}

impl CatalogTool {
    /// Whether the upstream annotates the tool `destructiveHint: true` (and not
    /// `readOnlyHint: true`, under which the spec says the destructive hint is
    /// meaningless). Only an explicit `true` counts.
    pub fn destructive(&self) -> bool {
        self.annotations
            .as_ref()
            .is_some_and(|a| a.destructive_hint == Some(true) && a.read_only_hint != Some(true))
    }
}

/// A configured server, whatever its state: code finds a module for each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CatalogServer {
    /// As configured in `.mcp.json`.
    pub name: String,
    /// The prefix of its tools' exposed names, its module's name.
    pub ident: String,
}

/// A consistent snapshot of all tools; `version` grows whenever any server's list changes.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Catalog {
    pub version: u64,
    pub tools: Vec<CatalogTool>,
    /// Every configured server, in configuration order (those without known tools too).
    pub servers: Vec<CatalogServer>,
}

impl Catalog {
    pub fn get(&self, name: &str) -> Option<&CatalogTool> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// The configured server whose tools `name` would be (`<server_ident>__...`), known
    /// tools or not.
    pub fn server_of(&self, name: &str) -> Option<&CatalogServer> {
        let (ident, _) = super::naming::split(name)?;
        self.servers.iter().find(|s| s.ident == ident)
    }
}

/// A server's `tools/list` as catalog entries: `server` as configured, `server_ident` its
/// identifier. A name listed twice keeps its first entry (logged); every tool gets an
/// identifier of its own ([`super::naming::tool_idents`]).
pub fn tools_of(
    server: &str,
    server_ident: &str,
    mut tools: Vec<rmcp::model::Tool>,
) -> Vec<CatalogTool> {
    use super::naming;
    let mut seen = std::collections::HashSet::new();
    tools.retain(|t| {
        let fresh = seen.insert(t.name.to_string());
        if !fresh {
            tracing::warn!(server = %server, tool = %t.name, "duplicate tool name in tools/list; keeping the first");
        }
        fresh
    });
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    let idents = naming::tool_idents(&names);
    tools
        .iter()
        .zip(idents)
        .map(|(tool, tool_ident)| CatalogTool {
            name: naming::exposed(server_ident, &tool_ident),
            server: server.to_string(),
            tool: tool.name.to_string(),
            server_ident: server_ident.to_string(),
            tool_ident,
            title: tool.title.clone(),
            description: tool.description.as_ref().map(|d| d.to_string()),
            input_schema: serde_json::Value::Object((*tool.input_schema).clone()),
            output_schema: tool
                .output_schema
                .as_ref()
                .map(|o| serde_json::Value::Object((**o).clone())),
            annotations: tool.annotations.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(annotations: Option<serde_json::Value>) -> CatalogTool {
        CatalogTool {
            name: "db__drop".into(),
            server: "db".into(),
            tool: "drop".into(),
            server_ident: "db".into(),
            tool_ident: "drop".into(),
            title: None,
            description: None,
            input_schema: serde_json::json!({"type": "object"}),
            output_schema: None,
            annotations: annotations.map(|a| serde_json::from_value(a).unwrap()),
        }
    }

    #[test]
    fn only_an_explicit_destructive_hint_counts() {
        use serde_json::json;
        assert!(tool(Some(json!({"destructiveHint": true}))).destructive());
        assert!(!tool(None).destructive());
        assert!(!tool(Some(json!({}))).destructive());
        assert!(!tool(Some(json!({"destructiveHint": false}))).destructive());
        assert!(!tool(Some(json!({"destructiveHint": true, "readOnlyHint": true}))).destructive());
    }
}
