//! A session's workspace on the host: measuring it, reading one file, and removing
//! entries, never following a symlink the sandbox may have planted.
//!
//! Every directory is opened relative to its parent's descriptor with `O_NOFOLLOW`, and
//! entries are examined with `AT_SYMLINK_NOFOLLOW`, so no path outside the workspace is
//! ever opened, read or removed.

use std::collections::HashSet;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::dir::Dir;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstatat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// Entries beyond this many are not counted one by one (the workspace is far over any
/// quota by then).
const SCAN_CEILING: u64 = 1_000_000;
/// Directories deeper than this are counted but not entered.
const MAX_DEPTH: usize = 64;

/// What a workspace holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes of regular files (their sizes, not blocks).
    pub bytes: u64,
    /// Entries of every kind: files, directories, symlinks.
    pub entries: u64,
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

fn open_root(root: &Path) -> std::io::Result<OwnedFd> {
    Ok(nix::fcntl::open(root, dir_flags(), Mode::empty())?)
}

/// Measures the workspace; with `paths`, also collects every entry's relative path.
pub fn scan(root: &Path, mut paths: Option<&mut HashSet<String>>) -> std::io::Result<Usage> {
    let mut usage = Usage::default();
    walk(open_root(root)?, "", 0, &mut usage, &mut paths);
    Ok(usage)
}

fn walk(
    dir: OwnedFd,
    prefix: &str,
    depth: usize,
    usage: &mut Usage,
    paths: &mut Option<&mut HashSet<String>>,
) {
    let Ok(mut d) = Dir::from_fd(dir) else {
        return;
    };
    let names = crate::workspace::entry_names(&mut d);
    for name in names {
        if usage.entries >= SCAN_CEILING {
            return;
        }
        let Ok(st) = fstatat(d.as_fd(), name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
            continue;
        };
        usage.entries += 1;
        let path = format!("{prefix}{name}");
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        if kind == SFlag::S_IFREG {
            usage.bytes += st.st_size as u64;
        }
        if kind == SFlag::S_IFDIR && depth < MAX_DEPTH {
            if let Ok(child) = openat(d.as_fd(), name.as_str(), dir_flags(), Mode::empty()) {
                walk(child, &format!("{path}/"), depth + 1, usage, paths);
            }
        }
        if let Some(p) = paths.as_deref_mut() {
            p.insert(path);
        }
    }
}

/// Removes the entries of the workspace that are not in `keep` (what a run created),
/// deepest first. Returns how many were removed.
pub fn remove_new(root: &Path, keep: &HashSet<String>) -> std::io::Result<usize> {
    let mut now = HashSet::new();
    scan(root, Some(&mut now))?;
    let mut new: Vec<&String> = now.iter().filter(|p| !keep.contains(*p)).collect();
    // Skip entries inside a new directory: removing the directory removes them.
    new.sort();
    let mut tops: Vec<&String> = Vec::new();
    for p in new {
        if tops
            .last()
            .is_some_and(|t| p.starts_with(t.as_str()) && p.as_bytes().get(t.len()) == Some(&b'/'))
        {
            continue;
        }
        tops.push(p);
    }
    let root_fd = open_root(root)?;
    let mut removed = 0;
    for p in tops {
        let (parent, name) = match p.rsplit_once('/') {
            Some((parent, name)) => (Some(parent), name),
            None => (None, p.as_str()),
        };
        let parent_fd = match parent {
            Some(parent) => match open_beneath(&root_fd, parent) {
                Ok(fd) => fd,
                Err(_) => continue,
            },
            None => root_fd.try_clone()?,
        };
        if remove_at(&parent_fd, name).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}

/// Opens the directory `rel` below `root`, component by component, refusing symlinks.
fn open_beneath(root: &OwnedFd, rel: &str) -> std::io::Result<OwnedFd> {
    let mut fd = root.try_clone()?;
    for part in rel.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(std::io::Error::other("invalid path component"));
        }
        fd = openat(fd.as_fd(), part, dir_flags(), Mode::empty())?;
    }
    Ok(fd)
}

/// Removes `name` in `parent`: a file or symlink is unlinked, a directory emptied
/// (making it writable first: the sandbox may have made it read-only) and removed.
fn remove_at(parent: &OwnedFd, name: &str) -> std::io::Result<()> {
    let st = fstatat(parent.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFDIR {
        unlinkat(parent.as_fd(), name, UnlinkatFlags::NoRemoveDir)?;
        return Ok(());
    }
    let dir = openat(parent.as_fd(), name, dir_flags(), Mode::empty())?;
    let _ = fchmod(dir.as_fd(), Mode::from_bits_truncate(0o700));
    let mut d = Dir::from_fd(dir.try_clone()?)?;
    let names = crate::workspace::entry_names(&mut d);
    for child in names {
        remove_at(&dir, &child)?;
    }
    unlinkat(parent.as_fd(), name, UnlinkatFlags::RemoveDir)?;
    Ok(())
}

/// Removes a whole workspace directory tree (a closed or expired session).
pub fn remove_tree(path: &Path) -> std::io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::other("not a removable path"));
    };
    let parent = nix::fcntl::open(parent, dir_flags(), Mode::empty())?;
    let name = name
        .to_str()
        .ok_or_else(|| std::io::Error::other("non-UTF-8 name"))?;
    match remove_at(&parent, name) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Reads the regular file `rel` of the workspace, at most `max` bytes; symlinks and
/// anything but a regular file are refused.
pub fn read_file(root: &Path, rel: &str, max: u64) -> std::io::Result<Vec<u8>> {
    let root_fd = open_root(root)?;
    let (dir, name) = match rel.rsplit_once('/') {
        Some((dir, name)) => (open_beneath(&root_fd, dir)?, name),
        None => (root_fd, rel),
    };
    if name.is_empty() || name == "." || name == ".." {
        return Err(std::io::Error::other("invalid path component"));
    }
    let fd = openat(
        dir.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::empty(),
    )?;
    let st = nix::sys::stat::fstat(fd.as_fd())?;
    if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFREG {
        return Err(std::io::Error::other("not a regular file"));
    }
    if st.st_size as u64 > max {
        return Err(std::io::Error::other(format!(
            "the file is {} bytes; at most {max} are returned",
            st.st_size
        )));
    }
    let mut out = Vec::new();
    std::fs::File::from(fd).take(max).read_to_end(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_files_and_bytes_without_following_links() {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("big"), vec![0u8; 10_000]).unwrap();
        std::fs::write(ws.path().join("a"), "12345").unwrap();
        std::fs::create_dir(ws.path().join("d")).unwrap();
        std::fs::write(ws.path().join("d/b"), "123").unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("out")).unwrap();
        let mut paths = HashSet::new();
        let u = scan(ws.path(), Some(&mut paths)).unwrap();
        assert_eq!(
            u,
            Usage {
                bytes: 8,
                entries: 4
            }
        );
        let mut sorted: Vec<_> = paths.into_iter().collect();
        sorted.sort();
        assert_eq!(sorted, ["a", "d", "d/b", "out"]);
    }

    #[test]
    fn remove_new_removes_only_what_appeared_and_never_follows_links() {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep-me"), "host").unwrap();
        std::fs::write(ws.path().join("old"), "1").unwrap();
        std::fs::create_dir(ws.path().join("olddir")).unwrap();
        let mut before = HashSet::new();
        scan(ws.path(), Some(&mut before)).unwrap();
        std::fs::write(ws.path().join("new"), "2").unwrap();
        std::fs::write(ws.path().join("olddir/new"), "3").unwrap();
        std::fs::create_dir_all(ws.path().join("nd/deep")).unwrap();
        std::fs::write(ws.path().join("nd/deep/f"), "4").unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("link")).unwrap();
        // A read-only new directory is still removed.
        std::fs::set_permissions(
            ws.path().join("nd"),
            std::os::unix::fs::PermissionsExt::from_mode(0o500),
        )
        .unwrap();
        let removed = remove_new(ws.path(), &before).unwrap();
        assert_eq!(removed, 4, "new, olddir/new, nd, link");
        let mut left = HashSet::new();
        scan(ws.path(), Some(&mut left)).unwrap();
        assert_eq!(left, before);
        assert!(outside.path().join("keep-me").exists());
    }

    #[test]
    fn read_file_refuses_links_and_escapes() {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "host secret").unwrap();
        std::fs::create_dir(ws.path().join("d")).unwrap();
        std::fs::write(ws.path().join("d/ok.txt"), "hello").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), ws.path().join("s")).unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("dl")).unwrap();
        assert_eq!(read_file(ws.path(), "d/ok.txt", 100).unwrap(), b"hello");
        assert!(read_file(ws.path(), "s", 100).is_err());
        assert!(read_file(ws.path(), "dl/secret", 100).is_err());
        assert!(read_file(ws.path(), "../x", 100).is_err());
        assert!(read_file(ws.path(), "d", 100).is_err());
        assert!(read_file(ws.path(), "d/ok.txt", 2).is_err());
    }

    #[test]
    fn remove_tree_removes_read_only_trees() {
        let base = tempfile::tempdir().unwrap();
        let ws = base.path().join("ws");
        std::fs::create_dir_all(ws.join("a/b")).unwrap();
        std::fs::write(ws.join("a/b/f"), "x").unwrap();
        std::fs::set_permissions(
            ws.join("a"),
            std::os::unix::fs::PermissionsExt::from_mode(0o000),
        )
        .unwrap();
        remove_tree(&ws).unwrap();
        assert!(!ws.exists());
        remove_tree(&ws).unwrap();
    }
}
