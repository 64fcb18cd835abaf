//! Locating the rootfs and verifying it against its manifest before use.
//!
//! Three levels of verification:
//! - full (`contents.rs`): every entry's kind, mode and size, every file's SHA-256, and no
//!   entry that the manifest does not list; done once per rootfs identity, it leaves a
//!   stamp (`stamp.rs`);
//! - metadata (`quick.rs`), for an **unsealed** tree with a stamp: every entry's kind, mode
//!   and size from `fstatat`, plus a fingerprint of all inode numbers and change times
//!   compared with the stamp. Any write, chmod, rename or added entry changes some ctime
//!   (the kernel sets it; users cannot), so a changed fingerprint triggers a full
//!   verification. It grows with the tree (~8,100 entries with the data set);
//! - sealed (`seal.rs`), for a **sealed** tree with a stamp, on every run: the root
//!   directory and `.manifest` are the inodes with the change times the stamp recorded
//!   (which pins the manifest's digest without reading it), both still sealed, and every
//!   directory (~700) has the `dev, ino, ctime` the stamp recorded. No manifest is read.
//!
//! "Sealed" is what `cargo xtask rootfs` and `cargo xtask dist` make: every file and
//! directory without any write bit (0444/0555), owned by root or by the user that runs
//! codebox, as the full verification saw it. Why the sealed check is no weaker than the
//! metadata check: a file of a sealed tree can be changed only by root (which ignores
//! modes) or by its owner after a chmod; both can already rewrite the stamp in their own
//! cache directory, or the codebox binary, so the metadata check never stood in their way
//! either, and [`locate`] already refuses trees owned by anyone else or group/world
//! writable. What the sealed check still catches at no cost: a file planted, removed or
//! renamed in any directory, a chmod'ed directory (each moves that directory's ctime), a
//! replaced `.manifest` or root directory, a stamp of another tree, a write bit on the
//! root or manifest. What it does not catch per run: a file's contents rewritten in place
//! by its owner after a chmod and a chmod back (the file's ctime moves, no directory's
//! does); `codebox serve` re-checks every entry in the background for that
//! (`server/rootfs_watch.rs`, [`recheck`]), and `codebox doctor` does too. A tree with
//! any write bit (a developer's scratch tree, the tamper tests' trees) keeps the
//! per-run metadata check.
//!
//! The stamp lives in the caller's private cache directory (`~/.cache/codebox`, mode
//! 0700); without one, every verification is full.

mod contents;
mod error;
mod locate;
pub mod manifest;
mod quick;
mod seal;
mod stamp;

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub use error::{Error, Result};
pub use locate::{candidates, locate, Candidate, Source, RELEASE_RELATIVE};
pub use manifest::{Entry, Manifest};
pub use stamp::default_dir as default_stamp_dir;

use crate::stopwatch::Stopwatch;
use seal::Observed;
use stamp::{Identity, Seal, Stamp};

/// How a rootfs was found to be intact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verification {
    /// Every file was hashed.
    Full,
    /// Every entry's metadata matched the manifest and the stamp of an earlier full
    /// verification (an unsealed tree).
    Stamp,
    /// A sealed tree whose root, manifest and directories are as the stamp of an earlier
    /// full verification recorded them.
    Sealed,
}

impl std::fmt::Display for Verification {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verification::Full => "full",
            Verification::Stamp => "quick (stamp)",
            Verification::Sealed => "sealed (stamp)",
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
    /// Whether the tree is sealed, or why not.
    pub sealed: std::result::Result<(), String>,
    /// The root directory and the metadata fingerprint as verified: what
    /// [`recheck`] compares the tree with.
    root: Identity,
    fingerprint: String,
}

impl Rootfs {
    /// A tree this module did not verify because something else did: the microVM guest's
    /// rootfs, an erofs image whose hash the host checked against the guest tree's
    /// manifest before the guest booted (`microvm::image`). It has no manifest digest, so
    /// [`recheck`] always refuses it.
    pub fn checked_elsewhere(path: PathBuf) -> Rootfs {
        Rootfs {
            path,
            manifest_sha256: String::new(),
            entries: 0,
            verification: Verification::Full,
            sealed: Ok(()),
            root: Identity {
                dev: 0,
                ino: 0,
                size: 0,
                ctime_ns: 0,
            },
            fingerprint: String::new(),
        }
    }
}

/// Verifies the rootfs at `root`: O(1) for a sealed tree with a valid stamp, a metadata
/// check of every entry for an unsealed one with a valid stamp, else in full (and stamps).
pub fn verify(root: &Path, stamp_dir: Option<&Path>) -> Result<Rootfs> {
    let mut sw = Stopwatch::start();
    let euid = nix::unistd::geteuid().as_raw();
    let stamp_path = stamp_dir.map(|d| stamp::path(d, root));
    let previous = stamp_path.as_ref().and_then(|p| Stamp::read(p));
    let seen = Observed::of(root);
    let stamp_us = sw.lap_us();
    if let (Some(prev), Some(seen)) = (&previous, &seen) {
        match seal::holds(seen, prev, euid) {
            Ok(()) => {
                tracing::debug!(
                    stamp_us,
                    seal_us = sw.lap_us(),
                    dirs = prev.dirs.len(),
                    entries = prev.entries,
                    "rootfs verification steps"
                );
                return Ok(Rootfs {
                    path: root.to_path_buf(),
                    manifest_sha256: prev.manifest_sha256.clone(),
                    entries: prev.entries,
                    verification: Verification::Sealed,
                    sealed: Ok(()),
                    root: prev.root,
                    fingerprint: prev.fingerprint.clone(),
                });
            }
            Err(why) => tracing::debug!(why, "the sealed fast path does not apply"),
        }
    }
    let seal_us = sw.lap_us();
    let manifest_path = root.join(manifest::FILE_NAME);
    let text = read_manifest(&manifest_path)?;
    let manifest_id = seen
        .as_ref()
        .and_then(|s| s.manifest.as_ref())
        .map(Identity::of);
    // The manifest's digest is reused while the manifest file itself is unchanged (same
    // inode, size and ctime, which only the kernel sets).
    let manifest_sha256 = match &previous {
        Some(s) if manifest_id == Some(s.manifest) => s.manifest_sha256.clone(),
        _ => manifest::hex(&Sha256::digest(text.as_bytes())),
    };
    let hash_us = sw.lap_us();
    let manifest = Manifest::parse(&text, &manifest_path)?;
    let parse_us = sw.lap_us();
    let scan = quick::check_metadata(root, &manifest, &manifest_sha256, euid)?;
    tracing::debug!(
        stamp_us,
        seal_us,
        hash_us,
        parse_us,
        metadata_us = sw.lap_us(),
        entries = manifest.entries.len(),
        "rootfs verification steps"
    );
    let root_id = seen.as_ref().map(Observed::root_identity);
    // The seal of the whole tree: every entry, the root directory and the manifest.
    let seal = match (&scan.seal, &seen) {
        (Seal::Sealed, Some(s)) => s.seal(euid),
        (Seal::Sealed, None) => Seal::Unsealed("the root directory cannot be read".into()),
        (unsealed, _) => unsealed.clone(),
    };
    let stamp_holds = previous.as_ref().is_some_and(|s| {
        Some(s.root) == root_id
            && s.manifest_sha256 == manifest_sha256
            && s.fingerprint == scan.fingerprint
    });
    let verification = if stamp_holds {
        Verification::Stamp
    } else {
        contents::check_contents(root, &manifest)?;
        if let (Some(p), Some(dir), Some(root_id), Some(manifest_id)) =
            (&stamp_path, stamp_dir, root_id, manifest_id)
        {
            let sealed = seal == Seal::Sealed;
            let new = Stamp {
                root: root_id,
                manifest: manifest_id,
                manifest_sha256: manifest_sha256.clone(),
                entries: manifest.entries.len(),
                fingerprint: scan.fingerprint.clone(),
                seal: seal.clone(),
                dirs: if sealed { scan.dirs } else { Vec::new() },
            };
            stamp::write(dir, p, &new);
        }
        Verification::Full
    };
    Ok(Rootfs {
        path: root.to_path_buf(),
        manifest_sha256,
        entries: manifest.entries.len(),
        verification,
        sealed: match seal {
            Seal::Sealed => Ok(()),
            Seal::Unsealed(why) => Err(why),
        },
        root: root_id.unwrap_or(Identity {
            dev: 0,
            ino: 0,
            size: 0,
            ctime_ns: 0,
        }),
        fingerprint: scan.fingerprint,
    })
}

fn read_manifest(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::ManifestUnreadable {
        path: path.to_path_buf(),
        source,
    })
}

/// What [`recheck`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recheck {
    /// Every entry's metadata is as verified.
    Unchanged,
    /// Some entry's metadata moved (a file rewritten, a directory's entries touched), and
    /// a full verification found the tree intact all the same: the new state is the
    /// verified one from now on.
    Reverified,
}

/// Checks a tree in use against what was verified (`codebox serve`, in the background):
/// the same manifest, every entry's kind, mode and size, and the metadata fingerprint; a
/// moved fingerprint or root directory costs a full verification. Errors name what
/// changed. `stamp_dir`: where a re-verification leaves its stamp.
pub fn recheck(rootfs: &mut Rootfs, stamp_dir: Option<&Path>) -> Result<Recheck> {
    let root = rootfs.path.clone();
    let euid = nix::unistd::geteuid().as_raw();
    let seen = Observed::of(&root);
    let manifest_path = root.join(manifest::FILE_NAME);
    let text = read_manifest(&manifest_path)?;
    let digest = manifest::hex(&Sha256::digest(text.as_bytes()));
    if digest != rootfs.manifest_sha256 {
        return Err(Error::Replaced {
            root,
            verified: rootfs
                .manifest_sha256
                .get(..12)
                .unwrap_or("none")
                .to_string(),
            now: digest.get(..12).unwrap_or("none").to_string(),
        });
    }
    let manifest = Manifest::parse(&text, &manifest_path)?;
    let scan = quick::check_metadata(&root, &manifest, &digest, euid)?;
    let root_id = seen.as_ref().map(Observed::root_identity);
    if root_id == Some(rootfs.root) && scan.fingerprint == rootfs.fingerprint {
        return Ok(Recheck::Unchanged);
    }
    // Verify again in full, through the stamp-less path, and adopt what it saw.
    let fresh = verify_full(&root, stamp_dir)?;
    rootfs.root = fresh.root;
    rootfs.fingerprint = fresh.fingerprint;
    rootfs.sealed = fresh.sealed;
    Ok(Recheck::Reverified)
}

/// A full verification whatever the stamp says (the stamp is replaced).
fn verify_full(root: &Path, stamp_dir: Option<&Path>) -> Result<Rootfs> {
    if let Some(dir) = stamp_dir {
        let _ = std::fs::remove_file(stamp::path(dir, root));
    }
    verify(root, stamp_dir)
}

#[cfg(test)]
pub(crate) mod tests;
