//! A minimal HTTP/1.1 client over `std::net::TcpStream`, enough for MCP's streamable HTTP
//! on loopback: one keep-alive connection, requests with a body, responses with
//! `Content-Length`, chunked, or read to the end.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// No answer for this long is a hung server, not a slow one.
const READ_TIMEOUT: Duration = Duration::from_secs(120);
/// A connection idle for longer is not reused: the server closes a kept-alive connection
/// that waits for its next request past its header timeout (10 s), so a session idle
/// through a long load (bench-throughput's control session) would find it gone. httpx
/// keeps idle connections for 5 s too.
const KEEP_IDLE: Duration = Duration::from_secs(5);

pub struct Response {
    pub status: u16,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

pub struct Connection {
    addr: SocketAddr,
    /// `None` after the server asked to close; reopened on the next request.
    stream: Option<(TcpStream, BufReader<TcpStream>)>,
    /// When the last response was read: past [`KEEP_IDLE`] the stream is replaced.
    last_used: Instant,
}

impl Connection {
    pub fn new(addr: SocketAddr) -> Connection {
        Connection {
            addr,
            stream: None,
            last_used: Instant::now(),
        }
    }

    fn stream(&mut self) -> Result<&mut (TcpStream, BufReader<TcpStream>)> {
        if self.last_used.elapsed() > KEEP_IDLE {
            self.stream = None;
        }
        if self.stream.is_none() {
            let s = TcpStream::connect(self.addr)
                .with_context(|| format!("cannot connect to {}", self.addr))?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(READ_TIMEOUT))?;
            let reader = BufReader::new(s.try_clone()?);
            self.stream = Some((s, reader));
        }
        Ok(self.stream.as_mut().expect("just opened"))
    }

    /// Sends one request and reads the whole response.
    pub fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response> {
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (n, v) in headers {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let mut request = head.into_bytes();
        request.extend_from_slice(body);
        let result = (|| {
            let (writer, reader) = self.stream()?;
            writer
                .write_all(&request)
                .context("cannot send the request")?;
            read_response(reader)
        })();
        self.last_used = Instant::now();
        match &result {
            Ok(r)
                if !r
                    .header("connection")
                    .is_some_and(|v| v.eq_ignore_ascii_case("close")) => {}
            // The server closes this connection (or it broke): a new one next time.
            _ => self.stream = None,
        }
        result.with_context(|| format!("{method} http://{}{path}", self.addr))
    }
}

fn read_response(r: &mut impl BufRead) -> Result<Response> {
    let status_line = read_line(r)?;
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .and_then(|s| s.get(..3))
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("not an HTTP/1.1 status line: {status_line:?}"))?;
    let mut headers = Vec::new();
    loop {
        let line = read_line(r)?;
        if line.is_empty() {
            break;
        }
        let (n, v) = line
            .split_once(':')
            .with_context(|| format!("bad header line {line:?}"))?;
        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let mut response = Response {
        status,
        headers,
        body: Vec::new(),
    };
    if response
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        response.body = read_chunked(r)?;
    } else if let Some(len) = response.header("content-length") {
        let len: usize = len.parse().context("bad Content-Length")?;
        response.body = vec![0; len];
        r.read_exact(&mut response.body)?;
    } else if status != 204 && status != 304 {
        r.read_to_end(&mut response.body)?;
        response.headers.push(("connection".into(), "close".into()));
    }
    Ok(response)
}

fn read_chunked(r: &mut impl BufRead) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let size_line = read_line(r)?;
        let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("bad chunk size {size_line:?}"))?;
        if size == 0 {
            // Trailers, then the empty line.
            while !read_line(r)?.is_empty() {}
            return Ok(body);
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..])?;
        if !read_line(r)?.is_empty() {
            bail!("a chunk not followed by CRLF");
        }
    }
}

/// One CRLF-terminated line without its terminator; EOF is an error.
fn read_line(r: &mut impl BufRead) -> Result<String> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        bail!("the server closed the connection");
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_and_sized_bodies() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: b\r\n\r\n\
                    3\r\nabc\r\n2\r\nde\r\n0\r\n\r\nHTTP/1.1 202 Accepted\r\ncontent-length: 2\r\n\r\nok";
        let mut r = &raw[..];
        let first = read_response(&mut r).unwrap();
        assert_eq!((first.status, &first.body[..]), (200, &b"abcde"[..]));
        assert_eq!(first.header("x-a"), Some("b"));
        let second = read_response(&mut r).unwrap();
        assert_eq!((second.status, &second.body[..]), (202, &b"ok"[..]));
    }
}
