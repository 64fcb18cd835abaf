//! Arbitrary upstream text and JSON schemas, biased towards what breaks generated code.

use arbitrary::{Arbitrary, Unstructured};
use serde_json::{json, Map, Value};

/// Fragments that end or start literals and comments in TypeScript or Python, or that
/// some lexers take for line ends.
const NASTY: &[&str] = &[
    "\"",
    "'",
    "`",
    "\\",
    "\"\"\"",
    "'''",
    "*/",
    "/*",
    "/**",
    "//",
    "#",
    "${",
    "}",
    "{",
    "\n",
    "\r",
    "\r\n",
    "\u{2028}",
    "\u{2029}",
    "\u{85}",
    "\u{b}",
    "\u{c}",
    "\u{0}",
    "\u{feff}",
    "\u{1b}",
    "</script>",
    "-->",
    "<!--",
    "\\u0022",
    "\\x27",
    "\\N{QUOTE}",
    "{name}",
    "%s",
    "class",
    "def",
    "import",
    "__init__",
    "constructor",
    "__proto__",
    "1",
    " ",
    "\t",
    "a-b",
    "é",
    "\u{1F600}",
    "\u{d7ff}",
    "@",
    ")",
    "(",
    ":",
    ";",
    ",",
];

/// A string: arbitrary text mixed with [`NASTY`] fragments.
pub fn text(u: &mut Unstructured) -> arbitrary::Result<String> {
    let parts = u.int_in_range(0..=4)?;
    let mut s = String::new();
    for _ in 0..parts {
        if u.ratio(1, 2)? {
            s.push_str(u.choose(NASTY)?);
        } else {
            let t: &str = <&str>::arbitrary(u)?;
            s.extend(t.chars().take(40));
        }
    }
    Ok(s)
}

fn literal(u: &mut Unstructured) -> arbitrary::Result<Value> {
    Ok(match u.int_in_range(0..=5)? {
        0 => Value::Null,
        1 => Value::Bool(bool::arbitrary(u)?),
        2 => json!(i64::arbitrary(u)?),
        3 => json!(f64::arbitrary(u)?),
        _ => Value::String(text(u)?),
    })
}

/// An object schema, as an `inputSchema` must be.
pub fn object_schema(u: &mut Unstructured, depth: u32) -> arbitrary::Result<Map<String, Value>> {
    let mut m = Map::new();
    if u.ratio(7, 8)? {
        m.insert("type".into(), json!("object"));
    }
    let count = u.int_in_range(0..=5)?;
    let mut props = Map::new();
    let mut required = Vec::new();
    for _ in 0..count {
        let name = text(u)?;
        if bool::arbitrary(u)? {
            required.push(Value::String(name.clone()));
        }
        props.insert(name, schema(u, depth + 1)?);
    }
    if !props.is_empty() || bool::arbitrary(u)? {
        m.insert("properties".into(), Value::Object(props));
    }
    if !required.is_empty() {
        m.insert("required".into(), Value::Array(required));
    }
    if u.ratio(1, 4)? {
        let mut defs = Map::new();
        // "definitions" (draft 7) as often as "$defs".
        for _ in 0..u.int_in_range(1..=2)? {
            defs.insert(def_name(u)?, schema(u, depth + 1)?);
        }
        let key = if bool::arbitrary(u)? {
            "$defs"
        } else {
            "definitions"
        };
        m.insert(key.into(), Value::Object(defs));
    }
    if u.ratio(1, 4)? {
        m.insert("additionalProperties".into(), schema(u, depth + 1)?);
    }
    decorate(u, &mut m)?;
    Ok(m)
}

/// Description, title, default, examples: the text a schema carries.
fn decorate(u: &mut Unstructured, m: &mut Map<String, Value>) -> arbitrary::Result<()> {
    if u.ratio(1, 2)? {
        m.insert("description".into(), Value::String(text(u)?));
    }
    if u.ratio(1, 6)? {
        m.insert("title".into(), Value::String(text(u)?));
    }
    if u.ratio(1, 5)? {
        m.insert("default".into(), literal(u)?);
    }
    if u.ratio(1, 8)? {
        m.insert("examples".into(), json!([literal(u)?]));
    }
    if u.ratio(1, 10)? {
        m.insert("deprecated".into(), json!(true));
    }
    Ok(())
}

/// A `$defs` name: mostly one of two, so that `$ref`s find them.
fn def_name(u: &mut Unstructured) -> arbitrary::Result<String> {
    match u.int_in_range(0..=2)? {
        0 => Ok("A".into()),
        1 => Ok("B".into()),
        _ => text(u),
    }
}

const TYPES: &[&str] = &[
    "string", "number", "integer", "boolean", "null", "array", "object",
];

/// Any schema, nested at most four deep.
pub fn schema(u: &mut Unstructured, depth: u32) -> arbitrary::Result<Value> {
    let leaf = depth >= 4;
    let kind = if leaf {
        u.int_in_range(0..=3)?
    } else {
        u.int_in_range(0..=12)?
    };
    let mut m = Map::new();
    match kind {
        0 => {
            m.insert("type".into(), json!("string"));
            if u.ratio(1, 4)? {
                m.insert(
                    "format".into(),
                    json!(u.choose(&["date-time", "uri", "email", "byte"])?),
                );
            }
            if u.ratio(1, 6)? {
                m.insert("pattern".into(), Value::String(text(u)?));
            }
        }
        1 => {
            m.insert("type".into(), json!(u.choose(&["number", "integer"])?));
            if u.ratio(1, 4)? {
                m.insert("minimum".into(), json!(i32::arbitrary(u)?));
            }
        }
        2 => {
            m.insert("type".into(), json!("boolean"));
        }
        3 => {
            let n = u.int_in_range(1..=4)?;
            let values = (0..n)
                .map(|_| literal(u))
                .collect::<arbitrary::Result<Vec<_>>>()?;
            m.insert("enum".into(), Value::Array(values));
            if bool::arbitrary(u)? {
                m.insert("type".into(), json!("string"));
            }
        }
        4 => {
            m.insert("type".into(), json!("array"));
            m.insert("items".into(), schema(u, depth + 1)?);
        }
        5 => return Ok(Value::Object(object_schema(u, depth + 1)?)),
        6 => {
            m.insert("const".into(), literal(u)?);
        }
        7 => {
            let key = *u.choose(&["anyOf", "oneOf", "allOf"])?;
            let n = u.int_in_range(1..=3)?;
            let subs = (0..n)
                .map(|_| schema(u, depth + 1))
                .collect::<arbitrary::Result<Vec<_>>>()?;
            m.insert(key.into(), Value::Array(subs));
        }
        8 => {
            // Often a definition that exists (or the document itself): cycles.
            let target = match u.int_in_range(0..=4)? {
                0 | 1 => format!("#/$defs/{}", def_name(u)?),
                2 => format!("#/definitions/{}", def_name(u)?),
                3 => "#".to_string(),
                _ => text(u)?,
            };
            m.insert("$ref".into(), Value::String(target));
        }
        9 => {
            let n = u.int_in_range(1..=3)?;
            let types = (0..n)
                .map(|_| u.choose(TYPES).map(|t| json!(t)))
                .collect::<arbitrary::Result<Vec<_>>>()?;
            m.insert("type".into(), Value::Array(types));
        }
        10 => return Ok(Value::Bool(bool::arbitrary(u)?)),
        11 => {
            m.insert("type".into(), Value::String(text(u)?));
        }
        _ => {}
    }
    decorate(u, &mut m)?;
    Ok(Value::Object(m))
}

/// Keys whose string values are structure (references, type names), not upstream text
/// shown in code: kept as they are.
const STRUCTURAL: &[&str] = &["$ref", "type", "format", "$schema", "$id", "$anchor"];

/// `schema` with its names (`properties` keys and the `required` entries that name them)
/// passed through `name` and every other string of upstream text through `text`, but
/// the values of [`STRUCTURAL`] keys and the `$defs` names (for the `$ref`s that point
/// at them).
pub fn map_strings(
    schema: &Map<String, Value>,
    name: &dyn Fn(&str) -> String,
    text: &dyn Fn(&str) -> String,
) -> Map<String, Value> {
    schema
        .iter()
        .map(|(k, v)| {
            let v = match (k.as_str(), v) {
                (key, _) if STRUCTURAL.contains(&key) => v.clone(),
                ("properties" | "patternProperties", Value::Object(props)) => Value::Object(
                    props
                        .iter()
                        .map(|(n, s)| (name(n), map_value(s, name, text)))
                        .collect(),
                ),
                ("required", Value::Array(items)) => Value::Array(
                    items
                        .iter()
                        .map(|i| match i {
                            Value::String(n) => Value::String(name(n)),
                            other => map_value(other, name, text),
                        })
                        .collect(),
                ),
                _ => map_value(v, name, text),
            };
            (k.clone(), v)
        })
        .collect()
}

fn map_value(v: &Value, name: &dyn Fn(&str) -> String, text: &dyn Fn(&str) -> String) -> Value {
    match v {
        Value::String(s) => Value::String(text(s)),
        Value::Array(items) => {
            Value::Array(items.iter().map(|i| map_value(i, name, text)).collect())
        }
        Value::Object(m) => Value::Object(map_strings(m, name, text)),
        other => other.clone(),
    }
}
