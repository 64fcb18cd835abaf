//! The `/servers` tree generated from upstream tool lists
//! (`codebox::upstream::catalog::tools_of` then `codebox::codegen::render_tree`): tool
//! names, titles, descriptions and JSON schemas come from upstream servers, which may
//! be hostile, and end up in TypeScript and Python that sandboxed code imports.
//!
//! Input: structured (`arbitrary`): servers with tools whose names, descriptions and
//! schemas (types, enums, defaults, nesting, `$ref` cycles, odd property names) are
//! arbitrary, biased towards what ends strings and comments.
//!
//! Properties:
//! - every generated `.ts` file parses as TypeScript (oxc) and every `.py` file as
//!   Python (RustPython's parser), without a single diagnostic;
//! - no upstream text or name breaks out of its string or comment. The tree is generated
//!   again from a plain catalog, and each file must lex into the same code: the same
//!   tokens, with words and string literals as one class, comments dropped. In the plain
//!   catalog every piece of free text (descriptions, titles, enum and default values,
//!   patterns) is a placeholder (equal texts by equal placeholders, in the same order,
//!   blank ones kept), and every character of a name (servers, tools, properties) that is
//!   not `[A-Za-z0-9_$]` is `-` (which leaves every identifier derived from it as it
//!   was) whenever that keeps the names distinct and in the same order. Text that escaped
//!   a literal or a comment adds tokens, which a placeholder or a plain name cannot. (One
//!   plain catalog for both, not one each: a render is most of an execution);
//! - rendering holds at most a fixed multiple of the catalog's size.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use arbitrary::{Arbitrary, Unstructured};
use codebox::upstream::catalog::{tools_of, Catalog, CatalogServer};
use codebox::upstream::naming;
use serde_json::{Map, Value};

use codebox_fuzz_oracles::{python_shape, ts_shape, Piece};

use crate::budget;

mod schema_gen;

/// One upstream server and its `tools/list`.
#[derive(Debug)]
struct ServerIn {
    name: String,
    tools: Vec<ToolIn>,
}

#[derive(Debug)]
struct ToolIn {
    name: String,
    title: Option<String>,
    description: Option<String>,
    input_schema: Map<String, Value>,
    output_schema: Option<Map<String, Value>>,
}

impl<'a> Arbitrary<'a> for ToolIn {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(ToolIn {
            name: schema_gen::text(u)?,
            title: Option::<()>::arbitrary(u)?
                .map(|()| schema_gen::text(u))
                .transpose()?,
            description: Option::<()>::arbitrary(u)?
                .map(|()| schema_gen::text(u))
                .transpose()?,
            input_schema: schema_gen::object_schema(u, 0)?,
            output_schema: Option::<()>::arbitrary(u)?
                .map(|()| schema_gen::object_schema(u, 0))
                .transpose()?,
        })
    }
}

impl<'a> Arbitrary<'a> for ServerIn {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let name = schema_gen::text(u)?;
        let count = u.int_in_range(0..=3)?;
        let tools = (0..count)
            .map(|_| ToolIn::arbitrary(u))
            .collect::<arbitrary::Result<_>>()?;
        Ok(ServerIn { name, tools })
    }
}

pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(count) = u.int_in_range(1..=2u8) else {
        return;
    };
    let Ok(servers) = (0..count)
        .map(|_| ServerIn::arbitrary(&mut u))
        .collect::<arbitrary::Result<Vec<_>>>()
    else {
        return;
    };
    let same = |s: &str| s.to_string();
    let Some(catalog) = catalog_of(&servers, &same, &same) else {
        return;
    };
    let size = serde_json::to_vec(&catalog).map_or(0, |v| v.len());
    let (tree, peak) = budget::peak_during(|| codebox::codegen::render_tree(&catalog));
    let tree = tree.unwrap_or_else(|e| panic!("a catalog from tools_of did not render: {e}"));
    budget::assert_within("render_tree", peak, size, 64, 1 << 20);
    let shapes = shapes_of(&tree, true);

    // One plain catalog: free text as placeholders, and names with their odd characters
    // as `-` when that keeps them apart and in order (else names as they are). Text or a
    // name that escaped its literal or comment changes the code's tokens; a placeholder or
    // a plain name cannot.
    let (names, texts) = (
        std::cell::RefCell::new(BTreeSet::new()),
        std::cell::RefCell::new(BTreeSet::new()),
    );
    let collect = |into: &std::cell::RefCell<BTreeSet<String>>, s: &str| {
        into.borrow_mut().insert(s.to_string());
        s.to_string()
    };
    strings_of(&servers, &|s| collect(&names, s), &|s| collect(&texts, s));
    let placeholders = Placeholders::new(texts.into_inner());
    let text = |s: &str| placeholders.get(s);
    let names: Vec<String> = names.into_inner().into_iter().collect();
    let plain: Vec<String> = names.iter().map(|n| plain_name(n)).collect();
    let names_plain = plain != names && plain.windows(2).all(|w| w[0] < w[1]);
    let (what, plain) = match names_plain
        .then(|| catalog_of(&servers, &|s| plain_name(s), &text))
        .flatten()
    {
        Some(plain) => ("free text or names", plain),
        None => (
            "free text",
            catalog_of(&servers, &same, &text).expect("the same names"),
        ),
    };
    let plain = codebox::codegen::render_tree(&plain).expect("renders");
    compare(what, &tree, &shapes, &plain);
}

/// `name` with every character outside `[A-Za-z0-9_$]` as `-`.
fn plain_name(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '$' => c,
            _ => '-',
        })
        .collect()
}

/// Panics unless `other` has the files of `tree` and each lexes into the same shape.
fn compare(
    what: &str,
    tree: &BTreeMap<PathBuf, String>,
    shapes: &BTreeMap<PathBuf, Vec<Piece>>,
    other: &BTreeMap<PathBuf, String>,
) {
    assert!(
        tree.keys().eq(other.keys()),
        "{what}: other files were generated"
    );
    for (path, shape) in shapes {
        // A file the placeholders did not change lexes the same.
        if tree[path] == other[path] {
            continue;
        }
        let plain = &shape_of(path, &other[path], false);
        if shape != plain {
            let at = shape.iter().zip(plain).take_while(|(a, b)| a == b).count();
            let (ours, theirs) = (describe(path, &tree[path]), describe(path, &other[path]));
            panic!(
                "upstream {what} changed the code of {} (broke out of a literal or comment?) \
                 at token {at}: {:?} where the plain catalog has {:?}\n--- generated:\n{}\n--- plain:\n{}",
                path.display(),
                &ours[at.min(ours.len())..(at + 8).min(ours.len())],
                &theirs[at.min(theirs.len())..(at + 8).min(theirs.len())],
                tree[path],
                other[path],
            );
        }
    }
}

/// The catalog of `servers`, their names (servers, tools, properties) passed through
/// `name` and their free text (titles, descriptions, schema strings) through `text`;
/// `None` when two servers share a name (a config's keys cannot).
fn catalog_of(
    servers: &[ServerIn],
    name: &dyn Fn(&str) -> String,
    text: &dyn Fn(&str) -> String,
) -> Option<Catalog> {
    let names: Vec<String> = servers.iter().map(|s| name(&s.name)).collect();
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    if sorted.len() != names.len() {
        return None;
    }
    // The config's order: sorted by name.
    let mut order: Vec<usize> = (0..servers.len()).collect();
    order.sort_by(|&a, &b| names[a].cmp(&names[b]));
    let ordered: Vec<&str> = order.iter().map(|&i| names[i].as_str()).collect();
    let idents = naming::server_idents(&ordered);
    let mut catalog = Catalog {
        version: 1,
        ..Default::default()
    };
    for (&i, ident) in order.iter().zip(idents) {
        let tools = servers[i]
            .tools
            .iter()
            .map(|t| {
                let mut tool = rmcp::model::Tool::new(
                    name(&t.name),
                    String::new(),
                    Arc::new(schema_gen::map_strings(&t.input_schema, name, text)),
                );
                tool.description = t.description.as_deref().map(|d| text(d).into());
                tool.title = t.title.as_deref().map(text);
                tool.output_schema = t
                    .output_schema
                    .as_ref()
                    .map(|o| Arc::new(schema_gen::map_strings(o, name, text)));
                tool
            })
            .collect();
        catalog.tools.extend(tools_of(&names[i], &ident, tools));
        catalog.servers.push(CatalogServer {
            name: names[i].clone(),
            ident,
        });
    }
    Some(catalog)
}

/// Every name and piece of free text of `servers`, each passed to `name` or `text`: the
/// strings [`catalog_of`] maps, without building a catalog.
fn strings_of(servers: &[ServerIn], name: &dyn Fn(&str) -> String, text: &dyn Fn(&str) -> String) {
    for server in servers {
        name(&server.name);
        for tool in &server.tools {
            name(&tool.name);
            tool.title.as_deref().map(text);
            tool.description.as_deref().map(text);
            schema_gen::map_strings(&tool.input_schema, name, text);
            if let Some(output) = &tool.output_schema {
                schema_gen::map_strings(output, name, text);
            }
        }
    }
}

/// Upstream strings to plain placeholders: equal strings to equal placeholders, in the
/// same order (properties, tools and enum values are sorted), blank strings kept
/// (whether a text is blank decides whether it is shown at all).
struct Placeholders(BTreeMap<String, String>);

impl Placeholders {
    fn new(strings: std::collections::BTreeSet<String>) -> Placeholders {
        let mut rank = 0;
        let map = strings
            .into_iter()
            .map(|s| {
                let p = match s.trim().is_empty() {
                    true => s.clone(),
                    false => {
                        rank += 1;
                        format!("p{rank:05}")
                    }
                };
                (s, p)
            })
            .collect();
        Placeholders(map)
    }

    fn get(&self, s: &str) -> String {
        self.0.get(s).cloned().unwrap_or_else(|| s.to_string())
    }
}

/// The shape of every generated file but the fixed `client.ts`; parses each first when
/// `parse` is set.
fn shapes_of(tree: &BTreeMap<PathBuf, String>, parse: bool) -> BTreeMap<PathBuf, Vec<Piece>> {
    tree.iter()
        .filter(|(path, _)| path.as_os_str() != "client.ts")
        .map(|(path, text)| (path.clone(), shape_of(path, text, parse)))
        .collect()
}

/// The shape of one generated file (see [`ts_shape`], [`python_shape`]).
fn shape_of(path: &std::path::Path, text: &str, parse: bool) -> Vec<Piece> {
    let name = path.to_string_lossy();
    match language(&name) {
        Language::TypeScript => ts_shape::shape(&name, text, parse),
        Language::Python => python_shape::shape(&name, text, parse),
    }
}

/// The tokens of one generated file's shape, named (for a failure's message).
fn describe(path: &std::path::Path, text: &str) -> Vec<String> {
    match language(&path.to_string_lossy()) {
        Language::TypeScript => ts_shape::describe(text),
        Language::Python => python_shape::describe(text),
    }
}

enum Language {
    TypeScript,
    Python,
}

fn language(name: &str) -> Language {
    if name.ends_with(".ts") {
        Language::TypeScript
    } else if name.ends_with(".py") {
        Language::Python
    } else {
        panic!("a generated file that is neither TypeScript nor Python: {name}");
    }
}
