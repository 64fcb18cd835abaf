//! The `outputSchema` of the execute tools, written compactly by hand.
//!
//! Every tool definition is loaded into the model's context, so its size matters: the
//! schema schemars derives from `ExecutionResult` (with its doc comments, `format`,
//! `minimum` and `$defs`) costs about 900 tokens per tool; this one says the same about
//! the fields a model reads in about a fifth of that. A unit test checks it against real
//! serialised results, and the Python SDK validates every structuredContent against it
//! in the end-to-end tests.

use std::sync::Arc;

use rmcp::model::JsonObject;
use serde_json::json;

/// The output schema of `execute_python` and `execute_typescript`: the fields a model
/// reads; the others (truncation, CPU, memory, landlock, workspace usage) are there too
/// and need no introduction (additional properties are allowed).
pub fn execution_output_schema() -> Arc<JsonObject> {
    let opt_int = json!({"type": ["integer", "null"]});
    object(json!({
        "type": "object",
        "properties": {
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
            "value": {"type": "string"},
            "exit_code": opt_int,
            "signal": opt_int,
            "timed_out": {"type": "boolean"},
            "duration_ms": {"type": "number"},
            "tool_calls": {"type": "array", "items": {"type": "object"}},
            "session": {"type": "object"},
        },
        "required": ["stdout", "stderr", "exit_code", "signal", "timed_out", "duration_ms"],
    }))
}

/// The input schema of `execute_python` and `execute_typescript`, by hand for the same
/// reason (the derived one cost twice as much); `ExecuteParams` still checks every call.
pub fn execution_input_schema() -> Arc<JsonObject> {
    object(json!({
        "type": "object",
        "properties": {
            "code": {"type": "string"},
            "timeout_ms": {"type": "integer", "description": "default 30000"},
            "files": {"type": "object",
                      "description": "path: text or {\"base64\": ...}, written to /workspace first"},
            "allowed_tools": {"type": "array", "items": {"type": "string"},
                              "description": "upstream tools the code may call (names, globs)"},
            "session": {"type": "string", "description": "\"new\" or a session id: /workspace persists"},
            "keep_alive": {"type": "boolean", "description": "with session: variables persist"},
            "pii": {"type": "string", "enum": ["off", "output", "strict"],
                    "description": "tokenize personal data"},
            "packages": {"type": "array", "items": {"type": "string"},
                         "description": "install first: pip requirements, or npm:/jsr: specifiers"},
            "output_budget": {"type": "integer", "description": "output chars returned (default 20000)"},
            "outputs": {"type": "array", "items": {"type": "string"},
                        "description": "files returned, besides /workspace/out/*"},
        },
        "required": ["code"],
    }))
}

/// Drops what the derived input schemas carry and no client needs (`$schema`: 15 tokens
/// per tool in every `tools/list`).
pub(super) fn compact_input_schemas(
    router: &mut rmcp::handler::server::router::tool::ToolRouter<super::CodeboxServer>,
) {
    for route in router.map.values_mut() {
        let tool = &mut route.attr;
        if tool.input_schema.contains_key("$schema") {
            let mut schema = (*tool.input_schema).clone();
            schema.remove("$schema");
            tool.input_schema = Arc::new(schema);
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
    use crate::execution::ExecutionResult;
    use crate::proxy::ToolCallRecord;
    use crate::runtime::Language;
    use crate::sandbox::LandlockStatus;

    #[test]
    fn the_pii_enum_names_every_mode_as_calls_spell_it() {
        use crate::pii::PiiMode;
        let schema = execution_input_schema();
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

    fn type_matches(schema: &serde_json::Value, v: &serde_json::Value) -> bool {
        let names: Vec<&str> = match &schema["type"] {
            serde_json::Value::String(s) => vec![s.as_str()],
            serde_json::Value::Array(a) => a.iter().filter_map(|t| t.as_str()).collect(),
            _ => return false,
        };
        names.iter().any(|t| match *t {
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            "array" => v.is_array(),
            "object" => v.is_object(),
            _ => false,
        })
    }

    fn result(full: bool) -> ExecutionResult {
        ExecutionResult {
            start: full.then_some(crate::execution::SandboxStart::Warm),
            language: Language::Python,
            stdout: "1\n".into(),
            stderr: String::new(),
            value: full.then(|| "{'a': 1}".into()),
            files: Vec::new(),
            files_skipped: Vec::new(),
            files_omitted: 0,
            exit_code: full.then_some(0),
            signal: (!full).then_some(9),
            timed_out: !full,
            stdout_truncated: false,
            stderr_truncated: false,
            stdout_total_bytes: 2,
            stderr_total_bytes: 0,
            duration_ms: 12.5,
            landlock: full.then_some(LandlockStatus::FullyEnforced),
            seccomp_violation: false,
            oom_killed: false,
            pids_limited: false,
            peak_memory_bytes: full.then_some(1 << 20),
            cpu_ms: full.then_some(3.0),
            workspace_files: None,
            workspace_files_truncated: false,
            tool_calls: if full {
                vec![ToolCallRecord {
                    name: "time__get_current_time".into(),
                    ok: true,
                    duration_ms: 1.0,
                    bytes_in: 2,
                    bytes_out: 100,
                    error: None,
                    error_kind: None,
                }]
            } else {
                Vec::new()
            },
            tool_calls_dropped: None,
            tool_channel_error: (!full).then(|| "garbage".into()),
            network: None,
            packages: None,
            session: full.then(
                || serde_json::json!({"id": "cbx_1", "keep_alive": true, "interpreter": "kept"}),
            ),
            workspace_usage: full.then(|| serde_json::json!({"bytes": 1, "entries": 1})),
            workspace_quota_exceeded: full,
            output: None,
        }
    }

    #[test]
    fn the_input_schema_names_every_argument() {
        let schema = execution_input_schema();
        let derived =
            serde_json::to_value(schemars::schema_for!(super::super::ExecuteParams)).unwrap();
        let mut ours: Vec<&String> = schema["properties"].as_object().unwrap().keys().collect();
        let mut theirs: Vec<&String> = derived["properties"].as_object().unwrap().keys().collect();
        // `network` is listed only by servers in proxy mode (egress_glue::describe_network).
        theirs.retain(|k| *k != "network");
        ours.sort();
        theirs.sort();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn real_results_match_the_schema() {
        let schema = execution_output_schema();
        let props = schema["properties"].as_object().unwrap();
        for full in [true, false] {
            let v = serde_json::to_value(result(full)).unwrap();
            for (key, prop) in props {
                if let Some(value) = v.get(key) {
                    assert!(type_matches(prop, value), "{key}: {value} vs {prop}");
                }
            }
            for required in schema["required"].as_array().unwrap() {
                assert!(v.get(required.as_str().unwrap()).is_some(), "{required}");
            }
        }
    }
}
