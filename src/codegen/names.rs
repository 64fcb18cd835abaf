//! Identifiers for generated code: camelCase / PascalCase for TypeScript, sanitised names
//! for Python, reserved-word escaping, and a [`Namer`] that keeps names unique.
//!
//! Everything here is ASCII: characters outside `[A-Za-z0-9]` separate words (TypeScript)
//! or become `_` (Python), so an upstream name can never smuggle anything into the code.

use std::collections::HashSet;

/// Words that cannot name a function or variable in a TypeScript module (reserved words,
/// strict-mode and module reserved words, and globals a declaration must not shadow).
pub const TS_RESERVED: &[&str] = &[
    "break",
    "case",
    "catch",
    "class",
    "const",
    "continue",
    "debugger",
    "default",
    "delete",
    "do",
    "else",
    "enum",
    "export",
    "extends",
    "false",
    "finally",
    "for",
    "function",
    "if",
    "import",
    "in",
    "instanceof",
    "new",
    "null",
    "return",
    "super",
    "switch",
    "this",
    "throw",
    "true",
    "try",
    "typeof",
    "var",
    "void",
    "while",
    "with",
    "implements",
    "interface",
    "let",
    "package",
    "private",
    "protected",
    "public",
    "static",
    "yield",
    "await",
    "arguments",
    "eval",
    "undefined",
    "NaN",
    "Infinity",
    "as",
    "async",
    "of",
    "type",
    "any",
    "unknown",
    "never",
];

/// Whether `name` is reserved in TypeScript or Python (see the two lists).
pub fn is_reserved(name: &str) -> bool {
    TS_RESERVED.contains(&name) || PY_KEYWORDS.contains(&name)
}

/// Python 3.11 keywords (`keyword.kwlist`); soft keywords are valid names.
pub const PY_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// Splits a name into words: at characters outside `[A-Za-z0-9]`, at lower→upper case
/// changes (`readText`), and before the last capital of an acronym (`HTTPGet`).
pub fn words(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for chunk in name.split(|c: char| !c.is_ascii_alphanumeric()) {
        let chars: Vec<char> = chunk.chars().collect();
        let mut start = 0;
        for i in 1..chars.len() {
            let (prev, cur) = (chars[i - 1], chars[i]);
            let next_lower = chars.get(i + 1).is_some_and(|c| c.is_ascii_lowercase());
            let boundary = ((prev.is_ascii_lowercase() || prev.is_ascii_digit())
                && cur.is_ascii_uppercase())
                || (prev.is_ascii_uppercase() && cur.is_ascii_uppercase() && next_lower);
            if boundary {
                out.push(chars[start..i].iter().collect());
                start = i;
            }
        }
        if start < chars.len() {
            out.push(chars[start..].iter().collect());
        }
    }
    out
}

fn capitalize(word: &str) -> String {
    let lower = word.to_ascii_lowercase();
    let mut chars = lower.chars();
    match chars.next() {
        Some(c) => c.to_ascii_uppercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

/// `read_text_file` → `readTextFile`; never empty, never starts with a digit.
pub fn camel_case(name: &str) -> String {
    let words = words(name);
    let mut out = String::new();
    for (i, w) in words.iter().enumerate() {
        if i == 0 {
            out.push_str(&w.to_ascii_lowercase());
        } else {
            out.push_str(&capitalize(w));
        }
    }
    identifier_start(out, "tool")
}

/// `read_text_file` → `ReadTextFile`; never empty, never starts with a digit.
pub fn pascal_case(name: &str) -> String {
    let out: String = words(name).iter().map(|w| capitalize(w)).collect();
    identifier_start(out, "Type")
}

fn identifier_start(name: String, empty: &str) -> String {
    if name.is_empty() {
        empty.to_string()
    } else if name.starts_with(|c: char| c.is_ascii_digit()) {
        format!("_{name}")
    } else {
        name
    }
}

/// A TypeScript value name: `name` itself, or `name_` when it is reserved.
pub fn ts_value_ident(name: &str) -> String {
    if TS_RESERVED.contains(&name) {
        format!("{name}_")
    } else {
        name.to_string()
    }
}

/// Whether `name` can be written unquoted as a TypeScript property name.
pub fn is_ts_property_ident(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
}

/// A Python name for `name`: `max-results` → `max_results`, `from` → `from_`, `2d` → `_2d`.
/// Dunder names (`__doc__`) lose a trailing underscore so they cannot clobber module
/// attributes; callers that need it pass `dunder_ok`.
pub fn py_ident(name: &str, dunder_ok: bool) -> String {
    let mut out: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    if PY_KEYWORDS.contains(&out.as_str()) {
        out.push('_');
    }
    if !dunder_ok && out.len() > 4 && out.starts_with("__") && out.ends_with("__") {
        out.pop();
    }
    out
}

/// Hands out unique names: the wanted one, else `wanted` + separator + 2, 3, ...
#[derive(Debug, Clone)]
pub struct Namer {
    taken: HashSet<String>,
    separator: &'static str,
}

impl Namer {
    pub fn new(separator: &'static str, reserved: &[&str]) -> Self {
        Namer {
            taken: reserved.iter().map(|s| s.to_string()).collect(),
            separator,
        }
    }

    pub fn is_taken(&self, name: &str) -> bool {
        self.taken.contains(name)
    }

    pub fn claim(&mut self, wanted: &str) -> String {
        if self.taken.insert(wanted.to_string()) {
            return wanted.to_string();
        }
        (2u64..)
            .map(|n| format!("{wanted}{}{n}", self.separator))
            .find(|candidate| self.taken.insert(candidate.clone()))
            .expect("an unused suffix exists")
    }
}

/// Names for `originals` (in order), unique in `namer`: names that need no change are
/// claimed first, so `max_results` keeps its name even if `max-results` comes earlier.
pub fn allocate(
    namer: &mut Namer,
    originals: &[&str],
    convert: impl Fn(&str) -> String,
) -> Vec<String> {
    let converted: Vec<String> = originals.iter().map(|o| convert(o)).collect();
    let mut out: Vec<Option<String>> = vec![None; originals.len()];
    for (i, (orig, conv)) in originals.iter().zip(&converted).enumerate() {
        if orig == conv && !namer.is_taken(conv) {
            out[i] = Some(namer.claim(conv));
        }
    }
    out.into_iter()
        .zip(converted)
        .map(|(done, conv)| done.unwrap_or_else(|| namer.claim(&conv)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn camel_and_pascal() {
        assert_eq!(camel_case("read_text_file"), "readTextFile");
        assert_eq!(camel_case("get-weather"), "getWeather");
        assert_eq!(camel_case("readTextFile"), "readTextFile");
        assert_eq!(camel_case("HTTPGet"), "httpGet");
        assert_eq!(camel_case("get_URL"), "getUrl");
        assert_eq!(camel_case("v2_api"), "v2Api");
        assert_eq!(camel_case("2fa"), "_2fa");
        assert_eq!(camel_case("--"), "tool");
        assert_eq!(camel_case("é/../x"), "x");
        assert_eq!(pascal_case("read_text_file"), "ReadTextFile");
        assert_eq!(pascal_case("getX2"), "GetX2");
        assert_eq!(pascal_case("delete_"), "Delete");
        assert_eq!(pascal_case(""), "Type");
    }

    #[test]
    fn typescript_reserved_words_are_escaped() {
        assert_eq!(ts_value_ident("delete"), "delete_");
        assert_eq!(ts_value_ident("eval"), "eval_");
        assert_eq!(ts_value_ident("readTextFile"), "readTextFile");
        assert!(is_ts_property_ident("__proto__"));
        assert!(is_ts_property_ident("$ref"));
        assert!(!is_ts_property_ident("max-results"));
        assert!(!is_ts_property_ident("0"));
        assert!(!is_ts_property_ident(""));
    }

    #[test]
    fn python_names() {
        assert_eq!(py_ident("max-results", true), "max_results");
        assert_eq!(py_ident("from", true), "from_");
        assert_eq!(py_ident("None", true), "None_");
        assert_eq!(py_ident("2d", true), "_2d");
        assert_eq!(py_ident("", true), "_");
        assert_eq!(py_ident("naïve", true), "na_ve");
        assert_eq!(py_ident("__proto__", true), "__proto__");
        assert_eq!(py_ident("__doc__", false), "__doc_");
        assert_eq!(py_ident("match", false), "match");
    }

    #[test]
    fn namer_suffixes_and_allocation_prefers_unchanged_names() {
        let mut n = Namer::new("_", &["_codebox"]);
        assert_eq!(n.claim("_codebox"), "_codebox_2");
        assert_eq!(n.claim("a"), "a");
        assert_eq!(n.claim("a"), "a_2");
        let mut n = Namer::new("_", &[]);
        let names = allocate(&mut n, &["max-results", "max_results", "class"], |s| {
            py_ident(s, true)
        });
        assert_eq!(names, ["max_results_2", "max_results", "class_"]);
    }
}
