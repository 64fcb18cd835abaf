//! The Python side of `/servers`: the package `servers` and one module per server with a
//! function per tool.
//!
//! ```python
//! def read_text_file(path: str, *, head: float | None = None, tail: float | None = None) -> Any:
//!     """Read the complete contents of a file ..."""
//!     _args = {"path": path}
//!     if head is not None:
//!         _args["head"] = head
//!     ...
//!     return _codebox.call_tool("filesystem__read_text_file", _args)
//! ```
//!
//! Parameters are named after the schema's properties (sanitised, with the original JSON
//! key used in the arguments). The required ones come first, positional-or-keyword, in
//! the order of the schema's `required` list (the one order a schema keeps: JSON objects,
//! and so `properties`, have none), then a required name no property declares, where the
//! list has it; the optional ones follow `*`, keyword-only and sorted by key, default to
//! `None` and are left out of the call when `None`. So `read_text_file("/a")` and
//! `read_text_file(path="/a")` both work, and leaving a required argument out is
//! Python's own `TypeError` naming it. Names are chosen over the keys in sorted order,
//! so a name never depends on where its key stands in `required`. `aio.<function>` is
//! each function as a coroutine, taking the same arguments.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use serde_json::Value;

use crate::codegen::escape::{normalize_newlines, py_docstring, py_string};
use crate::codegen::names::{allocate, py_ident, Namer};
use crate::codegen::schema::{
    canonical, description, effective_types, literal_values, properties, reference, required,
    resolve, subschemas, MAX_DEPTH,
};
use crate::upstream::catalog::CatalogTool;

/// Module-level names of a server module that tool functions must not take.
pub const MODULE_RESERVED: &[&str] = &["_codebox", "Any", "Literal", "annotations", "aio", "_Aio"];

/// Names the function body uses, which parameters must not shadow.
const BODY_NAMES: &[&str] = &["_codebox", "_args"];

/// Lines longer than this put one parameter per line.
const LINE: usize = 88;

/// One parameter of a tool function: positional-or-keyword when required, else
/// keyword-only.
#[derive(Debug, PartialEq)]
pub struct Param {
    /// The Python name.
    pub name: String,
    /// The JSON key it is sent as.
    pub key: String,
    /// The union members of its type hint (`["str", "None"]`).
    pub hint: Vec<String>,
    pub required: bool,
    pub doc: String,
}

/// A type hint as the members of a union (`["str", "None"]`); `["Any"]` is anything.
type Hint = Vec<String>;

fn any() -> Hint {
    vec!["Any".to_string()]
}

fn one(member: impl Into<String>) -> Hint {
    vec![member.into()]
}

/// The union of hints: flattened, deduplicated, `None` last; `Any` absorbs everything.
fn union(hints: Vec<Hint>) -> Hint {
    let mut kept: Vec<String> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    for m in hints.into_iter().flatten() {
        if m == "Any" {
            return any();
        }
        if seen.insert(m.clone()) {
            kept.push(m);
        }
    }
    if let Some(none) = kept.iter().position(|k| k == "None") {
        let none = kept.remove(none);
        kept.push(none);
    }
    if kept.is_empty() {
        any()
    } else {
        kept
    }
}

/// A `Literal[...]` (with `| None` for null) when every value can be one, else `Any`.
fn literal_hint(values: &[&Value]) -> Hint {
    let mut items = Vec::new();
    let mut null = false;
    for v in values {
        match v {
            Value::Null => null = true,
            Value::Bool(b) => items.push(if *b { "True" } else { "False" }.to_string()),
            Value::String(s) => items.push(py_string(s)),
            Value::Number(n) if n.is_i64() || n.is_u64() => items.push(n.to_string()),
            _ => return any(),
        }
    }
    let mut members = Vec::new();
    if !items.is_empty() {
        members.push(format!("Literal[{}]", items.join(", ")));
    }
    if null {
        members.push("None".into());
    }
    union(vec![members])
}

/// How many schema nodes the hints of one tool's parameters may visit together: `$ref`s
/// are expanded inline, so a schema whose definitions fan out could otherwise take
/// exponential time, and every parameter naming such a definition would start again.
const HINT_NODE_BUDGET: usize = 10_000;

/// Computes type hints for the schemas of one document, within one budget for them all.
struct Hinter<'a> {
    document: &'a Value,
    /// The `$ref` targets being expanded, to stop at cycles.
    visiting: Vec<String>,
    nodes_left: usize,
    /// Each `enum`/`const` node's hint, by the node's address in `document`: escaping a
    /// long literal is the dear part of a visit, and `$ref`s reach one node many times.
    literals: HashMap<*const Value, Hint>,
}

impl<'a> Hinter<'a> {
    fn new(document: &'a Value) -> Hinter<'a> {
        Hinter {
            document,
            visiting: Vec::new(),
            nodes_left: HINT_NODE_BUDGET,
            literals: HashMap::new(),
        }
    }

    fn hint(&mut self, schema: &Value, depth: usize) -> Hint {
        if depth > MAX_DEPTH || self.nodes_left == 0 || !schema.is_object() {
            return any();
        }
        self.nodes_left -= 1;
        if let Some(r) = reference(schema) {
            return self.reference(r, depth);
        }
        if let Some(values) = literal_values(schema) {
            return self
                .literals
                .entry(std::ptr::from_ref(schema))
                .or_insert_with(|| literal_hint(&values))
                .clone();
        }
        let types = effective_types(schema);
        if !types.is_empty() {
            let members = types
                .iter()
                .map(|t| self.of_type(t, schema, depth))
                .collect();
            return union(members);
        }
        let alternatives: Vec<&Value> = ["anyOf", "oneOf"]
            .iter()
            .flat_map(|k| subschemas(schema, k))
            .collect();
        if !alternatives.is_empty() {
            let members = alternatives
                .iter()
                .map(|s| self.hint(s, depth + 1))
                .collect();
            return union(members);
        }
        match subschemas(schema, "allOf") {
            [only] => self.hint(only, depth + 1),
            _ => any(),
        }
    }

    fn reference(&mut self, r: &str, depth: usize) -> Hint {
        let (Some(pointer), Some(target)) = (canonical(r), resolve(self.document, r)) else {
            return any();
        };
        if self.visiting.contains(&pointer) {
            return any();
        }
        self.visiting.push(pointer);
        let hint = self.hint(target, depth + 1);
        self.visiting.pop();
        hint
    }

    fn of_type(&mut self, t: &str, schema: &Value, depth: usize) -> Hint {
        match t {
            "string" => one("str"),
            "integer" => one("int"),
            "number" => one("float"),
            "boolean" => one("bool"),
            "null" => one("None"),
            "array" => match schema.get("items") {
                Some(items @ Value::Object(_)) if schema.get("prefixItems").is_none() => {
                    one(format!("list[{}]", self.hint(items, depth + 1).join(" | ")))
                }
                _ => one("list[Any]"),
            },
            "object" => match schema.get("additionalProperties") {
                Some(extra @ Value::Object(_)) if schema.get("properties").is_none() => one(
                    format!("dict[str, {}]", self.hint(extra, depth + 1).join(" | ")),
                ),
                _ => one("dict[str, Any]"),
            },
            _ => any(),
        }
    }
}

/// The parameters of a tool: the required ones in the order of `required`, then the
/// optional ones sorted by JSON key. Names and hints are worked out over the keys in
/// sorted order, so neither depends on that order.
pub fn params(input_schema: &Value) -> Vec<Param> {
    // Maps, not scans: a schema may list thousands of properties and required names.
    let props: HashMap<&str, &Value> = properties(input_schema).into_iter().collect();
    let required_order = required(input_schema);
    let required: HashMap<&str, usize> = required_order
        .iter()
        .enumerate()
        .map(|(i, r)| (*r, i))
        .collect();
    let mut keys: Vec<&str> = props.keys().copied().collect();
    keys.extend(required_order.iter().filter(|r| !props.contains_key(*r)));
    keys.sort();
    let mut namer = Namer::new("_", BODY_NAMES);
    let names = allocate(&mut namer, &keys, |k| py_ident(k, true));
    let mut hinter = Hinter::new(input_schema);
    let mut params: Vec<Param> = keys
        .iter()
        .zip(names)
        .map(|(key, name)| {
            let schema = props.get(key).copied();
            let mut doc = schema.and_then(description).unwrap_or_default().to_string();
            if let Some(default) = schema.and_then(|s| s.get("default")) {
                doc = format!("{doc} (default: {default})")
                    .trim_start()
                    .to_string();
            }
            if name != *key {
                doc = format!("{doc} (sent as {})", py_string(key))
                    .trim_start()
                    .to_string();
            }
            Param {
                hint: schema.map_or_else(any, |s| hinter.hint(s, 0)),
                required: required.contains_key(key),
                key: key.to_string(),
                name,
                doc,
            }
        })
        .collect();
    // Stable: the optional ones keep their sorted order.
    params.sort_by_key(|p| required.get(p.key.as_str()).copied().unwrap_or(usize::MAX));
    params
}

/// Each parameter as written in the signature: `path: str`, `head: float | None = None`.
fn rendered_params(params: &[Param]) -> Vec<String> {
    params
        .iter()
        .map(|p| {
            let h = p.hint.join(" | ");
            if p.required {
                format!("{}: {h}", p.name)
            } else if p.hint.iter().any(|m| m == "Any" || m == "None") {
                format!("{}: {h} = None", p.name)
            } else {
                format!("{}: {h} | None = None", p.name)
            }
        })
        .collect()
}

/// The parameter list: required parameters, then `*` and the optional ones.
fn parameter_list(params: &[Param]) -> Vec<String> {
    let rendered = rendered_params(params);
    let required = params.iter().take_while(|p| p.required).count();
    let mut out = rendered[..required].to_vec();
    if required < rendered.len() {
        out.push("*".to_string());
        out.extend_from_slice(&rendered[required..]);
    }
    out
}

/// The function's signature line(s), `def ...:` included.
pub fn signature(function: &str, params: &[Param]) -> String {
    let list = parameter_list(params);
    let one_line = format!("def {function}({}) -> Any:", list.join(", "));
    if one_line.len() <= LINE || list.is_empty() {
        return one_line;
    }
    let mut out = format!("def {function}(\n");
    for r in list {
        let _ = writeln!(out, "    {r},");
    }
    out.push_str(") -> Any:");
    out
}

/// The signature of `tool`'s function on one line, without the colon, for summaries:
/// `def read_text_file(path: str, *, head: float | None = None) -> Any`.
pub fn def_line(tool: &CatalogTool, function: &str) -> String {
    let list = parameter_list(&params(&tool.input_schema));
    format!("def {function}({}) -> Any", list.join(", "))
}

fn docstring(tool: &CatalogTool, params: &[Param]) -> String {
    let mut text = String::new();
    if let Some(title) = tool
        .title
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        let _ = write!(text, "{title}\n\n");
    }
    if let Some(d) = tool
        .description
        .as_deref()
        .map(str::trim)
        .filter(|d| !d.is_empty())
    {
        let _ = write!(text, "{d}\n\n");
    }
    if !params.is_empty() {
        text.push_str("Args:\n");
        for p in params {
            let optional = if p.required { "" } else { ", optional" };
            let doc = normalize_newlines(&p.doc).replace('\n', "\n        ");
            let _ = writeln!(
                text,
                "    {} ({}{optional}): {doc}",
                p.name,
                p.hint.join(" | ")
            );
        }
        text.push('\n');
    }
    let _ = write!(
        text,
        "Calls the tool {:?} of the MCP server {:?}.",
        tool.tool, tool.server
    );
    py_docstring(&text, "    ")
}

/// One tool function.
pub fn function(tool: &CatalogTool, name: &str) -> String {
    let params = params(&tool.input_schema);
    let mut out = signature(name, &params);
    let _ = write!(out, "\n    {}\n", docstring(tool, &params));
    let required: Vec<String> = params
        .iter()
        .filter(|p| p.required)
        .map(|p| format!("{}: {}", py_string(&p.key), p.name))
        .collect();
    let _ = writeln!(out, "    _args = {{{}}}", required.join(", "));
    for p in params.iter().filter(|p| !p.required) {
        let _ = writeln!(out, "    if {} is not None:", p.name);
        let _ = writeln!(out, "        _args[{}] = {}", py_string(&p.key), p.name);
    }
    let _ = writeln!(
        out,
        "    return _codebox.call_tool({}, _args)",
        py_string(&tool.name)
    );
    out
}

/// The first line of a description, shortened for a summary.
fn summary(text: Option<&str>) -> String {
    let text = normalize_newlines(text.unwrap_or_default());
    let line = text.trim().lines().next().unwrap_or_default();
    let mut short: String = line.chars().take(100).collect();
    if short.len() < line.len() {
        short.push_str("...");
    }
    short
}

/// `servers/<module>/__init__.py`: the functions of one server, `(tool, function name)`.
pub fn server_module(server: &str, tools: &[(&CatalogTool, String)]) -> String {
    let mut doc =
        format!("Tools of the MCP server {server:?}, generated by codebox.\n\nFunctions:\n");
    for (tool, name) in tools {
        let _ = writeln!(doc, "    {name}: {}", summary(tool.description.as_deref()));
    }
    let mut out = format!(
        "{}\n\nfrom __future__ import annotations\n\nfrom typing import Any, Literal\n\n\
         import codebox as _codebox\n\n__all__ = [\n",
        py_docstring(&doc, "")
    );
    for (_, name) in tools {
        let _ = writeln!(out, "    {},", py_string(name));
    }
    out.push_str("]\n");
    for (tool, name) in tools {
        let _ = write!(out, "\n\n{}", function(tool, name));
    }
    out.push_str(ASYNC_FORMS);
    out
}

/// The end of every server module: `aio.<function>(...)`, each function as a coroutine
/// (run on codebox's worker threads, so `asyncio.gather` fans out).
const ASYNC_FORMS: &str = r#"


class _Aio:
    """The functions of this module as coroutines taking the same arguments:
    `await aio.<function>(...)`, so `asyncio.gather(aio.a(...), aio.b(...))` runs the
    calls at once."""

    def __getattr__(self, name):
        function = globals().get(name) if name in __all__ else None
        if function is None:
            raise AttributeError(name)

        async def call(*args, **kwargs):
            return await _codebox.to_thread(function, *args, **kwargs)

        call.__name__ = name
        call.__doc__ = function.__doc__
        call.__wrapped__ = function
        return call

    def __dir__(self):
        return list(__all__)


aio = _Aio()
"#;

/// `servers/<module>/__init__.py` of a server whose tools were not known when the tree
/// was made (it was connecting, or failed): any name imported from it is a function that
/// calls the tool of that name, so the call reaches the server (waiting a bounded time
/// while it connects) or raises `ToolError` saying the server's state.
pub fn unknown_server_module(server: &str, ident: &str) -> String {
    let doc = format!(
        "Tools of the MCP server {server:?}, generated by codebox.\n\n\
         Its tools were not known when this sandbox started: the server was still \
         connecting, or it failed to start (codebox.health() and list_servers say which). \
         A function imported from here calls the server's tool of that name and raises \
         ToolError with the server's state when it cannot answer."
    );
    format!(
        "{}\n\nimport codebox as _codebox\n\n__all__ = []\n_PREFIX = {}\n{UNKNOWN_SERVER_BODY}",
        py_docstring(&doc, ""),
        py_string(&format!("{ident}__")),
    )
}

const UNKNOWN_SERVER_BODY: &str = r#"

def _tool(name):
    def call(*args, **arguments):
        if args:
            raise TypeError(
                "%s() takes keyword arguments only: the server's tools were not known when "
                "this sandbox started, so the order of their parameters is not either" % name
            )
        return _codebox.call_tool(_PREFIX + name, arguments)

    call.__name__ = name
    call.__doc__ = "Calls the tool " + repr(name) + " of this server (its schema was not known)."
    return call


class _Aio:
    """The functions of this module as coroutines: `await aio.<function>(...)`."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        function = _tool(name)

        async def call(*args, **kwargs):
            return await _codebox.to_thread(function, *args, **kwargs)

        call.__name__ = name
        return call


aio = _Aio()


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _tool(name)
"#;

/// `servers/__init__.py`: lists the servers as `(module, server name, tool count)`.
pub fn package_init(servers: &[(String, String, usize)]) -> String {
    let mut doc = String::from(
        "Typed functions for the tools of the upstream MCP servers, generated by codebox.\n\n\
         Import a server's module and call its tools: required arguments by position or \
         by name, optional ones by name:\n\n    \
         from servers.filesystem import read_text_file\n    \
         read_text_file(\"/data/a.txt\", head=10)\n\nServers:\n",
    );
    for (module, server, count) in servers {
        let _ = writeln!(
            doc,
            "    {module}: {count} tools of the MCP server {server:?}"
        );
    }
    let mut out = format!("{}\n\n__all__ = [\n", py_docstring(&doc, ""));
    for (module, _, _) in servers {
        let _ = writeln!(out, "    {},", py_string(module));
    }
    out.push_str("]\n");
    out
}

#[cfg(test)]
#[path = "python_tests.rs"]
mod tests;
