//! One tool as code, for tool search results: the signatures of its generated wrappers
//! (rendered by the same code that writes `/servers`) and an example call in each
//! language.
//!
//! ```text
//! ts_signature_line  function readTextFile(input: { path: string; head?: number }): Promise<{ content: string }>
//! ts_declaration     export interface ReadTextFileInput { .. }  export function readTextFile(input: ReadTextFileInput): Promise<..>;
//! py_def_line        def read_text_file(path: str, *, head: float | None = None) -> Any
//! example_python     from servers.filesystem import read_text_file
//!                    read_text_file("...")
//! example_typescript import { readTextFile } from "/servers/filesystem/index.ts";
//!                    await readTextFile({ path: "..." });
//! ```
//!
//! `names` come from [`tool_names`](super::tool_names), so the names match the tree.

use serde_json::Value;

use crate::codegen::escape::{py_string, ts_string};
use crate::codegen::names::is_ts_property_ident;
use crate::codegen::schema::{
    effective_types, literal_values, properties, reference, resolve, subschemas,
};
use crate::codegen::{python, typescript, ToolNames};
use crate::upstream::catalog::CatalogTool;

/// The TypeScript function's signature on one line, types inline where short.
pub fn ts_signature_line(tool: &CatalogTool, names: &ToolNames) -> String {
    typescript::signature_line(tool, &names.ts_function, &names.ts_type_base)
}

/// The TypeScript declarations of the tool's module: its interfaces and
/// `export function f(input: X): Promise<Y>;` without a body.
pub fn ts_declaration(tool: &CatalogTool, names: &ToolNames) -> String {
    typescript::tool_declaration(tool, &names.ts_function, &names.ts_type_base)
}

/// The Python function's `def` line with type hints, on one line and without the colon.
pub fn py_def_line(tool: &CatalogTool, names: &ToolNames) -> String {
    python::def_line(tool, &names.py_function)
}

/// How many `$ref`s / alternatives a placeholder follows before giving up.
const PLACEHOLDER_DEPTH: usize = 8;

/// A value of the right type to stand in an example: strings `"..."`, numbers `0`,
/// booleans `false`, arrays `[]`, objects `{}`, an enum's first value; `null` if unknown.
fn placeholder(document: &Value, schema: &Value, depth: usize) -> Value {
    if depth > PLACEHOLDER_DEPTH {
        return Value::Null;
    }
    if let Some(target) = reference(schema).and_then(|r| resolve(document, r)) {
        return placeholder(document, target, depth + 1);
    }
    if let Some(first) = literal_values(schema).and_then(|v| v.first().copied()) {
        return first.clone();
    }
    let types = effective_types(schema);
    let chosen = types
        .iter()
        .find(|t| **t != "null")
        .or(types.first())
        .copied();
    match chosen {
        Some("string") => Value::String("...".into()),
        Some("number" | "integer") => Value::from(0),
        Some("boolean") => Value::Bool(false),
        Some("array") => Value::Array(Vec::new()),
        Some("object") => Value::Object(Default::default()),
        Some(_) => Value::Null,
        None => ["anyOf", "oneOf", "allOf"]
            .iter()
            .find_map(|k| subschemas(schema, k).first())
            .map_or(Value::Null, |s| placeholder(document, s, depth + 1)),
    }
}

/// `(JSON key, Python name, placeholder)` of each required parameter, in signature order.
fn required_args(tool: &CatalogTool) -> Vec<(String, String, Value)> {
    let props = properties(&tool.input_schema);
    python::params(&tool.input_schema)
        .into_iter()
        .filter(|p| p.required)
        .map(|p| {
            let value = props
                .iter()
                .find(|(k, _)| *k == p.key)
                .map_or(Value::Null, |(_, s)| placeholder(&tool.input_schema, s, 0));
            (p.key, p.name, value)
        })
        .collect()
}

fn py_literal(value: &Value) -> String {
    match value {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => py_string(s),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(py_literal).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", py_string(k), py_literal(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
    }
}

fn ts_key(key: &str) -> String {
    if is_ts_property_ident(key) {
        key.to_string()
    } else {
        ts_string(key)
    }
}

fn ts_literal(value: &Value) -> String {
    match value {
        Value::String(s) => ts_string(s),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(ts_literal).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) if map.is_empty() => "{}".into(),
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", ts_key(k), ts_literal(v)))
                .collect();
            format!("{{ {} }}", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// An import and a call with the required parameters, in Python: a single one by
/// position (`read_text_file("...")`), several by name, which reads better than a row of
/// placeholders.
pub fn example_python(tool: &CatalogTool, names: &ToolNames) -> String {
    let required = required_args(tool);
    let args: Vec<String> = match required.as_slice() {
        [(_, _, value)] => vec![py_literal(value)],
        _ => required
            .iter()
            .map(|(_, name, value)| format!("{name}={}", py_literal(value)))
            .collect(),
    };
    format!(
        "from servers.{} import {f}\n{f}({})",
        names.py_module,
        args.join(", "),
        f = names.py_function,
    )
}

/// An import and an awaited call with the required parameters, in TypeScript.
pub fn example_typescript(tool: &CatalogTool, names: &ToolNames) -> String {
    let args: Vec<String> = required_args(tool)
        .iter()
        .map(|(key, _, value)| format!("{}: {}", ts_key(key), ts_literal(value)))
        .collect();
    let input = if args.is_empty() {
        "{}".to_string()
    } else {
        format!("{{ {} }}", args.join(", "))
    };
    let path = ts_string(&format!("/servers/{}/index.ts", names.ts_dir));
    format!(
        "import {{ {f} }} from {path};\nawait {f}({input});",
        f = names.ts_function
    )
}

#[cfg(test)]
#[path = "describe_tests.rs"]
mod tests;
