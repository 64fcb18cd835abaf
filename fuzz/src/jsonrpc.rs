//! The JSON-RPC checks every client message goes through before rmcp sees it
//! (`codebox::server::transport::framing::check_declared`), on stdio and over HTTP.
//!
//! Input: one byte choosing the `MCP-Protocol-Version` header the message came with (or
//! none, as on stdio), then the message.
//!
//! Properties:
//! - a message that passes is one rmcp parses (else rmcp would drop it without a word and
//!   the client would wait forever);
//! - a refused request whose id can be read is answered with that id, a refused
//!   notification with nothing, and the answer is a JSON-RPC error of one of the four
//!   codes whose message is bounded whatever the input echoes;
//! - checking holds at most a fixed multiple of the message's size.

use codebox::server::transport::framing::{self, Refusal};
use rmcp::model::ClientJsonRpcMessage;
use serde_json::Value;

use crate::{budget, oracle};

/// The headers an input can choose (index = first byte % 5; 4 = no header).
const DECLARED: [Option<&str>; 5] = [
    Some("2026-07-28"),
    Some("2025-11-25"),
    Some("2025-06-18"),
    Some("2030-01-01"),
    None,
];

/// Longest error message an answer may carry: the fixed text plus two echoes.
const MAX_ANSWER_MESSAGE: usize = 2 * framing::ECHO_BYTES + 600;

pub fn run(data: &[u8]) {
    let Some((&choice, message)) = data.split_first() else {
        return;
    };
    let declared = DECLARED[usize::from(choice) % DECLARED.len()];
    let (checked, peak) = budget::peak_during(|| framing::check_declared(message, declared));
    budget::assert_within("check_declared", peak, message.len(), 96, 64 * 1024);
    match checked {
        Ok(()) => assert_rmcp_parses(message),
        Err(refusal) => assert_answer(message, &refusal),
    }
}

/// A message that passed (and is not blank) is one rmcp parses.
fn assert_rmcp_parses(message: &[u8]) {
    if framing::is_blank(message) {
        return;
    }
    if let Err(e) = serde_json::from_slice::<ClientJsonRpcMessage>(message) {
        panic!(
            "passed the check but rmcp cannot parse it ({e}): {:?}",
            String::from_utf8_lossy(message)
        );
    }
}

/// The refusal answers the request it refuses (see the module docs).
pub fn assert_answer(message: &[u8], refusal: &Refusal) {
    assert!(
        [
            framing::PARSE_ERROR,
            framing::INVALID_REQUEST,
            framing::METHOD_NOT_FOUND,
            framing::INVALID_PARAMS
        ]
        .contains(&refusal.code),
        "unexpected code {}",
        refusal.code
    );
    assert!(
        !refusal.message.is_empty() && refusal.message.len() <= MAX_ANSWER_MESSAGE,
        "answer message of {} bytes: {:?}",
        refusal.message.len(),
        refusal.message
    );
    let answer = refusal.to_json();
    assert_eq!(answer["jsonrpc"], "2.0");
    assert!(answer["error"]["code"].is_i64());
    match oracle::readable_id(message, framing::MAX_ID_BYTES) {
        Some(id) => {
            assert!(
                !refusal.notification,
                "a request with id {id} was refused as a notification"
            );
            assert_eq!(
                refusal.id,
                id,
                "refused ({}) with the wrong id: {:?}",
                refusal.message,
                String::from_utf8_lossy(message)
            );
        }
        None => {
            if refusal.notification {
                assert!(
                    oracle::is_notification(message),
                    "a message that is not a notification got no answer: {:?}",
                    String::from_utf8_lossy(message)
                );
            }
            assert!(
                matches!(
                    refusal.id,
                    Value::Null | Value::String(_) | Value::Number(_)
                ),
                "id {:?}",
                refusal.id
            );
        }
    }
}
