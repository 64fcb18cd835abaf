//! The image read and run by real OCI tools, not by our own JSON reader:
//! 1. `skopeo inspect` of the layout (image and config): architecture, layers, user,
//!    entrypoint;
//! 2. `skopeo copy` of the oci-archive to a `docker-archive` (what `docker load` takes)
//!    and `skopeo inspect` of that;
//! 3. as root, `umoci unpack` into a runtime bundle (ownership and the runtime config
//!    umoci derives from the image config are checked), then `runc run` of the bundle
//!    (runc, not crun: Debian 12's crun 1.8 refuses hybrid cgroup hosts such as CI's):
//!    `codebox --version`, `codebox doctor --json` (ready: sandboxes run), and `codebox serve --http` answering
//!    `/healthz` on a loopback port (the bundle shares the host's network namespace for
//!    that; nothing listens beyond 127.0.0.1).
//!
//! What the bundle's runtime config must allow for codebox to make sandboxes inside a
//! container is recorded in [`sandbox_ready`] and docs/src/operations/deploy.md.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use super::{base, Image};
use crate::test::delegate::Delegation;
use crate::test::run_checked;

/// Every check the host can run; the runc part needs root.
pub fn all(image: &Image, dist: &Path) -> Result<()> {
    let _ = dist;
    let scratch = Scratch::new()?;
    skopeo(image, &scratch.0)?;
    if !crate::test::is_root() {
        println!("validate: not root, so umoci unpack and runc are skipped");
        return Ok(());
    }
    let bundle = scratch.0.join("bundle");
    umoci_unpack(image, &bundle)?;
    run_in_runc(&bundle, &scratch.0)
}

/// A private temporary directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch> {
        let d = std::env::temp_dir().join(format!("codebox-image-check-{}", std::process::id()));
        crate::rootfs::seal::remove_tree(&d)?;
        std::fs::create_dir_all(&d)?;
        Ok(Scratch(d))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // The image's rootfs is sealed (xtask/src/rootfs/seal.rs).
        if let Err(e) = crate::rootfs::seal::remove_tree(&self.0) {
            eprintln!("cannot remove {}: {e}", self.0.display());
        }
    }
}

fn json_of(cmd: &mut Command, what: &str) -> Result<Value> {
    let out = cmd.output().with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("{what} printed no JSON"))
}

/// skopeo reads the layout and the archive, and converts the archive for `docker load`.
pub fn skopeo(image: &Image, scratch: &Path) -> Result<()> {
    let reference = format!("oci:{}:{}", image.layout.display(), image.tag);
    let inspect = json_of(
        Command::new("skopeo").args(["inspect", &reference]),
        "skopeo inspect",
    )?;
    let arch = super::oci::oci_arch(std::env::consts::ARCH).unwrap_or_default();
    ensure!(
        inspect["Architecture"] == arch,
        "skopeo sees architecture {}",
        inspect["Architecture"]
    );
    ensure!(inspect["Os"] == "linux", "skopeo sees os {}", inspect["Os"]);
    let layers = inspect["Layers"].as_array().map_or(0, Vec::len);
    ensure!(layers == 3, "skopeo sees {layers} layers, expected 3");
    let config = json_of(
        Command::new("skopeo").args(["inspect", "--config", &reference]),
        "skopeo inspect --config",
    )?;
    let user = format!("{0}:{0}", base::UID);
    ensure!(
        config["config"]["User"] == user.as_str(),
        "image user {}",
        config["config"]["User"]
    );
    ensure!(
        config["config"]["Entrypoint"] == serde_json::json!(["codebox", "serve", "--http"]),
        "entrypoint {}",
        config["config"]["Entrypoint"]
    );
    println!(
        "skopeo inspect: {} {}/{}, {layers} layers, user {user}, entrypoint {}",
        inspect["Digest"], inspect["Os"], inspect["Architecture"], config["config"]["Entrypoint"]
    );
    let docker = scratch.join("docker-archive.tar");
    run_checked(
        Command::new("skopeo").args([
            "copy",
            "--quiet",
            &format!("oci-archive:{}", image.archive.display()),
            &format!("docker-archive:{}:codebox:{}", docker.display(), image.tag),
        ]),
        "skopeo copy oci-archive: docker-archive:",
    )?;
    let d = json_of(
        Command::new("skopeo").args(["inspect", &format!("docker-archive:{}", docker.display())]),
        "skopeo inspect docker-archive:",
    )?;
    ensure!(
        d["Layers"].as_array().map_or(0, Vec::len) == 3,
        "the docker-archive has {} layers",
        d["Layers"]
    );
    println!(
        "skopeo copy: oci-archive → docker-archive ({} bytes), inspected again",
        std::fs::metadata(&docker)?.len()
    );
    std::fs::remove_file(&docker)?;
    Ok(())
}

/// `umoci unpack` into `bundle`; checks what it made of the image.
pub fn umoci_unpack(image: &Image, bundle: &Path) -> Result<()> {
    run_checked(
        Command::new("umoci")
            .args(["unpack", "--image"])
            .arg(format!("{}:{}", image.layout.display(), image.tag))
            .arg(bundle),
        "umoci unpack",
    )?;
    let rootfs = bundle.join("rootfs");
    let bin = rootfs.join("opt/codebox/bin/codebox");
    let meta =
        std::fs::metadata(&bin).with_context(|| format!("{} after umoci unpack", bin.display()))?;
    ensure!(
        meta.uid() == 0 && meta.mode() & 0o777 == 0o755,
        "codebox binary: uid {} mode {:o}",
        meta.uid(),
        meta.mode()
    );
    let home = std::fs::metadata(rootfs.join(base::HOME))?;
    ensure!(
        home.uid() == base::UID && home.mode() & 0o777 == 0o700,
        "home: uid {} mode {:o}",
        home.uid(),
        home.mode()
    );
    let tmp = std::fs::metadata(rootfs.join("tmp"))?;
    ensure!(tmp.mode() & 0o7777 == 0o1777, "/tmp mode {:o}", tmp.mode());
    let config: Value = serde_json::from_slice(&std::fs::read(bundle.join("config.json"))?)?;
    ensure!(
        config["process"]["user"]["uid"] == base::UID,
        "runtime user {}",
        config["process"]["user"]
    );
    ensure!(
        config["process"]["args"] == serde_json::json!(["codebox", "serve", "--http"]),
        "runtime args {}",
        config["process"]["args"]
    );
    println!(
        "umoci unpack: bundle with uid {} and args {}",
        base::UID,
        config["process"]["args"]
    );
    Ok(())
}

/// The changes a bundle's runtime config needs for codebox to create sandboxes inside
/// (what a Kubernetes pod must allow; see docs/src/operations/deploy.md):
/// - `/proc` unmasked (no `maskedPaths`/`readonlyPaths`): the kernel lets a process
///   mount a new procfs, which every sandbox does for its pid namespace, only when no
///   procfs it can see has anything mounted over parts of it;
/// - no seccomp filter forbidding `clone`/`unshare` of namespaces, `mount`, `pivot_root`
///   (this config has none; a runtime default profile would refuse `unshare`);
/// - a writable cgroup for the limits: the container's own cgroup (`cgroups_path`,
///   relative to the runtime's) owned by the account, as systemd's `Delegate=yes` makes
///   it on a host, and the cgroup filesystems mounted read-write.
pub fn sandbox_ready(config: &mut Value, cgroups_path: &str) {
    if let Some(linux) = config["linux"].as_object_mut() {
        linux.remove("maskedPaths");
        linux.remove("readonlyPaths");
        linux.remove("seccomp");
        linux.insert("cgroupsPath".into(), Value::String(cgroups_path.into()));
    }
    if let Some(mounts) = config["mounts"].as_array_mut() {
        mounts.retain(|m| m["destination"] != "/sys/fs/cgroup");
        mounts.push(serde_json::json!({
            "destination": "/sys/fs/cgroup",
            "type": "bind",
            "source": "/sys/fs/cgroup",
            "options": ["rbind", "rw", "nosuid", "noexec", "nodev"],
        }));
    }
}

/// Shares the host's network namespace (so a loopback port is reachable from here).
fn host_network(config: &mut Value) {
    if let Some(ns) = config["linux"]["namespaces"].as_array_mut() {
        ns.retain(|n| n["type"] != "network");
    }
}

fn runc_state(scratch: &Path) -> PathBuf {
    scratch.join("runc-state")
}

/// Writes `config` with `args` and extra `env` to the bundle.
fn set_process(bundle: &Path, config: &Value, args: &[&str], env: &[String]) -> Result<()> {
    let mut c = config.clone();
    c["process"]["args"] = serde_json::json!(args);
    c["process"]["terminal"] = Value::Bool(false);
    if let Some(e) = c["process"]["env"].as_array_mut() {
        e.extend(env.iter().map(|s| Value::String(s.clone())));
    }
    std::fs::write(bundle.join("config.json"), serde_json::to_vec_pretty(&c)?)?;
    Ok(())
}

/// A container started with `runc run`, killed and deleted on drop; its cgroups (made
/// beforehand and given to the account, as `Delegate=yes` would) removed after it.
struct Container {
    id: String,
    state: PathBuf,
    child: Option<Child>,
    // Dropped after `Drop::drop` has deleted the container.
    _cgroups: Delegation,
}

impl Container {
    fn run(bundle: &Path, state: &Path, id: &str, capture: bool) -> Result<Container> {
        // runc removes the container's cgroups when it deletes it: each run gets them anew.
        // `cgroupsPath` is relative to runc's own cgroups, where the delegation is made.
        let cgroups = Delegation::create(id, base::UID, base::UID)?;
        let mut cmd = Command::new("runc");
        cmd.arg("--root")
            .arg(state)
            .args(["run", "--bundle"])
            .arg(bundle)
            .arg(id);
        cmd.stdin(Stdio::null());
        if capture {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        let child = cmd.spawn().context("cannot start runc")?;
        Ok(Container {
            id: id.to_string(),
            state: state.to_path_buf(),
            child: Some(child),
            _cgroups: cgroups,
        })
    }

    /// Waits for the container's process; its exit status and output.
    fn output(mut self) -> Result<std::process::Output> {
        let child = self.child.take().expect("a child");
        Ok(child.wait_with_output()?)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let runc = |args: &[&str]| {
            let _ = Command::new("runc")
                .arg("--root")
                .arg(&self.state)
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        if let Some(mut child) = self.child.take() {
            runc(&["kill", &self.id, "TERM"]);
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            runc(&["kill", &self.id, "KILL"]);
            let _ = child.wait();
        }
        runc(&["delete", "--force", &self.id]);
    }
}

/// Runs the image's binary under runc: `--version`, `doctor --json` (which must be
/// ready), then `serve --http` until `/healthz` answers.
pub fn run_in_runc(bundle: &Path, scratch: &Path) -> Result<()> {
    let state = runc_state(scratch);
    std::fs::create_dir_all(&state)?;
    let mut config: Value = serde_json::from_slice(&std::fs::read(bundle.join("config.json"))?)?;
    let id = format!("codebox-image-check-{}", std::process::id());
    host_network(&mut config);
    sandbox_ready(&mut config, &id);

    set_process(bundle, &config, &["codebox", "--version"], &[])?;
    let out = Container::run(bundle, &state, &id, true)?.output()?;
    ensure!(
        out.status.success(),
        "codebox --version in runc: {} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    println!("runc: {}", String::from_utf8_lossy(&out.stdout).trim());

    set_process(bundle, &config, &["codebox", "doctor", "--json"], &[])?;
    let out = Container::run(bundle, &state, &id, true)?.output()?;
    let report: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "doctor in runc printed no JSON ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let mut rootfs_ok = false;
    for c in report["checks"].as_array().into_iter().flatten() {
        println!(
            "runc doctor: {:24} {:9} {}",
            c["layer"].as_str().unwrap_or(""),
            c["status"].as_str().unwrap_or(""),
            c["detail"].as_str().unwrap_or("")
        );
        if c["layer"] == "rootfs" && c["status"] == "ok" {
            rootfs_ok = true;
        }
    }
    ensure!(
        rootfs_ok,
        "the image's codebox does not find or verify its rootfs"
    );
    ensure!(
        report["ready"] == true && out.status.success(),
        "codebox doctor in runc is not ready ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    println!("runc doctor: ready");

    let port = free_loopback_port()?;
    let token = format!("image-check-{}", std::process::id());
    set_process(
        bundle,
        &config,
        &["codebox", "serve", "--http"],
        &[
            format!("CODEBOX_HTTP_ADDR=127.0.0.1:{port}"),
            format!("CODEBOX_HTTP_TOKEN={token}"),
        ],
    )?;
    let container = Container::run(bundle, &state, &id, false)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let answer = loop {
        if let Ok(a) = http_get(port, "/healthz") {
            break a;
        }
        ensure!(
            Instant::now() < deadline,
            "codebox serve in runc did not answer /healthz within 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    ensure!(answer.starts_with("HTTP/1.1 200"), "/healthz: {answer}");
    println!(
        "runc serve: /healthz on 127.0.0.1:{port}: {}",
        answer.lines().next().unwrap_or("")
    );
    drop(container);
    Ok(())
}

fn free_loopback_port() -> Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

fn http_get(port: u16, path: &str) -> Result<String> {
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}
