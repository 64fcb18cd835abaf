//! A workspace's tree on the host, reached only through descriptors: its usage, reading
//! one file, and removal that reports what it could not remove.
//!
//! - Every directory is opened relative to its parent's descriptor with `O_NOFOLLOW`,
//!   entries are examined with `AT_SYMLINK_NOFOLLOW`, and names are the kernel's bytes
//!   (no UTF-8 assumption; lossy text only in what is shown), so no path outside the tree
//!   is ever opened, read or removed, whatever the names.
//! - Removal holds at most [`OPEN_DEPTH`] directory descriptors at any depth: a directory
//!   found deeper is first renamed to the top of the tree (same filesystem, one
//!   `renameat2(RENAME_NOREPLACE)`) and emptied from there, so a tree thousands of levels
//!   deep is removed under an ordinary `RLIMIT_NOFILE`.
//! - Usage is the filesystem's own count (`fstatvfs`): a session's workspace is a
//!   filesystem of its own, so allocated blocks and inodes are counted by the kernel,
//!   not by a walk.

use std::ffi::{CStr, CString};
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::dir::Dir;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstatat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// Directory descriptors held at once while removing; deeper directories are moved up.
pub const OPEN_DEPTH: usize = 32;
/// Leftovers named in a removal report (the count covers all).
const NAMED_LEFTOVERS: usize = 5;
/// Passes over the top of a tree before a removal gives up on what resists.
const MAX_PASSES: usize = 100_000;

/// What a workspace filesystem holds, by the kernel's count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes of allocated blocks (data, holes do not count; fallocated space does).
    pub bytes: u64,
    /// Inodes in use, the root directory and `out/` (codebox's, see [`OUT_DIR`]) left
    /// out: the program's files, directories, links.
    pub entries: u64,
    /// No block or no inode is free: a write or create in it fails now.
    pub full: bool,
    /// When the root directory last changed (ns since the epoch): with the figures
    /// above, tells a run that changed the workspace from one that only read it.
    pub root_changed_ns: i64,
}

/// The directory every run finds at `/workspace/out` (output files). A session's
/// workspace gets it when it is made, with an inode of its own beyond the entry limit.
pub const OUT_DIR: &CStr = c"out";

/// Makes `out/` at the top of a fresh workspace, owned by the sandbox user (`owner`).
pub fn make_out_dir(root: BorrowedFd<'_>, owner: (u32, u32)) -> std::io::Result<()> {
    nix::sys::stat::mkdirat(root, OUT_DIR, Mode::from_bits_truncate(0o755))?;
    nix::unistd::fchownat(
        root,
        OUT_DIR,
        Some(nix::unistd::Uid::from_raw(owner.0)),
        Some(nix::unistd::Gid::from_raw(owner.1)),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )?;
    Ok(())
}

/// The usage of the filesystem `root` is on.
pub fn usage(root: BorrowedFd<'_>) -> std::io::Result<Usage> {
    let st = nix::sys::statvfs::fstatvfs(root)?;
    let block = st.fragment_size() as u64;
    let blocks = st.blocks() as u64;
    let free = st.blocks_free() as u64;
    let files = st.files() as u64;
    let ffree = st.files_free() as u64;
    let root_st = nix::sys::stat::fstat(root)?;
    Ok(Usage {
        root_changed_ns: root_st.st_mtime * 1_000_000_000 + root_st.st_mtime_nsec,
        bytes: blocks.saturating_sub(free) * block,
        entries: files
            .saturating_sub(ffree)
            .saturating_sub(1 + u64::from(out_is_there(root))),
        full: free == 0 || ffree == 0,
    })
}

/// Whether `out/` is a directory at the top of `root` (never following a link).
fn out_is_there(root: BorrowedFd<'_>) -> bool {
    fstatat(root, OUT_DIR, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| {
        SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR
    })
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// Opens the directory `root` itself (it may be an `O_PATH` or mount descriptor) for
/// reading its entries.
pub fn open_dir(root: BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    Ok(openat(root, c".", dir_flags(), Mode::empty())?)
}

/// The names in directory `dir` (`.` and `..` left out), as bytes, unsorted.
pub fn names(dir: BorrowedFd<'_>) -> std::io::Result<Vec<CString>> {
    let mut d = Dir::from_fd(open_dir(dir)?)?;
    Ok(d.iter()
        .flatten()
        .map(|e| e.file_name().to_owned())
        .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
        .collect())
}

/// What a removal could not remove.
#[derive(Debug, Default)]
pub struct Leftover {
    /// Entries that resisted.
    pub count: u64,
    /// The first few: their path (lossy text) and why.
    pub named: Vec<(String, std::io::Error)>,
}

impl Leftover {
    fn add(&mut self, path: String, e: impl Into<std::io::Error>) {
        self.count += 1;
        if self.named.len() < NAMED_LEFTOVERS {
            self.named.push((path, e.into()));
        }
    }
}

impl std::fmt::Display for Leftover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} entries could not be removed", self.count)?;
        for (i, (path, e)) in self.named.iter().enumerate() {
            let sep = if i == 0 { ": " } else { "; " };
            write!(f, "{sep}{path:?} ({e})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Leftover {}

fn show(prefix: &str, name: &CStr) -> String {
    format!("{prefix}{}", String::from_utf8_lossy(name.to_bytes()))
}

/// One pass of a removal: what resisted, and how many directories were moved up.
#[derive(Default)]
struct Pass {
    left: Leftover,
    moved_up: u64,
}

/// Empties the directory `root` (a directory or mount descriptor). Every entry goes,
/// whatever its name, depth or mode; `Err` says what stayed.
pub fn remove_contents(root: BorrowedFd<'_>) -> Result<(), Leftover> {
    // The sandbox may have taken every permission off the root itself; an `O_PATH` or
    // mount descriptor cannot be chmod'ed directly, its /proc/self/fd link can.
    if matches!(names(root), Err(e) if e.raw_os_error() == Some(libc::EACCES)) {
        use std::os::fd::AsRawFd;
        let link = format!("/proc/self/fd/{}", root.as_raw_fd());
        let _ = std::fs::set_permissions(link, std::os::unix::fs::PermissionsExt::from_mode(0o700));
    }
    let mut serial = 0u64;
    let mut last = Leftover::default();
    for _ in 0..MAX_PASSES {
        let names = match names(root) {
            Ok(n) => n,
            Err(e) => {
                last.add(".".into(), e);
                return Err(last);
            }
        };
        if names.is_empty() {
            return Ok(());
        }
        let mut pass = Pass::default();
        for name in &names {
            remove_at(root, root, name, "", 1, &mut serial, &mut pass);
        }
        // Directories moved up are emptied by the next pass; a pass that moved nothing
        // and left something will not do better next time.
        if pass.moved_up == 0 && pass.left.count > 0 {
            return Err(pass.left);
        }
        last = pass.left;
    }
    Err(last)
}

/// Removes `name` in `parent`: unlinks a non-directory; empties (making it writable
/// first: the sandbox may have made it read-only) and removes a directory. Deeper than
/// [`OPEN_DEPTH`] a directory is moved to `root` instead, for the next pass.
fn remove_at(
    root: BorrowedFd<'_>,
    parent: BorrowedFd<'_>,
    name: &CStr,
    prefix: &str,
    depth: usize,
    serial: &mut u64,
    pass: &mut Pass,
) {
    let st = match fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(nix::errno::Errno::ENOENT) => return,
        Err(e) => return pass.left.add(show(prefix, name), e),
    };
    if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFDIR {
        match unlinkat(parent, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => pass.left.add(show(prefix, name), e),
        }
        return;
    }
    if depth > OPEN_DEPTH {
        // Too deep to hold another descriptor: move it to the top, empty it from there.
        *serial += 1;
        let to = CString::new(format!(".codebox-rm-{}-{serial}", std::process::id()))
            .expect("no NUL in a formatted name");
        match nix::fcntl::renameat2(
            parent,
            name,
            root,
            to.as_c_str(),
            nix::fcntl::RenameFlags::RENAME_NOREPLACE,
        ) {
            Ok(()) => pass.moved_up += 1,
            Err(e) => pass.left.add(show(prefix, name), e),
        }
        return;
    }
    let dir = match openat(parent, name, dir_flags(), Mode::empty()) {
        Ok(d) => d,
        Err(e) => {
            // Searchable only after a chmod (the sandbox made it 0000): try once more.
            let _ = nix::sys::stat::fchmodat(
                parent,
                name,
                Mode::from_bits_truncate(0o700),
                nix::sys::stat::FchmodatFlags::NoFollowSymlink,
            );
            match openat(parent, name, dir_flags(), Mode::empty()) {
                Ok(d) => d,
                Err(_) => return pass.left.add(show(prefix, name), e),
            }
        }
    };
    let _ = fchmod(dir.as_fd(), Mode::from_bits_truncate(0o700));
    let path = format!("{}/", show(prefix, name));
    match names(dir.as_fd()) {
        Ok(children) => {
            for child in &children {
                remove_at(root, dir.as_fd(), child, &path, depth + 1, serial, pass);
            }
        }
        Err(e) => pass.left.add(path.clone(), e),
    }
    drop(dir);
    match unlinkat(parent, name, UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
        // Whatever inside resisted is reported already.
        Err(nix::errno::Errno::ENOTEMPTY) if pass.left.count > 0 => {}
        Err(e) => pass.left.add(show(prefix, name), e),
    }
}

/// Removes a whole directory tree at `path` (a dead supervisor's directory); symlinks in
/// it are removed, never followed. A missing `path` is not an error. A directory this
/// process's user does not own is left alone: in a shared directory such as `/tmp`
/// anyone can plant one under a supervisor's name, and a root supervisor must not empty
/// (or spend its start-up walking) a tree someone else made.
pub fn remove_tree(path: &Path) -> Result<(), Leftover> {
    let mut left = Leftover::default();
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        left.add(
            path.display().to_string(),
            std::io::Error::other("not a removable path"),
        );
        return Err(left);
    };
    let name = CString::new(name.as_bytes()).expect("a path component has no NUL");
    let parent = match nix::fcntl::open(parent, dir_flags(), Mode::empty()) {
        Ok(p) => p,
        Err(e) => {
            left.add(path.display().to_string(), e);
            return Err(left);
        }
    };
    let dir = match openat(parent.as_fd(), name.as_c_str(), dir_flags(), Mode::empty()) {
        Ok(d) => d,
        Err(nix::errno::Errno::ENOENT) => return Ok(()),
        Err(e) => {
            left.add(path.display().to_string(), e);
            return Err(left);
        }
    };
    match nix::sys::stat::fstat(dir.as_fd()) {
        Ok(st) if st.st_uid == nix::unistd::geteuid().as_raw() => {}
        Ok(st) => {
            let e = std::io::Error::other(format!("owned by uid {}, not by us", st.st_uid));
            left.add(path.display().to_string(), e);
            return Err(left);
        }
        Err(e) => {
            left.add(path.display().to_string(), e);
            return Err(left);
        }
    }
    let _ = fchmod(dir.as_fd(), Mode::from_bits_truncate(0o700));
    remove_contents(dir.as_fd())?;
    drop(dir);
    match unlinkat(parent.as_fd(), name.as_c_str(), UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => {
            left.add(path.display().to_string(), e);
            Err(left)
        }
    }
}

/// Reads the regular file `rel` below `root`, at most `max` bytes; symlinks and anything
/// but a regular file are refused.
pub fn read_file(root: BorrowedFd<'_>, rel: &str, max: u64) -> std::io::Result<Vec<u8>> {
    let mut dir = open_dir(root)?;
    let mut parts: Vec<&str> = rel.split('/').collect();
    let name = parts.pop().unwrap_or_default();
    for part in parts.into_iter().chain(std::iter::once(name)) {
        if part.is_empty() || part == "." || part == ".." {
            return Err(std::io::Error::other("invalid path component"));
        }
    }
    for part in rel.split('/').take(rel.split('/').count() - 1) {
        dir = openat(dir.as_fd(), part, dir_flags(), Mode::empty())?;
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

    fn open(p: &Path) -> OwnedFd {
        nix::fcntl::open(p, dir_flags(), Mode::empty()).unwrap()
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
        let root = open(ws.path());
        let r = root.as_fd();
        assert_eq!(read_file(r, "d/ok.txt", 100).unwrap(), b"hello");
        assert!(read_file(r, "s", 100).is_err());
        assert!(read_file(r, "dl/secret", 100).is_err());
        assert!(read_file(r, "../x", 100).is_err());
        assert!(read_file(r, "d/../d/ok.txt", 100).is_err());
        assert!(read_file(r, "d", 100).is_err());
        assert!(read_file(r, "d/ok.txt", 2).is_err());
    }

    #[test]
    fn remove_tree_removes_read_only_trees_and_never_follows_links() {
        let base = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep-me"), "host").unwrap();
        let ws = base.path().join("ws");
        std::fs::create_dir_all(ws.join("a/b")).unwrap();
        std::fs::write(ws.join("a/b/f"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.join("a/link")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(ws.join("a/b"), std::fs::Permissions::from_mode(0o000)).unwrap();
        std::fs::set_permissions(ws.join("a"), std::fs::Permissions::from_mode(0o500)).unwrap();
        remove_tree(&ws).unwrap();
        assert!(!ws.exists());
        assert!(outside.path().join("keep-me").exists());
        remove_tree(&ws).unwrap();
    }

    #[test]
    fn non_utf8_names_are_removed() {
        let base = tempfile::tempdir().unwrap();
        let ws = base.path().join("ws");
        let bad = std::ffi::OsStr::from_bytes(b"caf\xe9\xff");
        std::fs::create_dir_all(ws.join(bad).join(bad)).unwrap();
        std::fs::write(ws.join(bad).join(bad).join(bad), "x").unwrap();
        std::fs::write(ws.join(bad).join("\n"), "x").unwrap();
        remove_tree(&ws).unwrap();
        assert!(!ws.exists());
    }

    /// A tree far deeper than the descriptors a process may hold goes, with the
    /// descriptor limit lowered so recursion-bound descriptors would fail.
    #[test]
    fn deep_trees_are_removed_with_few_descriptors() {
        let base = tempfile::tempdir().unwrap();
        let ws = base.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        let mut dir = open(&ws);
        for _ in 0..1500 {
            nix::sys::stat::mkdirat(dir.as_fd(), c"d", Mode::from_bits_truncate(0o700)).unwrap();
            dir = openat(dir.as_fd(), c"d", dir_flags(), Mode::empty()).unwrap();
        }
        nix::fcntl::openat(
            dir.as_fd(),
            c"f",
            OFlag::O_CREAT | OFlag::O_WRONLY,
            Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        drop(dir);
        // Run in a child with RLIMIT_NOFILE 64: well below the depth.
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "session::disk::tests::child_removes_deep_tree",
                "--ignored",
                "--nocapture",
            ])
            .env("DEEP_TREE", &ws)
            .status()
            .unwrap();
        assert!(status.success());
        assert!(!ws.exists());
    }

    #[test]
    #[ignore = "run by deep_trees_are_removed_with_few_descriptors"]
    fn child_removes_deep_tree() {
        let Some(ws) = std::env::var_os("DEEP_TREE") else {
            return;
        };
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 64, 64).unwrap();
        match std::env::var("EXPECT_LEFTOVER") {
            Ok(path) => {
                let left = remove_tree(Path::new(&ws)).unwrap_err();
                assert_eq!(left.count, 1, "{left}");
                assert!(left.named[0].0.ends_with(&path), "{left}");
                assert!(left.to_string().contains("could not be removed"), "{left}");
            }
            Err(_) => remove_tree(Path::new(&ws)).unwrap(),
        }
    }

    #[test]
    fn what_cannot_be_removed_is_reported() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to put a mount point in the tree");
            return;
        }
        let base = tempfile::tempdir().unwrap();
        let ws = base.path().join("ws");
        std::fs::create_dir_all(ws.join("sub/mp")).unwrap();
        std::fs::write(ws.join("sub/f"), "x").unwrap();
        let mp = ws.join("sub/mp");
        // A mount point cannot be removed: the removal must say so, not claim success.
        let r = std::process::Command::new("unshare")
            .args(["-m", "sh", "-c"])
            .arg(format!(
                "mount -t tmpfs none {0} && {1} --exact session::disk::tests::child_removes_deep_tree --ignored",
                mp.display(),
                std::env::current_exe().unwrap().display()
            ))
            .env("DEEP_TREE", &ws)
            .env("EXPECT_LEFTOVER", "sub/mp")
            .status()
            .unwrap();
        assert!(r.success());
        remove_tree(&ws).unwrap();
    }
}
