//! `cargo xtask image`: an OCI image of the release, written as an image layout (and an
//! `oci-archive` tarball) without a container engine.
//!
//! - [`base`]: the base tree from Debian packages (only what the binary loads, CA roots,
//!   the account);
//! - [`layer`]: `tar` + `gzip -n` into content-addressed blobs;
//! - [`oci`]: the config, manifest, index and `oci-layout` documents (data);
//! - [`validate`]: real OCI tools read and run the result (skopeo, umoci, runc).
//!
//! Three layers, so a new binary does not re-ship the rootfs: the base, the rootfs
//! (`/opt/codebox/share/codebox/rootfs`), the binary with its units and docs
//! (`/opt/codebox/bin`, `/opt/codebox/share/...`). The binary finds the rootfs next to
//! itself, as in the tarball.

pub mod base;
pub mod layer;
pub mod oci;
pub mod validate;

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::test::{run_checked, workspace_root};
use layer::Part;

const HELP: &str = "\
cargo xtask image [--dist DIR] [--tag TAG] [--validate] [--no-build]

Writes an OCI image layout of the release built by `cargo xtask dist` to target/image
(index.json, oci-layout, blobs/sha256/...) and the same as an oci-archive,
target/codebox-VERSION-oci.tar. No container engine is used: the base is made of
the Debian packages the binary's shared libraries come from (`apt-get download`), the CA
roots of ca-certificates, and an account (uid 65532); then the rootfs layer and the
binary's layer. The image runs `codebox serve --http` as that account, listening on
0.0.0.0:8080 (CODEBOX_HTTP_ADDR), which needs CODEBOX_HTTP_TOKEN.

  skopeo copy oci-archive:target/codebox-VERSION-oci.tar docker-daemon:codebox:VERSION
  podman load -i target/codebox-VERSION-oci.tar

Options:
  --dist DIR   the release tree (default: target/packages/codebox-VERSION-ARCH-linux)
  --tag TAG    the reference name in index.json (default: the version)
  --validate   then inspect it with skopeo, unpack it with umoci and, as root, run
               `codebox --version`, `codebox doctor` and `codebox serve --http` in it
               with runc
  --no-build   validate the image already in target/image (with --validate)
";

struct Options {
    dist: Option<PathBuf>,
    tag: Option<String>,
    validate: bool,
    build: bool,
}

/// What `image` wrote.
pub struct Image {
    pub layout: PathBuf,
    pub archive: PathBuf,
    pub tag: String,
}

pub fn run(args: &[OsString]) -> Result<()> {
    let mut o = Options {
        dist: None,
        tag: None,
        validate: false,
        build: true,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| -> Result<String> {
            it.next()
                .and_then(|v| v.to_str())
                .map(str::to_string)
                .with_context(|| format!("{name} needs a value"))
        };
        match a.to_str() {
            Some("--dist") => o.dist = Some(value("--dist")?.into()),
            Some("--tag") => o.tag = Some(value("--tag")?),
            Some("--validate") => o.validate = true,
            Some("--no-build") => o.build = false,
            Some("-h" | "--help") => {
                print!("{HELP}");
                return Ok(());
            }
            _ => bail!("unknown option {a:?}; see `cargo xtask image --help`"),
        }
    }
    let root = workspace_root();
    let dist = match o.dist {
        Some(d) => d,
        None => root.join("target/packages").join(crate::dist::stem(&root)?),
    };
    let image = if o.build {
        build(&dist, o.tag.as_deref())?
    } else {
        let version = crate::dist::version(&root)?;
        Image {
            layout: root.join("target/image"),
            archive: root.join(format!("target/codebox-{version}-oci.tar")),
            tag: o.tag.unwrap_or(version),
        }
    };
    if o.validate {
        validate::all(&image, &dist)?;
    }
    Ok(())
}

/// Builds the image from the release tree `dist`.
pub fn build(dist: &Path, tag: Option<&str>) -> Result<Image> {
    let started = Instant::now();
    let root = workspace_root();
    let binary = dist.join("bin/codebox");
    if !binary.is_file() || !dist.join("share/codebox/rootfs/.manifest").is_file() {
        bail!(
            "{} is not a release tree (bin/codebox, share/codebox/rootfs): run `cargo xtask dist` first",
            dist.display()
        );
    }
    let version = crate::dist::version(&root)?;
    let tag = tag.map_or_else(|| version.clone(), str::to_string);
    if !oci::valid_tag(&tag) {
        bail!("{tag:?} is not a valid tag (letters, digits, '.', '_', '-'; at most 128)");
    }
    let arch = oci::oci_arch(std::env::consts::ARCH)
        .with_context(|| format!("no OCI architecture known for {}", std::env::consts::ARCH))?;
    let work = root.join("target/image-build");
    let layout = root.join("target/image");
    if layout.exists() {
        fs::remove_dir_all(&layout)?;
    }
    fs::create_dir_all(&layout)?;
    fs::create_dir_all(&work)?;

    // 1. The base tree.
    let base_dir = work.join("base");
    let packages = base::build(&binary, &base_dir, &work.join("debs"))?;
    let names: Vec<String> = packages
        .iter()
        .map(|p| format!("{} {}", p.name, p.version))
        .collect();

    // 2. The layers. Root owns everything but the account's home.
    let base_members = top_level(&base_dir)?;
    let base_layer = layer::build(
        &[
            Part {
                dir: base_dir.clone(),
                members: base_members,
                prefix: None,
                owner: 0,
                zero_mtime: true,
                exclude: vec![base::HOME.to_string()],
            },
            Part {
                dir: base_dir.clone(),
                members: vec![base::HOME.to_string()],
                prefix: None,
                owner: base::UID,
                zero_mtime: true,
                exclude: vec![],
            },
        ],
        &work,
        &layout,
        &format!(
            "base: {}, ca-certificates, account {}",
            names.join(", "),
            base::USER
        ),
    )?;
    // The rootfs keeps its files' times (its .pyc are unchecked-hash; times carry no
    // meaning, but are left as the manifest's tree has them).
    let rootfs_layer = layer::build(
        &[Part {
            dir: dist.to_path_buf(),
            members: vec!["share/codebox/rootfs".into()],
            prefix: Some("opt/codebox/".into()),
            owner: 0,
            zero_mtime: false,
            exclude: vec![],
        }],
        &work,
        &layout,
        "codebox rootfs: /opt/codebox/share/codebox/rootfs",
    )?;
    let app_layer = layer::build(
        &[Part {
            dir: dist.to_path_buf(),
            members: vec![
                "bin".into(),
                "share/codebox/systemd".into(),
                "share/doc/codebox".into(),
            ],
            prefix: Some("opt/codebox/".into()),
            owner: 0,
            zero_mtime: true,
            exclude: vec![],
        }],
        &work,
        &layout,
        "codebox binary, units and docs: /opt/codebox",
    )?;
    let layers = [base_layer, rootfs_layer, app_layer];

    // 3. The documents.
    let runtime = runtime(&version);
    let config = oci::config(arch, &runtime, &layers);
    let config_blob = layer::store_bytes(&serde_json::to_vec(&config)?, &layout)?;
    let manifest = oci::manifest(
        &config_blob,
        &layers,
        &[("org.opencontainers.image.version".into(), version.clone())],
    );
    let manifest_blob = layer::store_bytes(&serde_json::to_vec(&manifest)?, &layout)?;
    fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&oci::index(&manifest_blob, &tag, arch))?,
    )?;
    fs::write(
        layout.join("oci-layout"),
        serde_json::to_vec(&oci::layout_file())?,
    )?;

    // 4. The same as one file (an oci-archive is the layout, tarred).
    let archive = root.join(format!("target/codebox-{version}-oci.tar"));
    run_checked(
        Command::new("tar")
            .args([
                "--create",
                "--format=gnu",
                "--sort=name",
                "--numeric-owner",
                "--owner=0",
                "--group=0",
                "--mtime=@0",
                "--file",
            ])
            .arg(&archive)
            .arg("--directory")
            .arg(&layout)
            .args(["index.json", "oci-layout", "blobs"]),
        "tar (oci-archive)",
    )?;
    let final_archive = archive;
    for (l, what) in layers.iter().zip(["base", "rootfs", "binary"]) {
        println!(
            "layer {what}: {} ({} bytes gzip)",
            l.blob.digest, l.blob.size
        );
    }
    println!(
        "image: {} (tag {tag}, manifest {}), archive {} ({} bytes), in {:.0?}",
        layout.display(),
        manifest_blob.digest,
        final_archive.display(),
        fs::metadata(&final_archive)?.len(),
        started.elapsed()
    );
    Ok(Image {
        layout,
        archive: final_archive,
        tag,
    })
}

/// How the image runs codebox.
pub fn runtime(version: &str) -> oci::Runtime {
    oci::Runtime {
        user: format!("{0}:{0}", base::UID),
        entrypoint: vec!["codebox".into(), "serve".into(), "--http".into()],
        env: vec![
            "PATH=/opt/codebox/bin:/usr/bin:/bin".into(),
            format!("HOME=/{}", base::HOME),
            // `--http` alone listens where CODEBOX_HTTP_ADDR says; off loopback codebox
            // refuses to start without CODEBOX_HTTP_TOKEN.
            "CODEBOX_HTTP_ADDR=0.0.0.0:8080".into(),
        ],
        working_dir: format!("/{}", base::HOME),
        exposed_port: 8080,
        labels: vec![
            ("org.opencontainers.image.title".into(), "codebox".into()),
            ("org.opencontainers.image.version".into(), version.into()),
            ("org.opencontainers.image.licenses".into(), "Apache-2.0".into()),
            (
                "org.opencontainers.image.description".into(),
                "Code-execution sandboxes for AI agents over MCP (streamable HTTP on :8080; set CODEBOX_HTTP_TOKEN)".into(),
            ),
        ],
    }
}

/// The names directly below `dir`, sorted.
fn top_level(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    names.sort();
    Ok(names)
}
