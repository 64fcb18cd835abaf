//! Listing what a program left in its workspace, without ever following a symlink.
//!
//! The workspace is written by untrusted code, so every path in it may be a symlink to a
//! host file. The walk opens each directory relative to its parent's descriptor with
//! `O_NOFOLLOW | O_DIRECTORY` and reads entry metadata with `AT_SYMLINK_NOFOLLOW`: a
//! symlink is reported as a symlink (with its link text), never resolved, and no
//! directory outside the workspace is ever opened.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::dir::Dir;
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
    let mut out = Vec::new();
    let cut = walk(dir, "", 0, &mut out);
    Ok((out, cut))
}

/// The names in `d` (UTF-8 ones; `.` and `..` left out), unsorted.
pub(crate) fn entry_names(d: &mut Dir) -> Vec<String> {
    d.iter()
        .flatten()
        .filter_map(|e| e.file_name().to_str().ok().map(str::to_string))
        .filter(|n| n != "." && n != "..")
        .collect()
}

/// Returns true when the listing was cut at MAX_ENTRIES.
fn walk(dir: OwnedFd, prefix: &str, depth: usize, out: &mut Vec<Entry>) -> bool {
    let Ok(mut d) = Dir::from_fd(dir) else {
        return false;
    };
    let mut names = entry_names(&mut d);
    names.sort();
    for name in names {
        if out.len() >= MAX_ENTRIES {
            return true;
        }
        let Ok(st) = fstatat(d.as_fd(), name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
            continue;
        };
        let path = format!("{prefix}{name}");
        let kind = match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
            SFlag::S_IFREG => Kind::File,
            SFlag::S_IFDIR => Kind::Dir,
            SFlag::S_IFLNK => Kind::Symlink,
            _ => Kind::Other,
        };
        let link = (kind == Kind::Symlink)
            .then(|| nix::fcntl::readlinkat(d.as_fd(), name.as_str()).ok())
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
                d.as_fd(),
                name.as_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) {
                if walk(child, &format!("{path}/"), depth + 1, out) {
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
