//! What both transports check before rmcp sees a message, and the JSON-RPC error
//! answered when a check fails.
//!
//! rmcp drops some bad messages without a word (JSON nested deeper than serde_json's
//! recursion limit is a "syntax" error it ignores), answers others with `id: null` (a
//! request whose `params` has the wrong shape) or as an unknown method (a `tools/call`
//! whose `arguments` is not an object falls through to its catch-all request). So every
//! message is parsed here first, with the parser and limits rmcp uses, and refused with:
//!
//! - `-32700 Parse error` (id `null`): not UTF-8, not JSON, nested too deep, too large;
//! - `-32600 Invalid Request`: not a JSON-RPC object, a bad `id` or `method`;
//! - `-32601 Method not found`: a method name too long to be any method;
//! - `-32602 Invalid params`: `params` of a known method that do not fit it;
//!
//! with the request's `id` whenever it can be read. Whatever the client sent is echoed
//! (and logged) only through [`bounded`].
//!
//! The params check knows the revision: a request of 2026-07-28 or later (its `_meta`
//! `io.modelcontextprotocol/protocolVersion`, or the `MCP-Protocol-Version` header the
//! HTTP layer passes to [`check_declared`], as rmcp reads them) calling a method that
//! revision removed ([`REMOVED_AT_2026_07_28`]) is not a params error: it goes to rmcp,
//! which answers `-32601 Method not found` (HTTP 404).

use std::borrow::Cow;

use rmcp::model::{ClientJsonRpcMessage, ClientRequest, ConstString};
use serde::Deserialize;
use serde_json::{json, Value};

/// Largest JSON-RPC message accepted, on stdio and over HTTP.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Most memory parsing one message may take, as [`crate::proxy::parse_cost`] estimates
/// it: a 16 MiB message of `[0,0,…]` parsed into some 1.9 GB (a `Value` per two bytes,
/// twice: here and in rmcp). Code and file contents are strings, which cost their size.
pub const MAX_PARSE_COST: usize = 64 * 1024 * 1024;

/// Longest string `id` accepted (it comes back in every answer).
pub const MAX_ID_BYTES: usize = 1024;

/// Longest method name, tool or prompt name accepted (none of ours is near it).
pub const MAX_NAME_BYTES: usize = 256;

/// Longest resource URI accepted.
pub const MAX_URI_BYTES: usize = 4096;

/// How much of a client's string is echoed in an answer or a log line.
pub const ECHO_BYTES: usize = 200;

/// JSON-RPC error codes.
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;

/// Why a message is refused, and the answer it gets.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub code: i64,
    /// The request's id, or `null` when it cannot be read.
    pub id: Value,
    pub message: String,
    /// A notification (no id): JSON-RPC sends it no answer (HTTP still answers 400).
    pub notification: bool,
}

impl Refusal {
    fn new(code: i64, id: Value, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            id,
            message: message.into(),
            notification: false,
        }
    }

    /// The JSON-RPC error response.
    pub fn to_json(&self) -> Value {
        json!({
            "jsonrpc": "2.0",
            "id": self.id,
            "error": {"code": self.code, "message": self.message},
        })
    }
}

/// `s` as it may be echoed: at most [`ECHO_BYTES`] of it, with a marker saying how much
/// was left out.
pub fn bounded(s: &str) -> Cow<'_, str> {
    if s.len() <= ECHO_BYTES {
        return Cow::Borrowed(s);
    }
    let mut end = ECHO_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…[{} more bytes]", &s[..end], s.len() - end))
}

/// The first revision without a handshake, sessions or the methods below.
pub const STATELESS_REVISION: &str = "2026-07-28";

/// Methods 2026-07-28 removed (SEP-2575): a request of that revision calling one gets
/// rmcp's `-32601`, whatever its params.
pub const REMOVED_AT_2026_07_28: &[&str] = &[
    "initialize",
    "ping",
    "logging/setLevel",
    "resources/subscribe",
    "resources/unsubscribe",
];

/// Whether `version` (an ISO date) is 2026-07-28 or later: they compare as strings.
pub fn is_stateless_revision(version: &str) -> bool {
    version >= STATELESS_REVISION
}

/// Whether `message` holds only JSON's whitespace (space, tab, newline, carriage return):
/// nothing to answer. Other whitespace (`\x0b`, `\x0c`, U+00A0, ...) is not JSON and gets
/// a parse error; taken for blank it went on to rmcp, which dropped it without a word
/// (found by fuzzing).
pub fn is_blank(message: &[u8]) -> bool {
    message
        .iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
}

/// `Ok` when `message` is blank or a JSON-RPC message rmcp will parse as what it is;
/// else the answer it gets. For stdio, where the revision is only in the message.
pub fn check(message: &[u8]) -> Result<(), Refusal> {
    check_declared(message, None)
}

/// [`check`] for a message that came with `declared`, the `MCP-Protocol-Version` HTTP
/// header.
pub fn check_declared(message: &[u8], declared: Option<&str>) -> Result<(), Refusal> {
    let parse_error = |why: String| Refusal::new(PARSE_ERROR, Value::Null, why);
    if message.len() > MAX_MESSAGE_BYTES {
        return Err(parse_error(too_large()));
    }
    let text = std::str::from_utf8(message).map_err(|e| {
        parse_error(format!(
            "Parse error: the message is not UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        ))
    })?;
    if is_blank(message) {
        return Ok(());
    }
    let cost = crate::proxy::parse_cost(text);
    if cost > MAX_PARSE_COST {
        let mut refusal = parse_error(format!(
            "Parse error: the message would take about {} MiB of memory to parse; the limit is {} MiB (send large data as strings)",
            cost >> 20,
            MAX_PARSE_COST >> 20
        ));
        if let Some(id) = shallow_id(text) {
            refusal.id = id;
        }
        return Err(refusal);
    }
    // serde_json's default recursion limit (128 levels), the one rmcp parses with.
    let value: Value = serde_json::from_str(text).map_err(|e| {
        let mut refusal = parse_error(format!("Parse error: {}", bounded(&e.to_string())));
        if let Some(id) = shallow_id(text) {
            refusal.id = id;
        }
        refusal
    })?;
    check_value(&value, text, declared)
}

/// The top-level `id` of a JSON object too deep to parse whole: serde_json skips the
/// other members without recursing, so the depth limit does not stop this read.
fn shallow_id(text: &str) -> Option<Value> {
    #[derive(Deserialize)]
    struct IdOnly {
        id: Option<Value>,
    }
    match serde_json::from_str::<IdOnly>(text).ok()?.id? {
        Value::String(s) if s.len() <= MAX_ID_BYTES => Some(Value::String(s)),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(Value::Number(n)),
        _ => None,
    }
}

/// The JSON-RPC checks of a parsed message (see the module docs). What rmcp will make
/// of it is read from `text`, the way rmcp reads it: a `Value` keeps the last of
/// duplicate keys where rmcp's typed parse refuses them (and answers `id: null`).
fn check_value(value: &Value, text: &str, declared: Option<&str>) -> Result<(), Refusal> {
    let rmcp_parse = || serde_json::from_str::<ClientJsonRpcMessage>(text);
    let invalid = |id: &Value, why: &str| {
        Refusal::new(
            INVALID_REQUEST,
            id.clone(),
            format!("Invalid Request: {why}"),
        )
    };
    let Some(obj) = value.as_object() else {
        return Err(invalid(&Value::Null, "a message must be a JSON object"));
    };
    let id = match obj.get("id") {
        None => None,
        Some(Value::String(s)) if s.len() > MAX_ID_BYTES => {
            return Err(invalid(
                &Value::Null,
                &format!("the id is longer than {MAX_ID_BYTES} bytes"),
            ))
        }
        Some(id @ Value::String(_)) => Some(id.clone()),
        Some(id @ Value::Number(n)) if n.is_i64() || n.is_u64() => Some(id.clone()),
        Some(_) => return Err(invalid(&Value::Null, "id must be a string or an integer")),
    };
    let answer_id = id.clone().unwrap_or(Value::Null);
    let Some(method) = obj.get("method") else {
        // A response to one of our requests, or nothing rmcp can read.
        return match rmcp_parse() {
            Ok(_) => Ok(()),
            Err(e) => Err(invalid(&answer_id, &bounded(&e.to_string()))),
        };
    };
    let notification = id.is_none();
    let refuse = |r: Refusal| Err(Refusal { notification, ..r });
    let Some(method) = method.as_str() else {
        return refuse(invalid(&answer_id, "method must be a string"));
    };
    if method.len() > MAX_NAME_BYTES {
        return refuse(Refusal::new(
            METHOD_NOT_FOUND,
            answer_id,
            format!("Method not found: {}", bounded(method)),
        ));
    }
    let params = obj.get("params");
    let invalid_params = |why: String| {
        Refusal::new(
            INVALID_PARAMS,
            answer_id.clone(),
            format!("Invalid params: {}", bounded(&why)),
        )
    };
    match params {
        None | Some(Value::Null) | Some(Value::Object(_)) => {}
        Some(_) => {
            return refuse(invalid_params(format!(
                "the params of {} must be an object",
                bounded(method)
            )))
        }
    }
    if let Some(why) = oversized_name(method, params) {
        return refuse(invalid_params(why));
    }
    // The progress token comes back in every progress notification of the call.
    let token = params.and_then(|p| p.get("_meta")?.get("progressToken")?.as_str());
    if token.is_some_and(|t| t.len() > MAX_ID_BYTES) {
        return refuse(invalid_params(format!(
            "the progressToken is longer than {MAX_ID_BYTES} bytes"
        )));
    }
    if notification {
        return match rmcp_parse() {
            Ok(_) => Ok(()),
            Err(e) => refuse(invalid(&Value::Null, &bounded(&e.to_string()))),
        };
    }
    // A method the request's revision removed is rmcp's to refuse.
    if REMOVED_AT_2026_07_28.contains(&method) {
        let in_meta = params.and_then(|p| {
            p.get("_meta")?
                .get("io.modelcontextprotocol/protocolVersion")?
                .as_str()
        });
        if in_meta.or(declared).is_some_and(is_stateless_revision) {
            // ... provided rmcp can read it at all (found by fuzzing: a duplicate `id`
            // made rmcp refuse the message without a JSON-RPC answer).
            return match rmcp_parse() {
                Ok(_) => Ok(()),
                Err(e) => refuse(invalid(&answer_id, &bounded(&e.to_string()))),
            };
        }
    }
    // A known method whose params do not fit falls through to rmcp's catch-all request
    // (or fails to parse at all): that is a params error of that method.
    match rmcp_parse() {
        Ok(ClientJsonRpcMessage::Request(r)) => match &r.request {
            ClientRequest::CustomRequest(_) => match typed_params_error(method, params) {
                Some(why) => refuse(invalid_params(why)),
                None => Ok(()),
            },
            _ => Ok(()),
        },
        Ok(_) => Ok(()),
        Err(e) => match typed_params_error(method, params) {
            Some(why) => refuse(invalid_params(why)),
            None => refuse(invalid(&answer_id, &bounded(&e.to_string()))),
        },
    }
}

/// A name or URI in the params that is too long to be one we know.
fn oversized_name(method: &str, params: Option<&Value>) -> Option<String> {
    let field = |key: &str| params?.get(key)?.as_str().map(str::len);
    match method {
        "tools/call" | "prompts/get" => field("name")
            .filter(|&n| n > MAX_NAME_BYTES)
            .map(|n| format!("the name is {n} bytes; no name is longer than {MAX_NAME_BYTES}")),
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => field("uri")
            .filter(|&n| n > MAX_URI_BYTES)
            .map(|n| format!("the uri is {n} bytes; the limit is {MAX_URI_BYTES}")),
        _ => None,
    }
}

/// Why `params` do not fit `method`, for the methods rmcp parses into types; `None` for
/// other methods (and when they fit).
fn typed_params_error(method: &str, params: Option<&Value>) -> Option<String> {
    use rmcp::model as m;
    let request = json!({"method": method, "params": params.cloned().unwrap_or(Value::Null)});
    let request = match params {
        Some(_) => request,
        None => json!({ "method": method }),
    };
    macro_rules! typed {
        ($(($method:ty, $request:ty)),* $(,)?) => {
            $(
                if method == <$method as ConstString>::VALUE {
                    return <$request>::deserialize(&request)
                        .err()
                        .map(|e| format!("{method}: {e}"));
                }
            )*
        };
    }
    typed!(
        (m::PingRequestMethod, m::PingRequest),
        (m::InitializeResultMethod, m::InitializeRequest),
        (m::CompleteRequestMethod, m::CompleteRequest),
        (m::SetLevelRequestMethod, m::SetLevelRequest),
        (m::GetPromptRequestMethod, m::GetPromptRequest),
        (m::ListPromptsRequestMethod, m::ListPromptsRequest),
        (m::ListResourcesRequestMethod, m::ListResourcesRequest),
        (
            m::ListResourceTemplatesRequestMethod,
            m::ListResourceTemplatesRequest
        ),
        (m::ReadResourceRequestMethod, m::ReadResourceRequest),
        (m::SubscribeRequestMethod, m::SubscribeRequest),
        (m::UnsubscribeRequestMethod, m::UnsubscribeRequest),
        (m::CallToolRequestMethod, m::CallToolRequest),
        (m::ListToolsRequestMethod, m::ListToolsRequest),
    );
    None
}

/// The error for a message over [`MAX_MESSAGE_BYTES`].
pub fn too_large() -> String {
    format!("Parse error: message larger than {MAX_MESSAGE_BYTES} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(message: &str) -> Refusal {
        check(message.as_bytes()).expect_err(message)
    }

    #[test]
    fn removed_methods_of_a_stateless_request_are_left_to_rmcp() {
        let modern = r#"{"jsonrpc":"2.0","id":7,"method":"logging/setLevel","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        check(modern.as_bytes()).unwrap();
        let bare = r#"{"jsonrpc":"2.0","id":7,"method":"resources/subscribe","params":{}}"#;
        // Without a revision it is a 2025-11-25 request with params that do not fit.
        assert_eq!(refusal(bare).code, INVALID_PARAMS);
        check_declared(bare.as_bytes(), Some("2026-07-28")).unwrap();
        assert_eq!(
            check_declared(bare.as_bytes(), Some("2025-11-25"))
                .unwrap_err()
                .code,
            INVALID_PARAMS
        );
        // Methods the revision kept are still checked.
        let read = r#"{"jsonrpc":"2.0","id":8,"method":"resources/read","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        assert_eq!(refusal(read).code, INVALID_PARAMS);
        let old_init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2025-11-25"}}}"#;
        assert_eq!(refusal(old_init).code, INVALID_PARAMS);
        // One rmcp cannot parse is refused here, not passed on (fuzz/regressions/jsonrpc).
        let twice = r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#;
        let r = check_declared(twice.as_bytes(), Some("2026-07-28")).unwrap_err();
        assert_eq!((r.code, r.notification), (INVALID_REQUEST, false));
    }

    #[test]
    fn json_rpc_passes_and_the_rest_gets_a_reason() {
        check(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).unwrap();
        check(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
        check(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#).unwrap();
        check(b"  ").unwrap();
        check(b" \t\r\n").unwrap();
        for not_json in ["\u{b}", "\u{c}", " \u{a0}", "\u{2028}"] {
            assert_eq!(refusal(not_json).code, PARSE_ERROR, "{not_json:?}");
        }
        let r = refusal("{\"a\":");
        assert!(r.message.contains("EOF") && r.code == PARSE_ERROR && r.id.is_null());
        let r = check(b"\xc3\x28").unwrap_err();
        assert!(r.message.contains("not UTF-8"));
        assert!(refusal("{} {}").message.contains("trailing"));
        assert_eq!(refusal("[1,2]").code, INVALID_REQUEST);
        let e = refusal("{\"a\":").to_json();
        assert_eq!(e["error"]["code"], -32700);
        assert!(e["id"].is_null());
    }

    /// The depth check is the one rmcp parses with: whatever passes it, rmcp parses;
    /// whatever rmcp's parser rejects as too deep, it refuses.
    #[test]
    fn nesting_is_refused_exactly_where_rmcp_would_drop_it() {
        let mut last_ok = 0;
        for depth in 100..140 {
            let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let msg = format!(
                r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"x","arguments":{{"a":{nested}}}}}}}"#
            );
            let ours = check(msg.as_bytes());
            let rmcp = serde_json::from_str::<ClientJsonRpcMessage>(&msg);
            assert_eq!(ours.is_ok(), rmcp.is_ok(), "depth {depth}: {ours:?}");
            if let Err(r) = ours {
                assert_eq!((r.code, r.id.clone()), (PARSE_ERROR, json!(7)));
                assert!(r.message.contains("recursion limit"), "{}", r.message);
            } else {
                last_ok = depth;
            }
        }
        // serde_json's limit is 128 levels; the envelope takes 4 of them.
        assert_eq!(last_ok, 124);
    }

    #[test]
    fn bad_params_are_answered_with_the_request_id() {
        let r = refusal(r#"{"jsonrpc":"2.0","id":5,"method":"tools/list","params":7}"#);
        assert_eq!((r.code, r.id.clone()), (INVALID_PARAMS, json!(5)));
        let r = refusal(r#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":[1]}"#);
        assert_eq!((r.code, r.id.clone()), (INVALID_PARAMS, json!("x")));
        let r = refusal(
            r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"execute_python","arguments":"print(1)"}}"#,
        );
        assert_eq!((r.code, r.id.clone()), (INVALID_PARAMS, json!(6)));
        assert!(r.message.contains("tools/call"), "{}", r.message);
        let r =
            refusal(r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"arguments":{}}}"#);
        assert_eq!(r.code, INVALID_PARAMS);
        let r = refusal(r#"{"jsonrpc":"2.0","id":9,"method":"initialize","params":{}}"#);
        assert_eq!((r.code, r.id.clone()), (INVALID_PARAMS, json!(9)));
        // Unknown methods are rmcp's to answer (-32601).
        check(br#"{"jsonrpc":"2.0","id":10,"method":"no/such","params":{"a":1}}"#).unwrap();
        check(
            br#"{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"t","arguments":{"a":1}}}"#,
        )
        .unwrap();
        let r = refusal(r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#);
        assert_eq!((r.code, r.id.clone()), (INVALID_REQUEST, Value::Null));
        let r = refusal(r#"{"jsonrpc":"2.0","method":"notifications/x","params":3}"#);
        assert!(r.notification);
        // Neither a request, a notification nor a response.
        let r = refusal(r#"{"jsonrpc":"2.0"}"#);
        assert_eq!((r.code, r.id.clone()), (INVALID_REQUEST, Value::Null));
        let r = refusal(r#"{"jsonrpc":"2.0","id":3}"#);
        assert_eq!((r.code, r.id.clone()), (INVALID_REQUEST, json!(3)));
        let r = refusal(r#"{"id":4,"method":"ping"}"#);
        assert_eq!((r.code, r.id.clone()), (INVALID_REQUEST, json!(4)));
        assert!(refusal(r#"{"jsonrpc":"1.0","method":"notifications/initialized"}"#).notification);
        check(br#"{"jsonrpc":"2.0","method":"notifications/whatever"}"#).unwrap();
        check(br#"{"jsonrpc":"2.0","id":5,"error":{"code":1,"message":"m"}}"#).unwrap();
    }

    /// A `Value` keeps the last of duplicate keys; rmcp's typed parse refuses them and
    /// answers `id: null`, so the check reads the text as rmcp does and answers with
    /// the id.
    #[test]
    fn duplicate_keys_are_refused_as_rmcp_would_with_the_id() {
        for msg in [
            r#"{"jsonrpc":"2.0","id":7,"method":"ping","method":"ping"}"#,
            r#"{"jsonrpc":"2.0","jsonrpc":"2.0","id":7,"method":"tools/list"}"#,
        ] {
            // rmcp refuses the text, though the `Value` of it reads as a message.
            assert!(
                serde_json::from_str::<ClientJsonRpcMessage>(msg).is_err(),
                "{msg}"
            );
            let value: Value = serde_json::from_str(msg).unwrap();
            assert!(ClientJsonRpcMessage::deserialize(&value).is_ok());
            let r = refusal(msg);
            assert_eq!(r.id, json!(7), "{msg}: {r:?}");
            assert!(
                [INVALID_REQUEST, INVALID_PARAMS].contains(&r.code),
                "{msg}: {r:?}"
            );
        }
        // Duplicate keys inside params are rmcp's to take (the last wins).
        for msg in [
            r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"a","arguments":{"x":1,"x":2}}}"#,
            r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"a","name":"b"}}"#,
        ] {
            assert!(
                serde_json::from_str::<ClientJsonRpcMessage>(msg).is_ok(),
                "{msg}"
            );
            check(msg.as_bytes()).unwrap();
        }
    }

    /// A message whose parse would amplify its size many times is refused before it is
    /// parsed, with its id; as large a message of strings passes.
    #[test]
    fn messages_that_parse_into_gigabytes_are_refused_unparsed() {
        let zeros = format!("[{}0]", "0,".repeat(4 << 20));
        let msg = format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"execute_python","arguments":{{"code":"1","x":{zeros}}}}}}}"#
        );
        let r = refusal(&msg);
        assert_eq!((r.code, r.id.clone()), (PARSE_ERROR, json!(3)));
        assert!(r.message.contains("MiB of memory"), "{}", r.message);
        let code = "x".repeat(15 << 20);
        let msg = format!(
            r#"{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{"name":"execute_python","arguments":{{"code":"{code}"}}}}}}"#
        );
        check(msg.as_bytes()).unwrap();
    }

    #[test]
    fn client_strings_are_echoed_bounded() {
        let method = "m".repeat(1 << 20);
        let msg = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{method}"}}"#);
        let r = check(msg.as_bytes()).unwrap_err();
        assert_eq!(r.code, METHOD_NOT_FOUND);
        assert!(
            r.message.len() < 300 && r.message.contains("more bytes]"),
            "{}",
            r.message
        );
        let name = "n".repeat(10_000);
        let msg = format!(
            r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"{name}"}}}}"#
        );
        let r = check(msg.as_bytes()).unwrap_err();
        assert_eq!((r.code, r.id.clone()), (INVALID_PARAMS, json!(2)));
        assert!(r.message.len() < 300);
        let id = "i".repeat(2000);
        let r = check(format!(r#"{{"jsonrpc":"2.0","id":"{id}","method":"ping"}}"#).as_bytes())
            .unwrap_err();
        assert!(r.id.is_null() && r.message.len() < 300);
        let token = "t".repeat(2000);
        let msg = format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{{"_meta":{{"progressToken":"{token}"}}}}}}"#
        );
        let r = check(msg.as_bytes()).unwrap_err();
        assert_eq!((r.code, r.id.clone()), (INVALID_PARAMS, json!(3)));
        // A serde message quoting a long string is bounded too.
        let junk = format!("\"{}", "j".repeat(5000));
        assert!(check(junk.as_bytes()).unwrap_err().message.len() < 300);
        assert_eq!(bounded("short"), "short");
        let long = "é".repeat(200);
        let b = bounded(&long);
        assert!(b.ends_with("more bytes]") && b.len() < 230, "{b}");
    }
}
