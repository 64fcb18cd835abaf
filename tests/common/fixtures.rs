//! A catalog built from the tool lists of real MCP servers, captured in
//! `tests/fixtures/tools/<server>.json` by `tests/fixtures/tools/refresh.py`.

use std::path::Path;

use codebox::upstream::catalog::{Catalog, CatalogTool};
use serde_json::Value;

/// The servers with a captured tool list.
pub const FIXTURE_SERVERS: &[&str] = &["filesystem", "memory", "everything", "time"];

/// `[A-Za-z0-9_]`, other characters as `_`, not starting with a digit.
pub fn ident(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// One `tools/list` entry of `server` as a catalog tool named `<server>__<tool>`.
pub fn catalog_tool(server: &str, tool: &Value) -> CatalogTool {
    let name = tool["name"].as_str().expect("tool name");
    let text = |k: &str| tool.get(k).and_then(Value::as_str).map(String::from);
    CatalogTool {
        name: format!("{}__{}", ident(server), ident(name)),
        server: server.into(),
        tool: name.into(),
        server_ident: ident(server),
        tool_ident: ident(name),
        title: text("title"),
        description: text("description"),
        input_schema: tool["inputSchema"].clone(),
        output_schema: tool.get("outputSchema").cloned(),
        annotations: tool
            .get("annotations")
            .and_then(|a| serde_json::from_value(a.clone()).ok()),
    }
}

/// The captured `tools` array of `server`.
pub fn fixture_tools(server: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tools")
        .join(format!("{server}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let list: Vec<Value> = serde_json::from_str(&text).expect("fixture is a tools array");
    assert!(!list.is_empty(), "{server}: no tools in the fixture");
    list
}

/// Every fixture server's tools, as catalog `version`.
pub fn fixture_catalog(version: u64) -> Catalog {
    let tools = FIXTURE_SERVERS
        .iter()
        .flat_map(|server| {
            fixture_tools(server)
                .iter()
                .map(|t| catalog_tool(server, t))
                .collect::<Vec<_>>()
        })
        .collect();
    Catalog {
        version,
        tools,
        ..Default::default()
    }
}
