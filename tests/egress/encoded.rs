//! A credentialed host that echoes its credential encoded: every common encoding of every
//! kind of credential is redacted, in the body (also split across chunks) and in headers.

use tokio::net::TcpStream;

use crate::support::*;
use crate::*;

/// One credentialed host's intercepted connection, trusting the codebox CA.
async fn intercepted(
    p: &Proxy,
    host: &str,
    port: u16,
) -> hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>> {
    let ca = p.egress.ca_certificate_pem().expect("a CA").to_string();
    let tunnel: TcpStream = connect(p.addr, &format!("{host}:{port}")).await.unwrap();
    let tls = tls(tunnel, host, client_tls(&[&ca])).await.unwrap();
    http_client(tls).await
}

#[tokio::test]
async fn every_encoding_of_every_credential_is_redacted() {
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let mut p = proxy(
        &pki,
        &format!(
            "allow = [\"api.test:{port}\", \"echo.test:{port}\", \"other.test:{port}\"]\n\
             allow_private = [\"127.0.0.1\"]\n\
             [[credentials]]\nhost = \"api.test:{port}\"\nbearer = \"env:ODD_BEARER\"\n\
             [[credentials]]\nhost = \"echo.test:{port}\"\nheader = \"X-Api-Key\"\nvalue = \"env:ODD_HEADER\"\n\
             [[credentials]]\nhost = \"other.test:{port}\"\nquery = \"key\"\nvalue = \"env:ODD_QUERY\"\n"
        ),
        |_| {},
    )
    .await;
    let wire: String = form_urlencoded::byte_serialize(ODD_QUERY.as_bytes()).collect();
    let bearer = format!("Bearer {ODD_BEARER}");
    // (host, what the origin reflects, the value it reflects)
    let cases: [(&str, &str, &str); 5] = [
        ("api.test", "authorization", &bearer),
        ("api.test", "bearer-token", ODD_BEARER),
        ("echo.test", "x-api-key", ODD_HEADER),
        ("other.test", "key", ODD_QUERY),
        ("other.test", "key-wire", &wire),
    ];
    let mut leaks = Vec::new();
    let mut checked = 0;
    for (host, what, value) in cases {
        let mut sender = intercepted(&p, host, port).await;
        for form in FORMS {
            let encoded = encode(value, form).unwrap();
            // The value whole in one chunk, and split after its first byte, in its
            // middle and before its last byte.
            for split in [0, 1, encoded.len() / 2, encoded.len() - 1] {
                let path = format!("/reflect?what={what}&form={form}&split={split}");
                let got = send(&mut sender, get(&path, host)).await.unwrap();
                assert_eq!(got.status, 200, "{path}: {}", got.body);
                checked += 1;
                let all = got.everything();
                let whole = got.body == "before [REDACTED] middle [REDACTED] after"
                    && got
                        .headers
                        .get("x-reflect")
                        .is_some_and(|v| v == "[REDACTED]");
                if !whole || all.contains(&encoded) || all.contains(value) {
                    leaks.push(format!(
                        "{host} {what} {form} split {split}: x-reflect {:?}, body {:?}",
                        got.headers.get("x-reflect"),
                        got.body
                    ));
                }
            }
        }
    }
    assert!(
        leaks.is_empty(),
        "{} of {checked} echoes were not redacted whole:\n{}",
        leaks.len(),
        leaks.join("\n")
    );
    // The origin got each credential as configured.
    let seen = origin.seen.lock().unwrap().clone();
    assert!(seen
        .iter()
        .any(|s| s.header("authorization") == Some(bearer.as_str())));
    assert!(seen
        .iter()
        .any(|s| s.header("x-api-key") == Some(ODD_HEADER)));
    assert!(seen.iter().any(|s| s.uri.ends_with(&format!("key={wire}"))));
    p.finish().await;
}
