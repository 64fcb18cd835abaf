//! Finding the `id` of a JSON-RPC message that cannot be parsed: one too large to keep,
//! one that is not valid UTF-8, or one whose JSON is broken or of the wrong shape.
//!
//! [`IdScanner`] is fed the message's bytes in any number of pieces and keeps only a
//! few bytes of state, so an oversized message can be scanned while it is streamed to
//! nothing. It follows strings and nesting and notes the value of the top-level object's
//! `id` member (a number or a string), wherever the member comes: the TypeScript SDK
//! writes `id` after `result`. Invalid UTF-8 inside strings does not disturb it.

use rmcp::model::{NumberOrString, RequestId};

/// The longest `id` value kept (ids are short numbers or strings).
const MAX_ID_BYTES: usize = 256;

/// Watches a message's bytes for its top-level `id`.
#[derive(Debug, Default)]
pub struct IdScanner {
    /// Nesting depth: 1 inside the top-level object.
    depth: u32,
    /// Whether the message began with `{` (otherwise there is no top-level member).
    object: bool,
    started: bool,
    in_string: bool,
    escaped: bool,
    /// At depth 1, the next string is a member name.
    expect_key: bool,
    /// The member name being read (at depth 1), up to 3 bytes: enough to tell "id".
    key: Option<Vec<u8>>,
    /// The last member name was `id`; its value comes next.
    id_key: bool,
    /// The raw bytes of the `id` value being read.
    value: Option<Vec<u8>>,
    /// The first `id` found.
    found: Option<RequestId>,
    /// The `id` value was not a number or a string, or too long.
    unreadable: bool,
}

impl IdScanner {
    pub fn new() -> IdScanner {
        IdScanner::default()
    }

    /// The `id` found so far.
    pub fn id(&self) -> Option<&RequestId> {
        self.found.as_ref()
    }

    /// Whether the message began with `{`, as every JSON-RPC message does (a line that
    /// does not is some other output, such as a banner).
    pub fn object(&self) -> bool {
        self.object
    }

    /// Scans a whole message.
    pub fn scan(bytes: &[u8]) -> Option<RequestId> {
        let mut s = IdScanner::new();
        s.feed(bytes);
        s.finish();
        s.found
    }

    /// Scans the next piece of the message.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.found.is_some() || self.unreadable {
                return;
            }
            self.step(b);
        }
    }

    /// The message ended (an `id` value may end at the end of a truncated message).
    pub fn finish(&mut self) {
        self.end_value();
    }

    fn step(&mut self, b: u8) {
        if let Some(value) = &mut self.value {
            // Inside the id's value: keep its bytes until a `,` or `}` at depth 1.
            if !self.in_string && (b == b',' || b == b'}') {
                self.end_value();
            } else {
                if value.len() == MAX_ID_BYTES || (!self.in_string && (b == b'{' || b == b'[')) {
                    self.value = None;
                    self.unreadable = true;
                    return;
                }
                value.push(b);
                self.string_state(b);
                return;
            }
        }
        if self.in_string {
            if let (Some(key), false) = (&mut self.key, self.escaped || b == b'\\' || b == b'"') {
                if key.len() < 3 {
                    key.push(b);
                }
            }
            self.string_state(b);
            if !self.in_string {
                if let Some(key) = self.key.take() {
                    self.id_key = key == b"id";
                    self.expect_key = false;
                }
            }
            return;
        }
        match b {
            b' ' | b'\t' | b'\r' | b'\n' => return,
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.object && self.expect_key {
                    self.key = Some(Vec::new());
                }
            }
            b'{' | b'[' => {
                if !self.started {
                    self.object = b == b'{';
                }
                self.depth += 1;
                if self.depth == 1 {
                    self.expect_key = true;
                }
            }
            b'}' | b']' => self.depth = self.depth.saturating_sub(1),
            b',' if self.depth == 1 => {
                self.expect_key = true;
                self.id_key = false;
            }
            b':' if self.depth == 1 && self.id_key => {
                self.id_key = false;
                self.value = Some(Vec::new());
            }
            _ => {}
        }
        self.started = true;
    }

    /// Follows quotes and backslashes.
    fn string_state(&mut self, b: u8) {
        if self.escaped {
            self.escaped = false;
        } else if b == b'\\' && self.in_string {
            self.escaped = true;
        } else if b == b'"' {
            self.in_string = !self.in_string;
        }
    }

    fn end_value(&mut self) {
        let Some(value) = self.value.take() else {
            return;
        };
        match serde_json::from_slice::<NumberOrString>(value.trim_ascii()) {
            Ok(id) => self.found = Some(id),
            Err(_) => self.unreadable = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(n: i64) -> Option<RequestId> {
        Some(NumberOrString::Number(n))
    }

    #[test]
    fn id_anywhere_in_the_top_level_object() {
        assert_eq!(
            IdScanner::scan(br#"{"jsonrpc":"2.0","id":7,"result":{}}"#),
            num(7)
        );
        assert_eq!(
            IdScanner::scan(br#"{"result":{"id":1,"x":[{"id":2}]},"jsonrpc":"2.0","id":42}"#),
            num(42)
        );
        assert_eq!(
            IdScanner::scan(br#" { "id" : "abc" , "result" : 1 }"#),
            Some(NumberOrString::String("abc".into()))
        );
        // Strings that look like members do not count.
        assert_eq!(
            IdScanner::scan(br#"{"result":"\"id\":9, \\","id":3}"#),
            num(3)
        );
    }

    #[test]
    fn no_id_or_an_unreadable_one() {
        assert_eq!(
            IdScanner::scan(br#"{"jsonrpc":"2.0","result":{"id":1}}"#),
            None
        );
        assert_eq!(IdScanner::scan(br#"[{"id":1}]"#), None);
        assert_eq!(IdScanner::scan(br#"{"id":{"a":1}}"#), None);
        assert_eq!(IdScanner::scan(br#"{"id":null}"#), None);
        assert_eq!(IdScanner::scan(b"hello world"), None);
        assert_eq!(IdScanner::scan(br#"{"idx":5,"xid":6}"#), None);
    }

    #[test]
    fn pieces_invalid_utf8_and_truncation() {
        let msg = b"{\"result\":{\"text\":\"\xff\xfe\x80 bad\"},\"id\":12}";
        for split in 0..msg.len() {
            let mut s = IdScanner::new();
            s.feed(&msg[..split]);
            s.feed(&msg[split..]);
            s.finish();
            assert_eq!(s.id(), num(12).as_ref(), "split at {split}");
        }
        // Cut off right after the id's value.
        assert_eq!(IdScanner::scan(br#"{"id":99"#), num(99));
        assert_eq!(
            IdScanner::scan(br#"{"id":5,"result":{"text":"unterminated"#),
            num(5)
        );
    }
}
