//! What the proxy changes in a request it forwards and in the response it returns.
//!
//! Requests: origin-form URI; `Host` set from the CONNECT target or the absolute URL (what
//! was decided), never from the program's `Host`; hop-by-hop and `Proxy-*` headers
//! removed; framing headers (`Content-Length`, `Transfer-Encoding`) removed so hyper frames
//! the body itself (what the program wrote cannot smuggle a second request); `Expect` and
//! `Upgrade` removed. To a host with credentials: each credential set (any copy the
//! program sent removed first), `Accept-Encoding: identity`, and `Range`/`If-Range`
//! removed (byte ranges of an echoed secret would each be too short to recognise).
//!
//! Responses: hop-by-hop headers removed; from a host with credentials, every secret in
//! the reason phrase, any header value or the body replaced by `[REDACTED]` (streaming), a
//! header whose name holds one dropped, and a body in any content or transfer coding but
//! identity and chunked refused: it cannot be checked.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::head::Refusal;
use crate::egress::rules::pattern::Target;
use crate::egress::rules::policy::{Credential, Inject};
use crate::egress::secrets::redact::{Redactor, Secrets, REDACTED};

/// Every body the proxy returns to a client.
pub type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// A `codebox:` answer as a hyper response.
pub fn refusal_response(refusal: &Refusal) -> Response<ProxyBody> {
    let mut resp = Response::new(
        Full::new(Bytes::from(refusal.body()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = refusal.status;
    if let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(refusal.reason_phrase()) {
        resp.extensions_mut().insert(phrase);
    }
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if refusal.status == StatusCode::BAD_REQUEST {
        // A client that sent something malformed gets no second chance on this connection.
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// Sends one prepared request upstream and notes the answer's status in `rec`; a failure
/// becomes the client's 502, naming the byte limit when that is what cut it.
pub async fn send_upstream(
    sender: &mut hyper::client::conn::http1::SendRequest<hyper::body::Incoming>,
    req: http::Request<hyper::body::Incoming>,
    rec: &std::sync::Mutex<super::record::PendingRecord>,
    shown: &str,
) -> Result<Response<hyper::body::Incoming>, Response<ProxyBody>> {
    match sender.send_request(req).await {
        Ok(resp) => {
            rec.lock().expect("record lock").record.status = Some(resp.status().as_u16());
            Ok(resp)
        }
        Err(err) => {
            tracing::info!(target = %shown, ?err, "egress: upstream request failed");
            let reason = match rec.lock().expect("record lock").meter.limit_hit.get() {
                Some(limit) => limit.clone(),
                None => format!("upstream request failed: {err}"),
            };
            Err(refusal_response(&Refusal::failed(
                StatusCode::BAD_GATEWAY,
                shown,
                &reason,
            )))
        }
    }
}

/// Headers that belong to one hop, never forwarded either way.
const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed.iter().chain(HOP_BY_HOP) {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

/// Rewrites a request the policy allowed to `target` for the upstream connection.
/// `default_port` is the scheme's (80 or 443), for the `Host` header.
pub fn prepare_request(
    req: Request<Incoming>,
    target: &Target,
    default_port: u16,
    credentials: &[&Credential],
) -> Result<Request<Incoming>, Refusal> {
    let (mut parts, body) = req.into_parts();
    if parts.method == http::Method::CONNECT {
        return Err(Refusal::bad_request(
            "CONNECT must be the first request on a proxy connection",
        ));
    }
    let mut path_and_query = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    if !path_and_query.starts_with('/') && path_and_query != "*" {
        path_and_query.insert(0, '/');
    }
    for cred in credentials {
        if let Inject::Query { name, value } = &cred.inject {
            path_and_query = with_query_param(&path_and_query, name, value);
        }
    }
    parts.uri = Uri::builder()
        .path_and_query(path_and_query.as_str())
        .build()
        .map_err(|e| Refusal::bad_request(format!("the request's path is invalid: {e}")))?;
    parts.version = Version::HTTP_11;
    let headers = &mut parts.headers;
    strip_hop_by_hop(headers);
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::EXPECT);
    let host = HeaderValue::from_str(&target.host_header(default_port))
        .expect("a normalised host is a valid header value");
    headers.insert(header::HOST, host);
    if !credentials.is_empty() {
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        headers.remove(header::RANGE);
        headers.remove(header::IF_RANGE);
        for cred in credentials {
            if let Inject::Header { name, value } = &cred.inject {
                headers.remove(name);
                headers.insert(name.clone(), value.clone());
            }
        }
    }
    Ok(Request::from_parts(parts, body))
}

/// `path?query` with `name` set to `value` (every earlier `name` removed).
fn with_query_param(path_and_query: &str, name: &str, value: &str) -> String {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if k != name {
            out.append_pair(&k, &v);
        }
    }
    out.append_pair(name, value);
    format!("{path}?{}", out.finish())
}

/// Rewrites an upstream response for the client; with `secrets`, redacts them.
pub fn prepare_response(
    resp: Response<Incoming>,
    target: &Target,
    secrets: Option<&Secrets>,
) -> Result<Response<ProxyBody>, Refusal> {
    let (mut parts, body) = resp.into_parts();
    if parts.status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(Refusal::failed(
            StatusCode::BAD_GATEWAY,
            &target.to_string(),
            "the upstream switched protocols, which the proxy does not forward",
        ));
    }
    let Some(secrets) = secrets.filter(|s| !s.is_empty()) else {
        strip_hop_by_hop(&mut parts.headers);
        return Ok(Response::from_parts(parts, body.boxed()));
    };
    // Every coding named, in every header of either kind (hyper decodes only chunked, and
    // the transfer coding is stripped below as hop-by-hop).
    let codings_ok = |name: HeaderName, allowed: &[&str]| {
        parts
            .headers
            .get_all(name)
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b','))
            .map(|c| c.trim_ascii())
            .all(|c| c.is_empty() || allowed.iter().any(|a| c.eq_ignore_ascii_case(a.as_bytes())))
    };
    if !codings_ok(header::CONTENT_ENCODING, &["identity"])
        || !codings_ok(header::TRANSFER_ENCODING, &["chunked"])
    {
        return Err(Refusal::failed(
            StatusCode::BAD_GATEWAY,
            &target.to_string(),
            "compressed response from a host with credentials cannot be checked for the secret",
        ));
    }
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::CONTENT_LENGTH);
    if let Some(reason) = parts.extensions.remove::<hyper::ext::ReasonPhrase>() {
        // hyper writes a non-canonical reason phrase back out as it came.
        let redacted = secrets.redact_all(reason.as_bytes());
        let kept = hyper::ext::ReasonPhrase::try_from(redacted)
            .unwrap_or_else(|_| hyper::ext::ReasonPhrase::from_static(REDACTED.as_bytes()));
        parts.extensions.insert(kept);
    }
    let names: Vec<HeaderName> = parts.headers.keys().cloned().collect();
    for name in names {
        let values: Vec<HeaderValue> = parts
            .headers
            .get_all(&name)
            .iter()
            .map(|v| secrets.redact_header(v))
            .collect();
        parts.headers.remove(&name);
        if secrets.in_any_case(name.as_str().as_bytes()) {
            continue;
        }
        for v in values {
            parts.headers.append(name.clone(), v);
        }
    }
    let body = RedactingBody {
        inner: body,
        redactor: Redactor::new(secrets.clone()),
        done: false,
    };
    Ok(Response::from_parts(parts, body.boxed()))
}

/// A response body with every secret replaced, across chunk boundaries. Trailers are
/// dropped (they could carry a secret too, and clients rarely read them).
struct RedactingBody {
    inner: Incoming,
    redactor: Redactor,
    done: bool,
}

impl Body for RedactingBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        let out = self.redactor.push(&data);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                }
                Poll::Ready(None) => {
                    self.done = true;
                    let rest = self.redactor.finish();
                    if !rest.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(rest))));
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_are_replaced() {
        assert_eq!(
            with_query_param("/v1/x", "key", "a b&c"),
            "/v1/x?key=a+b%26c"
        );
        assert_eq!(
            with_query_param("/v1/x?q=1&key=mine&z=2", "key", "real"),
            "/v1/x?q=1&z=2&key=real"
        );
    }

    #[test]
    fn hop_by_hop_headers_go() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("close, X-Secret-Hop"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        h.insert(
            header::PROXY_AUTHORIZATION,
            HeaderValue::from_static("Basic x"),
        );
        h.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key(header::ACCEPT));
    }
}
