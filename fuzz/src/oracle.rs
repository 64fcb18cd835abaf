//! What a message says, read independently of the code under test: the top-level
//! members of a JSON object, and the request id an answer must carry.

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;

/// The members of a JSON object, in order, duplicates kept, values unparsed.
pub struct Members<'a>(pub Vec<(String, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Collect;
        impl<'de> Visitor<'de> for Collect {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut members = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    members.push((key, map.next_value::<&'de RawValue>()?));
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(Collect)
    }
}

/// The top-level members of `text` when it is exactly one JSON object.
pub fn members(text: &str) -> Option<Vec<(String, &RawValue)>> {
    serde_json::from_str::<Members>(text).ok().map(|m| m.0)
}

/// The one member called `key` (`None` when absent or given twice).
pub fn only<'a>(members: &[(String, &'a RawValue)], key: &str) -> Option<&'a RawValue> {
    let mut found = members.iter().filter(|(k, _)| k == key);
    let first = found.next()?;
    found.next().is_none().then_some(first.1)
}

/// How many members are called `key`.
pub fn count(members: &[(String, &RawValue)], key: &str) -> usize {
    members.iter().filter(|(k, _)| k == key).count()
}

/// The id an MCP answer to `message` must carry: a message that is UTF-8 JSON, an object
/// with exactly one `id` that is a string of at most `max_string` bytes or an integer.
/// `None` when there is no such id (the answer's id is then `null`, or there is none).
pub fn readable_id(message: &[u8], max_string: usize) -> Option<Value> {
    let text = std::str::from_utf8(message).ok()?;
    let members = members(text)?;
    let raw = only(&members, "id")?;
    match serde_json::from_str::<Value>(raw.get()).ok()? {
        Value::String(s) if s.len() <= max_string => Some(Value::String(s)),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(Value::Number(n)),
        _ => None,
    }
}

/// Whether `message` is a JSON object with no `id` member but a `method`: a notification.
pub fn is_notification(message: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(message) else {
        return false;
    };
    members(text).is_some_and(|m| count(&m, "id") == 0 && count(&m, "method") > 0)
}
