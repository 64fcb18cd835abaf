//! The egress proxy end to end on loopback: a real HTTPS origin with its own test CA,
//! the proxy on 127.0.0.1:0, and real clients through it (raw CONNECT + rustls, hyper in
//! absolute form, and CPython's urllib when python3 is there).

mod credentials;
mod decisions;
mod encoded;
mod limits;
mod review;
mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use codebox::egress::{
    ConnectionRecord, Egress, EgressOptions, EgressPolicy, EgressReport, EgressRun, Limits,
    Narrowing, NetworkSection, StaticResolver,
};
use support::*;

pub const SECRET: &str = "s3cr3t-T0KEN-value-42";
/// Secrets with the characters encoders treat differently (`/`, `+`, `=`, `~`, space, `&`,
/// `%`, `"`, `'`, `<`), for each kind of credential: env `ODD_BEARER`, `ODD_HEADER`, `ODD_QUERY`.
pub const ODD_BEARER: &str = "b3ar/T0K+en=v~a.l_u-e";
pub const ODD_HEADER: &str = "h3ad er/V+al=ue:x&y\"q'<z>";
pub const ODD_QUERY: &str = "q v/al+ue=x&y%z~";

pub struct Proxy {
    pub egress: Egress,
    run: Option<EgressRun>,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Proxy {
    pub async fn finish(&mut self) -> EgressReport {
        self.run.take().expect("running").finish().await
    }

    pub fn bundle(&self) -> PathBuf {
        self.egress.trust_dir().join("ca-bundle.pem")
    }
}

fn resolver() -> StaticResolver {
    NAMES.iter().fold(StaticResolver::new(), |r, n| {
        r.with(n, &[IpAddr::V4(Ipv4Addr::LOCALHOST)])
    })
}

pub async fn proxy(pki: &TestPki, toml_text: &str, tweak: impl FnOnce(&mut Limits)) -> Proxy {
    proxy_narrowed(pki, toml_text, tweak, None).await
}

pub async fn proxy_narrowed(
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
    let env = |k: &str| {
        match k {
            "TOKEN" => Some(SECRET),
            "ODD_BEARER" => Some(ODD_BEARER),
            "ODD_HEADER" => Some(ODD_HEADER),
            "ODD_QUERY" => Some(ODD_QUERY),
            _ => None,
        }
        .map(str::to_string)
    };
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

pub fn record<'a>(report: &'a EgressReport, host: &str) -> &'a ConnectionRecord {
    report
        .connections
        .iter()
        .find(|r| r.host == host)
        .unwrap_or_else(|| panic!("no record for {host}: {report:#?}"))
}

/// GET `path` over a CONNECT tunnel with TLS, trusting `roots`.
pub async fn https_get(
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
