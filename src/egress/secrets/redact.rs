//! Streaming redaction of secret values in responses from hosts with credentials.
//!
//! Every occurrence of every secret, raw or in any form an echoing host writes it in
//! (percent-encoded with any characters kept, either hex case, `+` for a space; JSON and
//! HTML escapes: [`crate::egress::secrets::encodings`]), becomes `[REDACTED]`, also when it straddles chunk
//! boundaries: the redactor holds back the last `longest - 1` bytes of each chunk (the
//! longest text a secret's pattern can match) until the next one shows whether they start
//! a secret. Matching is leftmost, longest secret first at a position (a secret that
//! extends another is redacted whole), in time linear in the text (the regex crate: finite
//! automata, no backtracking) and memory bounded by the held-back bytes.

use bytes::{Bytes, BytesMut};
use http::HeaderValue;

/// What a secret is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// The secrets to find; cheap to clone. Its `Debug` shows no value (a regex's `Debug`
/// prints its pattern: here, the secrets).
///
/// One automaton, ASCII case-insensitive: header names arrive lower-cased (hyper), and a
/// secret written in another case is redacted too (a false positive needs a text equal
/// to a secret but for case).
#[derive(Clone)]
pub struct Secrets {
    pattern: Option<regex::bytes::Regex>,
    longest: usize,
}

/// The secrets are too large to match in every form (the policy's bounds prevent it).
#[derive(Debug, thiserror::Error)]
#[error("the credentials' secrets ({bytes} bytes in all) are too large to match in every encoding: {why}")]
pub struct TooLarge {
    pub bytes: usize,
    pub why: String,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("empty", &self.pattern.is_none())
            .field("longest", &self.longest)
            .finish_non_exhaustive()
    }
}

impl Secrets {
    pub fn new(values: &[String]) -> Result<Secrets, TooLarge> {
        let mut values: Vec<&String> = values.iter().filter(|v| !v.is_empty()).collect();
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        values.dedup();
        let longest = values
            .iter()
            .map(|v| crate::egress::secrets::encodings::longest_match(v.as_bytes()))
            .max()
            .unwrap_or(0);
        if values.is_empty() {
            return Ok(Secrets {
                pattern: None,
                longest,
            });
        }
        let alternatives: Vec<String> = values
            .iter()
            .map(|v| crate::egress::secrets::encodings::pattern(v.as_bytes()))
            .collect();
        let pattern = regex::bytes::RegexBuilder::new(&alternatives.join("|"))
            .unicode(false)
            .case_insensitive(true)
            .size_limit(64 << 20)
            .dfa_size_limit(16 << 20)
            .build()
            .map_err(|e| TooLarge {
                bytes: values.iter().map(|v| v.len()).sum(),
                why: e.to_string(),
            })?;
        Ok(Secrets {
            pattern: Some(pattern),
            longest,
        })
    }

    /// No secrets at all.
    pub fn none() -> Secrets {
        Secrets {
            pattern: None,
            longest: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.pattern.is_none()
    }

    /// `text` with every secret replaced (whole values, not streaming).
    pub fn redact_all(&self, text: &[u8]) -> Vec<u8> {
        match &self.pattern {
            None => text.to_vec(),
            Some(p) => p.replace_all(text, REDACTED.as_bytes()).into_owned(),
        }
    }

    /// Whether `text` holds a secret (a header name: a name cannot take `[REDACTED]`, so
    /// such a header is dropped whole).
    pub fn in_any_case(&self, text: &[u8]) -> bool {
        self.pattern.as_ref().is_some_and(|p| p.is_match(text))
    }

    /// A header value with every secret replaced.
    pub fn redact_header(&self, value: &HeaderValue) -> HeaderValue {
        match &self.pattern {
            Some(p) if p.is_match(value.as_bytes()) => {
                HeaderValue::from_bytes(&self.redact_all(value.as_bytes()))
                    .unwrap_or_else(|_| HeaderValue::from_static(REDACTED))
            }
            _ => value.clone(),
        }
    }
}

/// One stream's redactor. Its `Debug` shows neither the secrets nor the bytes held back
/// (which may be the start of one).
pub struct Redactor {
    secrets: Secrets,
    held: BytesMut,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("secrets", &self.secrets)
            .field("held", &self.held.len())
            .finish()
    }
}

impl Redactor {
    pub fn new(secrets: Secrets) -> Redactor {
        Redactor {
            secrets,
            held: BytesMut::new(),
        }
    }

    /// Takes the next chunk; returns what can be passed on now.
    pub fn push(&mut self, chunk: &[u8]) -> Bytes {
        let Some(pattern) = &self.secrets.pattern else {
            return Bytes::copy_from_slice(chunk);
        };
        self.held.extend_from_slice(chunk);
        let data = self.held.split().freeze();
        // A match starting before `safe` lies wholly within `data` (a secret is at most
        // `longest` bytes), so it is decided; later bytes may begin a secret still arriving.
        let safe = data.len().saturating_sub(self.secrets.longest - 1);
        let mut out = BytesMut::with_capacity(data.len());
        let mut pos = 0;
        for m in pattern.find_iter(&data) {
            if m.start() >= safe {
                break;
            }
            out.extend_from_slice(&data[pos..m.start()]);
            out.extend_from_slice(REDACTED.as_bytes());
            pos = m.end();
        }
        let keep_from = pos.max(safe);
        out.extend_from_slice(&data[pos..keep_from]);
        self.held.extend_from_slice(&data[keep_from..]);
        out.freeze()
    }

    /// The end of the stream: what was held back, redacted.
    pub fn finish(&mut self) -> Bytes {
        let rest = self.held.split();
        Bytes::from(self.secrets.redact_all(&rest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(secrets: &[&str], chunks: &[&str]) -> String {
        let s: Vec<String> = secrets.iter().map(|s| s.to_string()).collect();
        let mut r = Redactor::new(Secrets::new(&s).unwrap());
        let mut out = Vec::new();
        for c in chunks {
            out.extend_from_slice(&r.push(c.as_bytes()));
        }
        out.extend_from_slice(&r.finish());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn whole_and_split_secrets() {
        assert_eq!(run(&["s3cr3t"], &["a s3cr3t b"]), "a [REDACTED] b");
        assert_eq!(run(&["s3cr3t"], &["a s3", "cr3t b"]), "a [REDACTED] b");
        assert_eq!(
            run(&["s3cr3t"], &["s", "3", "c", "r", "3", "t"]),
            "[REDACTED]"
        );
        assert_eq!(
            run(&["s3cr3t"], &["s3cr3", "x s3cr3t"]),
            "s3cr3x [REDACTED]"
        );
        assert_eq!(run(&["s3cr3t"], &["s3cr3ts3cr3t"]), "[REDACTED][REDACTED]");
        assert_eq!(run(&["s3cr3t"], &["no secret here", ""]), "no secret here");
        assert_eq!(run(&[], &["as is"]), "as is");
        assert_eq!(
            run(&["abc"], &["ab"]),
            "ab",
            "a prefix at the end is passed on at the end"
        );
    }

    #[test]
    fn every_split_point_of_every_secret() {
        let text = "head tokenAAAA mid Bearer tokenAAAA tail tok";
        let expected = "head [REDACTED] mid [REDACTED] tail tok";
        for i in 0..=text.len() {
            for j in i..=text.len() {
                let got = run(
                    &["tokenAAAA", "Bearer tokenAAAA"],
                    &[&text[..i], &text[i..j], &text[j..]],
                );
                assert_eq!(got, expected, "split at {i},{j}");
            }
        }
    }

    #[test]
    fn a_longer_secret_that_extends_a_shorter_one_is_redacted_whole() {
        assert_eq!(
            run(&["abc", "abcdef"], &["xx abc", "def yy"]),
            "xx [REDACTED] yy"
        );
        assert_eq!(
            run(&["abc", "abcdef"], &["xx abc", "dXf"]),
            "xx [REDACTED]dXf"
        );
    }

    #[test]
    fn encoded_forms_are_redacted_at_every_split_point() {
        let secrets = ["t/k+n=1", "Bearer t/k+n=1"];
        for echoed in [
            "t%2Fk%2Bn%3D1",
            "t%2fk%2bn%3d1",
            "t/k%2Bn%3D1",
            "Bearer%20t%2Fk%2Bn%3D1",
            "Bearer+t/k%2Bn%3D1",
            "t\\/k+n=1",
            "Bearer\\u0020t\\u002fk+n=1",
            "Bearer&#x20;t&#47;k&#x2b;n&#61;1",
        ] {
            let text = format!("head {echoed} mid {echoed} tail");
            let expected = "head [REDACTED] mid [REDACTED] tail";
            for i in 0..=text.len() {
                let got = run(&secrets, &[&text[..i], &text[i..]]);
                assert_eq!(got, expected, "{echoed} split at {i}");
            }
        }
    }

    #[test]
    fn near_misses_pass_unchanged() {
        let text = "t%2Fk%2Bn%3D2 t%2Fk%2Bn%3 t/k n=1 t%2Gk+n=1 t/k+n=";
        for i in 0..=text.len() {
            assert_eq!(run(&["t/k+n=1"], &[&text[..i], &text[i..]]), text);
        }
    }

    #[test]
    fn held_back_bytes_are_bounded_by_the_longest_encoding() {
        let s = Secrets::new(&["ab".to_string()]).unwrap();
        let mut r = Redactor::new(s);
        let mut out = Vec::new();
        for _ in 0..10_000 {
            out.extend_from_slice(&r.push(b"&#x61;&#x6"));
            assert!(r.held.len() < 2 * crate::egress::secrets::encodings::MAX_FORM_LEN);
        }
        out.extend_from_slice(&r.finish());
        assert_eq!(out, b"&#x61;&#x6".repeat(10_000));
    }

    #[test]
    fn debug_output_holds_no_secret() {
        let s = Secrets::new(&["tok-debug-123".to_string()]).unwrap();
        let r = Redactor::new(s.clone());
        for text in [format!("{s:?}"), format!("{r:?}")] {
            assert!(!text.contains("tok"), "{text}");
        }
    }

    #[test]
    fn headers() {
        let s = Secrets::new(&["tok123".to_string()]).unwrap();
        let v = HeaderValue::from_static("echo: Bearer tok123");
        assert_eq!(s.redact_header(&v), "echo: Bearer [REDACTED]");
        let plain = HeaderValue::from_static("text/plain");
        assert_eq!(s.redact_header(&plain), "text/plain");
        let t = Secrets::new(&["Tok-ABC".to_string()]).unwrap();
        assert!(t.in_any_case(b"x-tok-abc-echo"));
        assert!(!t.in_any_case(b"x-tok-abd"));
        assert!(!Secrets::new(&[]).unwrap().in_any_case(b"anything"));
        // Encoded, in a value and (lower-cased by hyper) in a name.
        let u = Secrets::new(&["Tok/ABC".to_string()]).unwrap();
        let v = HeaderValue::from_static("next=%2Fx%3Ft%3DTok%2FABC");
        assert_eq!(u.redact_header(&v), "next=%2Fx%3Ft%3D[REDACTED]");
        assert!(u.in_any_case(b"x-tok%2fabc"));
    }
}
