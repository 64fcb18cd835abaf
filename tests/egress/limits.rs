//! Time and size bounds: slow clients, silent origins, hanging connects, connection,
//! concurrency and byte limits, finish() with connections open, hostile upstream heads.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;
use crate::*;

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

/// One execution floods its proxy with slow-loris connections and a tunnel to an origin
/// that never answers; another execution of the same engine is served as usual, and both
/// finish promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooded_run_does_not_slow_another() {
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let mut flooded = proxy(
        &pki,
        &format!("allow = [\"api.test:{port}\"]\nallow_private = [\"127.0.0.1\"]"),
        |_| {},
    )
    .await;
    // A second run of the same engine.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let calm_addr = listener.local_addr().unwrap();
    let calm = flooded
        .egress
        .start(listener, codebox::egress::Narrowing::none());

    let mut flood = Vec::new();
    for _ in 0..200 {
        let addr = flooded.addr;
        flood.push(tokio::spawn(async move {
            let Ok(mut s) = TcpStream::connect(addr).await else {
                return;
            };
            for b in b"CONNECT api.test:" {
                if s.write_all(&[*b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let started = Instant::now();
    let tunnel = connect(calm_addr, &format!("api.test:{port}"))
        .await
        .unwrap();
    let tls = tls(tunnel, "api.test", client_tls(&[&pki.ca_pem]))
        .await
        .unwrap();
    let mut sender = http_client(tls).await;
    let got = send(&mut sender, get("/ok", "api.test")).await.unwrap();
    assert_eq!(got.status, 200);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "the calm run waited {:?}",
        started.elapsed()
    );

    let started = Instant::now();
    let report = flooded.finish().await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        report.limit_reached.as_deref(),
        Some("max_concurrent_connections (16)")
    );
    assert!(
        report.dropped > 0,
        "past 100 records are counted: {}",
        report.dropped
    );
    let calm_report = calm.finish().await;
    assert_eq!((calm_report.allowed, calm_report.denied), (1, 0));
    for f in flood {
        f.abort();
    }
}
