//! The egress proxy's reading of a sandbox's first request (`codebox::egress::head`)
//! and of the hosts it names (`codebox::egress::rules::pattern`).
//!
//! Input: one byte choosing the mode, then
//! - even: the bytes a sandboxed program sends to the proxy;
//! - odd: a host pattern (as a rule or a call's `network` names it), a newline, and a
//!   `host:port` target.
//!
//! Properties:
//! - a head is read only up to its limit; a CONNECT gives a normalised target and the
//!   bytes after the head exactly; an absolute-form request keeps every byte read;
//! - a refusal is one well-formed HTTP/1.1 response with exactly its own headers, its
//!   status, and a body of its declared length, whatever the request said (no header
//!   or response can be injected through a reason phrase);
//! - patterns and targets print as they parse (parse, print, parse is the identity),
//!   names come out normalised, and a pattern covers the target it names.

use std::time::Duration;

use codebox::egress::head::{read_first, FirstRequest, NoRequest, Refusal};
use codebox::egress::rules::pattern::{Host, HostMatch, HostPattern, Target};

use crate::{block_on, budget};

const MAX_HEAD: usize = 8 * 1024;

pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        check_head(rest);
    } else if let Ok(text) = std::str::from_utf8(rest) {
        let (pattern, target) = text.split_once('\n').unwrap_or((text, ""));
        check_names(pattern, target);
    }
}

fn check_head(input: &[u8]) {
    let mut stream = input;
    let (first, peak) =
        budget::peak_during(|| block_on(read_first(&mut stream, Duration::from_secs(5), MAX_HEAD)));
    budget::assert_within("read_first", peak, input.len(), 8, 64 * 1024);
    let consumed = input.len() - stream.len();
    assert!(
        consumed <= MAX_HEAD,
        "read {consumed} bytes past the head limit"
    );
    match first {
        Ok(FirstRequest::Connect { target, early }) => {
            // HTTP/1.1 lets a server skip empty lines before the request line.
            let request = input.trim_ascii_start();
            assert!(request.starts_with(b"CONNECT "), "{input:?}");
            assert!(
                input[..consumed].ends_with(&early),
                "early bytes are the head's tail"
            );
            check_target(&target);
        }
        Ok(FirstRequest::Absolute { buffered }) => {
            assert_eq!(&buffered[..], &input[..consumed], "buffered bytes");
        }
        Err(NoRequest::Refuse { refusal, .. }) => check_refusal(&refusal),
        Err(NoRequest::Closed { reason }) => assert!(!reason.is_empty()),
    }
}

/// `refusal.to_bytes()` is exactly one response: its status, our three headers, and a
/// body as long as it says.
fn check_refusal(refusal: &Refusal) {
    let bytes = refusal.to_bytes();
    let mut headers = [httparse::EMPTY_HEADER; 8];
    let mut response = httparse::Response::new(&mut headers);
    let head = match response.parse(&bytes) {
        Ok(httparse::Status::Complete(n)) => n,
        other => panic!("a refusal that does not parse ({other:?}): {bytes:?}"),
    };
    assert_eq!(response.code, Some(refusal.status.as_u16()));
    let names: Vec<String> = response
        .headers
        .iter()
        .map(|h| h.name.to_ascii_lowercase())
        .collect();
    assert_eq!(
        names,
        ["content-type", "content-length", "connection"],
        "headers"
    );
    let length: usize = std::str::from_utf8(response.headers[1].value)
        .expect("ASCII")
        .parse()
        .expect("a number");
    assert_eq!(bytes.len() - head, length, "body length");
    assert!(
        refusal.reason_phrase().len() <= codebox::egress::head::MAX_REASON_PHRASE,
        "reason phrase too long"
    );
}

fn check_target(target: &Target) {
    if let Host::Name(name) = &target.host {
        assert!(
            name.bytes().all(|b| b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || b == b'-'
                || b == b'.'
                || b == b'_'),
            "a name not normalised: {name:?}"
        );
    }
    let printed = target.to_string();
    let again = Target::parse_authority(&printed, None)
        .unwrap_or_else(|e| panic!("{target:?} prints as {printed:?}, which does not parse: {e}"));
    assert_eq!(&again, target, "parse(print(target))");
}

fn check_names(pattern: &str, target: &str) {
    if let Ok(t) = Target::parse_authority(target, Some(443)) {
        check_target(&t);
        let exact = HostPattern::parse(&t.to_string())
            .unwrap_or_else(|e| panic!("target {t} is not a pattern: {e}"));
        assert!(exact.matches(&t), "{exact} does not cover {t}");
        if let Ok(p) = HostPattern::parse(pattern) {
            if p.matches(&t) {
                assert!(
                    p.overlaps(&exact),
                    "{p} covers {t} but does not overlap {exact}"
                );
                assert!(p.denies(&t), "{p} covers {t} but would not deny it");
            }
        }
    }
    let Ok(p) = HostPattern::parse(pattern) else {
        return;
    };
    let printed = p.to_string();
    let again = HostPattern::parse(&printed)
        .unwrap_or_else(|e| panic!("{p:?} prints as {printed:?}, which does not parse: {e}"));
    assert_eq!(again, p, "parse(print(pattern))");
    if let HostMatch::Exact(name) | HostMatch::Below(name) = &p.host {
        assert!(!name.is_empty() && name == &name.to_ascii_lowercase());
    }
}
