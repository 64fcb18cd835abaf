//! Reading JSON Schema the way both generators need it: local `$ref`s, the `type`
//! keyword, and what a schema implies when it leaves `type` out.
//!
//! Schemas come from upstream servers and may be anything; every reader here accepts any
//! JSON value and answers "nothing known" for what it does not understand.

use serde_json::Value;

/// How deep the generators follow nested schemas before answering `unknown` / `Any`.
pub const MAX_DEPTH: usize = 40;

/// The target of a local reference (`#`, `#/$defs/X`, `#/definitions/X`, any JSON pointer
/// into the document, percent-encoded or not). Remote references resolve to nothing.
pub fn resolve<'a>(document: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    let pointer = percent_decode(pointer)?;
    if pointer.is_empty() {
        return Some(document);
    }
    document.pointer(&pointer)
}

/// The canonical form of a local reference, so `#/$defs/A` and `#/%24defs/A` are one type.
pub fn canonical(reference: &str) -> Option<String> {
    percent_decode(reference.strip_prefix('#')?)
}

/// The last segment of a pointer, unescaped: the natural name of the type it points to.
pub fn pointer_name(pointer: &str) -> String {
    pointer
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .replace("~1", "/")
        .replace("~0", "~")
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The `$ref` of a schema object, if it has one.
pub fn reference(schema: &Value) -> Option<&str> {
    schema.get("$ref").and_then(Value::as_str)
}

/// The named types of `type` (a string or an array of strings); empty when absent.
pub fn types(schema: &Value) -> Vec<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => {
            let mut out: Vec<&str> = ts.iter().filter_map(Value::as_str).collect();
            out.dedup();
            out
        }
        _ => Vec::new(),
    }
}

/// The types a schema describes: its `type`, or the type its keywords imply when `type` is
/// missing (`properties` → object, `items` → array); empty means "any".
pub fn effective_types(schema: &Value) -> Vec<&str> {
    let declared = types(schema);
    if !declared.is_empty() {
        return declared;
    }
    let has = |k: &str| schema.get(k).is_some();
    if has("properties") || has("required") || has("additionalProperties") {
        vec!["object"]
    } else if has("items") || has("prefixItems") {
        vec!["array"]
    } else {
        Vec::new()
    }
}

/// The schemas of an `anyOf` / `oneOf` / `allOf` array (empty when absent or malformed).
pub fn subschemas<'a>(schema: &'a Value, keyword: &str) -> &'a [Value] {
    schema
        .get(keyword)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// `properties` as (name, schema) pairs, sorted by name.
pub fn properties(schema: &Value) -> Vec<(&str, &Value)> {
    let mut out: Vec<(&str, &Value)> = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.as_str(), v)).collect())
        .unwrap_or_default();
    out.sort_by(|a, b| a.0.cmp(b.0));
    out
}

/// The `required` names that are strings, deduplicated, in order.
pub fn required(schema: &Value) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for name in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if seen.insert(name) {
            out.push(name);
        }
    }
    out
}

/// The values a schema allows when it lists them: `enum`, or `const` as a single value.
pub fn literal_values(schema: &Value) -> Option<Vec<&Value>> {
    if let Some(c) = schema.get("const") {
        return Some(vec![c]);
    }
    schema
        .get("enum")
        .and_then(Value::as_array)
        .map(|vs| vs.iter().collect())
}

/// The schema's `description` (its `title` is left out: generators such as pydantic fill
/// it with the property name, which documents nothing).
pub fn description(schema: &Value) -> Option<&str> {
    schema
        .get("description")
        .and_then(Value::as_str)
        .filter(|d| !d.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn local_references_resolve() {
        let doc = json!({"$defs": {"A": {"type": "string"}, "a/b": {"type": "null"}},
                         "definitions": {"B": true}});
        assert_eq!(resolve(&doc, "#/$defs/A"), Some(&json!({"type": "string"})));
        assert_eq!(
            resolve(&doc, "#/%24defs/A"),
            Some(&json!({"type": "string"}))
        );
        assert_eq!(
            resolve(&doc, "#/$defs/a~1b"),
            Some(&json!({"type": "null"}))
        );
        assert_eq!(resolve(&doc, "#/definitions/B"), Some(&json!(true)));
        assert_eq!(resolve(&doc, "#"), Some(&doc));
        assert_eq!(resolve(&doc, "#/$defs/missing"), None);
        assert_eq!(resolve(&doc, "https://example.com/s.json"), None);
        assert_eq!(resolve(&doc, "#/%zz"), None);
        assert_eq!(pointer_name("/$defs/a~1b"), "a/b");
        assert_eq!(canonical("#/%24defs/A").as_deref(), Some("/$defs/A"));
    }

    #[test]
    fn implied_types() {
        assert_eq!(
            effective_types(&json!({"type": ["string", "null"]})),
            ["string", "null"]
        );
        assert_eq!(effective_types(&json!({"properties": {}})), ["object"]);
        assert_eq!(effective_types(&json!({"items": {}})), ["array"]);
        assert!(effective_types(&json!({"type": 3})).is_empty());
        assert!(effective_types(&json!(true)).is_empty());
        assert_eq!(
            required(&json!({"required": ["a", 1, "a", "b"]})),
            ["a", "b"]
        );
    }
}
