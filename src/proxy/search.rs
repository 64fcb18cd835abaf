//! `tools/search` and `tools/get` over the catalog, at three levels of detail.
//!
//! Matching is by words: the query is split into lowercase words, and a tool scores for
//! each word found in its name (twice) or description. Only tools the execution may call
//! are searched. (The discovery issue replaces the scoring; the shape stays.)

use serde_json::{json, Value};

use crate::upstream::catalog::{Catalog, CatalogTool};

/// Results returned when the query does not say.
pub const DEFAULT_LIMIT: usize = 10;
/// Most results one query may ask for.
pub const MAX_LIMIT: usize = 100;

/// How much of each tool to return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// The name only.
    Name,
    /// Name, server and description.
    Summary,
    /// Everything, including the input and output schemas.
    Full,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub words: Vec<String>,
    pub detail: Detail,
    pub limit: usize,
}

impl Query {
    /// From `tools/search` params `{query, detail?, limit?}`; the error is for the caller.
    pub fn from_params(params: &Value) -> Result<Query, String> {
        let text = params
            .get("query")
            .and_then(Value::as_str)
            .ok_or("tools/search needs a string \"query\"")?;
        let detail = match params.get("detail").and_then(Value::as_str) {
            None | Some("summary") => Detail::Summary,
            Some("name") => Detail::Name,
            Some("full") => Detail::Full,
            Some(other) => {
                return Err(format!(
                    "detail {other:?} is not one of \"name\", \"summary\", \"full\""
                ))
            }
        };
        let limit = match params.get("limit") {
            None | Some(Value::Null) => DEFAULT_LIMIT,
            Some(v) => match v.as_u64() {
                Some(n) if (1..=MAX_LIMIT as u64).contains(&n) => n as usize,
                _ => return Err(format!("limit must be an integer from 1 to {MAX_LIMIT}")),
            },
        };
        Ok(Query {
            words: words(text),
            detail,
            limit,
        })
    }
}

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// The best matches among the tools `allowed` lets through; an empty query lists them.
pub fn search(catalog: &Catalog, query: &Query, allowed: impl Fn(&str) -> bool) -> Vec<Value> {
    let mut scored: Vec<(usize, &CatalogTool)> = catalog
        .tools
        .iter()
        .filter(|t| allowed(&t.name))
        .filter_map(|t| {
            if query.words.is_empty() {
                return Some((0, t));
            }
            let name = words(&t.name).join(" ");
            let text = words(t.description.as_deref().unwrap_or("")).join(" ");
            let score: usize = query
                .words
                .iter()
                .map(|w| {
                    2 * usize::from(name.contains(w.as_str()))
                        + usize::from(text.contains(w.as_str()))
                })
                .sum();
            (score > 0).then_some((score, t))
        })
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.name.cmp(&b.1.name)));
    scored
        .into_iter()
        .take(query.limit)
        .map(|(_, t)| describe(t, query.detail))
        .collect()
}

/// One tool at the given detail.
pub fn describe(tool: &CatalogTool, detail: Detail) -> Value {
    match detail {
        Detail::Name => json!({ "name": tool.name }),
        Detail::Summary => json!({
            "name": tool.name,
            "server": tool.server,
            "description": tool.description.as_deref().map(first_paragraph),
        }),
        Detail::Full => json!({
            "name": tool.name,
            "server": tool.server,
            "tool": tool.tool,
            "title": tool.title,
            "description": tool.description,
            "input_schema": tool.input_schema,
            "output_schema": tool.output_schema,
        }),
    }
}

/// The description up to its first blank line, at most 300 characters.
fn first_paragraph(text: &str) -> String {
    let para = text.split("\n\n").next().unwrap_or("").trim();
    if para.chars().count() > 300 {
        let cut: String = para.chars().take(299).collect();
        format!("{cut}…")
    } else {
        para.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, description: &str) -> CatalogTool {
        let (server, t) = name.split_once("__").unwrap();
        CatalogTool {
            name: name.into(),
            server: server.into(),
            tool: t.into(),
            server_ident: server.into(),
            tool_ident: t.into(),
            title: None,
            description: Some(description.into()),
            input_schema: json!({"type": "object"}),
            output_schema: None,
        }
    }

    fn catalog() -> Catalog {
        Catalog {
            version: 1,
            tools: vec![
                tool(
                    "filesystem__read_text_file",
                    "Read a file as text.\n\nMore detail.",
                ),
                tool(
                    "filesystem__list_directory",
                    "List the entries of a directory.",
                ),
                tool("memory__read_graph", "Read the whole knowledge graph."),
                tool("time__get_current_time", "The current time in a time zone."),
            ],
        }
    }

    fn q(params: Value) -> Query {
        Query::from_params(&params).unwrap()
    }

    #[test]
    fn name_hits_rank_above_description_hits() {
        let found = search(&catalog(), &q(json!({"query": "read file"})), |_| true);
        let names: Vec<_> = found.iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(names[0], "filesystem__read_text_file");
        assert!(names.contains(&"memory__read_graph"));
        assert!(!names.contains(&"time__get_current_time"));
        assert_eq!(found[0]["description"], "Read a file as text.");
    }

    #[test]
    fn only_allowed_tools_are_found() {
        let found = search(&catalog(), &q(json!({"query": "read"})), |n| {
            n.starts_with("memory__")
        });
        assert_eq!(found.len(), 1);
        assert_eq!(found[0]["name"], "memory__read_graph");
    }

    #[test]
    fn detail_and_limit() {
        let found = search(
            &catalog(),
            &q(json!({"query": "", "detail": "name", "limit": 2})),
            |_| true,
        );
        assert_eq!(
            found,
            vec![
                json!({"name": "filesystem__list_directory"}),
                json!({"name": "filesystem__read_text_file"})
            ]
        );
        let full = search(
            &catalog(),
            &q(json!({"query": "time", "detail": "full"})),
            |_| true,
        );
        assert_eq!(full[0]["input_schema"], json!({"type": "object"}));
    }

    #[test]
    fn bad_params_are_explained() {
        for (p, why) in [
            (json!({}), "needs a string"),
            (json!({"query": "x", "detail": "all"}), "not one of"),
            (json!({"query": "x", "limit": 0}), "limit must be"),
            (json!({"query": "x", "limit": "5"}), "limit must be"),
        ] {
            assert!(Query::from_params(&p).unwrap_err().contains(why), "{p}");
        }
    }
}
