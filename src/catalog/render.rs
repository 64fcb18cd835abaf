//! A tool as a search result, at each [`Detail`](crate::catalog::Detail):
//!
//! - name: `{name}`
//! - summary: `{name, server, description, typescript, python}`: the first sentence of
//!   the description (≤ [`SUMMARY_CHARS`]), the one-line TypeScript signature and the
//!   Python `def` line
//! - full: `{name, server, tool, title, description, input_schema, output_schema,
//!   typescript, python}`: TypeScript declarations and the Python `def` line
//! - [`SearchIndex::get`](crate::catalog::SearchIndex::get): full plus
//!   `example: {python, typescript}`
//!
//! Signatures and examples come from [`codegen::describe`], so they are the wrappers'.

use serde_json::{json, Value};

use crate::codegen::{describe, ToolNames};
use crate::upstream::catalog::CatalogTool;

/// Longest summary description, in characters.
pub const SUMMARY_CHARS: usize = 200;

pub fn name(tool: &CatalogTool) -> Value {
    json!({ "name": tool.name })
}

pub fn summary(tool: &CatalogTool, names: &ToolNames) -> Value {
    json!({
        "name": tool.name,
        "server": tool.server,
        "description": summary_description(tool),
        "typescript": describe::ts_signature_line(tool, names),
        "python": describe::py_def_line(tool, names),
    })
}

pub fn full(tool: &CatalogTool, names: &ToolNames) -> Value {
    json!({
        "name": tool.name,
        "server": tool.server,
        "tool": tool.tool,
        "title": tool.title,
        "description": tool.description,
        "input_schema": tool.input_schema,
        "output_schema": tool.output_schema,
        "typescript": describe::ts_declaration(tool, names),
        "python": describe::py_def_line(tool, names),
    })
}

/// One tool of a search page as the answer's text shows it: its name (and its server's
/// state when marked), the description, then the signatures its detail level has, one
/// language a line (a multi-line declaration's further lines indented):
///
/// ```text
/// filesystem__read_text_file: Read the complete contents of a file as text.
///   ts: function readTextFile(input: { path: string; head?: number }): Promise<{ content: string }>
///   py: def read_text_file(path: str, *, head: float | None = None) -> Any
/// ```
pub fn text_entry(tool: &Value) -> String {
    let mut text = tool["name"].as_str().unwrap_or_default().to_string();
    if let Some(state) = tool.get("server_status").and_then(Value::as_str) {
        text.push_str(&format!(" (its server is {state})"));
    }
    if let Some(d) = tool.get("description").and_then(Value::as_str) {
        text.push_str(": ");
        text.push_str(d);
    }
    text.push('\n');
    for (key, label) in [("typescript", "ts"), ("python", "py")] {
        if let Some(signature) = tool.get(key).and_then(Value::as_str) {
            text.push_str("  ");
            text.push_str(label);
            text.push_str(": ");
            text.push_str(&signature.trim_end().replace('\n', "\n    "));
            text.push('\n');
        }
    }
    text
}

/// `full` with an example call in each language.
pub fn with_example(mut full: Value, tool: &CatalogTool, names: &ToolNames) -> Value {
    full["example"] = json!({
        "python": describe::example_python(tool, names),
        "typescript": describe::example_typescript(tool, names),
    });
    full
}

/// The description's first sentence (or its title when it has none), whitespace
/// collapsed, cut at a word to at most [`SUMMARY_CHARS`] characters with `…`.
pub fn summary_description(tool: &CatalogTool) -> String {
    let text = [tool.description.as_deref(), tool.title.as_deref()]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|t| !t.is_empty())
        .unwrap_or_default();
    let line = text.lines().next().unwrap_or_default();
    let sentence = first_sentence(line);
    let words: Vec<&str> = sentence.split_whitespace().collect();
    shorten(&words.join(" "), SUMMARY_CHARS)
}

/// Up to and including the first `.`, `!` or `?` followed by whitespace, or all of it.
fn first_sentence(line: &str) -> &str {
    let mut chars = line.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if matches!(c, '.' | '!' | '?') && chars.peek().is_some_and(|(_, n)| n.is_whitespace()) {
            return &line[..i + c.len_utf8()];
        }
    }
    line
}

fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let cut: String = text.chars().take(max - 1).collect();
    let at_word = match cut.rfind(' ') {
        Some(space) if space >= cut.len() / 2 => &cut[..space],
        _ => &cut,
    };
    format!("{}…", at_word.trim_end_matches([' ', ',', ';', ':']))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described(description: Option<&str>, title: Option<&str>) -> String {
        summary_description(&CatalogTool {
            name: "s__t".into(),
            server: "s".into(),
            tool: "t".into(),
            server_ident: "s".into(),
            tool_ident: "t".into(),
            title: title.map(String::from),
            description: description.map(String::from),
            input_schema: json!({}),
            output_schema: None,
            annotations: None,
        })
    }

    #[test]
    fn first_sentence_of_the_first_line() {
        assert_eq!(
            described(Some("Read a file as text. DEPRECATED: use x."), None),
            "Read a file as text."
        );
        assert_eq!(
            described(Some("\n  List entries\n\nMore."), None),
            "List entries"
        );
        assert_eq!(
            described(Some("Uses e.g.a version 1.2 here! Then"), None),
            "Uses e.g.a version 1.2 here!"
        );
        assert_eq!(described(Some("  "), Some("Title")), "Title");
        assert_eq!(described(None, None), "");
        assert_eq!(described(Some("a\tb   c"), None), "a b c");
    }

    #[test]
    fn long_sentences_are_cut_at_a_word() {
        let long = "word ".repeat(100);
        let short = described(Some(&long), None);
        assert!(short.chars().count() <= SUMMARY_CHARS, "{short}");
        assert!(short.ends_with("word…"), "{short}");
        let unbroken = "x".repeat(500);
        let short = described(Some(&unbroken), None);
        assert_eq!(short.chars().count(), SUMMARY_CHARS);
        let wide = "é".repeat(300);
        assert_eq!(described(Some(&wide), None).chars().count(), SUMMARY_CHARS);
    }
}
