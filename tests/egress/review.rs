//! Findings of the hostile review of the proxy, each pinned by the test that showed it:
//! parts of a credentialed host's response the redaction missed, upstream reconnections
//! of an intercepted connection that no connection limit counted, an IPv4 deny rule that
//! the mapped IPv6 form of its address walked past, the supervisor's own public address
//! (SSRF into its host), name lookups piling up on the blocking pool, and client
//! connections across runs unbounded by the descriptor limit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::support::*;
use crate::*;

/// A TLS origin that answers every request with `template` (a whole HTTP/1.1 response,
/// `{auth}` replaced by the request's `authorization` value, lower-cased where it says
/// `{auth_lower}`) and closes; it counts the TCP connections it accepted.
struct RawOrigin {
    port: u16,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawOrigin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawOrigin {
    async fn start(pki: &TestPki, template: &'static str) -> RawOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted: Arc<AtomicUsize> = Arc::default();
        let counter = accepted.clone();
        let acceptor = tokio_rustls::TlsAcceptor::from(pki.server.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                counter.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut s) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match s.read(&mut byte).await {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let auth = head
                        .lines()
                        .find_map(|l| {
                            let (n, v) = l.split_once(':')?;
                            n.eq_ignore_ascii_case("authorization")
                                .then(|| v.trim().to_string())
                        })
                        .unwrap_or_default();
                    let resp = template
                        .replace("{auth_lower}", &auth.to_ascii_lowercase().replace(' ', "-"))
                        .replace("{auth}", &auth);
                    let _ = s.write_all(resp.as_bytes()).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        RawOrigin {
            port,
            accepted,
            task,
        }
    }
}

async fn credentialed_proxy(pki: &TestPki, port: u16, extra: &str) -> Proxy {
    proxy(
        pki,
        &format!(
            "allow = [\"api.test:{port}\"]\nallow_private = [\"127.0.0.1\"]\n{extra}\n\
             [[credentials]]\nhost = \"api.test:{port}\"\nbearer = \"env:TOKEN\"\n"
        ),
        |_| {},
    )
    .await
}

/// One intercepted request to `api.test:port`, the raw bytes the client received.
async fn intercepted_raw(p: &Proxy, port: u16) -> String {
    let ca = p.egress.ca_certificate_pem().unwrap().to_string();
    let tunnel = connect(p.addr, &format!("api.test:{port}")).await.unwrap();
    let mut tls = tls(tunnel, "api.test", client_tls(&[&ca])).await.unwrap();
    tls.write_all(b"GET /x HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tls.read_to_end(&mut out),
    )
    .await;
    String::from_utf8_lossy(&out).into_owned()
}

/// hyper keeps a non-canonical reason phrase and writes it back out: an origin that put
/// the request's credential there handed it to the program verbatim.
#[tokio::test]
async fn a_reason_phrase_of_a_credentialed_host_is_redacted() {
    let pki = TestPki::new();
    let origin = RawOrigin::start(
        &pki,
        "HTTP/1.1 401 bad credential {auth}\r\ncontent-length: 3\r\n\r\nno\n",
    )
    .await;
    let mut p = credentialed_proxy(&pki, origin.port, "").await;
    let got = intercepted_raw(&p, origin.port).await;
    assert!(got.starts_with("HTTP/1.1 401 "), "{got}");
    assert!(
        !got.contains(SECRET),
        "the secret reached the client: {got}"
    );
    assert_eq!(origin.accepted.load(Ordering::SeqCst), 1);
    p.finish().await;
}

/// A header *name* carrying the credential (hyper lower-cases names, so the value is
/// found only case-insensitively) is dropped.
#[tokio::test]
async fn a_header_name_carrying_the_credential_is_dropped() {
    let pki = TestPki::new();
    let origin = RawOrigin::start(
        &pki,
        "HTTP/1.1 200 OK\r\nx-{auth_lower}: 1\r\ncontent-length: 3\r\n\r\nok\n",
    )
    .await;
    let mut p = credentialed_proxy(&pki, origin.port, "").await;
    let got = intercepted_raw(&p, origin.port).await;
    assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
    assert!(
        !got.to_ascii_lowercase()
            .contains(&SECRET.to_ascii_lowercase()),
        "the secret reached the client: {got}"
    );
    p.finish().await;
}

/// Only the first `Content-Encoding` header was looked at: `identity` then `gzip` passed a
/// compressed body (which redaction cannot read) to the client. Likewise a transfer
/// coding other than chunked, which hyper does not decode and the proxy strips.
#[tokio::test]
async fn every_coding_of_a_credentialed_response_is_checked() {
    let pki = TestPki::new();
    for template in [
        "HTTP/1.1 200 OK\r\ncontent-encoding: identity\r\ncontent-encoding: gzip\r\ncontent-length: 3\r\n\r\nzz\n",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n3\r\nzz\n\r\n0\r\n\r\n",
    ] {
        let origin = RawOrigin::start(&pki, template).await;
        let mut p = credentialed_proxy(&pki, origin.port, "").await;
        let got = intercepted_raw(&p, origin.port).await;
        assert!(
            got.starts_with("HTTP/1.1 502 "),
            "an encoded body reached the client ({template:?}): {got}"
        );
        p.finish().await;
    }
}

/// An intercepted connection reopens its upstream when the origin closes it; those
/// connections must count against `max_connections` like any other.
#[tokio::test]
async fn reopened_upstreams_count_against_max_connections() {
    let pki = TestPki::new();
    let origin = RawOrigin::start(
        &pki,
        "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 3\r\n\r\nok\n",
    )
    .await;
    let mut p = credentialed_proxy(&pki, origin.port, "max_connections = 3").await;
    let ca = p.egress.ca_certificate_pem().unwrap().to_string();
    let tunnel = connect(p.addr, &format!("api.test:{}", origin.port))
        .await
        .unwrap();
    let tls = tls(tunnel, "api.test", client_tls(&[&ca])).await.unwrap();
    let mut sender = http_client(tls).await;
    let mut statuses = Vec::new();
    for _ in 0..8 {
        match send(&mut sender, get("/x", "api.test")).await {
            Ok(got) => statuses.push(got.status),
            Err(_) => break,
        }
    }
    assert!(
        origin.accepted.load(Ordering::SeqCst) <= 3,
        "the origin accepted {} connections past max_connections = 3 (statuses {statuses:?})",
        origin.accepted.load(Ordering::SeqCst)
    );
    let report = p.finish().await;
    assert_eq!(report.limit_reached.as_deref(), Some("max_connections (3)"));
}

/// A deny rule naming an IPv4 address must also stop its IPv4-mapped IPv6 form, which the
/// proxy connects to as that very IPv4 address.
#[tokio::test]
async fn a_mapped_ipv6_literal_does_not_pass_an_ipv4_deny_rule() {
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let mut p = proxy(
        &pki,
        &format!(
            "allow = [\"*:{port}\"]\ndeny = [\"127.0.0.1\", \"127.0.0.1:{port}\"]\nallow_private = [\"127.0.0.1\"]"
        ),
        |_| {},
    )
    .await;
    for target in [
        format!("127.0.0.1:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
        format!("[::FFFF:7f00:1]:{port}"),
    ] {
        let answer = connect(p.addr, &target).await.map(|_| ()).unwrap_err();
        assert_eq!(answer.status, 403, "{target}: {answer:?}");
        assert!(
            answer.body.contains("denied by rule"),
            "{target}: {answer:?}"
        );
    }
    let report = p.finish().await;
    assert_eq!(origin.count(), 0);
    assert!(report.connections.iter().all(|r| !r.allowed), "{report:#?}");
}

/// Marks the copy of this test binary re-run inside namespaces of its own.
const IN_NETNS: &str = "CODEBOX_EGRESS_TEST_IN_NETNS";
/// A public address, given to `lo` in a network namespace the test makes (nothing leaves
/// it): what a host on a public network has on its interface.
const HOST_ADDR: &str = "11.0.0.1";

/// The supervisor's own public address reaches every service of its host listening on
/// `0.0.0.0` or `::`; it must be refused like loopback. Run in a user and network
/// namespace of the test's own (`unshare`), where `lo` carries a public address and an
/// origin listens on all addresses, as root and rootless.
#[test]
fn an_address_of_the_supervisors_host_is_refused() {
    if std::env::var_os(IN_NETNS).is_some() {
        eprintln!("in a namespace of the test's own");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(an_address_of_the_supervisors_host_is_refused_here());
        return;
    }
    let strict = std::env::var_os("CODEBOX_TEST_STRICT").is_some_and(|v| v == "1");
    let skip = |why: String| {
        assert!(!strict, "{why}");
        eprintln!("SKIP an_address_of_the_supervisors_host_is_refused: {why}");
    };
    let Some(ip) = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        return skip("no `ip` command to give lo an address".into());
    };
    let script = format!(
        "{ip} link set lo up && {ip} addr add {HOST_ADDR}/32 dev lo && exec \"$0\" --exact \
         review::an_address_of_the_supervisors_host_is_refused --nocapture --test-threads 1"
    );
    let out = match std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--net", "sh", "-c", &script])
        .arg(std::env::current_exe().unwrap())
        .env(IN_NETNS, "1")
        .output()
    {
        Ok(out) => out,
        Err(e) => return skip(format!("cannot run unshare: {e}")),
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !stderr.contains("in a namespace of the test's own") {
        return skip(format!("cannot make the namespaces: {stderr}"));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{stdout}\n{stderr}"
    );
}

async fn an_address_of_the_supervisors_host_is_refused_here() {
    let pki = TestPki::new();
    let service = Origin::start_on("0.0.0.0:0", Some(pki.server.clone()))
        .await
        .unwrap();
    let port = service.port();
    let mut p = proxy(&pki, &format!("allow = [\"*:{port}\"]"), |_| {}).await;
    let answer = connect(p.addr, &format!("{HOST_ADDR}:{port}"))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(answer.status, 403, "{answer:?}");
    assert!(
        answer.body.contains("an address of this host"),
        "{answer:?}"
    );
    let report = p.finish().await;
    assert!(!report.connections[0].allowed, "{report:#?}");
}

/// A resolver whose lookups never end (a name server that never answers, as an attacker's
/// domain can arrange), counting the lookups started.
struct Silent {
    started: AtomicUsize,
}

impl codebox::egress::Resolve for Silent {
    fn resolve(&self, _host: &str, _port: u16) -> codebox::egress::rules::resolve::Resolving {
        self.started.fetch_add(1, Ordering::SeqCst);
        Box::pin(std::future::pending())
    }
}

/// The system resolver holds a thread of the blocking pool per lookup until getaddrinfo
/// gives up (tens of seconds for a silent name server), long after the proxy's connect
/// timeout answered the program. A run must not be able to pile those up: a lookup that
/// timed out keeps its slot until it really ends, and a run has only a few slots.
#[tokio::test]
async fn lookups_that_time_out_do_not_pile_up() {
    let dir = tempfile::tempdir().unwrap();
    let section: NetworkSection =
        toml::from_str("allow = [\"*.test\"]\nconnect_timeout = \"200ms\"").unwrap();
    let policy = EgressPolicy::from_section(&section, &|_| None).unwrap();
    let resolver = Arc::new(Silent {
        started: AtomicUsize::new(0),
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
    for i in 0..12 {
        let answer = connect(addr, &format!("n{i}.test:443")).await.unwrap_err();
        assert_eq!(answer.status, 504, "{answer:?}");
        assert!(
            answer.body.contains("cannot resolve within 200ms"),
            "{answer:?}"
        );
    }
    let started = resolver.started.load(Ordering::SeqCst);
    assert!(
        started <= codebox::egress::rules::resolve::MAX_RESOLUTIONS_PER_RUN,
        "{started} lookups in flight at once for one run"
    );
    run.finish().await;
}

/// Every execution's proxy shares the supervisor's file descriptors: each client
/// connection holds one, and its upstream another. Per-run limits alone let enough
/// concurrent runs (2 × cores by default, with 16 connections each) exhaust the
/// supervisor's RLIMIT_NOFILE, and with it every client's accepts, sandboxes and audit
/// writes. The engine caps the connections open across runs.
#[tokio::test]
async fn connections_open_across_runs_are_capped() {
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let dir = tempfile::tempdir().unwrap();
    let section: NetworkSection = toml::from_str(&format!(
        "allow = [\"api.test:{port}\"]\nallow_private = [\"127.0.0.1\"]"
    ))
    .unwrap();
    let egress = Egress::new(
        EgressPolicy::from_section(&section, &|_| None).unwrap(),
        EgressOptions {
            state_dir: dir.path().to_path_buf(),
            resolver: Arc::new(
                codebox::egress::StaticResolver::new()
                    .with("api.test", &["127.0.0.1".parse().unwrap()]),
            ),
        },
    )
    .unwrap()
    .with_max_open_connections(2);
    let start = || {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        (egress.start(listener, Narrowing::none()), addr)
    };
    let (run_a, a) = start();
    let (run_b, b) = start();
    let target = format!("api.test:{port}");
    let held = [
        connect(a, &target).await.unwrap(),
        connect(a, &target).await.unwrap(),
    ];
    let answer = connect(b, &target).await.map(|_| ()).unwrap_err();
    assert_eq!(answer.status, 429, "{answer:?}");
    assert!(
        answer.body.contains("max_open_connections (2)"),
        "{answer:?}"
    );
    drop(held);
    let mut reopened = false;
    for _ in 0..50 {
        if connect(b, &target).await.is_ok() {
            reopened = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(reopened, "the cap was not given back");
    assert!(
        egress.health()["open_connections"].is_number(),
        "{}",
        egress.health()
    );
    let report = run_b.finish().await;
    assert_eq!(
        report.limit_reached.as_deref(),
        Some("max_open_connections (2)")
    );
    run_a.finish().await;
}

/// Marks the copy of this test binary re-run with a small descriptor limit.
const SMALL_NOFILE: &str = "CODEBOX_EGRESS_TEST_SMALL_NOFILE";

/// With the default engine, the cap follows the process's RLIMIT_NOFILE: under a soft
/// limit of 128, two runs together get at most 16 client connections (an eighth), not
/// 2 × max_concurrent_connections (32, with as many upstreams). Re-run in a child process
/// of its own so the lowered limit touches nothing else.
#[test]
fn the_default_cap_follows_the_descriptor_limit() {
    if std::env::var_os(SMALL_NOFILE).is_some() {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        setrlimit(Resource::RLIMIT_NOFILE, 128, hard).unwrap();
        eprintln!("running with RLIMIT_NOFILE 128");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(the_default_cap_follows_the_descriptor_limit_here());
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "review::the_default_cap_follows_the_descriptor_limit",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(SMALL_NOFILE, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("running with RLIMIT_NOFILE 128"),
        "{stderr}"
    );
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{stdout}\n{stderr}"
    );
}

async fn the_default_cap_follows_the_descriptor_limit_here() {
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let dir = tempfile::tempdir().unwrap();
    let section: NetworkSection = toml::from_str(&format!(
        "allow = [\"api.test:{port}\"]\nallow_private = [\"127.0.0.1\"]"
    ))
    .unwrap();
    let egress = Egress::new(
        EgressPolicy::from_section(&section, &|_| None).unwrap(),
        EgressOptions {
            state_dir: dir.path().to_path_buf(),
            resolver: Arc::new(
                codebox::egress::StaticResolver::new()
                    .with("api.test", &["127.0.0.1".parse().unwrap()]),
            ),
        },
    )
    .unwrap();
    let mut runs = Vec::new();
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        addrs.push(listener.local_addr().unwrap());
        runs.push(egress.start(listener, Narrowing::none()));
    }
    let target = format!("api.test:{port}");
    let mut open = Vec::new();
    let mut refused = 0;
    for i in 0..20 {
        match connect(addrs[i % 2], &target).await {
            Ok(tunnel) => open.push(tunnel),
            Err(answer) => {
                assert_eq!(answer.status, 429, "{answer:?}");
                refused += 1;
            }
        }
    }
    assert_eq!(
        (open.len(), refused),
        (16, 4),
        "tunnels open across two runs under RLIMIT_NOFILE 128"
    );
    drop(open);
    for run in runs {
        run.finish().await;
    }
}
