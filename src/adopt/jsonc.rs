//! Claude Code's files are JSON, but people edit them by hand and JSONC habits slip in:
//! `//` and `/* */` comments, a comma before `}` or `]`, a byte-order mark. [`parse`]
//! reads those: each is blanked to spaces (newlines kept, so an error's line and column
//! still point into the text as written) and counted, so the caller can say that the
//! rewrite will not keep them. Anything else that is not JSON is an error with its line
//! and column. A file holding only whitespace is an empty object.
//!
//! Besides the parsed value, [`Parsed::text`] is the file as JSON for a rewrite that keeps
//! values as written: comments and trailing commas gone, and with them the space they
//! leave at the end of a line and the lines they held alone.

use serde_json::Value;

/// A parsed file and what of it a rewrite cannot keep.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub value: Value,
    /// The text as plain JSON (`{}` for an empty file).
    pub text: String,
    pub comments: usize,
    pub trailing_commas: usize,
    /// The file held only whitespace (read as `{}`).
    pub empty: bool,
}

impl Parsed {
    /// What a rewrite drops, in words (`None`: nothing).
    pub fn dropped(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.comments > 0 {
            parts.push(plural(self.comments, "comment"));
        }
        if self.trailing_commas > 0 {
            parts.push(plural(self.trailing_commas, "trailing comma"));
        }
        (!parts.is_empty()).then(|| parts.join(" and "))
    }
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// Where the text stops being JSON (1-based line and column, as serde_json counts them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Parses `text` as JSON with comments and trailing commas.
pub fn parse(text: &[u8]) -> Result<Parsed, SyntaxError> {
    let mut bytes = text.to_vec();
    if bytes.starts_with(b"\xef\xbb\xbf") {
        bytes[..3].fill(b' ');
    }
    let comments = blank_comments(&mut bytes)?;
    let trailing_commas = blank_trailing_commas(&mut bytes);
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Parsed {
            value: Value::Object(Default::default()),
            text: "{}".into(),
            comments,
            trailing_commas,
            empty: true,
        });
    }
    let value = serde_json::from_slice(&bytes).map_err(|e| {
        let text = e.to_string();
        // serde_json ends its message with " at line L column C"; we report those apart.
        let message = match text.rfind(" at line ") {
            Some(at) => text[..at].to_string(),
            None => text,
        };
        SyntaxError {
            line: e.line(),
            column: e.column(),
            message,
        }
    })?;
    let tidied = match comments + trailing_commas {
        0 => bytes,
        _ => tidy(text, &bytes),
    };
    // serde_json has checked every string; the rest of valid JSON is ASCII.
    let text = String::from_utf8(tidied).map_err(|e| SyntaxError {
        line: 1,
        column: 1,
        message: format!("not UTF-8: {e}"),
    })?;
    Ok(Parsed {
        value,
        text,
        comments,
        trailing_commas,
        empty: false,
    })
}

/// `blanked` without what blanking left behind: on each line that blanking changed, the
/// spaces at its end, and the line itself when nothing else is left on it. (No string
/// holds a newline, so the end of a line is never inside one.)
fn tidy(original: &[u8], blanked: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(blanked.len());
    let lines = |b: &[u8]| -> Vec<Vec<u8>> {
        b.split_inclusive(|&c| c == b'\n')
            .map(<[u8]>::to_vec)
            .collect()
    };
    for (was, now) in lines(original).iter().zip(lines(blanked)) {
        if *was == now {
            out.extend_from_slice(&now);
            continue;
        }
        let newline = now.ends_with(b"\n");
        let body = now.strip_suffix(b"\n").unwrap_or(&now).trim_ascii_end();
        if body.is_empty() {
            continue;
        }
        out.extend_from_slice(body);
        if newline {
            out.push(b'\n');
        }
    }
    out
}

/// The index just past the string that opens at `start` (a `"`), or the end of the text
/// when it is not closed (serde_json then reports it).
fn skip_string(bytes: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// Blanks `// ...` and `/* ... */` outside strings; how many there were.
fn blank_comments(bytes: &mut [u8]) -> Result<usize, SyntaxError> {
    let mut count = 0;
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1)) {
            (b'"', _) => {
                i = skip_string(bytes, i);
                continue;
            }
            (b'/', Some(b'/')) => {
                count += 1;
                while i < bytes.len() && bytes[i] != b'\n' {
                    bytes[i] = b' ';
                    i += 1;
                }
            }
            (b'/', Some(b'*')) => {
                count += 1;
                let Some(len) = bytes[i + 2..].windows(2).position(|w| w == b"*/") else {
                    let (line, column) = line_and_column(bytes, i);
                    return Err(SyntaxError {
                        line,
                        column,
                        message: "a /* comment is never closed".into(),
                    });
                };
                let end = i + 2 + len + 2;
                for b in &mut bytes[i..end] {
                    if *b != b'\n' {
                        *b = b' ';
                    }
                }
                i = end;
            }
            _ => i += 1,
        }
    }
    Ok(count)
}

/// Blanks a `,` that only whitespace separates from the `}` or `]` after it; how many.
fn blank_trailing_commas(bytes: &mut [u8]) -> usize {
    let mut count = 0;
    let mut comma: Option<usize> = None;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                comma = None;
                i = skip_string(bytes, i);
                continue;
            }
            b',' => comma = Some(i),
            b'}' | b']' => {
                if let Some(at) = comma.take() {
                    bytes[at] = b' ';
                    count += 1;
                }
            }
            b if b.is_ascii_whitespace() => {}
            _ => comma = None,
        }
        i += 1;
    }
    count
}

/// 1-based line and column of byte `at`.
fn line_and_column(bytes: &[u8], at: usize) -> (usize, usize) {
    let before = &bytes[..at];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = at
        - before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |p| p + 1)
        + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn plain_json_is_read_as_is() {
        let p = parse(br#"{"a": [1, 2], "b": "x"}"#).unwrap();
        assert_eq!(p.value, json!({"a": [1, 2], "b": "x"}));
        assert_eq!((p.comments, p.trailing_commas, p.empty), (0, 0, false));
        assert_eq!(p.dropped(), None);
    }

    #[test]
    fn comments_and_trailing_commas_are_read_and_counted() {
        let text = b"\xef\xbb\xbf{\n  // servers\n  \"a\": \"x // not a comment\", /* one\n two */\n  \"b\": [1, 2,],\n  \"c\": \"/* nor this */\",\n}\n";
        let p = parse(text).unwrap();
        assert_eq!(
            p.value,
            json!({"a": "x // not a comment", "b": [1, 2], "c": "/* nor this */"})
        );
        assert_eq!((p.comments, p.trailing_commas), (2, 2));
        assert_eq!(
            p.dropped().as_deref(),
            Some("2 comments and 2 trailing commas")
        );
        // The JSON text: the comment lines gone, what is left of the others trimmed.
        assert_eq!(
            p.text,
            "   {\n  \"a\": \"x // not a comment\",\n  \"b\": [1, 2 ],\n  \"c\": \"/* nor this */\"\n}\n"
        );
        assert_eq!(serde_json::from_str::<Value>(&p.text).unwrap(), p.value);
    }

    #[test]
    fn plain_json_keeps_its_text() {
        let text = "{\n  \"a\": 1.10,   \n\n  \"b\": \"\\u00e9\"\n}";
        assert_eq!(parse(text.as_bytes()).unwrap().text, text);
        assert_eq!(parse(b"  ").unwrap().text, "{}");
    }

    #[test]
    fn escaped_quotes_do_not_end_a_string() {
        let p = parse(br#"{"a": "say \"// hi\" \\", "b": 1}"#).unwrap();
        assert_eq!(p.value, json!({"a": "say \"// hi\" \\", "b": 1}));
        assert_eq!(p.comments, 0);
    }

    #[test]
    fn errors_name_line_and_column_of_the_text_as_written() {
        let e = parse(b"{\n  /* a comment */ \"a\": 1\n  \"b\": 2\n}").unwrap_err();
        assert_eq!((e.line, e.column), (3, 3), "{e:?}");
        assert!(e.message.contains("expected"), "{e:?}");
        assert!(!e.message.contains("at line"), "{e:?}");
        let e = parse(b"{\"a\": 1}\n  /* open").unwrap_err();
        assert_eq!((e.line, e.column), (2, 3), "{e:?}");
        assert!(e.message.contains("never closed"), "{e:?}");
        let e = parse(b"{\"a\": [1,,]}").unwrap_err();
        assert_eq!(e.line, 1, "{e:?}");
    }

    #[test]
    fn whitespace_only_is_an_empty_object() {
        let p = parse(b" \n\t").unwrap();
        assert_eq!(p.value, json!({}));
        assert!(p.empty);
        let p = parse(b"// nothing yet\n").unwrap();
        assert!(p.empty && p.comments == 1);
    }
}
