//! Refusing a connection with an answer the client reads: `503` over a connection cap,
//! `400` for a bad PROXY header.
//!
//! An answer written before the request was read, on a socket then closed, usually never
//! reaches the client: it is still sending its request, its write fails with `EPIPE`,
//! and closing a socket with unread data makes the kernel send a reset that discards
//! what the client had not read yet. So a refusal here
//!
//! 1. reads the request head (within `header_timeout`, at most [`MAX_HEAD`]) and then its
//!    body (`Content-Length` or chunked, within `body_timeout`, at most [`MAX_DRAIN`]),
//!    discarding it; not the body of a request that asked `Expect: 100-continue`: the
//!    client waits for an answer before sending it;
//! 2. answers (`Connection: close`, for a 503 `Retry-After`, a one-line body saying which
//!    cap), then shuts its side down;
//! 3. lingers: discards whatever else comes (a pipelined request, the rest of a body
//!    over the bound) until the client closes, for at most [`LINGER`] and [`MAX_DRAIN`]
//!    more, and only then closes.
//!
//! Every step is bounded in bytes and time, and the accept loop bounds how many refusals
//! run at once ([`MAX_REFUSING`]): a client opening connections over its cap holds no
//! connection slot and at most one of those.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

/// The longest request head read before answering anyway.
pub const MAX_HEAD: usize = 64 << 10;
/// The most body bytes discarded before answering (an MCP message is at most 16 MiB),
/// and the most discarded again while lingering.
pub const MAX_DRAIN: u64 = (16 << 20) + (64 << 10);
/// How long a refused connection lingers after the answer for the client to close.
pub const LINGER: Duration = Duration::from_secs(2);
/// Refusals that read their request at once; past it a refused connection is answered
/// without reading and closed (the old best effort).
pub const MAX_REFUSING: usize = 64;

/// A refusal's answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: &'static str,
    pub body: String,
    pub retry_after: Option<u32>,
}

impl Answer {
    /// `503` for a connection over `cap` (`max_connections` or `max_connections_per_peer`).
    pub fn over_cap(cap: &str, limit: usize) -> Answer {
        let whose = match cap {
            "max_connections_per_peer" => "from this client",
            _ => "to this server",
        };
        Answer {
            status: "503 Service Unavailable",
            body: format!(
                "codebox: too many open connections {whose} ({cap} = {limit}); close one or retry shortly\n"
            ),
            retry_after: Some(1),
        }
    }

    /// `400` with `why` (one line).
    pub fn bad_request(why: &str) -> Answer {
        Answer {
            status: "400 Bad Request",
            body: format!("codebox: {why}\n"),
            retry_after: None,
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let retry = self
            .retry_after
            .map(|s| format!("retry-after: {s}\r\n"))
            .unwrap_or_default();
        format!(
            "HTTP/1.1 {}\r\nconnection: close\r\ncontent-type: text/plain; charset=utf-8\r\n\
             content-length: {}\r\n{retry}\r\n{}",
            self.status,
            self.body.len(),
            self.body
        )
        .into_bytes()
    }
}

/// How long a refusal may read.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
}

/// Reads (and discards) the request on `s`, whose first bytes are `head` (already read),
/// answers `answer` and closes after a bounded linger; see the module's description.
pub async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    mut head: Vec<u8>,
    answer: &Answer,
    bounds: Bounds,
) {
    let head_until = Instant::now() + bounds.header_timeout;
    let body = loop {
        if let Some(end) = find(&head, b"\r\n\r\n") {
            let after = head.split_off(end + 4);
            break Body::of(&head, after);
        }
        if head.len() >= MAX_HEAD {
            break Body::None;
        }
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout_at(head_until, s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => head.extend_from_slice(&chunk[..n]),
            // Closed, failed or silent: answer what there is (maybe nothing).
            _ => break Body::None,
        }
    };
    let body_until = Instant::now() + bounds.body_timeout;
    let _ = tokio::time::timeout_at(body_until, body.discard(&mut s)).await;
    if s.write_all(&answer.to_bytes()).await.is_err() {
        return;
    }
    let _ = s.flush().await;
    let _ = s.shutdown().await;
    // Linger: the client reads the answer and closes; what it still sends is discarded.
    let _ = tokio::time::timeout(LINGER, discard(&mut s, MAX_DRAIN)).await;
}

/// Where `needle` starts in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// What follows a request head.
enum Body {
    None,
    /// `Content-Length`: this many bytes still to come.
    Length(u64),
    /// Chunked: the bytes already read after the head.
    Chunked(Vec<u8>),
}

impl Body {
    /// From a complete head and the bytes read after it.
    fn of(head: &[u8], after: Vec<u8>) -> Body {
        let mut headers = [httparse::EMPTY_HEADER; 100];
        let mut req = httparse::Request::new(&mut headers);
        if !matches!(req.parse(head), Ok(httparse::Status::Complete(_))) {
            return Body::None;
        }
        let value = |name: &str| {
            req.headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        };
        if value("expect").iter().any(|v| v == "100-continue") {
            return Body::None;
        }
        if value("transfer-encoding")
            .iter()
            .any(|v| v.split(',').any(|c| c.trim() == "chunked"))
        {
            return Body::Chunked(after);
        }
        match value("content-length")
            .first()
            .and_then(|v| v.parse::<u64>().ok())
        {
            Some(n) => Body::Length(n.saturating_sub(after.len() as u64)),
            None => Body::None,
        }
    }

    /// Reads the rest of the body (at most [`MAX_DRAIN`]) and throws it away.
    async fn discard<S: AsyncRead + Unpin>(self, s: &mut S) {
        match self {
            Body::None => {}
            Body::Length(n) => {
                discard(s, n.min(MAX_DRAIN)).await;
            }
            Body::Chunked(mut seen) => {
                let mut total = seen.len() as u64;
                let mut chunked = Chunked::default();
                loop {
                    if chunked.feed(&seen) || total >= MAX_DRAIN {
                        return;
                    }
                    let mut chunk = [0u8; 16 << 10];
                    match s.read(&mut chunk).await {
                        Ok(n) if n > 0 => {
                            total += n as u64;
                            seen.clear();
                            seen.extend_from_slice(&chunk[..n]);
                        }
                        _ => return,
                    }
                }
            }
        }
    }
}

/// Reads and discards up to `limit` bytes, until the end of the stream.
async fn discard<S: AsyncRead + Unpin>(s: &mut S, limit: u64) {
    let mut left = limit;
    let mut chunk = [0u8; 16 << 10];
    while left > 0 {
        let want = chunk.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        match s.read(&mut chunk[..want]).await {
            Ok(n) if n > 0 => left -= n as u64,
            _ => return,
        }
    }
}

/// Where a chunked body's parser is.
#[derive(Default)]
enum Chunked {
    /// Reading a size line (the digits so far; extensions after `;` ignored).
    #[default]
    Size,
    SizeDigits(u64, bool),
    /// Skipping this many data bytes, then its CRLF.
    Data(u64),
    /// Skipping the CRLF after data (bytes left of it).
    DataEnd(u8),
    /// After the last chunk: trailer lines until an empty one (at a line's start).
    Trailers(bool),
    Done,
}

impl Chunked {
    /// Feeds body bytes; true once the body ended (or cannot be followed: malformed).
    fn feed(&mut self, bytes: &[u8]) -> bool {
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            *self = match std::mem::take(self) {
                Chunked::Size => match (b as char).to_digit(16) {
                    Some(d) => Chunked::SizeDigits(u64::from(d), false),
                    None => Chunked::Done,
                },
                Chunked::SizeDigits(n, ext) => match (b, ext) {
                    (b'\n', _) if n == 0 => Chunked::Trailers(true),
                    (b'\n', _) => Chunked::Data(n),
                    (b'\r', _) | (_, true) => Chunked::SizeDigits(n, ext),
                    (b';', false) => Chunked::SizeDigits(n, true),
                    _ => match (b as char).to_digit(16) {
                        Some(d) if n < u64::MAX >> 8 => {
                            Chunked::SizeDigits(n * 16 + u64::from(d), false)
                        }
                        _ => Chunked::Done,
                    },
                },
                Chunked::Data(n) => {
                    let take = (bytes.len() - i).min(usize::try_from(n).unwrap_or(usize::MAX));
                    i += take;
                    let left = n - take as u64;
                    *self = match left {
                        0 => Chunked::DataEnd(2),
                        _ => Chunked::Data(left),
                    };
                    continue;
                }
                Chunked::DataEnd(1) => Chunked::Size,
                Chunked::DataEnd(k) => Chunked::DataEnd(k - 1),
                Chunked::Trailers(start) if b == b'\r' => Chunked::Trailers(start),
                Chunked::Trailers(true) if b == b'\n' => Chunked::Done,
                Chunked::Trailers(_) if b == b'\n' => Chunked::Trailers(true),
                Chunked::Trailers(_) => Chunked::Trailers(false),
                Chunked::Done => Chunked::Done,
            };
            if matches!(self, Chunked::Done) {
                return true;
            }
            i += 1;
        }
        matches!(self, Chunked::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_end_where_they_end() {
        let body = b"4\r\nWiki\r\n5;ext=1\r\npedia\r\n0\r\nX-T: 1\r\n\r\n";
        for split in 0..body.len() {
            let mut c = Chunked::default();
            let first = c.feed(&body[..split]);
            assert!(!first, "ended early at {split}");
            assert!(c.feed(&body[split..]), "split {split}");
        }
        let mut c = Chunked::default();
        assert!(c.feed(b"0\r\n\r\n"));
        let mut c = Chunked::default();
        assert!(!c.feed(b"10\r\n0123456789abcde"));
        assert!(c.feed(b"f\r\n0\r\n\r\n"));
        // Garbage ends it (nothing more to follow).
        let mut c = Chunked::default();
        assert!(c.feed(b"zz\r\n"));
        let mut c = Chunked::default();
        assert!(c.feed(b"ffffffffffffffffffff\r\n"));
    }

    #[test]
    fn bodies_are_known_from_the_head() {
        let of = |head: &str, after: &[u8]| Body::of(head.as_bytes(), after.to_vec());
        assert!(matches!(
            of("POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n", b"abc"),
            Body::Length(7)
        ));
        assert!(matches!(
            of(
                "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                b""
            ),
            Body::Chunked(_)
        ));
        assert!(matches!(
            of(
                "POST / HTTP/1.1\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n",
                b""
            ),
            Body::None
        ));
        assert!(matches!(of("GET / HTTP/1.1\r\n\r\n", b""), Body::None));
        assert!(matches!(of("\0garbage\r\n\r\n", b""), Body::None));
    }

    #[test]
    fn answers_say_which_cap_and_when_to_retry() {
        let a =
            String::from_utf8(Answer::over_cap("max_connections_per_peer", 64).to_bytes()).unwrap();
        assert!(a.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{a}");
        assert!(a.contains("retry-after: 1\r\n") && a.contains("connection: close\r\n"));
        assert!(a.ends_with(
            "from this client (max_connections_per_peer = 64); close one or retry shortly\n"
        ));
        let (head, body) = a.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let b = String::from_utf8(Answer::bad_request("no").to_bytes()).unwrap();
        assert!(b.starts_with("HTTP/1.1 400 Bad Request\r\n") && !b.contains("retry-after"));
    }

    /// A client that sends a body the server never wanted still reads the answer.
    #[tokio::test]
    async fn a_client_sending_a_body_reads_the_answer() {
        use tokio::net::{TcpListener, TcpStream};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let bounds = Bounds {
                header_timeout: Duration::from_secs(10),
                body_timeout: Duration::from_secs(10),
            };
            refuse(
                s,
                Vec::new(),
                &Answer::over_cap("max_connections", 3),
                bounds,
            )
            .await;
        });
        let mut c = TcpStream::connect(addr).await.unwrap();
        let body = vec![b'x'; 4 << 20];
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        c.write_all(head.as_bytes()).await.unwrap();
        c.write_all(&body)
            .await
            .expect("the whole body is read, no EPIPE");
        let mut answer = Vec::new();
        c.read_to_end(&mut answer).await.expect("no reset");
        let answer = String::from_utf8(answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.ends_with("(max_connections = 3); close one or retry shortly\n"));
        drop(c);
        server.await.unwrap();
    }
}
