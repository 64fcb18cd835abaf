//! What the egress tests and bench share: a test PKI made with rcgen, local HTTP and HTTPS
//! origin servers (hyper + tokio-rustls on 127.0.0.1:0), and raw proxy clients.
#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Names the test certificates cover (and the test resolver maps to loopback).
pub const NAMES: &[&str] = &[
    "localhost",
    "api.test",
    "echo.test",
    "bad.test",
    "rebind.test",
    "other.test",
];

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A test CA and a server certificate for [`NAMES`], 127.0.0.1 and ::1.
pub struct TestPki {
    pub ca_pem: String,
    pub server: Arc<ServerConfig>,
}

impl TestPki {
    pub fn new() -> TestPki {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::default();
        ca.distinguished_name
            .push(DnType::CommonName, "egress test CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut names: Vec<String> = NAMES.iter().map(|s| s.to_string()).collect();
        names.push("127.0.0.1".into());
        names.push("::1".into());
        let mut params = CertificateParams::new(names).unwrap();
        params.use_authority_key_identifier_extension = true;
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &issuer).unwrap();
        let mut server = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone(), ca_cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        TestPki {
            ca_pem: ca_cert.pem(),
            server: Arc::new(server),
        }
    }
}

/// A TLS client trusting exactly the PEM certificates given.
pub fn client_tls(roots_pem: &[&str]) -> Arc<ClientConfig> {
    let mut store = RootCertStore::empty();
    for pem in roots_pem {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            store.add(cert.unwrap()).unwrap();
        }
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// One request an origin received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub uri: String,
    pub headers: Vec<(String, String)>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A local origin server, HTTPS when given a TLS configuration.
pub struct Origin {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Origin {
    pub async fn start(tls: Option<Arc<ServerConfig>>) -> Origin {
        Origin::start_on("127.0.0.1:0", tls).await.unwrap()
    }

    pub async fn start_on(bind: &str, tls: Option<Arc<ServerConfig>>) -> std::io::Result<Origin> {
        let listener = TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let seen2 = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let seen = seen2.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let seen = seen.clone();
                        async move { Ok::<_, Infallible>(route(req, seen).await) }
                    });
                    let builder = hyper::server::conn::http1::Builder::new();
                    match tls {
                        Some(cfg) => {
                            if let Ok(stream) =
                                tokio_rustls::TlsAcceptor::from(cfg).accept(tcp).await
                            {
                                let _ = builder
                                    .serve_connection(TokioIo::new(stream), service)
                                    .await;
                            }
                        }
                        None => {
                            let _ = builder.serve_connection(TokioIo::new(tcp), service).await;
                        }
                    }
                });
            }
        });
        Ok(Origin { addr, seen, task })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn last(&self) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("the origin saw a request")
    }

    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

fn query_value(uri: &http::Uri, key: &str) -> Option<String> {
    uri.query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.to_string())
    })
}

/// A body sent one byte per frame, 2 ms apart: a secret in it crosses every chunk boundary.
struct Drip {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for Drip {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

fn drip(text: String) -> BoxBody<Bytes, Infallible> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        for b in text.into_bytes() {
            if tx.send(Bytes::from(vec![b])).await.is_err() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    });
    Drip { rx }.boxed()
}

/// A body of the frames given, in that order.
fn frames(parts: Vec<Bytes>) -> BoxBody<Bytes, Infallible> {
    let (tx, rx) = tokio::sync::mpsc::channel(parts.len().max(1));
    for p in parts {
        tx.try_send(p).expect("room for every frame");
    }
    Drip { rx }.boxed()
}

/// `value` in one of the ways a host may echo it (`form`); `None` for an unknown form.
/// Written independently of the proxy's matcher: each form is what a common encoder
/// writes.
pub fn encode(value: &str, form: &str) -> Option<String> {
    let pct = |keep: &str, upper: bool, plus: bool| {
        let mut out = String::new();
        for b in value.bytes() {
            if b.is_ascii_alphanumeric() || keep.as_bytes().contains(&b) {
                out.push(b as char);
            } else if b == b' ' && plus {
                out.push('+');
            } else if upper {
                out.push_str(&format!("%{b:02X}"));
            } else {
                out.push_str(&format!("%{b:02x}"));
            }
        }
        out
    };
    let escaped = |each: &dyn Fn(u8) -> Option<String>| {
        value
            .bytes()
            .map(|b| each(b).unwrap_or_else(|| (b as char).to_string()))
            .collect::<String>()
    };
    Some(match form {
        "raw" => value.to_string(),
        // RFC 3986 (Go's url.PathEscape-like, Rust's percent-encoding NON_ALPHANUMERIC
        // minus the unreserved): upper and lower hex.
        "pct" => pct("-._~", true, false),
        "pct-lower" => pct("-._~", false, false),
        // Python's quote() (`/` kept), quote_plus() (space as `+`, `/` encoded), and
        // quote_plus(safe="/").
        "pct-slash" => pct("-._~/", true, false),
        "plus" => pct("-._~", true, true),
        "plus-slash" => pct("-._~/", true, true),
        // JavaScript's encodeURIComponent.
        "js" => pct("-_.!~*'()", true, false),
        // Every byte, letters and digits too, hex case alternating.
        "every-byte" => value
            .bytes()
            .enumerate()
            .map(|(i, b)| match i % 2 {
                0 => format!("%{b:02X}"),
                _ => format!("%{b:02x}"),
            })
            .collect(),
        // PHP's json_encode (`\/`), and an encoder writing \u00XX for every symbol.
        "json" => escaped(&|b| match b {
            b'/' => Some("\\/".into()),
            b'"' => Some("\\\"".into()),
            b'\\' => Some("\\\\".into()),
            _ => None,
        }),
        "json-u" => escaped(&|b| (!b.is_ascii_alphanumeric()).then(|| format!("\\u{:04x}", b))),
        // HTML character references: hex (OWASP's encoder), decimal, and the named ones
        // Python's html.escape writes.
        "html-hex" => escaped(&|b| (!b.is_ascii_alphanumeric()).then(|| format!("&#x{b:02X};"))),
        "html-dec" => escaped(&|b| (!b.is_ascii_alphanumeric()).then(|| format!("&#{b};"))),
        "html" => escaped(&|b| match b {
            b'&' => Some("&amp;".into()),
            b'<' => Some("&lt;".into()),
            b'>' => Some("&gt;".into()),
            b'"' => Some("&quot;".into()),
            b'\'' => Some("&#x27;".into()),
            _ => None,
        }),
        _ => return None,
    })
}

/// Every form [`encode`] knows.
pub const FORMS: &[&str] = &[
    "raw",
    "pct",
    "pct-lower",
    "pct-slash",
    "plus",
    "plus-slash",
    "js",
    "every-byte",
    "json",
    "json-u",
    "html-hex",
    "html-dec",
    "html",
];

/// `/reflect?what=W&form=F&split=N`: echoes a credential the way an echoing host might,
/// in a header `x-reflect` and twice in the body (`before V middle V after`), the body
/// in two frames split N bytes into the first V (a value across chunk boundaries). W:
/// `authorization` (the whole header), `bearer-token` (after `Bearer `), `x-api-key`, `key`
/// (the query parameter, decoded), `key-wire` (as it came on the wire).
fn reflect(req: &Request<Incoming>) -> Response<BoxBody<Bytes, Infallible>> {
    let uri = req.uri();
    let param = |k: &str| query_value(uri, k).unwrap_or_default();
    let header = |name: &str| {
        req.headers()
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default()
    };
    let value = match param("what").as_str() {
        "authorization" => header("authorization"),
        "bearer-token" => header("authorization")
            .strip_prefix("Bearer ")
            .unwrap_or_default()
            .to_string(),
        "x-api-key" => header("x-api-key"),
        "key" => form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
            .find(|(k, _)| k == "key")
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default(),
        "key-wire" => param("key"),
        _ => String::new(),
    };
    let Some(encoded) = encode(&value, &param("form")) else {
        let mut r = Response::new(Full::new(Bytes::from_static(b"unknown form")).boxed());
        *r.status_mut() = StatusCode::BAD_REQUEST;
        return r;
    };
    let body = format!("before {encoded} middle {encoded} after");
    let split = ("before ".len() + param("split").parse::<usize>().unwrap_or(0)).min(body.len());
    let (a, b) = body.as_bytes().split_at(split);
    let mut r = Response::new(frames(vec![
        Bytes::copy_from_slice(a),
        Bytes::copy_from_slice(b),
    ]));
    if let Ok(v) = http::HeaderValue::from_str(&encoded) {
        r.headers_mut().insert("x-reflect", v);
    }
    r
}

/// `/echo` (the request back: headers as `x-echo-*` and in the body), `/drip` (the
/// `authorization` header back a byte at a time), `/reflect` (see [`reflect`]),
/// `/redirect?to=URL`, `/big?n=N`, `/hang` (never answers), `/gzip`, `/huge-head` (a
/// 300 KB header), `/ok`, `/close` (ends the connection after answering).
async fn route(
    req: Request<Incoming>,
    seen: Arc<Mutex<Vec<Seen>>>,
) -> Response<BoxBody<Bytes, Infallible>> {
    if req.uri().path() == "/reflect" {
        note(&req, &seen);
        return reflect(&req);
    }
    if req.uri().path() == "/drip" {
        let auth = req
            .headers()
            .get("authorization")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        return Response::new(drip(format!("before {auth} middle {auth} after")));
    }
    route_full(req, seen).await.map(|b| b.boxed())
}

/// Notes a request in `seen`; returns its headers.
fn note(req: &Request<Incoming>, seen: &Mutex<Vec<Seen>>) -> Vec<(String, String)> {
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    seen.lock().unwrap().push(Seen {
        method: req.method().to_string(),
        uri: req.uri().to_string(),
        headers: headers.clone(),
    });
    headers
}

async fn route_full(req: Request<Incoming>, seen: Arc<Mutex<Vec<Seen>>>) -> Response<Full<Bytes>> {
    let headers = note(&req, &seen);
    let uri = req.uri().clone();
    let mut resp = Response::new(Full::new(Bytes::new()));
    match uri.path() {
        "/ok" => *resp.body_mut() = Full::new(Bytes::from_static(b"ok\n")),
        "/close" => {
            resp.headers_mut()
                .insert(http::header::CONNECTION, "close".parse().unwrap());
            *resp.body_mut() = Full::new(Bytes::from_static(b"closing\n"));
        }
        "/echo" => {
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let mut text = format!("uri {uri}\n");
            for (n, v) in &headers {
                text.push_str(&format!("{n}: {v}\n"));
                if let Ok(v) = http::HeaderValue::from_str(v) {
                    resp.headers_mut().append(
                        http::HeaderName::from_bytes(format!("x-echo-{n}").as_bytes()).unwrap(),
                        v,
                    );
                }
            }
            text.push_str(&format!("body {}\n", String::from_utf8_lossy(&body)));
            *resp.body_mut() = Full::new(Bytes::from(text));
        }
        "/redirect" => {
            *resp.status_mut() = StatusCode::FOUND;
            let to = query_value(&uri, "to").unwrap_or_default();
            resp.headers_mut()
                .insert(http::header::LOCATION, to.parse().unwrap());
        }
        "/big" => {
            let n: usize = query_value(&uri, "n")
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            *resp.body_mut() = Full::new(Bytes::from(vec![b'x'; n]));
        }
        "/hang" => std::future::pending::<()>().await,
        "/gzip" => {
            resp.headers_mut()
                .insert(http::header::CONTENT_ENCODING, "gzip".parse().unwrap());
            *resp.body_mut() = Full::new(Bytes::from_static(b"\x1f\x8b not really"));
        }
        "/huge-head" => {
            resp.headers_mut()
                .insert("x-big", "a".repeat(300_000).parse().unwrap());
        }
        _ => *resp.status_mut() = StatusCode::NOT_FOUND,
    }
    resp
}

/// A proxy's refusal or an unexpected answer to a CONNECT: its status and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

/// Reads a response head byte by byte (so nothing after it is consumed): status, head.
pub async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> std::io::Result<(u16, String)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("eof after {:?}", String::from_utf8_lossy(&head)),
            ));
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, text))
}

/// Writes `request` raw and reads the whole answer (to EOF): status and body.
pub async fn raw(proxy: SocketAddr, request: &[u8]) -> Answer {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let _ = s.write_all(request).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(20), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Answer { status, body }
}

/// `CONNECT authority` through the proxy: the open tunnel, or the answer.
pub async fn connect(proxy: SocketAddr, authority: &str) -> Result<TcpStream, Answer> {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let (status, head) = read_head(&mut s).await.unwrap();
    if status == 200 {
        return Ok(s);
    }
    let mut body = Vec::new();
    let _ = s.read_to_end(&mut body).await;
    let _ = head;
    Err(Answer {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// TLS over an open tunnel.
pub async fn tls<S: AsyncRead + AsyncWrite + Unpin>(
    s: S,
    name: &str,
    config: Arc<ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<S>> {
    let name = ServerName::try_from(name.to_string()).unwrap();
    tokio_rustls::TlsConnector::from(config)
        .connect(name, s)
        .await
}

/// An HTTP/1 client over `io`; the connection is driven by a task.
pub async fn http_client<S>(io: S) -> hyper::client::conn::http1::SendRequest<Full<Bytes>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

/// A response, collected.
#[derive(Debug)]
pub struct Got {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
}

impl Got {
    /// Headers and body as one text, to look for a string anywhere in the response.
    pub fn everything(&self) -> String {
        let mut s = String::new();
        for (n, v) in &self.headers {
            s.push_str(&format!("{n}: {}\n", String::from_utf8_lossy(v.as_bytes())));
        }
        s.push_str(&self.body);
        s
    }
}

pub async fn send(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    req: Request<Full<Bytes>>,
) -> Result<Got, hyper::Error> {
    sender.ready().await?;
    let resp = sender.send_request(req).await?;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok(Got {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

pub fn get(uri: &str, host: &str) -> Request<Full<Bytes>> {
    Request::get(uri)
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .unwrap()
}
