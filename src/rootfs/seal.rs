//! The per-run check of a sealed tree (see the module documentation of `rootfs` for why
//! it suffices): the root directory and `.manifest` are the inodes, with the change
//! times, that the last full verification saw, both still sealed, and every directory of
//! the tree still has the identity the stamp recorded. No manifest is read.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::fcntl::AtFlags;
use nix::sys::stat::{FileStat, SFlag};

use super::manifest;
use super::quick::{open_root, relative, unsealed_by};
use super::stamp::{ctime_ns, Identity, Seal, Stamp};

/// The root directory and the manifest file as they are now, read before anything else
/// (a change after this moves a change time the next run sees).
pub(super) struct Observed {
    pub root_fd: OwnedFd,
    pub root: FileStat,
    /// `None` when there is no `.manifest` (the manifest's read reports it).
    pub manifest: Option<FileStat>,
}

impl Observed {
    /// `None` when the root cannot be opened (the manifest's read reports why).
    pub fn of(root: &Path) -> Option<Observed> {
        let root_fd = open_root(root).ok()?;
        let root = nix::sys::stat::fstat(&root_fd).ok()?;
        let manifest = nix::sys::stat::fstatat(
            root_fd.as_fd(),
            manifest::FILE_NAME,
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .ok()
        .filter(|m| m.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFREG.bits());
        Some(Observed {
            root_fd,
            root,
            manifest,
        })
    }

    pub fn root_identity(&self) -> Identity {
        Identity {
            size: 0,
            ..Identity::of(&self.root)
        }
    }

    /// Whether the root directory and the manifest are sealed for `euid`.
    pub fn seal(&self, euid: u32) -> Seal {
        let manifest_path = format!("/{}", manifest::FILE_NAME);
        let why = unsealed_by("the root directory", &self.root, euid).or_else(|| {
            self.manifest
                .as_ref()
                .and_then(|m| unsealed_by(&manifest_path, m, euid))
        });
        match why {
            Some(why) => Seal::Unsealed(why),
            None => Seal::Sealed,
        }
    }
}

/// Whether `stamp` vouches for the tree as `seen` now, without reading the manifest:
/// `Err` says why not (the caller falls back to the metadata check).
pub(super) fn holds(seen: &Observed, stamp: &Stamp, euid: u32) -> Result<(), String> {
    if let Seal::Unsealed(why) = &stamp.seal {
        return Err(format!("the tree is not sealed: {why}"));
    }
    if seen.root_identity() != stamp.root {
        return Err("the root directory changed".into());
    }
    let Some(manifest) = &seen.manifest else {
        return Err("the manifest is missing".into());
    };
    if Identity::of(manifest) != stamp.manifest {
        return Err("the manifest changed".into());
    }
    if let Seal::Unsealed(why) = seen.seal(euid) {
        return Err(format!("the seal broke: {why}"));
    }
    for d in &stamp.dirs {
        let st = nix::sys::stat::fstatat(
            seen.root_fd.as_fd(),
            relative(&d.path),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| format!("{}: {e}", d.path))?;
        if (st.st_dev, st.st_ino, ctime_ns(&st)) != (d.dev, d.ino, d.ctime_ns)
            || st.st_mode & SFlag::S_IFMT.bits() != SFlag::S_IFDIR.bits()
        {
            return Err(format!("directory {} changed", d.path));
        }
    }
    Ok(())
}
