//! Credentials at the boundary: interception, redaction, plain HTTP only when allowed,
//! and CPython's urllib trusting the sandbox bundle.

use codebox::egress::ConnectionKind;
use tokio::net::TcpStream;

use crate::support::*;
use crate::*;

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

    // The origin ends its connection: the proxy opens a new one to the same checked
    // address for the next request, the program's connection stays.
    let got = send(&mut sender, get("/close", "api.test")).await.unwrap();
    assert_eq!(got.body, "closing\n");

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
    assert_eq!(r.requests, Some(4));
    assert_eq!(r.status, Some(200), "the upstream's last status");
    assert_eq!(record(&report, "echo.test").kind, ConnectionKind::Connect);
    let json = serde_json::to_string(&report).unwrap();
    assert!(!json.contains(SECRET));
    assert!(!p.egress.health().to_string().contains(SECRET));
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

/// curl (OpenSSL's verifier, as Node and most tools use it) through the proxy with only
/// the sandbox bundle: the intercepted host's leaf must pass a strict X.509 check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_trusts_the_bundle() {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("CODEBOX_TEST_STRICT").is_none_or(|v| v != "1"),
            "curl is missing (cargo xtask test installs it)"
        );
        eprintln!("skipping: no curl on this host");
        return;
    }
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let mut p = proxy(
        &pki,
        &format!(
            "allow = [\"api.test:{port}\"]\nallow_private = [\"127.0.0.1\"]\n\
             [[credentials]]\nhost = \"api.test:{port}\"\nheader = \"X-Api-Key\"\nvalue = \"env:TOKEN\"\n"
        ),
        |_| {},
    )
    .await;
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "--proxy"])
        .arg(format!("http://{}", p.addr))
        .arg("--cacert")
        .arg(p.bundle())
        .arg(format!("https://api.test:{port}/echo"))
        .env_clear()
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("x-api-key: [REDACTED]"), "{stdout}");
    assert_eq!(origin.last().header("x-api-key"), Some(SECRET));
    p.finish().await;
}

/// The proxy verifies the upstream before it answers the CONNECT: an origin whose
/// certificate no trusted root signed is a 502 naming the reason, and no request (with
/// the secret) is ever sent to it.
#[tokio::test]
async fn an_upstream_with_an_untrusted_certificate_gets_no_secret() {
    let pki = TestPki::new();
    let stranger = TestPki::new();
    let origin = Origin::start(Some(stranger.server.clone())).await;
    let port = origin.port();
    let mut p = proxy(
        &pki,
        &format!(
            "allow = [\"api.test:{port}\"]\nallow_private = [\"127.0.0.1\"]\n\
             [[credentials]]\nhost = \"api.test:{port}\"\nbearer = \"env:TOKEN\"\n"
        ),
        |_| {},
    )
    .await;
    let answer = connect(p.addr, &format!("api.test:{port}"))
        .await
        .unwrap_err();
    assert_eq!(answer.status, 502);
    assert!(
        answer.body.starts_with(&format!(
            "codebox: egress to api.test:{port} failed (upstream certificate invalid: "
        )),
        "{}",
        answer.body
    );
    assert_eq!(origin.count(), 0);
    let report = p.finish().await;
    let r = record(&report, "api.test");
    assert!(r
        .reason
        .as_deref()
        .unwrap()
        .starts_with("upstream certificate invalid"));
    assert!(!r.credential_added);
}
