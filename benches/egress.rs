//! The egress proxy's cost per request: a small HTTPS GET on a new TCP + TLS connection
//! (as a program doing one request makes it), against a local rustls HTTPS server:
//!
//! - `direct`: straight to the server;
//! - `tunnel`: through the proxy as a CONNECT tunnel (policy, resolution, address check,
//!   connect, bytes relayed);
//! - `intercept`: through the proxy with TLS interception and a credential header added
//!   (a second TLS handshake, a leaf certificate from the cache, hyper both ways,
//!   redaction of the response).
//!
//! Client TLS session resumption is off (a new program has no session cache).
//! `cargo bench --bench egress`; criterion's estimates, then medians and the overhead
//! over `direct` from a separate interleaved run printed at the end. Goals on a 2-core
//! machine: ≤ 0.5 ms over direct for `tunnel`, ≤ 2 ms for `intercept`.

#[path = "../tests/egress/support.rs"]
mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use codebox::egress::{
    Egress, EgressOptions, EgressPolicy, EgressRun, Narrowing, NetworkSection, StaticResolver,
};
use criterion::Criterion;
use rustls::ClientConfig;
use support::{client_tls, connect, get, http_client, send, tls, Origin, TestPki};
use tokio::net::TcpStream;

struct Setup {
    origin: Origin,
    proxy: SocketAddr,
    direct_tls: Arc<ClientConfig>,
    intercept_tls: Arc<ClientConfig>,
    _egress: Egress,
    _run: EgressRun,
    _dir: tempfile::TempDir,
}

fn no_resumption(config: Arc<ClientConfig>) -> Arc<ClientConfig> {
    let mut c = (*config).clone();
    c.resumption = rustls::client::Resumption::disabled();
    Arc::new(c)
}

async fn setup() -> Setup {
    let pki = TestPki::new();
    let origin = Origin::start(Some(pki.server.clone())).await;
    let port = origin.port();
    let dir = tempfile::tempdir().unwrap();
    let ca_path = dir.path().join("test-ca.pem");
    std::fs::write(&ca_path, &pki.ca_pem).unwrap();
    let mut section: NetworkSection = toml::from_str(&format!(
        "allow = [\"api.test:{port}\", \"echo.test:{port}\"]\nallow_private = [\"127.0.0.1:{port}\"]\n\
         [[credentials]]\nhost = \"api.test:{port}\"\nbearer = \"env:TOKEN\"\n"
    ))
    .unwrap();
    section.extra_roots.push(ca_path);
    let env = |k: &str| (k == "TOKEN").then(|| "bench-secret-token-0123456789".to_string());
    let policy = EgressPolicy::from_section(&section, &env).unwrap();
    let mut limits = policy.limits().clone();
    limits.max_connections = u32::MAX;
    limits.max_bytes_up = u64::MAX;
    limits.max_bytes_down = u64::MAX;
    let policy = policy.with_limits(limits);
    let resolver = StaticResolver::new()
        .with("api.test", &[IpAddr::V4(Ipv4Addr::LOCALHOST)])
        .with("echo.test", &[IpAddr::V4(Ipv4Addr::LOCALHOST)]);
    let egress = Egress::new(
        policy,
        EgressOptions {
            state_dir: dir.path().join("state"),
            resolver: Arc::new(resolver),
        },
    )
    .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy = listener.local_addr().unwrap();
    let run = egress.start(listener, Narrowing::none());
    let ca = egress.ca_certificate_pem().unwrap().to_string();
    Setup {
        direct_tls: no_resumption(client_tls(&[&pki.ca_pem])),
        intercept_tls: no_resumption(client_tls(&[&ca])),
        origin,
        proxy,
        _egress: egress,
        _run: run,
        _dir: dir,
    }
}

#[derive(Clone, Copy, Debug)]
enum Path {
    Direct,
    Tunnel,
    Intercept,
}

async fn one_get(s: &Setup, path: Path) {
    let port = s.origin.port();
    let (tcp, name, config) = match path {
        Path::Direct => (
            {
                let t = TcpStream::connect(s.origin.addr).await.unwrap();
                t.set_nodelay(true).unwrap();
                t
            },
            "echo.test",
            s.direct_tls.clone(),
        ),
        Path::Tunnel => (
            connect(s.proxy, &format!("echo.test:{port}"))
                .await
                .unwrap(),
            "echo.test",
            s.direct_tls.clone(),
        ),
        Path::Intercept => (
            connect(s.proxy, &format!("api.test:{port}")).await.unwrap(),
            "api.test",
            s.intercept_tls.clone(),
        ),
    };
    tcp.set_nodelay(true).unwrap();
    let stream = tls(tcp, name, config).await.unwrap();
    let mut sender = http_client(stream).await;
    let got = send(&mut sender, get("/ok", name)).await.unwrap();
    assert_eq!(got.status, 200);
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let s = rt.block_on(setup());
    // Warm the leaf certificate cache and the code paths once.
    for path in [Path::Direct, Path::Tunnel, Path::Intercept] {
        rt.block_on(one_get(&s, path));
    }

    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    {
        let mut group = c.benchmark_group("egress_https_get");
        for (id, path) in [
            ("direct", Path::Direct),
            ("tunnel", Path::Tunnel),
            ("intercept", Path::Intercept),
        ] {
            group.bench_function(id, |b| b.iter(|| rt.block_on(one_get(&s, path))));
        }
        group.finish();
    }
    c.final_summary();

    // Medians from one interleaved run, so drift affects the three alike.
    let n = 400;
    let mut times: [Vec<Duration>; 3] = Default::default();
    for _ in 0..n {
        for (i, path) in [Path::Direct, Path::Tunnel, Path::Intercept]
            .into_iter()
            .enumerate()
        {
            let t = Instant::now();
            rt.block_on(one_get(&s, path));
            times[i].push(t.elapsed());
        }
    }
    let [direct, tunnel, intercept] = times.map(median);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!("\nmedians over {n} interleaved requests each:");
    println!("  direct     {:.3} ms", ms(direct));
    println!(
        "  tunnel     {:.3} ms  (+{:.3} ms over direct; goal <= 0.5)",
        ms(tunnel),
        ms(tunnel) - ms(direct)
    );
    println!(
        "  intercept  {:.3} ms  (+{:.3} ms over direct; goal <= 2)",
        ms(intercept),
        ms(intercept) - ms(direct)
    );
}
