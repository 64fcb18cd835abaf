//! Listing what a program left in its workspace, without ever following a symlink.
//!
//! The workspace is written by untrusted code, so every path in it may be a symlink to a
//! host file. The walk opens each directory relative to its parent's descriptor with
//! `O_NOFOLLOW | O_DIRECTORY` and reads entry metadata with `AT_SYMLINK_NOFOLLOW`: a
//! symlink is reported as a symlink (with its link text), never resolved, and no
//! directory outside the workspace is ever opened.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};
use serde::Serialize;

/// At most this many entries are listed.
pub const MAX_ENTRIES: usize = 1000;
/// Directories deeper than this are not entered.
pub const MAX_DEPTH: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open workspace {path}")]
    Open {
        path: String,
        #[source]
        source: nix::Error,
    },
}

/// One entry of the workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Entry {
    /// Relative to the workspace root.
    pub path: String,
    pub kind: Kind,
    /// Size in bytes for regular files.
    pub size: Option<u64>,
    /// The link text of a symlink (not resolved).
    pub link: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

/// Lists the workspace at `root` (depth-first, sorted per directory), up to
/// [`MAX_ENTRIES`]; returns the entries and whether the list was cut.
pub fn list(root: &Path) -> Result<(Vec<Entry>, bool), Error> {
    let dir = nix::fcntl::open(
        root,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|source| Error::Open {
        path: root.display().to_string(),
        source,
    })?;
    Ok(list_at(dir.as_fd()))
}

/// Lists the tree below the directory (or mount) descriptor `root`, as [`list`] does.
/// Names are bytes: a name that is not UTF-8 is shown lossily but still entered, and at
/// most [`MAX_DEPTH`] directory descriptors are open at once.
pub fn list_at(root: BorrowedFd<'_>) -> (Vec<Entry>, bool) {
    let mut out = Vec::new();
    let cut = walk(root, "", 0, &mut out);
    (out, cut)
}

/// Returns true when the listing was cut at MAX_ENTRIES.
fn walk(dir: BorrowedFd<'_>, prefix: &str, depth: usize, out: &mut Vec<Entry>) -> bool {
    let Ok(mut names) = crate::session::disk::names(dir) else {
        return false;
    };
    names.sort();
    for name in names {
        if out.len() >= MAX_ENTRIES {
            return true;
        }
        let Ok(st) = fstatat(dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
            continue;
        };
        let path = format!("{prefix}{}", String::from_utf8_lossy(name.as_bytes()));
        let kind = match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
            SFlag::S_IFREG => Kind::File,
            SFlag::S_IFDIR => Kind::Dir,
            SFlag::S_IFLNK => Kind::Symlink,
            _ => Kind::Other,
        };
        let link = (kind == Kind::Symlink)
            .then(|| nix::fcntl::readlinkat(dir, name.as_c_str()).ok())
            .flatten()
            .map(|l| l.to_string_lossy().into_owned());
        out.push(Entry {
            path: path.clone(),
            kind,
            size: (kind == Kind::File).then_some(st.st_size as u64),
            link,
        });
        if kind == Kind::Dir && depth < MAX_DEPTH {
            // O_NOFOLLOW: if the entry was swapped for a symlink since the fstatat, the
            // open fails instead of leaving the workspace.
            if let Ok(child) = openat(
                dir,
                name.as_c_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) {
                if walk(child.as_fd(), &format!("{path}/"), depth + 1, out) {
                    return true;
                }
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_are_listed_not_followed() {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "host secret").unwrap();
        std::fs::write(ws.path().join("a.txt"), "hello").unwrap();
        std::fs::create_dir(ws.path().join("sub")).unwrap();
        std::fs::write(ws.path().join("sub/b.txt"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("escape")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), ws.path().join("sub/s")).unwrap();
        let (entries, cut) = list(ws.path()).unwrap();
        assert!(!cut);
        let paths: Vec<_> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["a.txt", "escape", "sub", "sub/b.txt", "sub/s"]);
        let escape = &entries[1];
        assert_eq!(escape.kind, Kind::Symlink);
        assert_eq!(escape.size, None);
        assert_eq!(escape.link.as_deref(), outside.path().to_str());
        assert_eq!(entries[0].size, Some(5));
        assert_eq!(entries[4].kind, Kind::Symlink);
    }

    #[test]
    fn a_symlinked_root_is_refused() {
        let outside = tempfile::tempdir().unwrap();
        let base = tempfile::tempdir().unwrap();
        let link = base.path().join("ws");
        std::os::unix::fs::symlink(outside.path(), &link).unwrap();
        assert!(list(&link).is_err());
    }

    #[test]
    fn names_that_are_not_utf8_are_listed_and_entered() {
        use std::os::unix::ffi::OsStrExt;
        let ws = tempfile::tempdir().unwrap();
        let bad = std::ffi::OsStr::from_bytes(b"d\xff");
        std::fs::create_dir(ws.path().join(bad)).unwrap();
        std::fs::write(ws.path().join(bad).join("f"), "12").unwrap();
        let (entries, _) = list(ws.path()).unwrap();
        let paths: Vec<_> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["d\u{fffd}", "d\u{fffd}/f"]);
        assert_eq!(entries[1].size, Some(2));
    }

    #[test]
    fn listing_is_capped() {
        let ws = tempfile::tempdir().unwrap();
        for i in 0..(MAX_ENTRIES + 5) {
            std::fs::write(ws.path().join(format!("f{i:05}")), "").unwrap();
        }
        let (entries, cut) = list(ws.path()).unwrap();
        assert!(cut);
        assert_eq!(entries.len(), MAX_ENTRIES);
    }
}
