//! The forms a host may echo a secret in, as one pattern per secret.
//!
//! A host that reflects a request writes the credential back raw, or encoded the way its
//! framework encodes: percent-encoding with any set of characters kept (RFC 3986's
//! unreserved, Python's `quote` keeping `/`, `encodeURIComponent`, every byte), hex in
//! either case, a space as `%20` or `+`; JSON string escapes (`\/` as PHP writes it, `\"`,
//! `\\`, `\u00XX`); HTML character references (`&#x2F;`, `&#47;`, `&amp;`, `&quot;` ...).
//! Encoders differ only in which characters they encode and how, so rather than a list of
//! encoders each byte of the secret matches any of its encodings, independently: the
//! pattern matches every string that decodes (one layer, each character by any of these
//! schemes) to the secret, mixed forms included, and nothing else.
//!
//! Not covered, and why:
//! - two layers (`%252F`: a URL inside a URL): the wire form of a query credential is
//!   itself a secret, so its single encoding (the whole URL encoded again) is covered;
//!   deeper nesting is a host transforming the value on purpose;
//! - base64, hashes, case changes, reversal, splitting: the value transformed, not
//!   escaped; base64 of a substring depends on its alignment in the encoded whole, so
//!   no pattern of the secret alone finds it (README: such hosts defeat redaction);
//! - `\u` escapes of non-ASCII characters and character references above 0x7F: they
//!   encode code points, not bytes; header credentials are ASCII, and a query value's
//!   non-ASCII bytes are still matched raw and percent-encoded (as UTF-8 bytes, as URLs
//!   carry them).
//!
//! Every alternative of a byte is at most [`MAX_FORM_LEN`] bytes long, so a match of a
//! secret of `n` bytes is at most `n * MAX_FORM_LEN` bytes: the streaming redactor holds
//! back that much.

/// The longest encoding of one byte: `\u002F`, `&#x2F;`, `&#126;`, `&quot;` (6 bytes).
pub const MAX_FORM_LEN: usize = 6;

/// The longest secret a credential may have. The automaton matching every form of every
/// secret grows with their length (about 20 states per byte): these bounds keep it
/// small enough to build at start-up in well under a second and to stay a lazy DFA,
/// linear in the text (`cargo bench --bench redaction`).
pub const MAX_SECRET_BYTES: usize = 4096;
/// The most bytes all secrets together may have (their derived forms included: the
/// `Bearer ` header value, a query value's wire form).
pub const MAX_ALL_SECRETS_BYTES: usize = 16 << 10;

/// A regex (bytes, no Unicode classes) matching `secret` raw or in any of the forms above.
pub fn pattern(secret: &[u8]) -> String {
    secret.iter().map(|&b| byte_forms(b)).collect()
}

/// The longest text [`pattern`] of `secret` can match.
pub fn longest_match(secret: &[u8]) -> usize {
    secret.len() * MAX_FORM_LEN
}

/// A group matching the byte `b` raw or in any encoding of it.
fn byte_forms(b: u8) -> String {
    let hex = |n: u8| -> String {
        let c = char::from_digit(u32::from(n), 16).expect("a nibble");
        match c.is_ascii_alphabetic() {
            true => format!("[{}{}]", c.to_ascii_lowercase(), c.to_ascii_uppercase()),
            false => c.to_string(),
        }
    };
    let (hi, lo) = (hex(b >> 4), hex(b & 0xf));
    let mut forms = vec![
        // The byte itself (\xHH: any byte, also non-ASCII ones, as a literal).
        format!(r"\x{b:02x}"),
        // Percent-encoding, either hex case.
        format!("%{hi}{lo}"),
    ];
    if b.is_ascii() {
        // JSON's \u escape (the `u` is lower-case in JSON), HTML's hex and decimal
        // character references (`x` either case).
        forms.push(format!(r"\\u00{hi}{lo}"));
        forms.push(format!("&#[xX]{hi}{lo};"));
        forms.push(format!("&#{b};"));
    }
    let extra: &[&str] = match b {
        b' ' => &[r"\+"],
        b'/' => &[r"\\/"],
        b'"' => &[r#"\\""#, "&quot;"],
        b'\\' => &[r"\\\\"],
        b'&' => &["&amp;"],
        b'<' => &["&lt;"],
        b'>' => &["&gt;"],
        b'\'' => &["&apos;"],
        _ => &[],
    };
    forms.extend(extra.iter().map(|s| s.to_string()));
    format!("(?:{})", forms.join("|"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(secret: &str) -> regex::bytes::Regex {
        regex::bytes::RegexBuilder::new(&format!("^(?:{})$", pattern(secret.as_bytes())))
            .unicode(false)
            .build()
            .unwrap()
    }

    #[test]
    fn every_form_of_each_byte_and_no_other() {
        let m = matcher("a/ b");
        for text in [
            "a/ b",
            "a%2F%20b",
            "a%2f+b",
            "%61%2F%20%62",
            "a\\/ b",
            "a\\u002f\\u0020b",
            "a&#x2F;&#32;b",
            "a&#X2f;&#x20;b",
            "a&#47; b",
            "a/+b",
        ] {
            assert!(m.is_match(text.as_bytes()), "{text}");
        }
        for text in [
            "a/ c",
            "a%2G b",
            "a%2F b ",
            "A/ b",
            "a//b",
            "a\\U002f b",
            "a&#x2F b",
            "a&#047; b",
            "a/%2B b",
            "a/%25 b",
        ] {
            assert!(!m.is_match(text.as_bytes()), "{text}");
        }
    }

    #[test]
    fn specials_have_their_named_and_escaped_forms() {
        let m = matcher(r#"&<>"'\"#);
        assert!(m.is_match(br#"&amp;&lt;&gt;&quot;&apos;\\"#));
        assert!(m.is_match(br#"&#38;&#60;&#62;\"&#x27;%5C"#));
        assert!(m.is_match(br#"%26%3C%3E%22%27%5c"#));
        // A plus stays a plus (or %2B): only a space may be written `+`.
        let plus = matcher("a+b");
        assert!(plus.is_match(b"a+b") && plus.is_match(b"a%2Bb"));
        assert!(!plus.is_match(b"a b") && !plus.is_match(b"a%20b"));
    }

    #[test]
    fn non_ascii_bytes_match_raw_and_percent_encoded() {
        let m = matcher("é");
        assert!(m.is_match("é".as_bytes()));
        assert!(m.is_match(b"%C3%A9") && m.is_match(b"%c3%a9"));
        assert!(!m.is_match(b"\\u00e9"));
    }

    #[test]
    fn no_match_is_longer_than_the_bound() {
        let secret = "/\"&'<>\\ ~é";
        let longest_form = "&#x2F;&quot;&amp;&apos;&lt;&gt;\\u005c&#x20;&#126;%C3%A9";
        assert!(matcher(secret).is_match(longest_form.as_bytes()));
        assert!(longest_form.len() <= longest_match(secret.as_bytes()));
    }
}
