//! Text from upstream servers (descriptions, names, enum values) written into generated
//! source: doc comments and string literals that no input can break out of.

use std::fmt::Write as _;

/// Line breaks (including the ones JavaScript treats as line terminators) as `\n`.
pub fn normalize_newlines(text: &str) -> String {
    text.replace("\r\n", "\n")
        .replace(['\r', '\u{2028}', '\u{2029}'], "\n")
}

/// The lines of `text`, trailing whitespace and blank edges removed.
fn lines(text: &str) -> Vec<String> {
    let text = normalize_newlines(text);
    let lines: Vec<String> = text.split('\n').map(|l| l.trim_end().to_string()).collect();
    let start = lines
        .iter()
        .position(|l| !l.is_empty())
        .unwrap_or(lines.len());
    let end = lines
        .iter()
        .rposition(|l| !l.is_empty())
        .map_or(start, |e| e + 1);
    lines[start..end].to_vec()
}

/// A `/** ... */` doc comment at `indent`, or nothing for blank text. `*/` cannot end it
/// early (it becomes `*\/`), and control characters are dropped.
pub fn ts_doc(text: &str, indent: &str) -> String {
    let lines: Vec<String> = lines(text)
        .into_iter()
        .map(|l| {
            l.chars()
                .filter(|c| !c.is_control() || *c == '\t')
                .collect::<String>()
                .replace("*/", "*\\/")
        })
        .collect();
    match lines.as_slice() {
        [] => String::new(),
        [one] => format!("{indent}/** {one} */\n"),
        many => {
            let mut out = format!("{indent}/**\n");
            for l in many {
                if l.is_empty() {
                    let _ = writeln!(out, "{indent} *");
                } else {
                    let _ = writeln!(out, "{indent} * {l}");
                }
            }
            let _ = writeln!(out, "{indent} */");
            out
        }
    }
}

/// A TypeScript string literal (JSON, with the JavaScript line separators escaped too).
pub fn ts_string(s: &str) -> String {
    serde_json::to_string(s)
        .expect("strings serialise")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

fn py_escape_char(out: &mut String, c: char) {
    match c {
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if (c as u32) < 0x20 || c == '\u{7f}' => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c => out.push(c),
    }
}

/// A double-quoted Python string literal.
pub fn py_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        if c == '"' {
            out.push_str("\\\"");
        } else {
            py_escape_char(&mut out, c);
        }
    }
    out.push('"');
    out
}

/// A Python docstring (`"""..."""`), its continuation lines at `indent`. Backslashes are
/// doubled and a quote next to another quote (or at the end) is escaped, so neither
/// `"""` nor `\` sequences in the text can end or alter the literal.
pub fn py_docstring(text: &str, indent: &str) -> String {
    let body = lines(text).join("\n");
    let chars: Vec<char> = body.chars().collect();
    // A multi-line docstring closes on a line of its own, where no quote can touch it.
    let closes_inline = !body.contains('\n');
    let mut out = String::from("\"\"\"");
    for (i, &c) in chars.iter().enumerate() {
        match (c, chars.get(i + 1)) {
            ('"', Some('"')) => out.push_str("\\\""),
            ('"', None) if closes_inline => out.push_str("\\\""),
            ('\n', next) => {
                out.push('\n');
                if next.is_some_and(|n| *n != '\n') {
                    out.push_str(indent);
                }
            }
            ('\t', _) => out.push('\t'),
            (c, _) => py_escape_char(&mut out, c),
        }
    }
    if body.contains('\n') {
        out.push('\n');
        out.push_str(indent);
    }
    out.push_str("\"\"\"");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ts_doc_cannot_be_closed_early() {
        assert_eq!(ts_doc("a */ b", ""), "/** a *\\/ b */\n");
        assert_eq!(ts_doc("  \n\n", ""), "");
        assert_eq!(
            ts_doc("one\r\n\r\ntwo\u{2028}x", "  "),
            "  /**\n   * one\n   *\n   * two\n   * x\n   */\n"
        );
        assert_eq!(ts_doc("bell\u{7}*/*/", ""), "/** bell*\\/*\\/ */\n");
    }

    #[test]
    fn ts_string_literals() {
        assert_eq!(ts_string("a\"b\\c\n"), r#""a\"b\\c\n""#);
        assert_eq!(ts_string("x\u{2028}"), r#""x\u2028""#);
    }

    #[test]
    fn python_literals() {
        assert_eq!(py_string("a\"b\\c\n\u{0}"), r#""a\"b\\c\n\x00""#);
        assert_eq!(py_docstring("plain", "    "), r#""""plain""""#);
        assert_eq!(
            py_docstring(r#"say """hi""" \n"#, ""),
            r#""""say \"\""hi\"\"" \\n""""#
        );
        assert_eq!(
            py_docstring("ends with \"", ""),
            "\"\"\"ends with \\\"\"\"\""
        );
        assert_eq!(
            py_docstring("a\n\nb", "    "),
            "\"\"\"a\n\n    b\n    \"\"\""
        );
        assert_eq!(py_docstring("a\n\"b\"", ""), "\"\"\"a\n\"b\"\n\"\"\"");
    }
}
