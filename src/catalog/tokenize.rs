//! Text → search terms, the same for tools and queries.
//!
//! Words are split at anything not alphanumeric and at camelCase boundaries
//! (`readTextFile`, `HTTPGet` → http get), lowercased; a short list of stop words is
//! dropped, and plural endings are stemmed (`entities` → entity, `files` → file,
//! `processes` → process) so a query's singular finds a description's plural.

use std::borrow::Cow;

/// Words too common to say anything about a tool.
pub const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "in", "into", "is", "it",
    "its", "of", "on", "or", "that", "the", "this", "to", "with",
];

/// Calls `each` with every word of `text`, not yet lowercased: split at characters that
/// are not alphanumeric, at lower→upper changes (`readText`) and before the last capital
/// of an acronym (`HTTPGet`).
fn for_each_word<'t>(text: &'t str, mut each: impl FnMut(&'t str)) {
    for chunk in text.split(|c: char| !c.is_alphanumeric()) {
        if chunk.is_empty() {
            continue;
        }
        let mut start = 0;
        let mut chars = chunk.char_indices().peekable();
        let mut prev: Option<char> = None;
        while let Some((i, cur)) = chars.next() {
            if let Some(p) = prev {
                let next_lower = chars.peek().is_some_and(|(_, c)| c.is_lowercase());
                let boundary = ((p.is_lowercase() || p.is_numeric()) && cur.is_uppercase())
                    || (p.is_uppercase() && cur.is_uppercase() && next_lower);
                if boundary {
                    each(&chunk[start..i]);
                    start = i;
                }
            }
            prev = Some(cur);
        }
        each(&chunk[start..]);
    }
}

/// The lowercase words of `text`, stop words included, nothing stemmed.
pub fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for_each_word(text, |w| out.push(w.to_lowercase()));
    out
}

/// A plural's singular, by its ending; other words unchanged. Short words are left alone.
pub fn stem(word: &str) -> Cow<'_, str> {
    if word.chars().count() <= 3 {
        return Cow::Borrowed(word);
    }
    if let Some(base) = word.strip_suffix("ies") {
        return Cow::Owned(format!("{base}y"));
    }
    for plural in ["sses", "xes", "ches", "shes"] {
        if word.ends_with(plural) {
            return Cow::Borrowed(&word[..word.len() - 2]);
        }
    }
    if word.ends_with("ss") || word.ends_with("us") || word.ends_with("is") {
        return Cow::Borrowed(word);
    }
    Cow::Borrowed(word.strip_suffix('s').unwrap_or(word))
}

/// Calls `each` with the terms of `text`, in order, repeats included. (Words are
/// lowercased into one buffer: indexing thousands of tools allocates only for stems.)
pub fn for_each_term(text: &str, mut each: impl FnMut(&str)) {
    let mut lower = String::new();
    for_each_word(text, |w| {
        lower.clear();
        if w.is_ascii() {
            lower.push_str(w);
            lower.make_ascii_lowercase();
        } else {
            lower.extend(w.chars().flat_map(char::to_lowercase));
        }
        if !STOP_WORDS.contains(&lower.as_str()) {
            each(&stem(&lower));
        }
    });
}

/// The terms of `text`, in order, repeats included.
pub fn terms(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for_each_term(text, |t| out.push(t.to_string()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_separators_and_case_changes() {
        assert_eq!(words("read_text_file"), ["read", "text", "file"]);
        assert_eq!(words("readTextFile"), ["read", "text", "file"]);
        assert_eq!(words("get-current-time"), ["get", "current", "time"]);
        assert_eq!(words("HTTPGet v2Api"), ["http", "get", "v2", "api"]);
        assert_eq!(
            words("filesystem__read_file"),
            ["filesystem", "read", "file"]
        );
        assert_eq!(words("  Ünïcode-Wörds, (x)  "), ["ünïcode", "wörds", "x"]);
        assert_eq!(words("base64-encoded"), ["base64", "encoded"]);
        assert!(words(" -- ").is_empty());
    }

    #[test]
    fn stems_plurals() {
        for (word, term) in [
            ("entities", "entity"),
            ("directories", "directory"),
            ("files", "file"),
            ("timezones", "timezone"),
            ("processes", "process"),
            ("matches", "match"),
            ("boxes", "box"),
            ("relations", "relation"),
            ("status", "status"),
            ("class", "class"),
            ("analysis", "analysis"),
            ("has", "has"),
            ("file", "file"),
        ] {
            assert_eq!(terms(word), [term], "{word}");
        }
    }

    #[test]
    fn drops_stop_words() {
        assert_eq!(terms("Read a file"), ["read", "file"]);
        assert_eq!(
            terms("create entities in the knowledge graph"),
            ["create", "entity", "knowledge", "graph"]
        );
        assert!(terms("the of a").is_empty());
    }
}
