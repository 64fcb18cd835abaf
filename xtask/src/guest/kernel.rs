//! The guest kernel: Debian's cloud kernel, fetched with `apt-get download` (the machine's
//! own apt sources and keys: apt checks the archive's signatures) and pinned by version and
//! SHA-256 in `rootfs/guest.lock`, as the rootfs pins its wheels.
//!
//! The meta package (`linux-image-cloud-amd64`) names the kernel image package with an
//! exact version (`Depends: linux-image-6.1.0-57-cloud-amd64 (= 6.1.192-3)`); both are
//! pinned. `--repin` takes the archive's current meta package (a kernel update, taken on
//! purpose) and rewrites the lock; a plain build fetches exactly what the lock names,
//! unless the build directory holds it already, and refuses a file whose hash differs.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::rootfs::state::{hash_file, hex};

/// One pinned package: `name version sha256`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    pub name: String,
    pub version: String,
    pub sha256: String,
}

const LOCK_HEADER: &str = "\
# What `cargo xtask guest` fetches with `apt-get download`: package, version, SHA-256 of
# the .deb. `cargo xtask guest --repin` takes the archive's current meta package and its
# kernel image and rewrites this file.
";

/// Parses `rootfs/guest.lock`: tab-separated lines, `#` comments.
pub fn parse_lock(text: &str) -> Result<Vec<Pin>> {
    let mut pins = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        let ok_name = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.:~".contains(&b))
        };
        match f.as_slice() {
            [name, version, sha]
                if ok_name(name)
                    && ok_name(version)
                    && sha.len() == 64
                    && sha.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                pins.push(Pin {
                    name: name.to_string(),
                    version: version.to_string(),
                    sha256: sha.to_ascii_lowercase(),
                })
            }
            _ => bail!(
                "rootfs/guest.lock line {}: expected NAME<TAB>VERSION<TAB>SHA256, got {line:?}",
                i + 1
            ),
        }
    }
    Ok(pins)
}

pub fn render_lock(pins: &[Pin]) -> String {
    let mut out = LOCK_HEADER.to_string();
    for p in pins {
        out.push_str(&format!("{}\t{}\t{}\n", p.name, p.version, p.sha256));
    }
    out
}

/// The exact dependency a kernel meta package names: `linux-image-X (= V)`.
pub fn image_dependency(depends: &str, prefix: &str) -> Result<(String, String)> {
    for dep in depends.split(',') {
        let dep = dep.trim();
        let Some((name, rest)) = dep.split_once(' ') else {
            continue;
        };
        if !name.starts_with(prefix) {
            continue;
        }
        if let Some(version) = rest
            .trim()
            .strip_prefix("(=")
            .and_then(|v| v.strip_suffix(')'))
        {
            return Ok((name.to_string(), version.trim().to_string()));
        }
    }
    bail!("no exact `{prefix}... (= VERSION)` dependency in {depends:?}")
}

/// The `.deb` file name apt gives `name` at `version` (`:` of an epoch becomes `%3a`).
fn deb_name(name: &str, version: &str) -> String {
    format!("{name}_{}_amd64.deb", version.replace(':', "%3a"))
}

/// `apt-get download name[=version]` into `dir`; returns the file.
fn download(dir: &Path, name: &str, version: Option<&str>) -> Result<PathBuf> {
    let spec = match version {
        Some(v) => format!("{name}={v}"),
        None => name.to_string(),
    };
    let out = Command::new("apt-get")
        .args(["download", "-q", &spec])
        .current_dir(dir)
        .output()
        .context("running apt-get (install apt)")?;
    if !out.status.success() {
        bail!(
            "apt-get download {spec} failed: {}{}",
            String::from_utf8_lossy(&out.stderr).trim(),
            if version.is_some() {
                "\n  (the archive may no longer carry this version: \
                 `cargo xtask guest --repin` pins its current kernel)"
            } else {
                ""
            }
        );
    }
    match version {
        Some(v) => Ok(dir.join(deb_name(name, v))),
        None => {
            // The newest file of that package in the directory.
            let mut found: Vec<PathBuf> = fs::read_dir(dir)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&format!("{name}_")) && n.ends_with(".deb"))
                })
                .collect();
            found.sort_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok());
            found
                .pop()
                .with_context(|| format!("apt-get download {name} left no .deb"))
        }
    }
}

/// A control field of a `.deb` (`dpkg-deb -f`).
fn control_field(deb: &Path, field: &str) -> Result<String> {
    let out = Command::new("dpkg-deb")
        .arg("-f")
        .arg(deb)
        .arg(field)
        .output()
        .context("running dpkg-deb")?;
    if !out.status.success() {
        bail!("dpkg-deb -f {} {field} failed", deb.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Makes sure the pinned `.deb` is in `dir` with the pinned hash.
fn fetch_pinned(dir: &Path, pin: &Pin) -> Result<PathBuf> {
    let path = dir.join(deb_name(&pin.name, &pin.version));
    if !path.is_file() {
        download(dir, &pin.name, Some(&pin.version))?;
    }
    let sha = hex(&hash_file(&path)?);
    if sha != pin.sha256 {
        bail!(
            "{} has SHA-256 {sha}; rootfs/guest.lock pins {} (refusing it)",
            path.display(),
            pin.sha256
        );
    }
    Ok(path)
}

/// The kernel image and its modules, unpacked.
#[derive(Debug)]
pub struct Kernel {
    /// The pinned image package and its version.
    pub package: String,
    pub version: String,
    /// `6.1.0-57-cloud-amd64`: the name of its modules directory.
    pub release: String,
    pub vmlinuz: PathBuf,
    pub modules_dir: PathBuf,
}

/// Fetches (or finds) the pinned packages and unpacks the image package.
pub fn prepare(root: &Path, build_dir: &Path, meta: &str, repin: bool) -> Result<Kernel> {
    let debs = build_dir.join("debs");
    fs::create_dir_all(&debs).with_context(|| format!("creating {}", debs.display()))?;
    let lock_path = root.join("rootfs/guest.lock");
    let pins = if repin {
        let meta_deb = download(&debs, meta, None)?;
        let meta_version = control_field(&meta_deb, "Version")?;
        let (image, image_version) =
            image_dependency(&control_field(&meta_deb, "Depends")?, "linux-image-")?;
        let image_deb = download(&debs, &image, Some(&image_version))?;
        let pins = vec![
            Pin {
                name: meta.to_string(),
                version: meta_version,
                sha256: hex(&hash_file(&meta_deb)?),
            },
            Pin {
                name: image,
                version: image_version,
                sha256: hex(&hash_file(&image_deb)?),
            },
        ];
        fs::write(&lock_path, render_lock(&pins))
            .with_context(|| format!("writing {}", lock_path.display()))?;
        println!("pinned {} {}", pins[1].name, pins[1].version);
        pins
    } else {
        let text = fs::read_to_string(&lock_path).with_context(|| {
            format!(
                "reading {} (create it with `cargo xtask guest --repin`)",
                lock_path.display()
            )
        })?;
        parse_lock(&text)?
    };
    let [meta_pin, image_pin] = pins.as_slice() else {
        bail!("rootfs/guest.lock must pin exactly the meta package and its kernel image");
    };
    if meta_pin.name != meta {
        bail!(
            "rootfs/guest.lock pins {} but rootfs/guest.toml names {meta}",
            meta_pin.name
        );
    }
    let meta_deb = fetch_pinned(&debs, meta_pin)?;
    // The meta package must still name the pinned image: the lock is one decision.
    let (named, named_version) =
        image_dependency(&control_field(&meta_deb, "Depends")?, "linux-image-")?;
    if named != image_pin.name || named_version != image_pin.version {
        bail!(
            "{} {} depends on {named} {named_version}, but the lock pins {} {}",
            meta_pin.name,
            meta_pin.version,
            image_pin.name,
            image_pin.version
        );
    }
    let image_deb = fetch_pinned(&debs, image_pin)?;
    let unpacked = build_dir.join(format!("kernel-{}-{}", image_pin.name, image_pin.version));
    let done = unpacked.join(".codebox-unpacked");
    if !done.exists() {
        if unpacked.exists() {
            fs::remove_dir_all(&unpacked)?;
        }
        fs::create_dir_all(&unpacked)?;
        let status = Command::new("dpkg-deb")
            .arg("-x")
            .arg(&image_deb)
            .arg(&unpacked)
            .status()
            .context("running dpkg-deb -x")?;
        if !status.success() {
            bail!("dpkg-deb -x {} failed", image_deb.display());
        }
        fs::write(&done, &image_pin.sha256)?;
    }
    let release = image_pin
        .name
        .strip_prefix("linux-image-")
        .context("the image package is not linux-image-*")?
        .to_string();
    let vmlinuz = unpacked.join(format!("boot/vmlinuz-{release}"));
    let modules_dir = unpacked.join(format!("lib/modules/{release}"));
    for p in [&vmlinuz, &modules_dir] {
        if !p.exists() {
            bail!("{} is missing from {}", p.display(), image_deb.display());
        }
    }
    Ok(Kernel {
        package: image_pin.name.clone(),
        version: image_pin.version.clone(),
        release,
        vmlinuz,
        modules_dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_round_trips_and_refuses_garbage() {
        let pins = vec![Pin {
            name: "linux-image-cloud-amd64".into(),
            version: "6.1.192-3".into(),
            sha256: "a".repeat(64),
        }];
        assert_eq!(parse_lock(&render_lock(&pins)).unwrap(), pins);
        for bad in [
            "x\t1\tshort",
            "x 1 aaaa",
            &format!("bad name\t1\t{}", "a".repeat(64)),
            &format!("x\t1;rm\t{}", "a".repeat(64)),
        ] {
            assert!(parse_lock(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_image_dependency_is_found() {
        let d = "linux-image-6.1.0-57-cloud-amd64 (= 6.1.192-3), foo (>= 1)";
        assert_eq!(
            image_dependency(d, "linux-image-").unwrap(),
            (
                "linux-image-6.1.0-57-cloud-amd64".into(),
                "6.1.192-3".into()
            )
        );
        assert!(image_dependency("linux-image-x (>= 1)", "linux-image-").is_err());
        assert_eq!(deb_name("a", "1:2-3"), "a_1%3a2-3_amd64.deb");
    }
}
