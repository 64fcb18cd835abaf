//! The image's base: only what the supervisor binary needs, from Debian packages.
//!
//! The sandboxes run on the rootfs codebox ships (its own CPython, Deno and libraries), so
//! the base holds what `codebox` itself loads and reads:
//! - the packages owning its interpreter and shared libraries (found as the loader finds
//!   them on this host, `dist::deps`), at the versions installed here, the ones it was
//!   built and tested against: `apt-get download NAME=VERSION`, unpacked with
//!   `dpkg-deb -x`, their manuals, locales and documentation left out (copyright kept);
//! - `/etc/ssl/certs/ca-certificates.crt`, the Mozilla roots of Debian's `ca-certificates`
//!   joined as `update-ca-certificates` joins them: `rustls-native-certs` reads the
//!   system's roots for HTTPS upstreams and the egress proxy;
//! - `/etc/passwd` and `/etc/group` with the account the image runs as, root and nobody;
//!   `/tmp` (1777), the account's home `/var/lib/codebox` (0700), mount points and the
//!   `/opt/codebox` directories the release's layers fill.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::dist::deps::{self, Package};
use crate::test::run_checked;

/// The account the image runs as (distroless's "nonroot" id).
pub const UID: u32 = 65532;
pub const USER: &str = "codebox";
pub const HOME: &str = "var/lib/codebox";

/// `/etc/passwd` of the image.
pub fn passwd() -> String {
    format!(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n\
         {USER}:x:{UID}:{UID}:codebox:/{HOME}:/usr/sbin/nologin\n\
         nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
}

/// `/etc/group` of the image.
pub fn group() -> String {
    format!("root:x:0:\n{USER}:x:{UID}:\nnogroup:x:65534:\n")
}

/// Paths below an unpacked package that the image leaves out (relative, no leading `/`).
pub fn pruned(rel: &str) -> bool {
    const DROP: [&str; 5] = [
        "usr/share/man",
        "usr/share/info",
        "usr/share/locale",
        "usr/share/lintian",
        "usr/share/doc",
    ];
    let dropped = DROP
        .iter()
        .any(|d| rel == *d || rel.strip_prefix(d).is_some_and(|r| r.starts_with('/')));
    // Licences stay: usr/share/doc/<package>/copyright.
    let licence = rel.starts_with("usr/share/doc/")
        && (rel.ends_with("/copyright") || rel.matches('/').count() == 3);
    dropped && !licence && rel != "usr/share/doc"
}

/// Joins certificate files (sorted by name) the way `update-ca-certificates` writes its
/// bundle: each PEM file as it is, a newline after any that lacks one.
pub fn bundle(mut certs: Vec<(String, String)>) -> String {
    certs.sort();
    let mut out = String::new();
    for (_, pem) in certs {
        out.push_str(&pem);
        if !pem.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// Makes `dir` the base tree for `binary`; `cache` keeps the downloaded packages.
pub fn build(binary: &Path, dir: &Path, cache: &Path) -> Result<Vec<Package>> {
    if dir.exists() {
        fs::remove_dir_all(dir)?;
    }
    fs::create_dir_all(dir)?;
    let (libs, packages) = deps::packages(binary)?;
    for lib in &libs {
        println!("base: {} ({})", lib.found.display(), lib.real.display());
    }
    for p in &packages {
        let deb = download(p, cache)?;
        unpack(&deb, dir)?;
    }
    prune(dir, dir)?;
    // The CA bundle from ca-certificates, at the candidate version (roots change over time).
    let ca = Package {
        name: "ca-certificates".into(),
        version: String::new(),
    };
    let scratch = cache.join("ca-certificates-unpacked");
    if scratch.exists() {
        fs::remove_dir_all(&scratch)?;
    }
    unpack(&download(&ca, cache)?, &scratch)?;
    let mozilla = scratch.join("usr/share/ca-certificates/mozilla");
    let mut certs = Vec::new();
    for e in fs::read_dir(&mozilla).with_context(|| format!("reading {}", mozilla.display()))? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".crt") {
            certs.push((name, fs::read_to_string(e.path())?));
        }
    }
    if certs.len() < 50 {
        bail!(
            "only {} certificates in {}: not Debian's ca-certificates",
            certs.len(),
            mozilla.display()
        );
    }
    write(
        dir,
        "etc/ssl/certs/ca-certificates.crt",
        &bundle(certs),
        0o644,
    )?;
    let licence = "usr/share/doc/ca-certificates/copyright";
    fs::create_dir_all(dir.join(licence).parent().expect("a parent"))?;
    fs::copy(scratch.join(licence), dir.join(licence))?;
    fs::remove_dir_all(&scratch)?;

    write(dir, "etc/passwd", &passwd(), 0o644)?;
    write(dir, "etc/group", &group(), 0o644)?;
    for (d, mode) in [
        ("tmp", 0o1777),
        ("proc", 0o755),
        ("sys", 0o755),
        ("dev", 0o755),
        ("root", 0o700),
        (HOME, 0o700),
        ("opt/codebox/bin", 0o755),
        ("opt/codebox/share/codebox", 0o755),
        ("opt/codebox/share/doc", 0o755),
    ] {
        let p = dir.join(d);
        fs::create_dir_all(&p)?;
        fs::set_permissions(&p, fs::Permissions::from_mode(mode))?;
    }
    Ok(packages.into_iter().collect())
}

fn write(dir: &Path, rel: &str, text: &str, mode: u32) -> Result<()> {
    let p = dir.join(rel);
    fs::create_dir_all(p.parent().expect("a parent"))?;
    fs::write(&p, text)?;
    fs::set_permissions(&p, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// The package's `.deb` in `cache/<name>/`, downloaded unless there already. An empty
/// version takes apt's candidate.
fn download(p: &Package, cache: &Path) -> Result<PathBuf> {
    let dir = cache.join(&p.name);
    let find = || -> Result<Option<PathBuf>> {
        if !dir.exists() {
            return Ok(None);
        }
        let mut debs: Vec<PathBuf> = fs::read_dir(&dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "deb"))
            .collect();
        debs.sort();
        Ok(debs.pop())
    };
    let wanted = if p.version.is_empty() {
        None
    } else {
        // apt writes the epoch's colon as %3a in file names.
        Some(format!("_{}_", p.version.replace(':', "%3a")))
    };
    if let Some(deb) = find()? {
        let name = deb
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if wanted.as_ref().is_none_or(|w| name.contains(w.as_str())) {
            return Ok(deb);
        }
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(&dir)?;
    let spec = if p.version.is_empty() {
        p.name.clone()
    } else {
        format!("{}={}", p.name, p.version)
    };
    let fetch = || {
        Command::new("apt-get")
            .args(["download", "-q", &spec])
            .current_dir(&dir)
            .output()
            .context("cannot run apt-get download")
    };
    let mut out = fetch()?;
    if !out.status.success() && crate::test::is_root() {
        // Stale or missing package lists: refresh them once, as CI's host step would.
        run_checked(
            Command::new("apt-get").args(["update", "-q"]),
            "apt-get update",
        )?;
        out = fetch()?;
    }
    if !out.status.success() {
        bail!(
            "apt-get download {spec} failed (run `apt-get update` first?): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    find()?.with_context(|| format!("apt-get download {spec} left no .deb in {}", dir.display()))
}

fn unpack(deb: &Path, into: &Path) -> Result<()> {
    fs::create_dir_all(into)?;
    run_checked(
        Command::new("dpkg-deb").arg("-x").arg(deb).arg(into),
        &format!("dpkg-deb -x {}", deb.display()),
    )
}

/// Removes what [`pruned`] names below `dir` (`top` is the tree's root).
fn prune(top: &Path, dir: &Path) -> Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        let path = e.path();
        let rel = path.strip_prefix(top)?.to_string_lossy().into_owned();
        let kind = e.file_type()?;
        if pruned(&rel) {
            if kind.is_dir() {
                fs::remove_dir_all(&path)?;
            } else {
                fs::remove_file(&path)?;
            }
        } else if kind.is_dir() {
            prune(top, &path)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_account_is_not_root_and_root_cannot_log_in() {
        let p = passwd();
        assert!(p.contains(&format!("{USER}:x:{UID}:{UID}:")));
        assert!(p.lines().all(|l| l.ends_with("/usr/sbin/nologin")));
        assert_ne!(UID, 0);
        assert!(group().contains(&format!("{USER}:x:{UID}:")));
    }

    #[test]
    fn documentation_goes_but_licences_stay() {
        assert!(pruned("usr/share/man"));
        assert!(pruned("usr/share/locale/de/LC_MESSAGES/libc.mo"));
        assert!(pruned("usr/share/doc/libc6/changelog.Debian.gz"));
        assert!(!pruned("usr/share/doc/libc6/copyright"));
        assert!(!pruned("usr/share/doc/libc6"));
        assert!(!pruned("usr/share/doc"));
        assert!(!pruned("usr/share/mandoc"));
        assert!(!pruned("lib/x86_64-linux-gnu/libc.so.6"));
    }

    #[test]
    fn the_bundle_is_sorted_and_newline_separated() {
        let b = bundle(vec![
            ("b.crt".into(), "B".into()),
            ("a.crt".into(), "A\n".into()),
        ]);
        assert_eq!(b, "A\nB\n");
    }
}
