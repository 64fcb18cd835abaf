//! The PII detectors and the token vault (`codebox::pii`), over text a sandboxed program
//! printed and over JSON tool results.
//!
//! Input: one byte choosing text (even) or JSON (odd), then the text or JSON.
//!
//! Properties:
//! - matches are sorted, non-overlapping, non-empty, on character boundaries, and never
//!   text shaped like a token;
//! - tokenizing twice changes nothing more than tokenizing once;
//! - tokenize then restore gives the text back (e-mail addresses as first seen, so up
//!   to ASCII case) when the text holds nothing shaped like a token, unless the vault
//!   failed closed and redacted it whole (detection that does not settle: a long chain
//!   of glued values);
//! - the JSON walk changes strings only, each exactly as `tokenize` would, and
//!   restoring walks it back;
//! - output and memory stay within a fixed multiple of the input.

use std::sync::{Arc, OnceLock};

use codebox::pii::{Detector, Vault};
use serde_json::Value;

use crate::budget;

fn detector() -> Arc<Detector> {
    static DETECTOR: OnceLock<Arc<Detector>> = OnceLock::new();
    DETECTOR
        .get_or_init(|| Arc::new(Detector::builtin()))
        .clone()
}

pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    if mode % 2 == 0 {
        check_text(text);
    } else if let Ok(value) = serde_json::from_str::<Value>(text) {
        check_json(value, text.len());
    }
}

/// Whether `text` holds something a vault could take for one of its tokens.
fn token_like(text: &str) -> bool {
    text.contains('[')
}

/// Whether `tokenized` is a whole text redacted (`[<LABEL>_REDACTED]` and nothing else):
/// the vault's answer to detection that does not settle.
fn redacted_whole(tokenized: &str) -> bool {
    tokenized
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix("_REDACTED]"))
        .is_some_and(|label| !label.is_empty() && !label.contains(['[', ']']))
}

fn check_text(text: &str) {
    let detector = detector();
    let (found, peak) = budget::peak_during(|| detector.find(text));
    budget::assert_within("find", peak, text.len(), 16, 256 * 1024);
    let mut last_end = 0;
    for m in &found {
        assert!(m.start < m.end && m.end <= text.len(), "{m:?}");
        assert!(m.start >= last_end, "overlapping or unsorted: {found:?}");
        assert!(text.is_char_boundary(m.start) && text.is_char_boundary(m.end));
        last_end = m.end;
    }

    let vault = Vault::new(detector);
    let (tokenized, peak) = budget::peak_during(|| vault.tokenize(text));
    budget::assert_within("tokenize", peak, text.len(), 16, 256 * 1024);
    assert!(
        tokenized.len() <= 3 * text.len() + 16,
        "{} bytes tokenized into {}",
        text.len(),
        tokenized.len()
    );
    if found.is_empty() {
        assert_eq!(tokenized, text, "text without PII changed");
    }
    assert_eq!(
        vault.tokenize(&tokenized),
        tokenized,
        "tokenizing again changed the text"
    );
    let restored = vault.restore(&tokenized);
    if tokenized != text && redacted_whole(&tokenized) {
        // Failed closed: nothing of the text may be left, and nothing comes back.
        assert!(!found.is_empty(), "a text without PII redacted");
        assert_eq!(restored, tokenized);
    } else if !token_like(text) {
        assert!(
            restored.eq_ignore_ascii_case(text),
            "restore(tokenize(t)) != t: {text:?} -> {tokenized:?} -> {restored:?}"
        );
        if !found.iter().any(|m| m.kind == "EMAIL") {
            assert_eq!(restored, text);
        }
    }
}

fn check_json(original: Value, input_len: usize) {
    let vault = Vault::new(detector());
    let mut tokenized = original.clone();
    let ((), peak) = budget::peak_during(|| vault.tokenize_json(&mut tokenized));
    budget::assert_within("tokenize_json", peak, input_len, 32, 256 * 1024);
    same_shape(&original, &tokenized, &|before, after| {
        assert_eq!(vault.tokenize(before), after, "a string walked differently")
    });
    let mut restored = tokenized.clone();
    vault.restore_json(&mut restored);
    same_shape(&original, &restored, &|before, after| {
        if !token_like(before) && !redacted_whole(after) {
            assert!(
                before.eq_ignore_ascii_case(after),
                "{before:?} -> {after:?}"
            );
        }
    });
}

/// Walks two values that must differ only in their strings, calling `strings` on each
/// pair of strings.
fn same_shape(a: &Value, b: &Value, strings: &dyn Fn(&str, &str)) {
    match (a, b) {
        (Value::String(x), Value::String(y)) => strings(x, y),
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len());
            for (x, y) in x.iter().zip(y) {
                same_shape(x, y, strings);
            }
        }
        (Value::Object(x), Value::Object(y)) => {
            assert!(x.keys().eq(y.keys()), "object keys changed");
            for (x, y) in x.values().zip(y.values()) {
                same_shape(x, y, strings);
            }
        }
        (x, y) => assert_eq!(x, y, "a non-string value changed"),
    }
}
