//! The book's configuration reference, rendered from the configuration types.
//!
//! Every key of `codebox.toml` is a field of [`super::Config`] or of a section type below
//! it, and each derives `schemars::JsonSchema`: its doc comment is the key's description.
//! [`markdown`] renders that schema as the reference page (`docs/src/reference/
//! configuration.md`); a test fails when the committed page differs (`cargo xtask docs`
//! writes it again) or when a key has no description, so a key cannot be documented wrong
//! or left out.

use serde_json::{Map, Value};

/// Where the book keeps the rendered page, from the repository's root.
pub const PAGE: &str = "docs/src/reference/configuration.md";

/// One table of keys: its TOML header (`None`: the top level) and its keys.
struct Table {
    header: Option<String>,
    description: String,
    keys: Vec<Key>,
}

struct Key {
    name: String,
    kind: String,
    description: String,
}

/// The reference page.
pub fn markdown() -> String {
    let schema =
        serde_json::to_value(schemars::schema_for!(super::Config)).expect("a schema is JSON");
    let defs = schema["$defs"].as_object().cloned().unwrap_or_default();
    let mut tables = Vec::new();
    collect(&schema, None, String::new(), &defs, &mut tables);
    let mut out = String::from(
        "# Configuration reference\n\n\
         <!-- Generated from the configuration types (src/config/reference.rs) by `cargo xtask \
         docs`; a test fails when it is out of date. Edit the types' doc comments, not this \
         page. -->\n\n\
         Every key of `codebox.toml`, table by table. Where the file is looked for, the \
         `CODEBOX_*` environment overrides and `env:VAR` secrets: [Configuration]\
         (../configuration.md). Unknown keys are an error naming the key; a key left out \
         takes the default its description gives.\n",
    );
    for t in &tables {
        let title = match &t.header {
            None => "Top level".to_string(),
            Some(h) => format!("`{h}`"),
        };
        out.push_str(&format!("\n## {title}\n\n"));
        if !t.description.is_empty() {
            out.push_str(&one_line(&t.description));
            out.push_str("\n\n");
        }
        out.push_str("| key | type | what |\n|---|---|---|\n");
        for k in &t.keys {
            out.push_str(&format!(
                "| `{}` | {} | {} |\n",
                k.name,
                k.kind,
                cell(&k.description)
            ));
        }
    }
    out
}

/// Keys without a description, as `table.key`.
pub fn undescribed() -> Vec<String> {
    let schema =
        serde_json::to_value(schemars::schema_for!(super::Config)).expect("a schema is JSON");
    let defs = schema["$defs"].as_object().cloned().unwrap_or_default();
    let mut tables = Vec::new();
    collect(&schema, None, String::new(), &defs, &mut tables);
    tables
        .iter()
        .flat_map(|t| {
            t.keys
                .iter()
                .filter(|k| k.description.trim().is_empty())
                .map(|k| {
                    format!(
                        "{}{}",
                        t.header
                            .as_deref()
                            .map_or(String::new(), |h| format!("{h} ")),
                        k.name
                    )
                })
        })
        .collect()
}

/// Adds the table of `schema`'s properties, then the tables nested in it.
fn collect(
    schema: &Value,
    header: Option<String>,
    description: String,
    defs: &Map<String, Value>,
    tables: &mut Vec<Table>,
) {
    let Some(props) = schema["properties"].as_object() else {
        return;
    };
    let mut keys = Vec::new();
    let mut nested = Vec::new();
    let path = |name: &str| match &header {
        Some(h) => format!("{}.{name}", h.trim_matches(|c| c == '[' || c == ']')),
        None => name.to_string(),
    };
    for (name, prop) in props {
        let described = prop["description"].as_str().unwrap_or_default().to_string();
        match table_of(prop, defs) {
            Some((table, array)) => {
                let h = if array {
                    format!("[[{}]]", path(name))
                } else {
                    format!("[{}]", path(name))
                };
                keys.push(Key {
                    name: name.clone(),
                    kind: format!("table: see `{h}`"),
                    description: described.clone(),
                });
                nested.push((table, h, described));
            }
            None => keys.push(Key {
                name: name.clone(),
                kind: kind_of(prop, defs),
                description: described,
            }),
        }
    }
    tables.push(Table {
        header,
        description,
        keys,
    });
    for (table, h, described) in nested {
        let own = table["description"].as_str().unwrap_or_default();
        let description = if described.is_empty() {
            own.to_string()
        } else {
            described
        };
        collect(&table, Some(h), description, defs, tables);
    }
}

/// The definition `prop` refers to, if it is a table (an object with properties) or an
/// array of tables (`true`).
fn table_of(prop: &Value, defs: &Map<String, Value>) -> Option<(Value, bool)> {
    let target = resolve(prop, defs);
    if target["properties"].is_object() {
        return Some((target, false));
    }
    let items = resolve(&target["items"], defs);
    if target["type"] == "array" && items["properties"].is_object() {
        return Some((items, true));
    }
    None
}

/// `prop` with a `$ref` (direct, or the one non-null member of an `anyOf`) replaced by
/// its definition.
fn resolve(prop: &Value, defs: &Map<String, Value>) -> Value {
    if let Some(r) = prop["$ref"].as_str() {
        let name = r.rsplit('/').next().unwrap_or(r);
        return defs.get(name).cloned().unwrap_or(Value::Null);
    }
    if let Some(any) = prop["anyOf"].as_array() {
        let real: Vec<&Value> = any.iter().filter(|m| m["type"] != "null").collect();
        if real.len() == 1 {
            return resolve(real[0], defs);
        }
    }
    prop.clone()
}

/// The key's type in words: `string`, `integer`, `boolean`, `list of string`, the values
/// of an enumeration, `map of string to string`.
fn kind_of(prop: &Value, defs: &Map<String, Value>) -> String {
    let p = resolve(prop, defs);
    let values: Vec<String> = enum_values(&p);
    if !values.is_empty() {
        return values.join(" \\| ");
    }
    let ty = match &p["type"] {
        Value::String(t) => t.clone(),
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("any")
            .to_string(),
        _ => "any".to_string(),
    };
    match ty.as_str() {
        "array" => format!("list of {}", kind_of(&p["items"], defs)),
        "object" => match &p["additionalProperties"] {
            Value::Object(_) => format!(
                "map of string to {}",
                kind_of(&p["additionalProperties"], defs)
            ),
            _ => "table".to_string(),
        },
        "integer" if p["minimum"].as_f64() == Some(0.0) => "integer ≥ 0".to_string(),
        other => other.to_string(),
    }
}

/// The allowed values of an enumeration (`enum`, or `oneOf` of `const`s), quoted.
fn enum_values(p: &Value) -> Vec<String> {
    let quote = |v: &Value| match v {
        Value::String(s) => format!("`\"{s}\"`"),
        other => format!("`{other}`"),
    };
    if let Some(values) = p["enum"].as_array() {
        return values.iter().filter(|v| !v.is_null()).map(quote).collect();
    }
    if let Some(one_of) = p["oneOf"].as_array() {
        let consts: Vec<String> = one_of
            .iter()
            .filter_map(|m| {
                m.get("const").map(quote).or_else(|| {
                    m["enum"]
                        .as_array()
                        .map(|e| e.iter().map(quote).collect::<Vec<_>>().join(" \\| "))
                })
            })
            .collect();
        if consts.len() == one_of.len() {
            return consts;
        }
    }
    Vec::new()
}

/// A description on one line (paragraphs kept apart with a space).
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A description as a table cell: one line, `|` escaped.
fn cell(s: &str) -> String {
    one_line(s).replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(PAGE)
    }

    /// `CODEBOX_UPDATE_DOCS=1` (what `cargo xtask docs` sets) writes the page instead.
    #[test]
    fn the_books_configuration_reference_is_current() {
        let rendered = markdown();
        if std::env::var_os("CODEBOX_UPDATE_DOCS").is_some() {
            std::fs::write(page(), &rendered).unwrap();
            return;
        }
        let committed = std::fs::read_to_string(page()).unwrap_or_default();
        assert!(
            committed == rendered,
            "{} is not what the configuration types say: run `cargo xtask docs`",
            PAGE
        );
    }

    #[test]
    fn every_key_is_described() {
        let missing = undescribed();
        assert!(
            missing.is_empty(),
            "keys without a doc comment (their description in the book): {missing:?}"
        );
    }

    #[test]
    fn tables_nest_and_enumerations_list_their_values() {
        let md = markdown();
        for header in [
            "## `[http]`",
            "## `[network]`",
            "## `[[network.credentials]]`",
            "## `[packages]`",
        ] {
            assert!(md.contains(header), "{header} missing");
        }
        assert!(
            md.contains("`\"none\"` \\| `\"loopback\"` \\| `\"proxy\"`"),
            "network modes"
        );
    }
}
