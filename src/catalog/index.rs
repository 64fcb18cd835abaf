//! [`SearchIndex`]: one BM25 document per tool, built once per catalog version.
//!
//! A tool's document has six BM25F fields: its upstream name (weight 3), title (2),
//! server name (1), description (1), parameter names (1) and parameter descriptions and
//! string enum values (0.5); parameters are the input schema's properties plus those of
//! nested objects and array items, two levels down.
//!
//! A tool's summary (first sentence, one-line TypeScript and Python signatures) and its full
//! definition are rendered when first returned and kept, so building stays proportional
//! to the text indexed and a repeated page costs only the scoring.

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

use serde_json::Value;

use crate::catalog::bm25::{Bm25, Builder, Field, B};
use crate::catalog::cursor::{query_hash, Cursor};
use crate::catalog::tokenize::{self, for_each_term};
use crate::catalog::{render, Detail, Result, SearchError, SearchPage, SearchQuery, MAX_LIMIT};
use crate::codegen::{tool_names, ToolNames};
use crate::upstream::catalog::{Catalog, CatalogTool};

/// The fields of a tool's document, by index: name, title, server, description,
/// parameter names, parameter details.
const FIELDS: &[Field] = &[
    Field { weight: 3.0, b: B },
    Field { weight: 2.0, b: B },
    Field { weight: 1.0, b: B },
    Field { weight: 1.0, b: B },
    Field { weight: 1.0, b: B },
    Field { weight: 0.5, b: B },
];
const NAME: usize = 0;
const TITLE: usize = 1;
const SERVER: usize = 2;
const DESCRIPTION: usize = 3;
const PARAM_NAME: usize = 4;
const PARAM_DETAIL: usize = 5;

/// How deep parameters are followed into nested objects and array items.
const PARAM_DEPTH: usize = 2;

struct Entry {
    tool: CatalogTool,
    names: ToolNames,
    server: u32,
    /// Position in name order: the tie-break between equal scores.
    rank: u32,
    summary: OnceLock<Value>,
    full: OnceLock<Value>,
}

/// The search index of one catalog version.
pub struct SearchIndex {
    version: u64,
    entries: Vec<Entry>,
    bm25: Bm25,
    /// Entry numbers sorted by tool name.
    by_name: Vec<u32>,
    by_tool_name: HashMap<String, u32>,
    /// Server name (as configured) → number.
    servers: BTreeMap<String, u32>,
}

impl std::fmt::Debug for SearchIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SearchIndex")
            .field("version", &self.version)
            .field("tools", &self.entries.len())
            .field("servers", &self.servers.len())
            .finish_non_exhaustive()
    }
}

/// Adds the document of one tool to `builder`.
fn index_tool(builder: &mut Builder<'_>, tool: &CatalogTool) {
    builder.document();
    let mut add = |text: &str, field: usize| for_each_term(text, |t| builder.add(field, t));
    add(&tool.tool, NAME);
    if let Some(title) = &tool.title {
        add(title, TITLE);
    }
    add(&tool.server, SERVER);
    if let Some(description) = &tool.description {
        add(description, DESCRIPTION);
    }
    parameters(&tool.input_schema, 0, &mut add);
}

/// The parameters of an object schema: names, descriptions, string enum values, and the
/// same for nested objects and array items up to [`PARAM_DEPTH`].
fn parameters(schema: &Value, depth: usize, add: &mut impl FnMut(&str, usize)) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, sub) in props {
        add(name, PARAM_NAME);
        if let Some(d) = sub.get("description").and_then(Value::as_str) {
            add(d, PARAM_DETAIL);
        }
        let values = sub.get("enum").and_then(Value::as_array);
        for v in values.into_iter().flatten().filter_map(Value::as_str) {
            add(v, PARAM_DETAIL);
        }
        if depth < PARAM_DEPTH {
            parameters(sub, depth + 1, add);
            if let Some(items) = sub.get("items") {
                parameters(items, depth + 1, add);
            }
        }
    }
}

impl SearchIndex {
    /// Indexes every tool of `catalog` (a copy is kept for the definitions).
    pub fn build(catalog: &Catalog) -> SearchIndex {
        let mut names = tool_names(catalog);
        let mut servers = BTreeMap::new();
        let mut entries = Vec::with_capacity(catalog.tools.len());
        for tool in &catalog.tools {
            let next = servers.len() as u32;
            let server = *servers.entry(tool.server.clone()).or_insert(next);
            let names = names.remove(&tool.name).unwrap_or_else(|| {
                // Two tools of one name: the catalog promises it never happens; the second
                // gets names of its own rather than none.
                let single = Catalog {
                    version: catalog.version,
                    tools: vec![tool.clone()],
                    ..Default::default()
                };
                tool_names(&single).remove(&tool.name).expect("named")
            });
            entries.push(Entry {
                tool: tool.clone(),
                names,
                server,
                rank: 0,
                summary: OnceLock::new(),
                full: OnceLock::new(),
            });
        }
        let mut by_name: Vec<u32> = (0..entries.len() as u32).collect();
        by_name.sort_by(|&a, &b| {
            entries[a as usize]
                .tool
                .name
                .cmp(&entries[b as usize].tool.name)
        });
        for (rank, &e) in by_name.iter().enumerate() {
            entries[e as usize].rank = rank as u32;
        }
        let mut by_tool_name = HashMap::with_capacity(entries.len());
        for (i, e) in entries.iter().enumerate() {
            by_tool_name.entry(e.tool.name.clone()).or_insert(i as u32);
        }
        let mut builder = Builder::new(FIELDS);
        for e in &entries {
            index_tool(&mut builder, &e.tool);
        }
        let bm25 = builder.finish();
        SearchIndex {
            version: catalog.version,
            entries,
            bm25,
            by_name,
            by_tool_name,
            servers,
        }
    }

    /// The catalog version the index was built from.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// One page of the tools matching `q` among those `allowed` lets through.
    pub fn search(&self, q: &SearchQuery, allowed: &dyn Fn(&str) -> bool) -> Result<SearchPage> {
        if !(1..=MAX_LIMIT).contains(&q.limit) {
            return Err(SearchError::BadLimit(q.limit));
        }
        let server = match &q.server {
            None => None,
            Some(name) => {
                Some(
                    *self
                        .servers
                        .get(name)
                        .ok_or_else(|| SearchError::UnknownServer {
                            server: name.clone(),
                            known: self.servers.keys().cloned().collect(),
                        })?,
                )
            }
        };
        let terms = tokenize::terms(&q.text);
        let hash = query_hash(
            terms
                .iter()
                .map(String::as_str)
                .chain(["\0server", q.server.as_deref().unwrap_or("\0all")]),
        );
        let offset = match &q.cursor {
            None => 0,
            Some(c) => Cursor::decode(c)?.offset_for(self.version, hash)?,
        };

        let keep = |doc: u32| {
            let e = &self.entries[doc as usize];
            server.is_none_or(|s| e.server == s) && allowed(&e.tool.name)
        };
        let mut found: Vec<(u32, f32)> = if terms.is_empty() {
            self.by_name
                .iter()
                .filter(|&&d| keep(d))
                .map(|&d| (d, 0.0))
                .collect()
        } else {
            let mut m = self.bm25.matches(&terms);
            m.retain(|&(d, _)| keep(d));
            m
        };
        let total = found.len();
        if offset > 0 && offset >= total {
            return Err(SearchError::BadCursor("it points past the last result"));
        }
        let end = (offset + q.limit).min(total);
        let order = |a: &(u32, f32), b: &(u32, f32)| {
            let rank = |d: u32| self.entries[d as usize].rank;
            b.1.total_cmp(&a.1).then(rank(a.0).cmp(&rank(b.0)))
        };
        if !terms.is_empty() {
            if end < total {
                found.select_nth_unstable_by(end, order);
            }
            found[..end].sort_unstable_by(order);
        }
        let tools = found[offset..end]
            .iter()
            .map(|&(d, _)| self.render(d, q.detail))
            .collect();
        let next_cursor = (end < total).then(|| {
            Cursor {
                version: self.version,
                offset: end as u64,
                query: hash,
            }
            .encode()
        });
        Ok(SearchPage {
            tools,
            next_cursor,
            total,
        })
    }

    fn full(&self, doc: u32) -> &Value {
        let e = &self.entries[doc as usize];
        e.full.get_or_init(|| render::full(&e.tool, &e.names))
    }

    fn render(&self, doc: u32, detail: Detail) -> Value {
        let e = &self.entries[doc as usize];
        match detail {
            Detail::Name => render::name(&e.tool),
            Detail::Summary => e
                .summary
                .get_or_init(|| render::summary(&e.tool, &e.names))
                .clone(),
            Detail::Full => self.full(doc).clone(),
        }
    }

    /// The full definition of the tool called `name` with an example call, if it exists.
    pub fn get(&self, name: &str) -> Option<Value> {
        let &doc = self.by_tool_name.get(name)?;
        let e = &self.entries[doc as usize];
        Some(render::with_example(
            self.full(doc).clone(),
            &e.tool,
            &e.names,
        ))
    }
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
