//! The egress proxy end to end on loopback: a real HTTPS origin with its own test CA,
//! the proxy on 127.0.0.1:0, and real clients through it (raw CONNECT + rustls, hyper in
//! absolute form, and CPython's urllib when python3 is there).

#[path = "egress_support/mod.rs"]
mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use codebox::egress::{
    ConnectionKind, ConnectionRecord, Egress, EgressOptions, EgressPolicy, EgressReport, EgressRun,
    Limits, Narrowing, NetworkSection, StaticResolver,
};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &str = "s3cr3t-T0KEN-value-42";

struct Proxy {
    egress: Egress,
    run: Option<EgressRun>,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Proxy {
    async fn finish(&mut self) -> EgressReport {
        self.run.take().expect("running").finish().await
    }

    fn bundle(&self) -> PathBuf {
        self.egress.trust_dir().join("ca-bundle.pem")
    }
}

fn resolver() -> StaticResolver {
    NAMES.iter().fold(StaticResolver::new(), |r, n| {
        r.with(n, &[IpAddr::V4(Ipv4Addr::LOCALHOST)])
    })
}

async fn proxy(pki: &TestPki, toml_text: &str, tweak: impl FnOnce(&mut Limits)) -> Proxy {
    proxy_narrowed(pki, toml_text, tweak, None).await
}

async fn proxy_narrowed(
    pki: &TestPki,
    toml_text: &str,
    tweak: impl FnOnce(&mut Limits),
    narrowing: Option<&[&str]>,
) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("test-ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let mut section: NetworkSection = toml::from_str(toml_text).unwrap();
    section.extra_roots.push(ca);
    let env = |k: &str| (k == "TOKEN").then(|| SECRET.to_string());
    let policy = EgressPolicy::from_section(&section, &env).unwrap();
    let mut limits = policy.limits().clone();
    tweak(&mut limits);
    let policy = policy.with_limits(limits);
    let narrowing = match narrowing {
        Some(list) => policy
            .narrowed(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap(),
        None => Narrowing::none(),
    };
    let egress = Egress::new(
        policy,
        EgressOptions {
            state_dir: dir.path().join("state"),
            resolver: Arc::new(resolver()),
        },
    )
    .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let run = egress.start(listener, narrowing);
    Proxy {
        egress,
        run: Some(run),
        addr,
        _dir: dir,
    }
}

fn record<'a>(report: &'a EgressReport, host: &str) -> &'a ConnectionRecord {
    report
        .connections
        .iter()
        .find(|r| r.host == host)
        .unwrap_or_else(|| panic!("no record for {host}: {report:#?}"))
}

/// GET `path` over a CONNECT tunnel with TLS, trusting `roots`.
async fn https_get(
    p: &Proxy,
    authority: &str,
    name: &str,
    roots: &[&str],
    req: http::Request<http_body_util::Full<bytes::Bytes>>,
) -> Got {
    let tunnel = connect(p.addr, authority)
        .await
        .unwrap_or_else(|a| panic!("CONNECT {authority}: {a:?}"));
    let tls = tls(tunnel, name, client_tls(roots)).await.unwrap();
    let mut sender = http_client(tls).await;
    send(&mut sender, req).await.unwrap()
}

#[tokio::test]
async fn an_allowed_tunnel_works_and_counts_bytes() {
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let mut p = proxy(
        &pki,
        &format!("allow = [\"api.test:{port}\"]\nallow_private = [\"127.0.0.1:{port}\"]"),
        |_| {},
    )
    .await;
    let got = https_get(
        &p,
        &format!("api.test:{port}"),
        "api.test",
        &[&pki.ca_pem],
        get("/ok", "api.test"),
    )
    .await;
    assert_eq!((got.status, got.body.as_str()), (200, "ok\n"));
    let report = p.finish().await;
    let r = record(&report, "api.test");
    assert_eq!(r.kind, ConnectionKind::Connect);
    assert!(r.allowed);
    assert_eq!(
        r.address.as_deref(),
        Some(format!("127.0.0.1:{port}").as_str())
    );
    assert_eq!(
        r.rule.as_deref(),
        Some(format!("api.test:{port} + allow_private 127.0.0.1:{port}").as_str())
    );
    assert!(r.bytes_up > 200 && r.bytes_down > 500, "{r:?}");
    assert_eq!(
        (report.bytes_up, report.bytes_down),
        (r.bytes_up, r.bytes_down)
    );
    assert_eq!((report.allowed, report.denied), (1, 0));
    let health = p.egress.health();
    assert_eq!(health["counters"]["connections_allowed"], 1, "{health}");
}

#[tokio::test]
async fn credentials_reach_the_origin_and_never_the_client() {
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let mut p = proxy(
        &pki,
        &format!(
            "allow = [\"api.test:{port}\", \"echo.test:{port}\"]\nallow_private = [\"127.0.0.1\"]\n\
             [[credentials]]\nhost = \"api.test:{port}\"\nbearer = \"env:TOKEN\"\n"
        ),
        |_| {},
    )
    .await;
    let ca = p
        .egress
        .ca_certificate_pem()
        .expect("a CA with credentials")
        .to_string();
    let bundle = std::fs::read_to_string(p.bundle()).unwrap();
    assert!(
        bundle.contains(ca.trim()),
        "the bundle holds the codebox CA"
    );
    assert!(
        bundle.contains(pki.ca_pem.trim()),
        "and the extra roots: {bundle}"
    );

    // The client trusts only the codebox CA: the proxy terminated TLS.
    let tunnel = connect(p.addr, &format!("api.test:{port}")).await.unwrap();
    let tls = tls(tunnel, "api.test", client_tls(&[&ca])).await.unwrap();
    let mut sender = http_client(tls).await;
    let req = http::Request::post("http://evil.test/echo?x=1")
        .header("host", "evil.test")
        .header("authorization", "Bearer fake-from-the-program")
        .header("accept-encoding", "gzip")
        .header("range", "bytes=3-5")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            b"hello",
        )))
        .unwrap();
    let got = send(&mut sender, req).await.unwrap();
    assert_eq!(got.status, 200, "{}", got.body);
    let seen = origin.last();
    assert_eq!(
        seen.header("authorization"),
        Some(format!("Bearer {SECRET}").as_str())
    );
    assert_eq!(
        seen.header("host"),
        Some(format!("api.test:{port}").as_str()),
        "Host follows the CONNECT target"
    );
    assert_eq!(seen.header("accept-encoding"), Some("identity"));
    assert_eq!(seen.header("range"), None);
    assert_eq!(
        seen.uri, "/echo?x=1",
        "origin-form, whatever the program wrote"
    );
    assert_eq!(
        seen.headers
            .iter()
            .filter(|(n, _)| n == "authorization")
            .count(),
        1
    );
    let all = got.everything();
    assert!(
        !all.contains(SECRET),
        "the secret reached the client: {all}"
    );
    // The whole header value is a configured secret too: it goes as one.
    assert!(got.headers["x-echo-authorization"] == "[REDACTED]", "{all}");
    assert!(got.body.contains("authorization: [REDACTED]"), "{all}");
    assert!(got.body.contains("body hello"));

    // The secret dripped a byte per chunk: redacted across every boundary.
    let got = send(&mut sender, get("/drip", "api.test")).await.unwrap();
    assert_eq!(got.body, "before [REDACTED] middle [REDACTED] after");

    // A second request on the same intercepted connection, and a compressed answer.
    let got = send(&mut sender, get("/gzip", "api.test")).await.unwrap();
    assert_eq!(got.status, 502);
    assert!(got.body.starts_with(&format!("codebox: egress to api.test:{port} failed (compressed response from a host with credentials cannot be checked for the secret)")), "{}", got.body);

    // A host without credentials stays an opaque tunnel (the test CA, not ours).
    let other = https_get(
        &p,
        &format!("echo.test:{port}"),
        "echo.test",
        &[&pki.ca_pem],
        get("/echo", "echo.test"),
    )
    .await;
    assert!(!other.body.contains("authorization"), "{}", other.body);

    let report = p.finish().await;
    let r = record(&report, "api.test");
    assert_eq!(r.kind, ConnectionKind::Intercept);
    assert!(r.credential_added && r.allowed);
    assert_eq!(r.requests, Some(3));
    assert_eq!(r.status, Some(200), "the upstream's last status");
    assert_eq!(record(&report, "echo.test").kind, ConnectionKind::Connect);
    let json = serde_json::to_string(&report).unwrap();
    assert!(!json.contains(SECRET));
    assert!(!p.egress.health().to_string().contains(SECRET));
}

#[tokio::test]
async fn refusals_name_the_host_and_the_reason() {
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let mut p = proxy(
        &pki,
        &format!(
            "allow = [\"*.test:{port}\", \"localhost:{port}\", \"169.254.169.254\"]\ndeny = [\"bad.test:{port}\"]\n\
             allow_private = [\"127.0.0.1:{port}\"]"
        ),
        |_| {},
    )
    .await;
    // rebind.test resolves to 127.0.0.1 too, but only :{port} is allowed privately; make
    // a second policy-free case: a name on the list whose address is not allowed.
    let cases = [
        (format!("nothere.example:{port}"), 403, format!("codebox: egress to nothere.example:{port} denied (not in allowlist)\n")),
        (format!("bad.test:{port}"), 403, format!("codebox: egress to bad.test:{port} denied (denied by rule bad.test:{port})\n")),
        ("169.254.169.254:443".into(), 403, "codebox: egress to 169.254.169.254:443 denied (private address 169.254.169.254: cloud metadata)\n".into()),
        (format!("api.test:{}", port + 1), 403, format!("codebox: egress to api.test:{} denied (not in allowlist)\n", port + 1)),
    ];
    for (authority, status, body) in &cases {
        let answer = connect(p.addr, authority).await.unwrap_err();
        assert_eq!(
            (answer.status, answer.body.as_str()),
            (*status, body.as_str()),
            "{authority}"
        );
    }
    let report = p.finish().await;
    assert_eq!(
        record(&report, "bad.test").rule.as_deref(),
        Some(format!("bad.test:{port}").as_str())
    );
    assert_eq!(
        record(&report, "169.254.169.254").reason.as_deref(),
        Some("private address 169.254.169.254: cloud metadata")
    );
    assert_eq!(
        record(&report, "nothere.example").reason.as_deref(),
        Some("not in allowlist")
    );
    assert_eq!(report.denied, 4);
}

#[tokio::test]
async fn loopback_names_are_private_without_allow_private() {
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let mut p = proxy(
        &pki,
        &format!("allow = [\"localhost:{port}\", \"rebind.test:{port}\", \"127.0.0.1:{port}\"]"),
        |_| {},
    )
    .await;
    for host in ["localhost", "rebind.test", "127.0.0.1"] {
        let answer = connect(p.addr, &format!("{host}:{port}"))
            .await
            .unwrap_err();
        assert_eq!(answer.status, 403);
        assert_eq!(
            answer.body,
            format!(
                "codebox: egress to {host}:{port} denied (private address 127.0.0.1: loopback)\n"
            )
        );
    }
    let report = p.finish().await;
    assert!(report
        .connections
        .iter()
        .all(|r| !r.allowed && r.reason.as_deref() == Some("private address 127.0.0.1: loopback")));
    assert_eq!(origin.count(), 0, "nothing reached the origin");
}

#[tokio::test]
async fn bare_ips_ipv6_trailing_dots_and_case() {
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let v6 = Origin::start_on("[::1]:0", Some(pki.server.clone()))
        .await
        .ok();
    let v6port = v6.as_ref().map_or(1, |o| o.port());
    let mut p = proxy(
        &pki,
        &format!(
            "allow = [\"127.0.0.1:{port}\", \"api.test:{port}\", \"[::1]:{v6port}\"]\nallow_private = [\"127.0.0.1:{port}\", \"[::1]:{v6port}\"]"
        ),
        |_| {},
    )
    .await;
    let got = https_get(
        &p,
        &format!("127.0.0.1:{port}"),
        "127.0.0.1",
        &[&pki.ca_pem],
        get("/ok", "127.0.0.1"),
    )
    .await;
    assert_eq!(got.status, 200);
    let got = https_get(
        &p,
        &format!("API.Test.:{port}"),
        "api.test",
        &[&pki.ca_pem],
        get("/ok", "api.test"),
    )
    .await;
    assert_eq!(got.status, 200);
    if v6.is_some() {
        let got = https_get(
            &p,
            &format!("[::1]:{v6port}"),
            "::1",
            &[&pki.ca_pem],
            get("/ok", "[::1]"),
        )
        .await;
        assert_eq!(got.status, 200);
    } else {
        eprintln!("skipping the IPv6 tunnel: ::1 cannot be bound on this host");
    }
    // An IPv4 rule does not let the mapped IPv6 form of another address through, and
    // a mapped loopback is loopback.
    let answer = connect(p.addr, &format!("[::ffff:127.0.0.2]:{port}"))
        .await
        .unwrap_err();
    assert!(answer.body.contains("not in allowlist"), "{}", answer.body);
    let report = p.finish().await;
    assert!(record(&report, "127.0.0.1").allowed);
    assert!(record(&report, "api.test").allowed, "API.Test. is api.test");
    if v6.is_some() {
        assert_eq!(
            record(&report, "::1").address.as_deref(),
            Some(format!("[::1]:{v6port}").as_str())
        );
    }
}

#[tokio::test]
async fn malformed_requests_get_a_clear_answer() {
    let pki = TestPki::new();
    let mut p = proxy(&pki, "allow = [\"api.test\"]", |l| l.max_head_bytes = 8192).await;
    let cases: &[(&[u8], u16, &str)] = &[
        (
            b"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n",
            400,
            "codebox: this is the egress proxy",
        ),
        (
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            400,
            "codebox: HTTP/2 is not supported",
        ),
        (
            b"GET http://api.test/ HTTP/3.0\r\n\r\n",
            400,
            "codebox: only HTTP/1.0 and HTTP/1.1",
        ),
        (
            b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n",
            400,
            "codebox: malformed request",
        ),
        (
            b"CONNECT api.test HTTP/1.1\r\n\r\n",
            400,
            "codebox: CONNECT target \"api.test\" is not a valid host: a port is required",
        ),
        (
            b"CONNECT a..test:443 HTTP/1.1\r\n\r\n",
            400,
            "codebox: CONNECT target \"a..test\" is not a valid host: it has an empty label",
        ),
        (
            b"CONNECT 2130706433:443 HTTP/1.1\r\n\r\n",
            400,
            "ends in a number",
        ),
        (
            b"GET https://api.test/ HTTP/1.1\r\n\r\n",
            400,
            "https:// URLs go through a CONNECT tunnel",
        ),
        (
            b"GET http://user:pw@api.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n",
            400,
            "codebox: user names and passwords",
        ),
        (
            b"GET ftp://api.test/ HTTP/1.1\r\n\r\n",
            400,
            "codebox: this is the egress proxy",
        ),
    ];
    for (req, status, start) in cases {
        let a = raw(p.addr, req).await;
        assert_eq!(
            a.status,
            *status,
            "{:?}: {}",
            String::from_utf8_lossy(req),
            a.body
        );
        assert!(
            a.body.contains(start),
            "{:?}: {}",
            String::from_utf8_lossy(req),
            a.body
        );
        assert!(
            a.body.ends_with('\n') && a.body.lines().count() == 1,
            "one line: {:?}",
            a.body
        );
    }
    let huge = format!(
        "GET http://api.test/ HTTP/1.1\r\nX: {}\r\n\r\n",
        "y".repeat(10_000)
    );
    let a = raw(p.addr, huge.as_bytes()).await;
    assert_eq!(a.status, 431, "{}", a.body);
    let report = p.finish().await;
    assert!(report.connections.iter().all(|r| !r.allowed));
    assert!(report
        .connections
        .iter()
        .any(|r| r.kind == ConnectionKind::Invalid));
}

#[tokio::test]
async fn plain_http_is_decided_per_request_and_the_url_host_wins() {
    let pki = TestPki::new();
    let origin = Origin::start(None).await;
    let port = origin.port();
    let mut p = proxy(&pki, &format!("allow = [\"api.test:{port}\", \"echo.test:{port}\"]\ndeny = [\"bad.test:{port}\"]\nallow_private = [\"127.0.0.1\"]"), |_| {}).await;
    let mut sender = http_client(TcpStream::connect(p.addr).await.unwrap()).await;
    let got = send(
        &mut sender,
        get(&format!("http://api.test:{port}/echo"), "evil.test"),
    )
    .await
    .unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(
        origin.last().header("host"),
        Some(format!("api.test:{port}").as_str())
    );
    assert_eq!(origin.last().uri, "/echo");
    // The same connection, another host: decided again and refused.
    let got = send(
        &mut sender,
        get(&format!("http://bad.test:{port}/echo"), "api.test"),
    )
    .await
    .unwrap();
    assert_eq!(got.status, 403);
    assert_eq!(
        got.body,
        format!("codebox: egress to bad.test:{port} denied (denied by rule bad.test:{port})\n")
    );
    // And back to an allowed one, then a third host: new upstream connections each.
    let got = send(
        &mut sender,
        get(&format!("http://echo.test:{port}/ok"), "x"),
    )
    .await
    .unwrap();
    assert_eq!(got.status, 200);
    let got = send(
        &mut sender,
        get(&format!("http://echo.test:{port}/ok"), "x"),
    )
    .await
    .unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(origin.count(), 3);
    drop(sender);
    let report = p.finish().await;
    assert_eq!(
        report
            .connections
            .iter()
            .filter(|r| r.kind == ConnectionKind::Http)
            .count(),
        3
    );
    assert_eq!(
        record(&report, "echo.test").requests,
        Some(2),
        "kept alive upstream"
    );
    assert!(!record(&report, "bad.test").allowed);
}

#[tokio::test]
async fn request_smuggling_is_refused_or_reframed() {
    let pki = TestPki::new();
    let origin = Origin::start(None).await;
    let port = origin.port();
    let mut p = proxy(
        &pki,
        &format!("allow = [\"api.test:{port}\"]\nallow_private = [\"127.0.0.1\"]"),
        |_| {},
    )
    .await;
    // CL + TE with a smuggled second request in the body.
    let smuggle = format!(
        "POST http://api.test:{port}/echo HTTP/1.1\r\nHost: api.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n\
         0\r\n\r\nGET http://api.test:{port}/ok HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n"
    );
    let a = raw(p.addr, smuggle.as_bytes()).await;
    assert!(a.status == 400 || a.status == 200, "{a:?}");
    let uris: Vec<String> = origin
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.uri.clone())
        .collect();
    // Whatever hyper made of it, the origin saw requests the proxy framed itself: never a
    // request hidden inside another's body.
    for s in origin.seen.lock().unwrap().iter() {
        assert!(s.header("transfer-encoding").is_none_or(|v| v == "chunked"));
        assert!(!(s.header("transfer-encoding").is_some() && s.header("content-length").is_some()));
    }
    // hyper reads Transfer-Encoding over Content-Length (RFC 9112) and closes the
    // connection after such a message, so the "smuggled" GET is never sent anywhere.
    assert_eq!(uris, vec!["/echo".to_string()]);
    // Two Content-Lengths that disagree: refused.
    let a = raw(p.addr, format!("POST http://api.test:{port}/echo HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 5\r\n\r\nhello").as_bytes()).await;
    assert_eq!(a.status, 400, "{a:?}");
    p.finish().await;
}

#[tokio::test]
async fn credentials_are_not_sent_in_clear_unless_allowed() {
    let pki = TestPki::new();
    let origin = Origin::start(None).await;
    let port = origin.port();
    let mut p = proxy(
        &pki,
        &format!(
            "allow = [\"api.test:{port}\", \"echo.test:{port}\"]\nallow_private = [\"127.0.0.1\"]\n\
             [[credentials]]\nhost = \"api.test:{port}\"\nbearer = \"env:TOKEN\"\n\
             [[credentials]]\nhost = \"echo.test:{port}\"\nheader = \"X-Api-Key\"\nvalue = \"env:TOKEN\"\nallow_plain_http = true\n"
        ),
        |_| {},
    )
    .await;
    let mut sender = http_client(TcpStream::connect(p.addr).await.unwrap()).await;
    let got = send(
        &mut sender,
        get(&format!("http://api.test:{port}/echo"), "api.test"),
    )
    .await
    .unwrap();
    assert_eq!(got.status, 403);
    assert!(
        got.body.contains("credentials go over https only"),
        "{}",
        got.body
    );
    let got = send(
        &mut sender,
        get(&format!("http://echo.test:{port}/echo"), "echo.test"),
    )
    .await
    .unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(origin.last().header("x-api-key"), Some(SECRET));
    assert!(!got.everything().contains(SECRET), "{}", got.everything());
    assert!(got.body.contains("x-api-key: [REDACTED]"));
    drop(sender);
    let report = p.finish().await;
    assert!(record(&report, "echo.test").credential_added);
    assert_eq!(origin.count(), 1);
}

#[tokio::test]
async fn a_redirect_to_a_denied_host_is_refused_on_the_next_connection() {
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let mut p = proxy(
        &pki,
        &format!("allow = [\"api.test:{port}\"]\nallow_private = [\"127.0.0.1\"]"),
        |_| {},
    )
    .await;
    let to = format!("https://bad.test:{port}/echo");
    let got = https_get(
        &p,
        &format!("api.test:{port}"),
        "api.test",
        &[&pki.ca_pem],
        get(&format!("/redirect?to={to}"), "api.test"),
    )
    .await;
    assert_eq!(got.status, 302);
    assert_eq!(got.headers["location"], to.as_str());
    let answer = connect(p.addr, &format!("bad.test:{port}"))
        .await
        .unwrap_err();
    assert_eq!(
        answer.body,
        format!("codebox: egress to bad.test:{port} denied (not in allowlist)\n")
    );
    let report = p.finish().await;
    assert!(record(&report, "api.test").allowed);
    assert!(!record(&report, "bad.test").allowed);
}

#[tokio::test]
async fn a_slow_loris_is_cut_while_another_client_proceeds() {
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let mut p = proxy(
        &pki,
        &format!("allow = [\"api.test:{port}\"]\nallow_private = [\"127.0.0.1\"]"),
        |l| l.head_timeout = Duration::from_millis(800),
    )
    .await;
    let addr = p.addr;
    let slow = tokio::spawn(async move {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let started = Instant::now();
        for b in format!("CONNECT api.test:{port} HTTP/1.1\r\nX-Slow: 1111111111111111111111111111")
            .bytes()
        {
            if s.write_all(&[b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            if started.elapsed() > Duration::from_secs(1) {
                break;
            }
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        (started.elapsed(), out)
    });
    // Meanwhile a normal client goes through.
    let got = https_get(
        &p,
        &format!("api.test:{port}"),
        "api.test",
        &[&pki.ca_pem],
        get("/ok", "api.test"),
    )
    .await;
    assert_eq!(got.status, 200);
    let (took, out) = slow.await.unwrap();
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");
    assert!(
        out.contains("codebox: request head not complete within 800ms"),
        "{out}"
    );
    assert!(took < Duration::from_secs(3), "{took:?}");
    p.finish().await;
}

#[tokio::test]
async fn an_origin_that_never_answers_hits_the_idle_timeout() {
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let mut p = proxy(
        &pki,
        &format!("allow = [\"api.test:{port}\"]\nallow_private = [\"127.0.0.1\"]\nidle_timeout = \"400ms\"\n[[credentials]]\nhost = \"api.test:{port}\"\nbearer = \"env:TOKEN\"\n"),
        |_| {},
    )
    .await;
    let ca = p.egress.ca_certificate_pem().unwrap().to_string();
    let tunnel = connect(p.addr, &format!("api.test:{port}")).await.unwrap();
    let tls = tls(tunnel, "api.test", client_tls(&[&ca])).await.unwrap();
    let mut sender = http_client(tls).await;
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        send(&mut sender, get("/hang", "api.test")),
    )
    .await;
    assert!(matches!(r, Ok(Err(_))), "the connection is closed: {r:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    let report = p.finish().await;
    assert_eq!(
        record(&report, "api.test").reason.as_deref(),
        Some("idle timeout (400ms)")
    );
}

#[tokio::test]
async fn a_connect_that_hangs_hits_the_connect_timeout() {
    // A listener whose accept queue is full drops further SYNs: connects hang.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        if let Ok(Ok(s)) = tokio::time::timeout(
            Duration::from_millis(200),
            TcpStream::connect(("127.0.0.1", port)),
        )
        .await
        {
            fillers.push(s);
        }
    }
    let probe = tokio::time::timeout(
        Duration::from_millis(300),
        TcpStream::connect(("127.0.0.1", port)),
    )
    .await;
    if probe.is_ok() {
        eprintln!("skipping: this kernel completes connects to a full accept queue");
        return;
    }
    let pki = TestPki::new();
    let mut p = proxy(&pki, &format!("allow = [\"api.test:{port}\"]\nallow_private = [\"127.0.0.1\"]\nconnect_timeout = \"300ms\""), |_| {}).await;
    let answer = connect(p.addr, &format!("api.test:{port}"))
        .await
        .unwrap_err();
    assert_eq!(answer.status, 504);
    assert_eq!(
        answer.body,
        format!("codebox: egress to api.test:{port} failed (connect timed out after 300ms)\n")
    );
    let report = p.finish().await;
    assert_eq!(
        record(&report, "api.test").reason.as_deref(),
        Some("connect timed out after 300ms")
    );
    drop(listener);
}

#[tokio::test]
async fn connection_and_byte_limits_are_named() {
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let mut p = proxy(
        &pki,
        &format!(
            "allow = [\"api.test:{port}\"]\nallow_private = [\"127.0.0.1\"]\nmax_connections = 2"
        ),
        |_| {},
    )
    .await;
    for _ in 0..2 {
        let got = https_get(
            &p,
            &format!("api.test:{port}"),
            "api.test",
            &[&pki.ca_pem],
            get("/ok", "api.test"),
        )
        .await;
        assert_eq!(got.status, 200);
    }
    let answer = connect(p.addr, &format!("api.test:{port}"))
        .await
        .unwrap_err();
    assert_eq!(answer.status, 429);
    assert_eq!(
        answer.body,
        format!("codebox: egress to api.test:{port} denied (limit max_connections (2) reached)\n")
    );
    let report = p.finish().await;
    assert_eq!(report.limit_reached.as_deref(), Some("max_connections (2)"));
    assert_eq!(
        report.connections[2].reason.as_deref(),
        Some("limit max_connections (2) reached")
    );

    let mut p = proxy(&pki, &format!("allow = [\"api.test:{port}\"]\nallow_private = [\"127.0.0.1\"]\nmax_bytes_down = \"16K\""), |_| {}).await;
    let tunnel = connect(p.addr, &format!("api.test:{port}")).await.unwrap();
    let tls = tls(tunnel, "api.test", client_tls(&[&pki.ca_pem]))
        .await
        .unwrap();
    let mut sender = http_client(tls).await;
    let r = send(&mut sender, get("/big?n=200000", "api.test")).await;
    assert!(r.is_err(), "the download is cut");
    let report = p.finish().await;
    assert_eq!(
        report.limit_reached.as_deref(),
        Some("max_bytes_down (16K)")
    );
    assert_eq!(report.bytes_down, 16 << 10);
    assert_eq!(
        record(&report, "api.test").reason.as_deref(),
        Some("limit max_bytes_down (16K) reached")
    );
}

#[tokio::test]
async fn an_upload_past_max_bytes_up_is_cut() {
    let pki = TestPki::new();
    let origin = Origin::start(None).await;
    let port = origin.port();
    let mut p = proxy(
        &pki,
        &format!(
            "allow = [\"api.test:{port}\"]\nallow_private = [\"127.0.0.1\"]\nmax_bytes_up = \"8K\""
        ),
        |_| {},
    )
    .await;
    let mut sender = http_client(TcpStream::connect(p.addr).await.unwrap()).await;
    let req = http::Request::post(format!("http://api.test:{port}/echo"))
        .header("host", "api.test")
        .body(http_body_util::Full::new(bytes::Bytes::from(vec![
            b'u';
            100_000
        ])))
        .unwrap();
    let got = send(&mut sender, req).await;
    match got {
        Ok(g) => {
            assert_eq!(g.status, 502, "{}", g.body);
            assert!(
                g.body.contains("limit max_bytes_up (8K) reached"),
                "{}",
                g.body
            );
        }
        Err(e) => eprintln!("the client saw the connection end: {e}"),
    }
    drop(sender);
    let report = p.finish().await;
    assert_eq!(report.limit_reached.as_deref(), Some("max_bytes_up (8K)"));
    assert_eq!(report.bytes_up, 8 << 10);
}

#[tokio::test]
async fn concurrent_connections_past_the_limit_are_refused_at_once() {
    let pki = TestPki::new();
    let mut p = proxy(&pki, "allow = [\"api.test\"]", |l| {
        l.max_concurrent_connections = 1
    })
    .await;
    let _holder = TcpStream::connect(p.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let a = raw(p.addr, b"CONNECT api.test:443 HTTP/1.1\r\n\r\n").await;
    assert_eq!(a.status, 429);
    assert!(
        a.body
            .contains("limit max_concurrent_connections (1) reached"),
        "{}",
        a.body
    );
    let report = p.finish().await;
    assert_eq!(
        report.limit_reached.as_deref(),
        Some("max_concurrent_connections (1)")
    );
}

#[tokio::test]
async fn finish_is_prompt_with_connections_still_open() {
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let mut p = proxy(
        &pki,
        &format!("allow = [\"api.test:{port}\"]\nallow_private = [\"127.0.0.1\"]"),
        |_| {},
    )
    .await;
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(connect(p.addr, &format!("api.test:{port}")).await.unwrap());
    }
    // And one that has sent half a head.
    let mut half = TcpStream::connect(p.addr).await.unwrap();
    half.write_all(b"CONNECT api.te").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let report = p.finish().await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(report.connections.len(), 4, "{report:#?}");
    assert_eq!(
        report
            .connections
            .iter()
            .filter(|r| r.reason.as_deref() == Some("execution finished"))
            .count(),
        3
    );
    assert!(report
        .connections
        .iter()
        .any(|r| r.reason.as_deref() == Some("execution finished before a whole request head")));
    for mut s in open {
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf))
            .await
            .unwrap();
        assert!(matches!(n, Ok(0) | Err(_)), "closed");
    }
    // The listener is closed too.
    assert!(TcpStream::connect(p.addr).await.is_err());
}

#[tokio::test]
async fn narrowing_applies_per_run() {
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let toml_text = format!("allow = [\"*.test:{port}\"]\nallow_private = [\"127.0.0.1\"]");
    let mut p = proxy_narrowed(
        &pki,
        &toml_text,
        |_| {},
        Some(&[&format!("api.test:{port}")]),
    )
    .await;
    assert!(connect(p.addr, &format!("api.test:{port}")).await.is_ok());
    let answer = connect(p.addr, &format!("echo.test:{port}"))
        .await
        .unwrap_err();
    assert!(
        answer.body.contains("not in this request's network list"),
        "{}",
        answer.body
    );
    p.finish().await;
}

#[tokio::test]
async fn hostile_upstreams_get_a_bounded_answer() {
    let pki = TestPki::new();
    let origin = Origin::start(None).await;
    let port = origin.port();
    let mut p = proxy(
        &pki,
        &format!("allow = [\"api.test:{port}\"]\nallow_private = [\"127.0.0.1\"]"),
        |_| {},
    )
    .await;
    let mut sender = http_client(TcpStream::connect(p.addr).await.unwrap()).await;
    let got = send(
        &mut sender,
        get(&format!("http://api.test:{port}/huge-head"), "api.test"),
    )
    .await
    .unwrap();
    assert_eq!(
        got.status,
        502,
        "{:?} {}",
        got.headers.get("x-big").map(|v| v.len()),
        got.body
    );
    assert!(
        got.body.starts_with(&format!(
            "codebox: egress to api.test:{port} failed (upstream request failed"
        )),
        "{}",
        got.body
    );
    p.finish().await;
}

/// CPython's own client through the proxy, trusting the sandbox bundle: a tunnel to a
/// host of the test CA (an extra root) and an intercepted host (the codebox CA).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_urllib_through_the_proxy() {
    if std::process::Command::new("python3")
        .arg("-c")
        .arg("import ssl")
        .output()
        .is_err()
    {
        eprintln!("skipping: no python3 on this host");
        return;
    }
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let mut p = proxy(
        &pki,
        &format!(
            "allow = [\"api.test:{port}\", \"echo.test:{port}\"]\nallow_private = [\"127.0.0.1\"]\n\
             [[credentials]]\nhost = \"api.test:{port}\"\nbearer = \"env:TOKEN\"\n"
        ),
        |_| {},
    )
    .await;
    let script = format!(
        "import urllib.request, urllib.error\n\
         for url in ['https://echo.test:{port}/ok', 'https://api.test:{port}/echo', 'https://bad.test:{port}/']:\n\
         \x20   try:\n\
         \x20       print(url, urllib.request.urlopen(url, timeout=10).read().decode())\n\
         \x20   except Exception as e:\n\
         \x20       print(url, 'ERROR', e)\n"
    );
    let proxy_url = format!("http://{}", p.addr);
    let out = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(&script)
        .env_clear()
        .env("HTTPS_PROXY", &proxy_url)
        .env("HTTP_PROXY", &proxy_url)
        .env("SSL_CERT_FILE", p.bundle())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("https://echo.test:{port}/ok ok")),
        "{stdout}"
    );
    assert!(stdout.contains("authorization: [REDACTED]"), "{stdout}");
    assert!(!stdout.contains(SECRET), "{stdout}");
    assert!(
        stdout.contains("403") && stdout.contains("bad.test"),
        "{stdout}"
    );
    assert_eq!(
        origin.last().header("authorization"),
        Some(format!("Bearer {SECRET}").as_str())
    );
    let report = p.finish().await;
    assert_eq!(record(&report, "api.test").kind, ConnectionKind::Intercept);
}

/// A resolver that answers differently on every call (a rebinding DNS server), counting
/// its calls.
struct Rebinding {
    calls: std::sync::atomic::AtomicUsize,
}

impl codebox::egress::Resolve for Rebinding {
    fn resolve(&self, _host: &str, port: u16) -> codebox::egress::resolve::Resolving {
        let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // First a refused loopback address, then the allowed one; later calls would
        // give only the refused one.
        let ips: Vec<IpAddr> = if n == 0 {
            vec!["127.0.0.2".parse().unwrap(), "127.0.0.1".parse().unwrap()]
        } else {
            vec!["127.0.0.2".parse().unwrap()]
        };
        Box::pin(async move {
            Ok(ips
                .into_iter()
                .map(|ip| SocketAddr::new(ip, port))
                .collect())
        })
    }
}

#[tokio::test]
async fn one_resolution_per_connection_and_only_checked_addresses() {
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let dir = tempfile::tempdir().unwrap();
    let section: NetworkSection = toml::from_str(&format!(
        "allow = [\"api.test:{port}\"]\nallow_private = [\"127.0.0.1\"]"
    ))
    .unwrap();
    let policy = EgressPolicy::from_section(&section, &|_| None).unwrap();
    let resolver = Arc::new(Rebinding {
        calls: Default::default(),
    });
    let egress = Egress::new(
        policy,
        EgressOptions {
            state_dir: dir.path().to_path_buf(),
            resolver: resolver.clone(),
        },
    )
    .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let run = egress.start(listener, Narrowing::none());
    let tunnel = connect(addr, &format!("api.test:{port}")).await.unwrap();
    let tls = tls(tunnel, "api.test", client_tls(&[&pki.ca_pem]))
        .await
        .unwrap();
    let mut sender = http_client(tls).await;
    assert_eq!(
        send(&mut sender, get("/ok", "api.test"))
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(resolver.calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    drop(sender);
    // The next connection resolves again and gets only the refused address.
    let answer = connect(addr, &format!("api.test:{port}"))
        .await
        .unwrap_err();
    assert_eq!(
        answer.body,
        format!(
            "codebox: egress to api.test:{port} denied (private address 127.0.0.2: loopback)\n"
        )
    );
    let report = run.finish().await;
    assert_eq!(
        report.connections[0].address.as_deref(),
        Some(format!("127.0.0.1:{port}").as_str())
    );
    assert!(!report.connections[1].allowed);
}
