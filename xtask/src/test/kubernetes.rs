//! `cargo xtask check-kubernetes` (and a step of `cargo xtask test`): the Kubernetes
//! manifests under deploy/kubernetes and the balancer's HAProxy config, offline.
//!
//! 1. `tests/kubernetes/check_manifests.py --self-test`: `kubectl kustomize` renders both
//!    installations, kubernetes-validate (PyPI, installed into target/kube-validate)
//!    checks every object against the Kubernetes OpenAPI schemas, strict; the security
//!    properties and the consistency between the pieces are asserted, and hostile
//!    changes must be caught.
//! 2. `haproxy -c` on deploy/kubernetes/balancer/haproxy.cfg, with the environment the
//!    balancer's Deployment sets, and again with the optional `TRUSTED_FORWARDERS`.
//! 3. `tests/kubernetes/balancer_routing.py`: the real HAProxy with that file routes
//!    sessions to their replica on loopback (a DNS server and replicas of the script's),
//!    with a PROXY protocol v2 header naming the client on every connection.
//!
//! About 10 s once kubernetes-validate is installed (about 15 s, once).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use super::{host, run_checked, workspace_root};

const HELP: &str = "\
cargo xtask check-kubernetes

Validates deploy/kubernetes offline: kubectl kustomize renders it, kubernetes-validate
checks every object (strict, Kubernetes 1.33 and the newest it knows), the security
properties are asserted (and hostile changes must fail), `haproxy -c` checks the
balancer's config and the real HAProxy routes sessions with it on loopback.
Needs kubectl, haproxy and python3 (as root, haproxy is installed with apt-get).
";

/// The environment the balancer's Deployment gives HAProxy (deployment.yaml).
const BALANCER_ENV: [(&str, &str); 4] = [
    ("POD_NAMESPACE", "codebox"),
    ("CLUSTER_DOMAIN", "cluster.local"),
    ("POD_CIDR", "10.0.0.0/8"),
    ("CODEBOX_PORT", "8080"),
];

pub fn run_command(args: &[std::ffi::OsString]) -> Result<()> {
    if let Some(a) = args.first() {
        if a == "-h" || a == "--help" {
            print!("{HELP}");
            return Ok(());
        }
        bail!("unknown option {a:?}; see `cargo xtask check-kubernetes --help`");
    }
    let root = workspace_root();
    host::ensure_packages(host::is_root())?;
    run(&root)
}

/// Every check; fails on the first that does not hold.
pub fn run(root: &Path) -> Result<()> {
    let started = Instant::now();
    for tool in ["kubectl", "haproxy", "python3"] {
        if Command::new(tool).arg("--help").output().is_err() {
            bail!(
                "{tool} is not on PATH: the Kubernetes checks need it (kubectl renders \
                 the kustomizations offline; haproxy checks and runs the balancer's config)"
            );
        }
    }
    let pydeps = host::ensure_kube_validate(root)?;
    let deploy = root.join("deploy/kubernetes");
    let tests = root.join("tests/kubernetes");
    run_checked(
        Command::new("python3")
            .arg(tests.join("check_manifests.py"))
            .arg(&deploy)
            .arg("--self-test")
            .env("PYTHONPATH", &pydeps),
        "deploy/kubernetes: schemas, security properties, self-test",
    )?;
    let cfg = deploy.join("balancer/haproxy.cfg");
    run_checked(
        Command::new("haproxy")
            .arg("-c")
            .arg("-f")
            .arg(&cfg)
            .envs(BALANCER_ENV),
        "haproxy -c deploy/kubernetes/balancer/haproxy.cfg",
    )?;
    run_checked(
        Command::new("haproxy")
            .arg("-c")
            .arg("-f")
            .arg(&cfg)
            .envs(BALANCER_ENV)
            .env("TRUSTED_FORWARDERS", "10.0.0.0/8"),
        "haproxy -c deploy/kubernetes/balancer/haproxy.cfg (TRUSTED_FORWARDERS set)",
    )?;
    run_checked(
        Command::new("python3")
            .arg(tests.join("balancer_routing.py"))
            .arg(&cfg),
        "the balancer's routing (HAProxy on loopback)",
    )
    .context("the shipped haproxy.cfg does not route as documented")?;
    println!(
        "Kubernetes manifests and balancer: all checks held in {:.1?}",
        started.elapsed()
    );
    Ok(())
}
