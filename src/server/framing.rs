//! What both transports check before rmcp sees a message: size, UTF-8 and JSON syntax,
//! and the JSON-RPC error answered when one fails (JSON-RPC 2.0 §5.1: `-32700 Parse
//! error`, id `null`).

use serde::de::IgnoredAny;

/// Largest JSON-RPC message accepted, on stdio and over HTTP.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// `None` when `message` is a UTF-8 JSON document (or blank), else the error message.
pub fn check_message(message: &[u8]) -> Option<String> {
    let text = match std::str::from_utf8(message) {
        Ok(t) => t,
        Err(e) => {
            return Some(format!(
                "Parse error: the message is not UTF-8 (invalid byte at offset {})",
                e.valid_up_to()
            ))
        }
    };
    if text.trim().is_empty() {
        return None;
    }
    match serde_json::from_str::<IgnoredAny>(text) {
        Ok(_) => None,
        Err(e) => Some(format!("Parse error: {e}")),
    }
}

/// The JSON-RPC error response for a message that could not be parsed.
pub fn parse_error(message: &str) -> serde_json::Value {
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32700, "message": message},
    })
}

/// The error for a message over [`MAX_MESSAGE_BYTES`].
pub fn too_large() -> String {
    format!("Parse error: message larger than {MAX_MESSAGE_BYTES} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_passes_and_the_rest_gets_a_reason() {
        assert_eq!(
            check_message(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
            None
        );
        assert_eq!(check_message(b"  "), None);
        assert!(check_message(b"{\"a\":").unwrap().contains("EOF"));
        assert!(check_message(b"\xc3\x28").unwrap().contains("not UTF-8"));
        assert!(check_message(b"{} {}").unwrap().contains("trailing"));
        let e = parse_error("Parse error: x");
        assert_eq!(e["error"]["code"], -32700);
        assert!(e["id"].is_null());
    }
}
