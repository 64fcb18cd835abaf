//! The input schemas of codebox's own tools, written compactly.
//!
//! Every tool definition is loaded into the model's context with each `tools/list`, so
//! its size matters (`codebox tools tokens`): the execute tools' and `search_tools`'
//! schemas are written by hand, the others derived by schemars and compacted. The
//! execute tools carry no `outputSchema`: the one schemars derives from
//! `ExecutionResult` cost about 900 tokens per tool, and even a hand-written one of the
//! few fields a model reads (stdout, stderr, exit_code) took 30 tokens per tool that no
//! model needs to call them. The result still comes as structuredContent (which MCP
//! allows without an output schema) and as text.

use std::sync::Arc;

use rmcp::model::JsonObject;
use serde_json::json;

/// The input schema of `execute_python` (`described`) and `execute_typescript` (types
/// only: its description says the arguments are execute_python's, so the model reads
/// their notes once), by hand (the derived one cost twice as much); `ExecuteParams` still
/// checks every call.
pub fn execution_input_schema(described: bool) -> Arc<JsonObject> {
    let mut schema = json!({
        "type": "object",
        "properties": {
            "code": {"type": "string"},
            "timeout_ms": {"type": "integer", "description": "default 30000"},
            "files": {"type": "object", "description": "path: text or {\"base64\"}, put in /workspace"},
            "allowed_tools": {"type": "array", "items": {"type": "string"},
                              "description": "upstream tools callable (names, globs)"},
            "session": {"type": "string", "description": "\"new\" or an id: /workspace persists"},
            "keep_alive": {"type": "boolean", "description": "with session: variables persist"},
            "pii": {"type": "string", "enum": ["off", "output", "strict"],
                    "description": "tokenize personal data"},
            "packages": {"type": "array", "items": {"type": "string"},
                         "description": "install first: pip, npm: or jsr: specs"},
            "output_budget": {"type": "integer", "description": "output chars returned (default 20000)"},
            "outputs": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["code"],
    });
    if !described {
        for prop in schema["properties"]
            .as_object_mut()
            .into_iter()
            .flat_map(|p| p.values_mut())
        {
            if let Some(p) = prop.as_object_mut() {
                p.remove("description");
            }
        }
    }
    object(schema)
}

/// The input schema of `search_tools`, by hand: `detail` as an enum, no `null`s.
pub fn search_input_schema() -> Arc<JsonObject> {
    object(json!({
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "\"\" lists all"},
            "detail": {"type": "string", "enum": ["summary", "name", "full"]},
            "server": {"type": "string"},
            "limit": {"type": "integer", "description": "max 100"},
            "cursor": {"type": "string", "description": "a next_cursor"},
        },
        "required": ["query"],
    }))
}

/// Marks every tool's `session` argument for SEP-2243 header mirroring
/// (`x-mcp-header`), so a 2026-07-28 client sends it as `Mcp-Param-Session` and a load
/// balancer can send the call to the replica the session lives on (see
/// [`crate::replica`]). Only replicas do this: it costs every `tools/list` a few tokens.
pub(in crate::server) fn route_sessions_by_header(
    router: &mut rmcp::handler::server::router::tool::ToolRouter<crate::server::CodeboxServer>,
) {
    for route in router.map.values_mut() {
        let tool = &mut route.attr;
        let mut schema = (*tool.input_schema).clone();
        let Some(session) = schema
            .get_mut("properties")
            .and_then(|p| p.get_mut("session"))
            .and_then(|s| s.as_object_mut())
            .filter(|s| s.get("type").and_then(|t| t.as_str()) == Some("string"))
        else {
            continue;
        };
        session.insert(
            "x-mcp-header".into(),
            crate::replica::SESSION_PARAM_TOKEN.into(),
        );
        tool.input_schema = Arc::new(schema);
    }
}

/// Compacts the input schemas schemars derives for the other tools, keeping what a
/// model needs to call them: drops `$schema` (15 tokens per tool in every `tools/list`),
/// `additionalProperties: false` (the argument structs still refuse unknown fields),
/// `format`/`minimum` of unsigned integers, and the `null` of optional arguments (an
/// argument not in `required` may be left out).
pub(in crate::server) fn compact_input_schemas(
    router: &mut rmcp::handler::server::router::tool::ToolRouter<crate::server::CodeboxServer>,
) {
    for route in router.map.values_mut() {
        let tool = &mut route.attr;
        let mut schema = (*tool.input_schema).clone();
        compact(&mut schema);
        tool.input_schema = Arc::new(schema);
    }
}

fn compact(schema: &mut JsonObject) {
    schema.remove("$schema");
    schema.remove("title");
    if schema.get("additionalProperties") == Some(&serde_json::Value::Bool(false)) {
        schema.remove("additionalProperties");
    }
    let Some(serde_json::Value::Object(props)) = schema.get_mut("properties") else {
        return;
    };
    for prop in props.values_mut() {
        let Some(prop) = prop.as_object_mut() else {
            continue;
        };
        prop.remove("format");
        if prop.get("minimum") == Some(&json!(0)) {
            prop.remove("minimum");
        }
        if let Some(serde_json::Value::Array(types)) = prop.get("type") {
            let named: Vec<&serde_json::Value> = types.iter().filter(|t| *t != "null").collect();
            if let [one] = named[..] {
                let one = one.clone();
                prop.insert("type".into(), one);
            }
        }
    }
}

fn object(value: serde_json::Value) -> Arc<JsonObject> {
    match value {
        serde_json::Value::Object(map) => Arc::new(map),
        _ => unreachable!("a JSON object literal"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_mark_every_session_argument_for_header_routing() {
        let mut router = crate::server::CodeboxServer::all_tools();
        route_sessions_by_header(&mut router);
        let marked: Vec<String> = router
            .list_all()
            .into_iter()
            .filter(|t| {
                t.input_schema["properties"]
                    .get("session")
                    .is_some_and(|s| s["x-mcp-header"] == "Session")
            })
            .map(|t| t.name.to_string())
            .collect();
        for name in ["execute_python", "execute_typescript", "close_session"] {
            assert!(marked.iter().any(|m| m == name), "{name} not in {marked:?}");
        }
        // Nothing else is touched: no tool without a session argument gains one.
        let plain = crate::server::CodeboxServer::all_tools();
        for tool in plain.list_all() {
            assert!(tool.input_schema["properties"]
                .get("session")
                .is_none_or(|s| s.get("x-mcp-header").is_none()));
        }
    }

    #[test]
    fn the_pii_enum_names_every_mode_as_calls_spell_it() {
        use crate::pii::PiiMode;
        let schema = execution_input_schema(true);
        let listed: Vec<&str> = schema["properties"]["pii"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let modes = [PiiMode::Off, PiiMode::Output, PiiMode::Strict];
        let spelled: Vec<String> = modes.iter().map(|m| m.to_string()).collect();
        assert_eq!(listed, spelled);
        for (text, mode) in listed.iter().zip(modes) {
            assert_eq!(text.parse::<PiiMode>().unwrap(), mode);
        }
    }

    #[test]
    fn the_input_schema_names_every_argument() {
        let schema = execution_input_schema(true);
        let derived =
            serde_json::to_value(schemars::schema_for!(crate::server::ExecuteParams)).unwrap();
        let mut ours: Vec<&String> = schema["properties"].as_object().unwrap().keys().collect();
        let mut theirs: Vec<&String> = derived["properties"].as_object().unwrap().keys().collect();
        // `network` is listed only by servers in proxy mode (wiring::egress::describe_network).
        theirs.retain(|k| *k != "network");
        ours.sort();
        theirs.sort();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn the_search_schema_names_every_argument_and_detail() {
        let schema = search_input_schema();
        let derived =
            serde_json::to_value(schemars::schema_for!(crate::server::SearchParams)).unwrap();
        let mut ours: Vec<&String> = schema["properties"].as_object().unwrap().keys().collect();
        let mut theirs: Vec<&String> = derived["properties"].as_object().unwrap().keys().collect();
        ours.sort();
        theirs.sort();
        assert_eq!(ours, theirs);
        for detail in schema["properties"]["detail"]["enum"].as_array().unwrap() {
            detail
                .as_str()
                .unwrap()
                .parse::<crate::catalog::Detail>()
                .unwrap();
        }
    }

    #[test]
    fn derived_schemas_lose_only_what_no_client_needs() {
        let mut schema = object(json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "P",
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "a": {"type": ["string", "null"], "description": "kept"},
                "n": {"type": ["integer", "null"], "format": "uint", "minimum": 0},
                "m": {"type": "integer", "minimum": 1},
            },
            "required": ["m"],
        }));
        compact(std::sync::Arc::make_mut(&mut schema));
        assert_eq!(
            serde_json::Value::Object((*schema).clone()),
            json!({
                "type": "object",
                "properties": {
                    "a": {"type": "string", "description": "kept"},
                    "n": {"type": "integer"},
                    "m": {"type": "integer", "minimum": 1},
                },
                "required": ["m"],
            })
        );
    }
}
