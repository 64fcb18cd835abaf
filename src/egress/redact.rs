//! Streaming redaction of secret values in responses from hosts with credentials.
//!
//! Every occurrence of every secret becomes `[REDACTED]`, also when it straddles chunk
//! boundaries: the redactor holds back the last `longest - 1` bytes of each chunk until
//! the next one shows whether they start a secret. Matching is leftmost, longest secret
//! first at a position (a secret that extends another is redacted whole), in linear time
//! (the regex crate over escaped literals).

use bytes::{Bytes, BytesMut};
use http::HeaderValue;

/// What a secret is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// The secrets to find; cheap to clone. Its `Debug` shows no value (a regex's `Debug`
/// prints its pattern: here, the secrets).
#[derive(Clone)]
pub struct Secrets {
    pattern: Option<regex::bytes::Regex>,
    /// The same, ASCII case-insensitive: for header names, which hyper lower-cases.
    folded: Option<regex::bytes::Regex>,
    longest: usize,
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
    pub fn new(values: &[String]) -> Secrets {
        let mut values: Vec<&String> = values.iter().filter(|v| !v.is_empty()).collect();
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        values.dedup();
        let longest = values.first().map_or(0, |v| v.len());
        let alternatives: Vec<String> = values.iter().map(|v| regex::escape(v)).collect();
        let build = |case_insensitive: bool| {
            (!values.is_empty()).then(|| {
                regex::bytes::RegexBuilder::new(&alternatives.join("|"))
                    .unicode(false)
                    .case_insensitive(case_insensitive)
                    .size_limit(64 << 20)
                    .build()
                    .expect("escaped literals always compile")
            })
        };
        Secrets {
            pattern: build(false),
            folded: build(true),
            longest,
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

    /// Whether `text` holds a secret in any ASCII case (a header name: hyper lower-cases
    /// them, and a name cannot take `[REDACTED]`, so such a header is dropped whole).
    pub fn in_any_case(&self, text: &[u8]) -> bool {
        self.folded.as_ref().is_some_and(|p| p.is_match(text))
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
        let mut r = Redactor::new(Secrets::new(&s));
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
    fn debug_output_holds_no_secret() {
        let s = Secrets::new(&["tok-debug-123".to_string()]);
        let r = Redactor::new(s.clone());
        for text in [format!("{s:?}"), format!("{r:?}")] {
            assert!(!text.contains("tok"), "{text}");
        }
    }

    #[test]
    fn headers() {
        let s = Secrets::new(&["tok123".to_string()]);
        let v = HeaderValue::from_static("echo: Bearer tok123");
        assert_eq!(s.redact_header(&v), "echo: Bearer [REDACTED]");
        let plain = HeaderValue::from_static("text/plain");
        assert_eq!(s.redact_header(&plain), "text/plain");
        let t = Secrets::new(&["Tok-ABC".to_string()]);
        assert!(t.in_any_case(b"x-tok-abc-echo"));
        assert!(!t.in_any_case(b"x-tok-abd"));
        assert!(!Secrets::new(&[]).in_any_case(b"anything"));
    }
}
