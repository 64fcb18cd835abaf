//! Host packages the build and the tests need, installed with apt-get when run as root.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Result};

use super::run_checked;

/// (a file the package provides, the Debian package).
const PACKAGES: &[(&str, &str)] = &[
    // Debian's CPython and standard library: the rootfs copies them.
    ("/usr/bin/python3.11", "python3.11"),
    ("/usr/lib/python3.11/os.py", "libpython3.11-stdlib"),
    // runuser and useradd for the rootless pass.
    ("/usr/sbin/runuser", "util-linux"),
    ("/usr/sbin/useradd", "passwd"),
    // curl checks the egress proxy's certificates with OpenSSL's verifier (tests/egress).
    ("/usr/bin/curl", "curl"),
    // openssl makes a private CA for the HTTPS package index (tests/mcp/packages_client.py).
    ("/usr/bin/openssl", "openssl"),
    // ip gives a test's own network namespace an address (tests/egress/review.rs).
    ("/bin/ip", "iproute2"),
    // The load balancer: three replicas behind it (tests/mcp/replicas_client.py), and
    // deploy/kubernetes's `haproxy -c` and routing test on loopback.
    ("/usr/sbin/haproxy", "haproxy"),
    // A real Prometheus scrapes `codebox serve --metrics` (tests/metrics.rs).
    ("/usr/bin/prometheus", "prometheus"),
    // The release step (test/release.rs): zstd compresses the dist tarball; skopeo, umoci
    // and runc read, unpack and run the OCI image `cargo xtask image` writes (runc: crun
    // 1.8 refuses hybrid cgroup hosts).
    ("/usr/bin/zstd", "zstd"),
    ("/usr/bin/skopeo", "skopeo"),
    ("/usr/bin/umoci", "umoci"),
    ("/usr/sbin/runc", "runc"),
    // callgrind counts the instructions of the hot paths against their budgets
    // (`cargo xtask instructions`, benches/instruction_budgets.toml).
    ("/usr/bin/valgrind", "valgrind"),
    // The microVM backend (`cargo xtask guest`, xtask/src/guest/): QEMU is the VMM and is
    // copied with its libraries into the jail's root; mkfs.erofs packs the rootfs image;
    // strip makes the guest init small; cpio lists the initramfs in its unit test.
    ("/usr/bin/qemu-system-x86_64", "qemu-system-x86"),
    ("/usr/bin/mkfs.erofs", "erofs-utils"),
    ("/usr/bin/strip", "binutils"),
    ("/usr/bin/cpio", "cpio"),
];

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Installs the official Python MCP SDK (PyPI `mcp`) into target/mcp-pydeps with pip
/// `--target`, for Debian's /usr/bin/python3 (same 3.11 ABI) to import: a directory any
/// user can read, unlike a venv whose interpreter may live under /root.
pub fn ensure_mcp_sdk(root: &Path) -> Result<std::path::PathBuf> {
    let dir = root.join("target/mcp-pydeps");
    pip_install_into(&dir, "mcp", "mcp/__init__.py")?;
    Ok(dir)
}

/// kubernetes-validate (PyPI: the Kubernetes OpenAPI schemas of 1.25 to 1.37 and a
/// validator) into target/kube-validate, for `cargo xtask check-kubernetes`. Pinned: a
/// new release brings new schemas, taken on purpose.
pub fn ensure_kube_validate(root: &Path) -> Result<std::path::PathBuf> {
    let dir = root.join("target/kube-validate");
    pip_install_into(
        &dir,
        "kubernetes-validate==1.37.0",
        "kubernetes_validate/__init__.py",
    )?;
    Ok(dir)
}

/// `pip install --target dir package`, unless `dir/marker` shows it is there already.
pub fn pip_install_into(dir: &Path, package: &str, marker: &str) -> Result<()> {
    if dir.join(marker).exists() {
        println!("present: {}", dir.display());
        return Ok(());
    }
    run_checked(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--target",
            ])
            .arg(dir)
            .arg(package),
        &format!("pip install {package}"),
    )
}

/// Node packages of the upstream MCP servers the integration tests connect to.
const UPSTREAM_NODE_PACKAGES: &[&str] = &[
    "@modelcontextprotocol/server-filesystem",
    "@modelcontextprotocol/server-memory",
    "@modelcontextprotocol/server-everything",
];

/// Installs the real upstream MCP servers `tests/upstream.rs` runs into target/upstreams:
/// the Node ones with `npm install --prefix target/upstreams/node`, the PyPI
/// `mcp-server-time` with pip `--target target/upstreams/python` and `mcp-server-git`
/// into `target/upstreams/python-git` (run with Debian's python3, like the MCP SDK
/// above). What is present is skipped.
pub fn ensure_upstream_servers(root: &Path) -> Result<std::path::PathBuf> {
    let dir = root.join("target/upstreams");
    let node = dir.join("node");
    let missing: Vec<&str> = UPSTREAM_NODE_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            !node
                .join("node_modules")
                .join(p)
                .join("package.json")
                .exists()
        })
        .collect();
    if missing.is_empty() {
        println!("present: {}", node.display());
    } else {
        std::fs::create_dir_all(&node)?;
        run_checked(
            Command::new("npm")
                .args([
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--loglevel=error",
                    "--prefix",
                ])
                .arg(&node)
                .args(&missing),
            "npm install (upstream MCP servers)",
        )?;
    }
    pip_install_into(
        &dir.join("python"),
        "mcp-server-time",
        "mcp_server_time/__init__.py",
    )?;
    // Its own directory: its dependencies' versions need not agree with the time server's.
    pip_install_into(
        &dir.join("python-git"),
        "mcp-server-git",
        "mcp_server_git/__init__.py",
    )?;
    Ok(dir)
}

pub fn ensure_packages(is_root: bool) -> Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(file, _)| !Path::new(file).exists())
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        println!("all present");
        return Ok(());
    }
    if !is_root {
        bail!(
            "missing packages {}: install them with `sudo apt-get install {}`",
            missing.join(", "),
            missing.join(" ")
        );
    }
    run_checked(
        Command::new("apt-get").args(["update", "-q"]),
        "apt-get update",
    )?;
    run_checked(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
        "apt-get install",
    )
}
