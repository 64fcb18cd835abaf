//! Lengths of text inside a JSON string, as serde_json escapes it, and text cut in pieces
//! by that length: what the result renderer, the progress forwarder and the kept outputs'
//! pages measure, so a piece that fits here fits on the wire.

/// Bytes `c` takes inside a JSON string as serde_json writes it.
pub fn escaped_char_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// Bytes `s` takes inside a JSON string.
pub fn escaped_len(s: &str) -> usize {
    s.chars().map(escaped_char_len).sum()
}

/// `s` in consecutive pieces of at most `max` escaped bytes each (for progress
/// notifications, which carry output as it comes).
pub fn pieces(s: &str, max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut used) = (0, 0);
    for (i, c) in s.char_indices() {
        let n = escaped_char_len(c);
        if used + n > max && i > start {
            out.push(&s[start..i]);
            (start, used) = (i, 0);
        }
        used += n;
    }
    if start < s.len() {
        out.push(&s[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_text_within_the_bound() {
        let s = format!("{}{}", "\u{1}".repeat(1000), "é".repeat(1000));
        let p = pieces(&s, 100);
        assert_eq!(p.concat(), s);
        assert!(p.iter().all(|x| escaped_len(x) <= 100));
        assert!(pieces("", 10).is_empty());
    }
}
