//! The first request on a proxy connection, read by hand: a CONNECT is served without
//! hyper (the proxy owns the bytes that follow), an absolute-form request is handed to
//! hyper with the bytes already read, and anything else gets a clear `codebox:` answer.
//!
//! The head must be complete within the head timeout (a deadline: trickling does not
//! extend it) and fit in the head size cap.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::StatusCode;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::limits::human_duration;
use crate::egress::rules::pattern::{clip, Target};

/// The longest reason phrase a refusal's status line carries.
pub const MAX_REASON_PHRASE: usize = 300;

/// A refusal the client reads: a status and the text after `codebox: `.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
}

impl Refusal {
    pub fn bad_request(message: impl Into<String>) -> Refusal {
        Refusal {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    /// 403: `egress to host:port denied (reason)`.
    pub fn denied(target: &str, reason: &str) -> Refusal {
        Refusal {
            status: StatusCode::FORBIDDEN,
            message: format!("egress to {target} denied ({reason})"),
        }
    }

    /// 429: a limit of the execution was reached.
    pub fn limit(target: &str, limit: &str) -> Refusal {
        Refusal {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!("egress to {target} denied (limit {limit} reached)"),
        }
    }

    /// 502 (or 504 for timeouts): `egress to host:port failed (reason)`.
    pub fn failed(status: StatusCode, target: &str, reason: &str) -> Refusal {
        Refusal {
            status,
            message: format!("egress to {target} failed ({reason})"),
        }
    }

    /// The one-line body.
    pub fn body(&self) -> String {
        format!("codebox: {}\n", self.message)
    }

    /// The status line's reason phrase: the same `codebox: ...` text. Clients that show
    /// only the status line of a failed tunnel (CPython's "Tunnel connection failed: 403
    /// ...", urllib's "HTTP Error 403: ...") then put the reason into the program's error.
    /// Printable ASCII only (anything else becomes `?`), at most [`MAX_REASON_PHRASE`].
    pub fn reason_phrase(&self) -> String {
        let mut phrase: String = format!("codebox: {}", self.message)
            .chars()
            .map(|c| {
                if c.is_ascii_graphic() || c == ' ' {
                    c
                } else {
                    '?'
                }
            })
            .collect();
        if phrase.len() > MAX_REASON_PHRASE {
            phrase.truncate(MAX_REASON_PHRASE - 3);
            phrase.push_str("...");
        }
        phrase
    }

    /// A whole HTTP/1.1 response that closes the connection.
    pub fn to_bytes(&self) -> Vec<u8> {
        let body = self.body();
        format!(
            "HTTP/1.1 {} {}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            self.status.as_u16(),
            self.reason_phrase(),
            body.len()
        )
        .into_bytes()
    }
}

/// What the first request asks for.
#[derive(Debug)]
pub enum FirstRequest {
    /// `CONNECT host:port`; `early` holds bytes the client sent after the head.
    Connect { target: Target, early: Bytes },
    /// An absolute-form plain-HTTP request; `buffered` holds every byte read so far.
    Absolute { buffered: Bytes },
}

/// Why no request came.
#[derive(Debug)]
pub enum NoRequest {
    /// Answer this and close.
    Refuse { refusal: Refusal, host: String },
    /// The client closed (or failed) before a whole head; nothing to answer.
    Closed { reason: String },
}

/// Reads and sorts the first request head.
pub async fn read_first<S: AsyncRead + Unpin>(
    stream: &mut S,
    timeout: Duration,
    max_head: usize,
) -> Result<FirstRequest, NoRequest> {
    let refuse = |refusal, host: &str| NoRequest::Refuse {
        refusal,
        host: host.to_string(),
    };
    let deadline = tokio::time::Instant::now() + timeout;
    let mut buf = BytesMut::with_capacity(4096);
    loop {
        let head_len = match parse(&buf) {
            Parsed::Complete(n) => n,
            Parsed::Partial if buf.len() >= max_head => {
                let refusal = Refusal {
                    status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    message: format!("request head larger than {} bytes", max_head),
                };
                return Err(refuse(refusal, ""));
            }
            Parsed::Partial => {
                let room = max_head - buf.len();
                let mut limited = (&mut *stream).take(room as u64);
                let read = tokio::time::timeout_at(deadline, limited.read_buf(&mut buf));
                match read.await {
                    Err(_) => {
                        let refusal = Refusal {
                            status: StatusCode::REQUEST_TIMEOUT,
                            message: format!(
                                "request head not complete within {}",
                                human_duration(timeout)
                            ),
                        };
                        return Err(refuse(refusal, ""));
                    }
                    Ok(Ok(0)) => {
                        return Err(NoRequest::Closed {
                            reason: if buf.is_empty() {
                                "closed without a request".into()
                            } else {
                                "closed in the middle of a request head".into()
                            },
                        })
                    }
                    Ok(Ok(_)) => continue,
                    Ok(Err(e)) => {
                        return Err(NoRequest::Closed {
                            reason: format!("read failed: {e}"),
                        })
                    }
                }
            }
            Parsed::Invalid(refusal) => return Err(refuse(refusal, "")),
        };
        return sort(buf.freeze(), head_len).map_err(|(refusal, host)| refuse(refusal, &host));
    }
}

enum Parsed {
    Complete(usize),
    Partial,
    Invalid(Refusal),
}

const PROXY_USAGE: &str =
    "this is the egress proxy: send CONNECT host:port (https) or an absolute URL (GET http://host/path)";

fn parse(buf: &[u8]) -> Parsed {
    if buf.starts_with(b"PRI * HTTP/2") {
        return Parsed::Invalid(Refusal::bad_request(
            "HTTP/2 is not supported by the egress proxy; use HTTP/1.1",
        ));
    }
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => Parsed::Complete(n),
        Ok(httparse::Status::Partial) => Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) => Parsed::Invalid(Refusal {
            status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            message: "more than 100 request headers".into(),
        }),
        Err(httparse::Error::Version) => Parsed::Invalid(Refusal::bad_request(
            "only HTTP/1.0 and HTTP/1.1 are supported",
        )),
        Err(e) => Parsed::Invalid(Refusal::bad_request(format!(
            "malformed request ({e}); {PROXY_USAGE}"
        ))),
    }
}

/// A complete head: CONNECT, absolute-form, or a refusal (with the host when known).
fn sort(buf: Bytes, head_len: usize) -> Result<FirstRequest, (Refusal, String)> {
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut req = httparse::Request::new(&mut headers);
    req.parse(&buf).expect("parsed before");
    let method = req.method.unwrap_or("");
    let path = req.path.unwrap_or("");
    if method == "CONNECT" {
        let body_headers = req.headers.iter().any(|h| {
            h.name.eq_ignore_ascii_case("transfer-encoding")
                || (h.name.eq_ignore_ascii_case("content-length") && h.value != b"0")
        });
        if body_headers {
            return Err((
                Refusal::bad_request("a CONNECT request cannot have a body"),
                String::new(),
            ));
        }
        let target = Target::parse_authority(path, None).map_err(|e| {
            (
                Refusal::bad_request(format!("CONNECT target {e}")),
                clip(path),
            )
        })?;
        let mut early = buf;
        early.advance(head_len);
        return Ok(FirstRequest::Connect { target, early });
    }
    let lower = path.get(..8).unwrap_or(path).to_ascii_lowercase();
    if lower.starts_with("http://") {
        return Ok(FirstRequest::Absolute { buffered: buf });
    }
    if lower.starts_with("https://") {
        return Err((
            Refusal::bad_request("https:// URLs go through a CONNECT tunnel (set HTTPS_PROXY, not an https:// request to the proxy)"),
            String::new(),
        ));
    }
    Err((Refusal::bad_request(PROXY_USAGE), String::new()))
}

/// Writes a refusal and closes, without waiting on the client for long: the write and a
/// short drain of what the client still sends (so the close does not reset the answer
/// away) are each bounded.
pub async fn write_refusal<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, refusal: &Refusal) {
    let bytes = refusal.to_bytes();
    let write = async {
        stream.write_all(&bytes).await?;
        stream.flush().await?;
        stream.shutdown().await
    };
    if let Ok(Err(e)) | Err(e) = tokio::time::timeout(Duration::from_secs(2), write)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "write timed out"))
    {
        tracing::debug!(err = %e, "egress: could not write a refusal");
        return;
    }
    let mut sink = [0u8; 4096];
    let drain = async {
        let mut total = 0;
        while total < 64 << 10 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(250), drain).await;
}

/// A stream that first yields bytes already read from it.
pub struct Prefixed<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> Prefixed<S> {
    pub fn new(prefix: Bytes, inner: S) -> Prefixed<S> {
        Prefixed { prefix, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn first(bytes: &[u8]) -> Result<FirstRequest, NoRequest> {
        let mut s = bytes;
        read_first(&mut s, Duration::from_secs(1), 1024).await
    }

    fn refused(r: Result<FirstRequest, NoRequest>) -> Refusal {
        match r {
            Err(NoRequest::Refuse { refusal, .. }) => refusal,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn connect_keeps_early_bytes() {
        match first(b"CONNECT Example.COM.:443 HTTP/1.1\r\nHost: x\r\n\r\n\x16\x03\x01").await {
            Ok(FirstRequest::Connect { target, early }) => {
                assert_eq!(target.to_string(), "example.com:443");
                assert_eq!(&early[..], b"\x16\x03\x01");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn an_internationalised_connect_target_becomes_punycode() {
        match first("CONNECT BÜcher.example.:443 HTTP/1.1\r\n\r\n".as_bytes()).await {
            Ok(FirstRequest::Connect { target, .. }) => {
                assert_eq!(target.to_string(), "xn--bcher-kva.example:443")
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn absolute_form_is_passed_on_whole() {
        let req = b"GET http://a.example/x HTTP/1.1\r\nHost: a.example\r\n\r\n";
        match first(req).await {
            Ok(FirstRequest::Absolute { buffered }) => assert_eq!(&buffered[..], &req[..]),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn everything_else_is_refused_clearly() {
        let r = refused(first(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await);
        assert_eq!(r.status, 400);
        assert!(
            r.body().starts_with("codebox: this is the egress proxy"),
            "{}",
            r.body()
        );
        let r = refused(first(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await);
        assert_eq!(r.status, 400);
        let r =
            refused(first(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 garbage\r\n\r\n").await);
        assert_eq!(r.status, 400);
        let r = refused(first(b"CONNECT a.example HTTP/1.1\r\n\r\n").await);
        assert!(r.message.contains("a port is required"), "{}", r.message);
        let r = refused(
            first(b"CONNECT a.example:443 HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello").await,
        );
        assert!(r.message.contains("cannot have a body"));
        let r = refused(first(b"GET https://a.example/ HTTP/1.1\r\n\r\n").await);
        assert!(r.message.contains("CONNECT"));
        let r = refused(first(&[b'A'; 2000]).await);
        assert!(r.status == 431 || r.status == 400, "{}", r.status);
        let big = format!(
            "GET http://a.example/ HTTP/1.1\r\nX: {}\r\n\r\n",
            "y".repeat(2000)
        );
        assert_eq!(refused(first(big.as_bytes()).await).status, 431);
        match first(b"GET http://a.exa").await {
            Err(NoRequest::Closed { reason }) => assert!(reason.contains("middle")),
            other => panic!("{other:?}"),
        }
        let bytes = Refusal::denied("evil.example:443", "not in allowlist").to_bytes();
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with(
            "HTTP/1.1 403 codebox: egress to evil.example:443 denied (not in allowlist)\r\n"
        ));
        assert!(text
            .ends_with("\r\n\r\ncodebox: egress to evil.example:443 denied (not in allowlist)\n"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_head_hits_the_deadline() {
        let (mut client, mut server) = tokio::io::duplex(64);
        let trickle = tokio::spawn(async move {
            for b in b"GET http://a.example/ HTTP/1.1\r\n" {
                if client.write_all(&[*b]).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            client
        });
        let r = refused(read_first(&mut server, Duration::from_secs(10), 1024).await);
        assert_eq!(r.status, 408);
        assert_eq!(r.message, "request head not complete within 10s");
        drop(trickle);
    }
}

#[cfg(test)]
mod reason_phrase_tests {
    use super::*;

    #[test]
    fn the_status_line_carries_the_reason_in_printable_ascii() {
        let r = Refusal::denied("evil.example:443", "not in allowlist");
        assert_eq!(
            r.reason_phrase(),
            "codebox: egress to evil.example:443 denied (not in allowlist)"
        );
        let bytes = String::from_utf8(r.to_bytes()).unwrap();
        assert!(bytes.starts_with(
            "HTTP/1.1 403 codebox: egress to evil.example:443 denied (not in allowlist)\r\n"
        ));
        // No way to end the status line early or smuggle a header.
        let r = Refusal::bad_request("bad\r\nx-injected: 1\u{7f}é");
        let phrase = r.reason_phrase();
        assert!(phrase.bytes().all(|b| b == b' ' || b.is_ascii_graphic()));
        assert!(!phrase.contains('\r') && !phrase.contains('\n'));
        let long = Refusal::bad_request("x".repeat(5000));
        assert_eq!(long.reason_phrase().len(), MAX_REASON_PHRASE);
        assert!(hyper::ext::ReasonPhrase::try_from(long.reason_phrase()).is_ok());
    }
}
