//! A JSON file edited where the command edits it and nowhere else: every value the command
//! does not change is written back as the text it was read as.
//!
//! An object is an order-preserving list of members ([`Members`]) whose values stay raw
//! text ([`serde_json::value::RawValue`]) until the command opens one to edit inside it
//! ([`Members::object_mut`]; looking inside, [`Node::members`], parses a copy). Only the
//! top level and the objects opened that way are laid out anew (in the file's own
//! indentation), and only values the command makes ([`Node::Value`]) are serialised. So a float, a huge integer, an escape or an odd layout
//! anywhere else in `~/.claude.json` comes back byte for byte, with no change to how
//! serde_json parses numbers anywhere else in codebox.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// One value of a document.
#[derive(Debug, Clone)]
pub enum Node {
    /// As read: written back as this text. `moved`: it was taken from another place (or
    /// file) and is re-indented to where it is written; otherwise it is written verbatim.
    Raw { raw: Box<RawValue>, moved: bool },
    /// An object opened to edit inside it, laid out anew; its members keep their own text.
    Object(Members),
    /// A value the command made.
    Value(Value),
}

impl Node {
    fn raw(raw: Box<RawValue>) -> Node {
        Node::Raw { raw, moved: false }
    }

    /// This value taken elsewhere: its text is kept, its indentation follows the new place.
    pub fn moved(self) -> Node {
        match self {
            Node::Raw { raw, .. } => Node::Raw { raw, moved: true },
            other => other,
        }
    }

    /// The value, parsed (for comparisons and for looking at an entry).
    pub fn to_value(&self) -> Value {
        match self {
            Node::Raw { raw, .. } => {
                serde_json::from_str(raw.get()).expect("a raw value is valid JSON")
            }
            Node::Object(m) => m.to_value(),
            Node::Value(v) => v.clone(),
        }
    }

    /// The members of this value when it is an object (a copy: nothing is opened).
    pub fn members(&self) -> Option<Members> {
        match self {
            Node::Raw { raw, .. } => Members::parse(raw.get()),
            Node::Object(m) => Some(m.clone()),
            Node::Value(Value::Object(o)) => Some(Members::from_map(o)),
            Node::Value(_) => None,
        }
    }

    /// Opens this value in place when it is an object.
    fn open(&mut self) -> Option<&mut Members> {
        if !matches!(self, Node::Object(_)) {
            *self = Node::Object(self.members()?);
        }
        match self {
            Node::Object(m) => Some(m),
            _ => unreachable!("just opened"),
        }
    }

    /// The text of this value written at a line indented by `indent`.
    fn render(&self, indent: &str, unit: &str, out: &mut String) {
        match self {
            Node::Raw { raw, moved: false } => out.push_str(raw.get()),
            Node::Raw { raw, moved: true } => out.push_str(&reindent(raw.get(), indent)),
            Node::Object(m) => m.render(indent, unit, out),
            Node::Value(v) => {
                let mut text = Vec::new();
                let formatter = serde_json::ser::PrettyFormatter::with_indent(unit.as_bytes());
                let mut ser = serde_json::Serializer::with_formatter(&mut text, formatter);
                v.serialize(&mut ser)
                    .expect("a JSON value always serializes");
                let text = String::from_utf8(text).expect("serde_json writes UTF-8");
                // A JSON text's newlines are all between tokens: each starts a line to indent.
                out.push_str(&text.replace('\n', &format!("\n{indent}")));
            }
        }
    }
}

/// `text` (a value as read) with the indentation of its lines after the first moved from
/// that of its last line (where its closing bracket was) to `indent`. A line indented
/// less than that is left alone.
fn reindent(text: &str, indent: &str) -> String {
    let Some(last) = text.rfind('\n') else {
        return text.to_string();
    };
    let tail = &text[last + 1..];
    let base = &tail[..tail.len() - tail.trim_start_matches([' ', '\t']).len()];
    if base == indent {
        return text.to_string();
    }
    let mut lines = text.split('\n');
    let mut out = lines.next().unwrap_or_default().to_string();
    for line in lines {
        out.push('\n');
        match line.strip_prefix(base) {
            Some(rest) => {
                out.push_str(indent);
                out.push_str(rest);
            }
            None => out.push_str(line),
        }
    }
    out
}

/// An object's members in the file's order. A key given twice is one member, at its first
/// place with its last value (as JavaScript's `JSON.parse` reads it).
#[derive(Debug, Clone, Default)]
pub struct Members(Vec<(String, Node)>);

impl Members {
    /// The members of `text` when it is a JSON object, each value raw.
    pub fn parse(text: &str) -> Option<Members> {
        if !text.trim_start().starts_with('{') {
            return None;
        }
        serde_json::from_str(text).ok()
    }

    fn from_map(map: &Map<String, Value>) -> Members {
        Members(
            map.iter()
                .map(|(k, v)| (k.clone(), Node::Value(v.clone())))
                .collect(),
        )
    }

    pub fn get(&self, key: &str) -> Option<&Node> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, n)| n)
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Node)> {
        self.0.iter().map(|(k, n)| (k.as_str(), n))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Sets `key`: in its place when it is there, else last.
    pub fn insert(&mut self, key: String, node: Node) {
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n = node,
            None => self.0.push((key, node)),
        }
    }

    pub fn remove(&mut self, key: &str) -> Option<Node> {
        let i = self.0.iter().position(|(k, _)| k == key)?;
        Some(self.0.remove(i).1)
    }

    /// The object at `key`, opened for editing; made (empty, last) when missing. `Err`:
    /// the value there is not an object.
    pub fn object_mut(&mut self, key: &str) -> Result<&mut Members, NotAnObject> {
        if self.get(key).is_none() {
            self.0
                .push((key.to_string(), Node::Object(Members::default())));
        }
        let (_, node) = self
            .0
            .iter_mut()
            .find(|(k, _)| k == key)
            .expect("just made");
        node.open().ok_or(NotAnObject)
    }

    pub fn to_value(&self) -> Value {
        Value::Object(
            self.0
                .iter()
                .map(|(k, n)| (k.clone(), n.to_value()))
                .collect(),
        )
    }

    /// The object's text when its `{` is on a line indented by `indent`, members one
    /// `unit` further in.
    fn render(&self, indent: &str, unit: &str, out: &mut String) {
        if self.0.is_empty() {
            out.push_str("{}");
            return;
        }
        let inner = format!("{indent}{unit}");
        out.push('{');
        for (i, (key, node)) in self.0.iter().enumerate() {
            out.push_str(if i == 0 { "\n" } else { ",\n" });
            out.push_str(&inner);
            out.push_str(&serde_json::to_string(key).expect("a string always serializes"));
            out.push_str(": ");
            node.render(&inner, unit, out);
        }
        out.push('\n');
        out.push_str(indent);
        out.push('}');
    }
}

/// The value at a key is not an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAnObject;

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MembersVisitor;
        impl<'de> Visitor<'de> for MembersVisitor {
            type Value = Members;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
                let mut members = Members::default();
                while let Some((key, raw)) = map.next_entry::<String, Box<RawValue>>()? {
                    members.insert(key, Node::raw(raw));
                }
                Ok(members)
            }
        }
        deserializer.deserialize_map(MembersVisitor)
    }
}

/// How a file is written: the indentation of its members and whether it ends in a newline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub unit: String,
    pub final_newline: bool,
}

impl Default for Layout {
    /// A new file: 2 spaces, as Claude Code writes its JSON, and a newline.
    fn default() -> Self {
        Layout {
            unit: "  ".into(),
            final_newline: true,
        }
    }
}

impl Layout {
    /// The layout of a file's text: the indentation of its first member when that starts a
    /// line (else 2 spaces), and its last newline.
    pub fn of(text: &str) -> Layout {
        let unit = text
            .trim_start()
            .strip_prefix('{')
            .and_then(|after| {
                let space = &after[..after.len() - after.trim_start().len()];
                let line = &space[space.rfind('\n')? + 1..];
                let only_indent = !line.is_empty() && line.bytes().all(|b| b == b' ' || b == b'\t');
                only_indent.then(|| line.to_string())
            })
            .unwrap_or_else(|| "  ".into());
        Layout {
            unit,
            final_newline: text.is_empty() || text.ends_with('\n'),
        }
    }

    /// The file's text.
    pub fn render(&self, top: &Members) -> String {
        let mut out = String::new();
        top.render("", &self.unit, &mut out);
        if self.final_newline {
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TEXT: &str = r#"{
  "zeta": 0.30000000000000004,
  "alpha": [1e-7,  123456789.123456789 , 18446744073709551616],
  "escaped": "caf\u00e9 \/ done",
  "projects": {
    "/p": {
      "mcpServers": {
        "s": {
          "command": "s",
          "args": ["-x"]
        }
      },
      "cost": 1.10
    }
  },
  "zeta": 2.50
}
"#;

    fn render(m: &Members, layout: &Layout) -> String {
        layout.render(m)
    }

    #[test]
    fn read_and_written_back_unchanged_is_the_same_text() {
        let m = Members::parse(TEXT).unwrap();
        assert_eq!(
            m.keys().collect::<Vec<_>>(),
            ["zeta", "alpha", "escaped", "projects"]
        );
        let layout = Layout::of(TEXT);
        assert_eq!(layout, Layout::default());
        // The duplicate key keeps its first place and takes its last value.
        let expected = TEXT
            .replace("  \"zeta\": 0.30000000000000004,\n", "  \"zeta\": 2.50,\n")
            .replace(",\n  \"zeta\": 2.50\n}", "\n}");
        assert_eq!(render(&m, &layout), expected);
        assert_eq!(m.to_value()["zeta"], json!(2.5));
    }

    #[test]
    fn an_edit_deep_inside_keeps_every_other_value_as_written() {
        let mut m = Members::parse(TEXT).unwrap();
        let servers = m
            .object_mut("projects")
            .unwrap()
            .object_mut("/p")
            .unwrap()
            .object_mut("mcpServers")
            .unwrap();
        let s = servers.remove("s").unwrap();
        servers.insert("codebox".into(), Node::Value(json!({"args": ["serve"]})));
        let text = render(&m, &Layout::of(TEXT));
        for kept in [
            "\"alpha\": [1e-7,  123456789.123456789 , 18446744073709551616],",
            "\"escaped\": \"caf\\u00e9 \\/ done\",",
            "\"cost\": 1.10",
        ] {
            assert!(text.contains(kept), "{kept} in\n{text}");
        }
        assert!(
            text.contains(
                "      \"mcpServers\": {\n        \"codebox\": {\n          \"args\": [\n            \"serve\"\n          ]\n        }\n      },\n"
            ),
            "{text}"
        );
        // Moved to the top of another file and back, it is re-indented each time.
        let mut other = Members::default();
        other
            .object_mut("mcpServers")
            .unwrap()
            .insert("s".into(), s.clone().moved());
        let other_text = render(&other, &Layout::default());
        assert_eq!(
            other_text,
            "{\n  \"mcpServers\": {\n    \"s\": {\n      \"command\": \"s\",\n      \"args\": [\"-x\"]\n    }\n  }\n}\n"
        );
        let back = Members::parse(&other_text)
            .unwrap()
            .get("mcpServers")
            .unwrap()
            .members()
            .unwrap();
        let servers = m
            .object_mut("projects")
            .unwrap()
            .object_mut("/p")
            .unwrap()
            .object_mut("mcpServers")
            .unwrap();
        servers.remove("codebox");
        servers.insert("s".into(), back.get("s").unwrap().clone().moved());
        let expected = TEXT
            .replace("  \"zeta\": 0.30000000000000004,\n", "  \"zeta\": 2.50,\n")
            .replace(",\n  \"zeta\": 2.50\n}", "\n}");
        assert_eq!(render(&m, &Layout::of(TEXT)), expected);
    }

    #[test]
    fn layouts_are_read_from_the_file() {
        let tabs = "{\n\t\"a\": {\"b\": 1}\n}";
        let layout = Layout::of(tabs);
        assert_eq!((layout.unit.as_str(), layout.final_newline), ("\t", false));
        assert_eq!(render(&Members::parse(tabs).unwrap(), &layout), tabs);
        let four = "\n\n{\n\n    \"a\": 1}\n";
        assert_eq!(Layout::of(four).unit, "    ");
        let minified = r#"{"a":{"b":[1.0,2]},"c":1E+40}"#;
        let layout = Layout::of(minified);
        assert_eq!(layout.unit, "  ");
        let mut m = Members::parse(minified).unwrap();
        m.object_mut("a")
            .unwrap()
            .insert("d".into(), Node::Value(json!(null)));
        assert_eq!(
            render(&m, &layout),
            "{\n  \"a\": {\n    \"b\": [1.0,2],\n    \"d\": null\n  },\n  \"c\": 1E+40\n}"
        );
    }

    #[test]
    fn not_objects() {
        assert!(Members::parse("[]").is_none());
        assert!(Members::parse(" 1").is_none());
        let mut m = Members::parse(r#"{"a": [1]}"#).unwrap();
        assert_eq!(m.object_mut("a").unwrap_err(), NotAnObject);
        assert!(m.object_mut("new").unwrap().is_empty());
        assert_eq!(m.to_value(), json!({"a": [1], "new": {}}));
    }

    #[test]
    fn reindenting_moves_the_base_only() {
        assert_eq!(reindent("[1, 2]", "    "), "[1, 2]");
        assert_eq!(
            reindent("{\n      \"a\": 1\n    }", "  "),
            "{\n    \"a\": 1\n  }"
        );
        assert_eq!(reindent("{\n\"a\": 1\n    }", "  "), "{\n\"a\": 1\n  }");
    }
}
