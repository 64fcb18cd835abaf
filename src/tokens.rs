//! Token accounting: how much of a model's context a list of tool definitions takes.
//!
//! A client connected to every upstream MCP server puts every upstream tool definition
//! into the model's context; connected to codebox it gets codebox's handful of tools
//! instead. This module measures both sides with a real BPE tokenizer: OpenAI's
//! `o200k_base` (GPT-4o and later), from `tiktoken-rs`, whose vocabulary is compiled into
//! the binary, so counting works offline. Other models' tokenizers give other numbers, but
//! of the same order: the ratio between the two sides is what matters.
//!
//! What is counted is the JSON a client receives as the `tools` array of a `tools/list`
//! result, serialised compactly (no whitespace), as rmcp and the reference SDKs put it on
//! the wire. Object keys come out in `serde_json`'s order (sorted), not necessarily the
//! server's; the same keys and values in another order give the same count to within a
//! token or so per object.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::upstream::{Catalog, CatalogTool};

/// Tokens of `text` in `o200k_base`. Special-token syntax such as `<|endoftext|>` counts as
/// the ordinary text it is: a tool description cannot end the model's input.
pub fn count(text: &str) -> usize {
    // Built once on first use (parsing the 200k-entry vocabulary takes a while), then
    // shared; the vocabulary is embedded in the binary, nothing is downloaded.
    tiktoken_rs::o200k_base_singleton()
        .encode_ordinary(text)
        .len()
}

/// Tokens of `tools` as the `tools` array of one `tools/list` result, compact JSON.
pub fn tools_list_tokens(tools: &[Value]) -> usize {
    // Serialising a `Value` cannot fail: its map keys are strings.
    count(&serde_json::to_string(tools).expect("a JSON value serialises"))
}

/// An upstream tool as its own server lists it: `name` is the upstream's spelling (not
/// codebox's `<server>__<tool>`), then `title`, `description`, `inputSchema` and
/// `outputSchema` where present. The catalog does not keep annotations, icons or `_meta`,
/// so those are not counted: the figures for upstream servers are a lower bound.
pub fn tools_list_entry(tool: &CatalogTool) -> Value {
    let mut entry = serde_json::Map::new();
    entry.insert("name".into(), tool.tool.clone().into());
    if let Some(title) = &tool.title {
        entry.insert("title".into(), title.clone().into());
    }
    if let Some(description) = &tool.description {
        entry.insert("description".into(), description.clone().into());
    }
    entry.insert("inputSchema".into(), tool.input_schema.clone());
    if let Some(output) = &tool.output_schema {
        entry.insert("outputSchema".into(), output.clone());
    }
    Value::Object(entry)
}

/// One upstream server's share of a catalog.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ServerTokens {
    /// The server's name as configured in `.mcp.json`.
    pub server: String,
    pub tools: usize,
    /// Tokens of the server's own `tools/list`.
    pub tokens: usize,
}

/// The catalog split by server (sorted by name), each server's tools counted as the
/// `tools/list` that server sends.
pub fn per_server(catalog: &Catalog) -> Vec<ServerTokens> {
    let mut servers: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    for tool in &catalog.tools {
        servers
            .entry(tool.server.as_str())
            .or_default()
            .push(tools_list_entry(tool));
    }
    servers
        .into_iter()
        .map(|(server, tools)| ServerTokens {
            server: server.to_string(),
            tools: tools.len(),
            tokens: tools_list_tokens(&tools),
        })
        .collect()
}

/// Tokens a client connected to every server of the catalog directly would load: the sum
/// of each server's `tools/list` (see [`per_server`]).
pub fn catalog_tokens(catalog: &Catalog) -> usize {
    per_server(catalog).iter().map(|s| s.tokens).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Counts from OpenAI's `tiktoken` 0.14 (`encode_ordinary`, with its o200k_base file
    /// checked against tiktoken's pinned SHA-256) and from the npm `tiktoken` 1.0.22 WASM
    /// build; both agree on every one.
    #[test]
    fn counts_match_the_reference_tokenizer() {
        for (text, expected) in [
            ("", 0),
            ("hello world", 2),
            ("Hello, world!", 4),
            ("The quick brown fox jumps over the lazy dog.", 10),
            (
                r#"{"name":"read_text_file","description":"Read a file"}"#,
                13,
            ),
            ("naïve café 東京", 5),
            ("<|endoftext|>", 7),
        ] {
            assert_eq!(count(text), expected, "{text:?}");
        }
    }

    #[test]
    fn a_tools_list_is_counted_as_compact_json() {
        let tools = [json!({"name": "a", "inputSchema": {"type": "object"}})];
        assert_eq!(
            tools_list_tokens(&tools),
            count(r#"[{"inputSchema":{"type":"object"},"name":"a"}]"#)
        );
        assert_eq!(tools_list_tokens(&[]), count("[]"));
    }

    fn tool(server: &str, name: &str, description: Option<&str>) -> CatalogTool {
        CatalogTool {
            name: format!("{server}__{}", name.replace('-', "_")),
            server: server.into(),
            tool: name.into(),
            server_ident: server.into(),
            tool_ident: name.replace('-', "_"),
            title: None,
            description: description.map(String::from),
            input_schema: json!({"type": "object", "properties": {"a": {"type": "number"}}}),
            output_schema: None,
            annotations: None,
        }
    }

    #[test]
    fn an_entry_is_what_the_upstream_itself_lists() {
        let mut t = tool("everything", "get-sum", Some("Adds two numbers"));
        assert_eq!(
            tools_list_entry(&t),
            json!({"name": "get-sum", "description": "Adds two numbers",
                   "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}}}})
        );
        t.description = None;
        t.title = Some("Sum".into());
        t.output_schema = Some(json!({"type": "object"}));
        assert_eq!(
            tools_list_entry(&t),
            json!({"name": "get-sum", "title": "Sum",
                   "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}}},
                   "outputSchema": {"type": "object"}})
        );
    }

    #[test]
    fn a_catalog_is_counted_server_by_server() {
        let catalog = Catalog {
            version: 1,
            tools: vec![
                tool("time", "now", Some("The time")),
                tool("files", "read", Some("Reads a file")),
                tool("time", "convert", None),
            ],
            ..Default::default()
        };
        let servers = per_server(&catalog);
        let time = [
            tools_list_entry(&catalog.tools[0]),
            tools_list_entry(&catalog.tools[2]),
        ];
        let files = [tools_list_entry(&catalog.tools[1])];
        assert_eq!(
            servers,
            vec![
                ServerTokens {
                    server: "files".into(),
                    tools: 1,
                    tokens: tools_list_tokens(&files),
                },
                ServerTokens {
                    server: "time".into(),
                    tools: 2,
                    tokens: tools_list_tokens(&time),
                },
            ]
        );
        assert_eq!(
            catalog_tokens(&catalog),
            tools_list_tokens(&files) + tools_list_tokens(&time)
        );
        assert_eq!(catalog_tokens(&Catalog::default()), 0);
    }
}
