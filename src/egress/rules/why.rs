//! Why a connection was refused, for clients that do not show the proxy's answer.
//!
//! A refused CONNECT is answered `403 codebox: egress to host:port denied (why)`, and
//! CPython shows that status line in its error. Deno's `fetch` does not: a failed tunnel
//! is only "unsuccessful tunnel". So a run's proxy answers one more plain-HTTP request
//! itself, never forwarding it: `GET http://egress.codebox.invalid/why?target=host:port`
//! (`.invalid` is reserved: no real host has that name). The answer is the latest refusal
//! of that target in this run, as the client was told it. The sandbox's Deno runtime
//! asks it when a fetch fails that way, and puts the answer into the error it throws.
//!
//! It reveals nothing the program was not told already, only for its own run.

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use crate::egress::forward::ProxyBody;
use crate::egress::head::Refusal;
use crate::egress::rules::pattern::{Host, Target};

/// The name the proxy answers for itself.
pub const WHY_HOST: &str = "egress.codebox.invalid";

/// Refusals kept per run (the latest ones).
const KEPT: usize = 64;

/// A run's latest refusals: (target as `host:port`, what the client was told).
#[derive(Debug, Default)]
pub struct Refusals(Mutex<VecDeque<(String, String)>>);

impl Refusals {
    pub fn note(&self, target: &str, refusal: &Refusal) {
        let mut kept = self.0.lock().expect("refusals lock");
        if kept.len() == KEPT {
            kept.pop_front();
        }
        kept.push_back((target.to_string(), refusal.body().trim_end().to_string()));
    }

    /// The latest refusal of `target`.
    pub fn latest(&self, target: &str) -> Option<String> {
        let kept = self.0.lock().expect("refusals lock");
        kept.iter()
            .rev()
            .find(|(t, _)| t == target)
            .map(|(_, m)| m.clone())
    }
}

pub fn is_why_host(target: &Target) -> bool {
    matches!(&target.host, Host::Name(n) if n == WHY_HOST)
}

/// `/why?target=host:port`: 200 with the refusal's text, 404 when none is recorded.
pub fn answer(refusals: &Refusals, uri: &http::Uri) -> Response<ProxyBody> {
    let target = (uri.path() == "/why")
        .then(|| {
            form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
                .find(|(k, _)| k == "target")
                .map(|(_, v)| normalise(&v))
        })
        .flatten();
    let (status, text) = match target {
        None => (
            StatusCode::BAD_REQUEST,
            "codebox: ask /why?target=host:port".to_string(),
        ),
        Some(t) => match refusals.latest(&t) {
            Some(m) => (StatusCode::OK, m),
            None => (
                StatusCode::NOT_FOUND,
                format!("codebox: no refusal of {} recorded in this run", clip(&t)),
            ),
        },
    };
    let mut resp = Response::new(
        Full::new(Bytes::from(format!("{text}\n")))
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// `host:port` as records name it: lower-case, one trailing dot off the host.
fn normalise(target: &str) -> String {
    let target = target.trim().to_ascii_lowercase();
    match target.rsplit_once(':') {
        Some((host, port)) => format!("{}:{port}", host.strip_suffix('.').unwrap_or(host)),
        None => target,
    }
}

fn clip(s: &str) -> String {
    s.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_refusal_of_a_target_is_answered() {
        let r = Refusals::default();
        r.note(
            "evil.example:443",
            &Refusal::denied("evil.example:443", "not in allowlist"),
        );
        r.note(
            "evil.example:443",
            &Refusal::denied("evil.example:443", "denied by rule evil.example"),
        );
        let uri: http::Uri = "http://egress.codebox.invalid/why?target=Evil.Example.:443"
            .parse()
            .unwrap();
        let resp = answer(&r, &uri);
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            r.latest("evil.example:443").unwrap(),
            "codebox: egress to evil.example:443 denied (denied by rule evil.example)"
        );
        let other: http::Uri = "http://egress.codebox.invalid/why?target=a.example:443"
            .parse()
            .unwrap();
        assert_eq!(answer(&r, &other).status(), StatusCode::NOT_FOUND);
        let bad: http::Uri = "http://egress.codebox.invalid/else".parse().unwrap();
        assert_eq!(answer(&r, &bad).status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn only_the_latest_refusals_are_kept() {
        let r = Refusals::default();
        for i in 0..KEPT + 10 {
            let t = format!("h{i}.example:443");
            r.note(&t, &Refusal::denied(&t, "not in allowlist"));
        }
        assert!(r.latest("h0.example:443").is_none());
        assert!(r.latest(&format!("h{}.example:443", KEPT + 9)).is_some());
        assert_eq!(r.0.lock().unwrap().len(), KEPT);
    }
}
