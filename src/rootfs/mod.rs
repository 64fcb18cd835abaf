//! Locating the rootfs and verifying it against its manifest before use.
//!
//! Two levels of verification:
//! - full: every entry's kind, mode and size, every file's SHA-256, and no entry that the
//!   manifest does not list;
//! - quick (`quick.rs`): every entry's kind, mode and size from `fstatat`, plus a
//!   fingerprint of all inode numbers and change times compared with a stamp written by
//!   the last full verification. Any write, chmod, rename or added entry changes some
//!   ctime (the kernel sets it; users cannot), so a changed fingerprint triggers a full
//!   verification.
//!
//! The stamp lives in the caller's private cache directory (`~/.cache/codebox`, mode
//! 0700); without one, every verification is full.

mod error;
mod locate;
pub mod manifest;
mod quick;

use std::collections::HashSet;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub use error::{Error, Result};
pub use locate::{candidates, locate, Candidate, Source, RELEASE_RELATIVE};
pub use manifest::{Entry, Manifest};

use crate::stopwatch::Stopwatch;
use quick::{check_metadata, host_path};

/// How a rootfs was found to be intact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verification {
    /// Every file was hashed.
    Full,
    /// Metadata matched the manifest and the stamp of an earlier full verification.
    Stamp,
}

impl std::fmt::Display for Verification {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verification::Full => "full",
            Verification::Stamp => "quick (stamp)",
        })
    }
}

/// A verified rootfs.
#[derive(Debug, Clone)]
pub struct Rootfs {
    pub path: PathBuf,
    /// SHA-256 of the manifest: identifies the exact tree.
    pub manifest_sha256: String,
    pub entries: usize,
    pub verification: Verification,
}

/// Verifies the rootfs at `root`, quickly when a valid stamp allows it.
pub fn verify(root: &Path, stamp_dir: Option<&Path>) -> Result<Rootfs> {
    let manifest_path = root.join(manifest::FILE_NAME);
    let text =
        std::fs::read_to_string(&manifest_path).map_err(|source| Error::ManifestUnreadable {
            path: manifest_path.clone(),
            source,
        })?;
    let mut sw = Stopwatch::start();
    let stamp = stamp_dir.map(|d| stamp_path(d, root));
    let previous = stamp.as_ref().and_then(|p| Stamp::read(p));
    // The manifest's digest is reused while the manifest file itself is unchanged (same
    // inode, size and ctime, which only the kernel sets).
    let manifest_id = std::fs::metadata(&manifest_path)
        .map(|m| {
            format!(
                "{}:{}:{}:{}.{}",
                m.dev(),
                m.ino(),
                m.size(),
                m.ctime(),
                m.ctime_nsec()
            )
        })
        .unwrap_or_default();
    let manifest_sha256 = match &previous {
        Some(s) if s.manifest_id == manifest_id => s.manifest_sha256.clone(),
        _ => manifest::hex(&Sha256::digest(text.as_bytes())),
    };
    let hash_us = sw.lap_us();
    let manifest = Manifest::parse(&text, &manifest_path)?;
    let parse_us = sw.lap_us();
    let fingerprint = check_metadata(root, &manifest, &manifest_sha256)?;
    tracing::debug!(
        hash_us,
        parse_us,
        metadata_us = sw.lap_us(),
        entries = manifest.entries.len(),
        "rootfs verification steps"
    );
    let verification = match &previous {
        Some(s) if s.fingerprint == fingerprint && s.manifest_sha256 == manifest_sha256 => {
            Verification::Stamp
        }
        _ => {
            check_contents(root, &manifest)?;
            if let (Some(p), Some(dir)) = (&stamp, stamp_dir) {
                let new = Stamp {
                    manifest_id,
                    manifest_sha256: manifest_sha256.clone(),
                    fingerprint,
                };
                write_stamp(dir, p, &new.render());
            }
            Verification::Full
        }
    };
    Ok(Rootfs {
        path: root.to_path_buf(),
        manifest_sha256,
        entries: manifest.entries.len(),
        verification,
    })
}

/// The per-user directory for verification stamps, created private if missing.
pub fn default_stamp_dir() -> Option<PathBuf> {
    let home = || {
        std::env::var_os("HOME").map(PathBuf::from).or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::geteuid())
                .ok()
                .flatten()
                .map(|u| u.dir)
        })
    };
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| home().map(|h| h.join(".cache")))?;
    Some(base.join("codebox"))
}

/// What a full verification leaves for the quick ones: the manifest file's identity and
/// digest, and the fingerprint of every entry's metadata.
struct Stamp {
    manifest_id: String,
    manifest_sha256: String,
    fingerprint: String,
}

impl Stamp {
    fn read(path: &Path) -> Option<Stamp> {
        let text = std::fs::read_to_string(path).ok()?;
        let mut lines = text.lines();
        Some(Stamp {
            manifest_id: lines.next()?.to_string(),
            manifest_sha256: lines.next()?.to_string(),
            fingerprint: lines.next()?.to_string(),
        })
    }

    fn render(&self) -> String {
        format!(
            "{}\n{}\n{}\n",
            self.manifest_id, self.manifest_sha256, self.fingerprint
        )
    }
}

fn stamp_path(dir: &Path, root: &Path) -> PathBuf {
    let id = manifest::hex(&Sha256::digest(root.as_os_str().as_encoded_bytes()));
    dir.join(format!("rootfs-{}.verified", &id[..16]))
}

fn write_stamp(dir: &Path, path: &Path, fingerprint: &str) {
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let meta = std::fs::metadata(dir)?;
        // Only trust a directory that is ours and private.
        if meta.uid() != nix::unistd::geteuid().as_raw() || meta.permissions().mode() & 0o022 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, fingerprint)?;
        std::fs::rename(&tmp, path)
    };
    if let Err(e) = write() {
        tracing::debug!(?e, dir = %dir.display(), "cannot write the rootfs verification stamp");
    }
}

/// Hashes every file and looks for entries the manifest does not list.
fn check_contents(root: &Path, manifest: &Manifest) -> Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    for entry in &manifest.entries {
        let Entry::File {
            path: rel, sha256, ..
        } = entry
        else {
            continue;
        };
        let path = host_path(root, rel);
        let io = |source| Error::Io {
            path: path.clone(),
            source,
        };
        let mut file = std::fs::File::open(&path).map_err(io)?;
        let mut hasher = Sha256::new();
        loop {
            let n = file.read(&mut buf).map_err(io)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        if hasher.finalize().as_slice() != sha256 {
            return Err(Error::Tampered {
                root: root.to_path_buf(),
                entry: rel.clone(),
                what: "has different contents (SHA-256 mismatch)".into(),
            });
        }
    }
    let listed: HashSet<&str> = manifest.entries.iter().map(Entry::path).collect();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let rd = std::fs::read_dir(&dir).map_err(|source| Error::Io {
            path: dir.clone(),
            source,
        })?;
        for item in rd {
            let item = item.map_err(|source| Error::Io {
                path: dir.clone(),
                source,
            })?;
            let path = item.path();
            let rel = format!("/{}", path.strip_prefix(root).unwrap_or(&path).display());
            if rel == format!("/{}", manifest::FILE_NAME) {
                continue;
            }
            if !listed.contains(rel.as_str()) {
                return Err(Error::Tampered {
                    root: root.to_path_buf(),
                    entry: rel,
                    what: "is not listed in the manifest".into(),
                });
            }
            if item.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// Builds a tiny rootfs with a valid manifest.
    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        fs::create_dir_all(r.join("usr/bin")).unwrap();
        fs::write(r.join("usr/bin/tool"), b"hello").unwrap();
        for (p, m) in [("usr", 0o755), ("usr/bin", 0o755), ("usr/bin/tool", 0o644)] {
            fs::set_permissions(r.join(p), fs::Permissions::from_mode(m)).unwrap();
        }
        std::os::unix::fs::symlink("usr/bin", r.join("bin")).unwrap();
        let sha = manifest::hex(&Sha256::digest(b"hello"));
        fs::write(
            r.join(manifest::FILE_NAME),
            format!(
                "{}\nl\tusr/bin\t/bin\nd\t0755\t/usr\nd\t0755\t/usr/bin\nf\t0644\t5\t{sha}\t/usr/bin/tool\n",
                manifest::HEADER
            ),
        )
        .unwrap();
        t
    }

    #[test]
    fn intact_tree_verifies_fully_then_by_stamp() {
        let t = tree();
        let stamps = tempfile::tempdir().unwrap();
        let v = verify(t.path(), Some(stamps.path())).unwrap();
        assert_eq!(v.verification, Verification::Full);
        assert_eq!(v.entries, 4);
        let v = verify(t.path(), Some(stamps.path())).unwrap();
        assert_eq!(v.verification, Verification::Stamp);
    }

    #[test]
    fn same_size_tampering_is_caught_despite_the_stamp() {
        let t = tree();
        let stamps = tempfile::tempdir().unwrap();
        verify(t.path(), Some(stamps.path())).unwrap();
        fs::write(t.path().join("usr/bin/tool"), b"HELLO").unwrap();
        let err = verify(t.path(), Some(stamps.path())).unwrap_err();
        assert!(err.to_string().contains("SHA-256 mismatch"), "{err}");
    }

    #[test]
    fn missing_file_is_incomplete() {
        let t = tree();
        fs::remove_file(t.path().join("usr/bin/tool")).unwrap();
        let err = verify(t.path(), None).unwrap_err();
        assert!(matches!(err, Error::Missing { .. }), "{err}");
        assert!(err.to_string().contains("cargo xtask rootfs"));
    }

    #[test]
    fn unlisted_file_and_mode_change_are_caught() {
        let t = tree();
        fs::write(t.path().join("usr/bin/extra"), b"x").unwrap();
        let err = verify(t.path(), None).unwrap_err();
        assert!(err.to_string().contains("not listed"), "{err}");

        let t = tree();
        fs::set_permissions(
            t.path().join("usr/bin/tool"),
            fs::Permissions::from_mode(0o4755),
        )
        .unwrap();
        let err = verify(t.path(), None).unwrap_err();
        assert!(err.to_string().contains("mode"), "{err}");
    }

    #[test]
    fn retargeted_symlink_and_changed_kind_are_caught() {
        let t = tree();
        fs::remove_file(t.path().join("bin")).unwrap();
        std::os::unix::fs::symlink("/usr/bin", t.path().join("bin")).unwrap();
        let err = verify(t.path(), None).unwrap_err();
        assert!(err.to_string().contains("points to /usr/bin"), "{err}");

        let t = tree();
        fs::remove_file(t.path().join("usr/bin/tool")).unwrap();
        fs::create_dir(t.path().join("usr/bin/tool")).unwrap();
        let err = verify(t.path(), None).unwrap_err();
        assert!(
            err.to_string().contains("no longer a regular file"),
            "{err}"
        );
    }

    #[test]
    fn missing_manifest_is_a_clear_error() {
        let t = tempfile::tempdir().unwrap();
        let err = verify(t.path(), None).unwrap_err();
        assert!(err.to_string().contains("no readable manifest"), "{err}");
        let err = locate(Some(t.path())).unwrap_err();
        assert!(err.to_string().contains("cargo xtask rootfs"), "{err}");
    }
}
