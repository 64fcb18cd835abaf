//! The MCP client side both transports share: JSON-RPC messages, the handshake, and the
//! check of an execute result.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::Lang;

pub const PROTOCOL_VERSION: &str = "2025-11-25";

/// One JSON-RPC request/response exchange over some transport.
pub trait Rpc {
    /// Sends `method` with `params` and returns the response's `result` (a JSON-RPC error
    /// is an `Err`).
    fn rpc(&mut self, method: &str, params: Value) -> Result<Value>;
}

pub fn request(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

pub fn initialize_params() -> Value {
    json!({
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "codebox-xtask-bench", "version": "0"},
    })
}

pub fn initialized_notification() -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
}

/// The result of the response to request `id` in `msg`: `None` when `msg` is something
/// else (a notification, another id), `Some(Err)` for a JSON-RPC error.
pub fn response_to(msg: &Value, id: u64) -> Option<Result<Value>> {
    if msg.get("id").and_then(Value::as_u64) != Some(id) || msg.get("method").is_some() {
        return None;
    }
    Some(match (msg.get("result"), msg.get("error")) {
        (Some(r), _) => Ok(r.clone()),
        (None, Some(e)) => Err(anyhow::anyhow!("JSON-RPC error: {e}")),
        (None, None) => Err(anyhow::anyhow!("a response without result or error: {msg}")),
    })
}

/// Checks that the server offers both execute tools and `health`.
pub fn check_tools(s: &mut impl Rpc) -> Result<()> {
    let list = s.rpc("tools/list", json!({}))?;
    let names: Vec<&str> = list["tools"]
        .as_array()
        .context("tools/list without tools")?
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for want in ["execute_python", "execute_typescript", "health"] {
        if !names.contains(&want) {
            bail!("tools/list has no {want}: {names:?}");
        }
    }
    Ok(())
}

/// `health`'s structured content.
pub fn health(s: &mut impl Rpc) -> Result<Value> {
    let r = s.rpc("tools/call", json!({"name": "health", "arguments": {}}))?;
    r.get("structuredContent")
        .cloned()
        .context("health without structuredContent")
}

/// Whether `health` shows the language's pool full (every sandbox idle) and nothing
/// running; `None` when the server has no pool for it.
pub fn pool_settled(health: &Value, lang: Lang) -> Option<bool> {
    let p = &health["pool"]["languages"][lang.name()];
    let size = p["size"].as_u64().filter(|n| *n > 0)?;
    let running = health["executions"]["running"].as_u64().unwrap_or(0);
    Some(p["idle"].as_u64() == Some(size) && running == 0)
}

/// Polls `health` until the pools of `langs` are full, for at most `timeout`; says
/// whether they are (also `true` when there is no pool).
pub fn wait_pools_full(
    s: &mut impl Rpc,
    langs: &[Lang],
    timeout: std::time::Duration,
) -> Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let h = health(s)?;
        if langs.iter().all(|l| pool_settled(&h, *l) != Some(false)) {
            return Ok(true);
        }
        if Instant::now() > deadline {
            return Ok(false);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// How one execute call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Printed `1`, exit 0; the sandbox's `start` (`warm`, `cold`), if reported.
    Ok { start: Option<String> },
    /// Refused by admission ("codebox is busy ...").
    Busy(String),
}

/// Runs the language's `print(1)` and times it from writing the request to reading the
/// response, in ms. A wrong result is an `Err`.
pub fn execute_print_one(s: &mut impl Rpc, lang: Lang) -> Result<(Outcome, f64)> {
    let params = json!({"name": lang.tool(), "arguments": {"code": lang.print_one()}});
    let started = Instant::now();
    let result = s.rpc("tools/call", params)?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    Ok((check_print_one(&result)?, ms))
}

/// Checks a `tools/call` result of a `print(1)`: stdout "1\n", exit 0, no error.
pub fn check_print_one(result: &Value) -> Result<Outcome> {
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    if result["isError"] == json!(true) {
        if text.starts_with("codebox is busy") {
            return Ok(Outcome::Busy(text.to_string()));
        }
        bail!("the execution failed: {}", short(result));
    }
    let sc = &result["structuredContent"];
    if sc["stdout"] != json!("1\n") || sc["exit_code"] != json!(0) {
        bail!(
            "wrong result (want stdout \"1\\n\", exit 0): {}",
            short(result)
        );
    }
    Ok(Outcome::Ok {
        start: sc["start"].as_str().map(str::to_string),
    })
}

/// A result, cut to a readable length for an error message.
fn short(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(600) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_checked() {
        let ok = json!({"content": [{"type": "text", "text": "exit 0"}], "isError": false,
            "structuredContent": {"stdout": "1\n", "exit_code": 0, "start": "warm"}});
        assert_eq!(
            check_print_one(&ok).unwrap(),
            Outcome::Ok {
                start: Some("warm".into())
            }
        );
        let busy = json!({"content": [{"type": "text", "text": "codebox is busy: 4 ..."}],
            "isError": true});
        assert!(matches!(check_print_one(&busy).unwrap(), Outcome::Busy(_)));
        let wrong =
            json!({"isError": false, "structuredContent": {"stdout": "2\n", "exit_code": 0}});
        assert!(check_print_one(&wrong).is_err());
    }

    #[test]
    fn responses_are_matched_by_id() {
        assert!(response_to(&json!({"jsonrpc": "2.0", "method": "notifications/x"}), 1).is_none());
        assert!(response_to(&json!({"id": 2, "result": {}}), 1).is_none());
        assert!(response_to(&json!({"id": 1, "result": {}}), 1)
            .unwrap()
            .is_ok());
        assert!(response_to(&json!({"id": 1, "error": {"code": -1}}), 1)
            .unwrap()
            .is_err());
    }
}
