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

/// The output schema of `execute_python` and `execute_typescript`.
pub fn execution_output_schema() -> Arc<JsonObject> {
    let int = json!({"type": "integer"});
    let opt_int = json!({"type": ["integer", "null"]});
    let flag = json!({"type": "boolean"});
    let value = json!({
        "type": "object",
        "properties": {
            "language": {"type": "string"},
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
            "exit_code": opt_int,
            "signal": opt_int,
            "timed_out": flag,
            "oom_killed": flag,
            "pids_limited": flag,
            "seccomp_violation": flag,
            "stdout_truncated": flag,
            "stderr_truncated": flag,
            "stdout_total_bytes": int,
            "stderr_total_bytes": int,
            "duration_ms": {"type": "number"},
            "cpu_ms": {"type": ["number", "null"]},
            "peak_memory_bytes": opt_int,
            "landlock": {"type": ["string", "null"]},
            "tool_calls": {
                "type": "array",
                "description": "Upstream tool calls the program made",
                "items": {"type": "object"}
            },
            "tool_channel_error": {"type": "string"},
            "session": {"type": "object", "description": "id (pass it as session), keep_alive, interpreter"},
            "workspace_files": {"type": "array", "items": {"type": "object"}},
            "workspace_files_truncated": flag,
            "workspace_usage": {"type": "object"},
            "workspace_quota_exceeded": flag,
        },
        "required": ["stdout", "stderr", "exit_code", "signal", "timed_out", "duration_ms"],
    });
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
            language: Language::Python,
            stdout: "1\n".into(),
            stderr: String::new(),
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
            tool_channel_error: (!full).then(|| "garbage".into()),
            session: full.then(
                || serde_json::json!({"id": "cbx_1", "keep_alive": true, "interpreter": "kept"}),
            ),
            workspace_usage: full.then(|| serde_json::json!({"bytes": 1, "entries": 1})),
            workspace_quota_exceeded: full,
        }
    }

    #[test]
    fn real_results_match_the_schema() {
        let schema = execution_output_schema();
        let props = schema["properties"].as_object().unwrap();
        for full in [true, false] {
            let v = serde_json::to_value(result(full)).unwrap();
            for (key, value) in v.as_object().unwrap() {
                let prop = props
                    .get(key)
                    .unwrap_or_else(|| panic!("{key} is not in the schema"));
                assert!(type_matches(prop, value), "{key}: {value} vs {prop}");
            }
            for required in schema["required"].as_array().unwrap() {
                assert!(v.get(required.as_str().unwrap()).is_some(), "{required}");
            }
        }
    }
}
