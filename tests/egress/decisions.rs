//! Decisions: allowed tunnels, refusals with their reasons, names and addresses in every
//! form, malformed requests, plain HTTP decided per request, smuggling, redirects,
//! narrowing, rebinding.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use codebox::egress::{
    ConnectionKind, Egress, EgressOptions, EgressPolicy, Narrowing, NetworkSection,
};
use tokio::net::TcpStream;

use crate::support::*;
use crate::*;

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

/// A resolver that answers differently on every call (a rebinding DNS server), counting
/// its calls.
struct Rebinding {
    calls: std::sync::atomic::AtomicUsize,
}

impl codebox::egress::Resolve for Rebinding {
    fn resolve(&self, _host: &str, port: u16) -> codebox::egress::rules::resolve::Resolving {
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
