//! The metadata check: kind, mode and size of every manifest entry from
//! `fstatat(AT_SYMLINK_NOFOLLOW)`, symlink targets from `readlinkat`, the metadata
//! fingerprint that a stamp of an earlier full verification must match, and whether the
//! tree is sealed (no write bit, owned by root or the caller) with its directories'
//! identities. Run on every use of an unsealed tree, by every full verification, and by
//! `codebox serve`'s background re-check; a sealed tree skips it per run.
//!
//! Every lookup is relative to one `O_PATH` descriptor of the root (the root's own path is
//! resolved once, not 1,300 times) through nix's stack buffer for the name (no
//! allocation per entry). The fingerprint is SHA-256 over the manifest's digest and, per
//! entry in manifest order, `dev, ino, ctime` (24 bytes: SHA-256 runs at ~140 MB/s on a
//! CPU without SHA extensions, so every byte per entry counts). The entry's path needs no
//! hashing (the manifest digest fixes which path is the i-th), nor its size or mtime:
//! changing either moves the ctime, which only the kernel sets.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use sha2::{Digest, Sha256};

use super::error::{Error, Result};
use super::manifest::{hex, Entry, Manifest};
use super::stamp::{ctime_ns, DirRecord, Seal};

/// What the metadata check found.
#[derive(Debug)]
pub(super) struct Scan {
    pub fingerprint: String,
    /// Whether every entry is sealed; the root directory and the manifest are judged by
    /// the caller.
    pub seal: Seal,
    /// Every directory's identity (kept in the stamp of a sealed tree).
    pub dirs: Vec<DirRecord>,
}

/// Checks kind, mode and size of every entry against the manifest; returns the metadata
/// fingerprint, whether the entries are sealed for `euid`, and the directories.
pub(super) fn check_metadata(
    root: &Path,
    manifest: &Manifest,
    manifest_sha256: &str,
    euid: u32,
) -> Result<Scan> {
    let dir = open_root(root)?;
    let mut fp = Sha256::new();
    fp.update(manifest_sha256.as_bytes());
    let mut seal = Seal::Sealed;
    let mut dirs = Vec::new();
    for entry in &manifest.entries {
        let rel = relative(entry.path());
        let meta = match nix::sys::stat::fstatat(dir.as_fd(), rel, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(m) => m,
            Err(Errno::ENOENT) => {
                return Err(Error::Missing {
                    root: root.to_path_buf(),
                    entry: entry.path().to_string(),
                })
            }
            Err(e) => {
                return Err(Error::Io {
                    path: host_path(root, entry.path()),
                    source: e.into(),
                })
            }
        };
        check_entry(root, dir.as_fd(), entry, &meta)?;
        // ctime is the one time users cannot set (any write, chmod, chown, rename, link
        // or utimes moves it to "now"), so size and mtime would add nothing.
        let ctime_ns = ctime_ns(&meta);
        let mut record = [0u8; 24];
        for (chunk, v) in record
            .chunks_exact_mut(8)
            .zip([meta.st_dev, meta.st_ino, ctime_ns])
        {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        fp.update(record);
        if seal == Seal::Sealed {
            if let Some(why) = unsealed_by(entry.path(), &meta, euid) {
                seal = Seal::Unsealed(why);
            }
        }
        if let Entry::Dir { path, .. } = entry {
            dirs.push(DirRecord {
                path: path.clone(),
                dev: meta.st_dev,
                ino: meta.st_ino,
                ctime_ns,
            });
        }
    }
    if seal != Seal::Sealed {
        dirs = Vec::new();
    }
    Ok(Scan {
        fingerprint: hex(&fp.finalize()),
        seal,
        dirs,
    })
}

/// Why `path` (with metadata `meta`) breaks the seal for `euid`, if it does: a write bit
/// (a symlink's mode means nothing), or an owner other than root and `euid`.
pub(super) fn unsealed_by(path: &str, meta: &FileStat, euid: u32) -> Option<String> {
    let is_link = meta.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFLNK.bits();
    if !is_link && meta.st_mode & 0o222 != 0 {
        return Some(format!(
            "{path} has a write bit (mode {:04o})",
            meta.st_mode & 0o7777
        ));
    }
    if meta.st_uid != 0 && meta.st_uid != euid {
        return Some(format!("{path} is owned by uid {}", meta.st_uid));
    }
    None
}

/// The kind, mode, size (files) and target (symlinks) the manifest gives `entry`.
fn check_entry(root: &Path, dir: BorrowedFd<'_>, entry: &Entry, meta: &FileStat) -> Result<()> {
    let tampered = |what: String| Error::Tampered {
        root: root.to_path_buf(),
        entry: entry.path().to_string(),
        what,
    };
    let kind = SFlag::from_bits_truncate(meta.st_mode & SFlag::S_IFMT.bits());
    let mode = meta.st_mode & 0o7777;
    let want_mode = |want: u32| {
        if mode == want {
            Ok(())
        } else {
            Err(tampered(format!(
                "has mode {mode:04o}, expected {want:04o}"
            )))
        }
    };
    match entry {
        Entry::Dir { mode: want, .. } => {
            if kind != SFlag::S_IFDIR {
                return Err(tampered("is no longer a directory".into()));
            }
            want_mode(*want)
        }
        Entry::File {
            mode: want, size, ..
        } => {
            if kind != SFlag::S_IFREG {
                return Err(tampered("is no longer a regular file".into()));
            }
            want_mode(*want)?;
            if meta.st_size as u64 != *size {
                return Err(tampered(format!(
                    "has {} bytes, expected {size}",
                    meta.st_size
                )));
            }
            Ok(())
        }
        Entry::Symlink { path, target } => {
            if kind != SFlag::S_IFLNK {
                return Err(tampered("is no longer a symlink".into()));
            }
            let actual = nix::fcntl::readlinkat(dir, relative(path)).map_err(|e| Error::Io {
                path: host_path(root, path),
                source: e.into(),
            })?;
            if Path::new(&actual) != target {
                return Err(tampered(format!(
                    "points to {}, expected {}",
                    Path::new(&actual).display(),
                    target.display()
                )));
            }
            Ok(())
        }
    }
}

pub(super) fn open_root(root: &Path) -> Result<OwnedFd> {
    nix::fcntl::open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::Io {
        path: root.to_path_buf(),
        source: e.into(),
    })
}

/// A manifest path (absolute below the root, checked when parsed) relative to the root.
pub(super) fn relative(path: &str) -> &str {
    path.trim_start_matches('/')
}

pub(super) fn host_path(root: &Path, rel: &str) -> PathBuf {
    root.join(relative(rel))
}
