//! The built tree is sealed: no write bit on any directory or file (directories and
//! executables 0555, other files 0444), the root directory and `.manifest` included.
//! codebox then checks such a tree in O(1) per run instead of every entry's metadata
//! (`src/rootfs/mod.rs` says why that is enough); a change needs root or a deliberate
//! chmod by the tree's owner, as in Go's module cache or the Nix store.
//!
//! Building keeps that cheap: as root (which writes whatever the modes) nothing is
//! opened; as another user a directory is made writable only right before something is
//! written into it ([`open_dir`]), and [`seal`] closes everything again at the end,
//! changing only what differs, so a rebuild that changes nothing changes no mode and no
//! change time (codebox's stamp of the tree stays valid).

use std::fs::{self, Permissions};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{Context, Result};

use super::plan::{Entry, Plan};
use super::sync::MANIFEST;

/// A sealed directory.
pub const DIR_MODE: u32 = 0o555;

/// The sealed mode of a file the plan gives `mode` (0644 or 0755).
pub fn file_mode(mode: u32) -> u32 {
    mode & !0o222
}

/// Makes `dir` writable by this process if it is not (a sealed directory, as another user
/// than root); [`seal`] closes it again.
pub fn open_dir(dir: &Path) -> Result<()> {
    if writable(dir) {
        return Ok(());
    }
    let meta = fs::symlink_metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
    if !meta.is_dir() {
        return Ok(());
    }
    fs::set_permissions(
        dir,
        Permissions::from_mode(meta.permissions().mode() | 0o700),
    )
    .with_context(|| format!("chmod u+w {}", dir.display()))
}

/// Runs `f` with `dir` writable by this process, then gives `dir` its mode back if it had
/// to be opened (writing one file into a sealed directory).
pub fn with_open_dir<T>(dir: &Path, f: impl FnOnce() -> Result<T>) -> Result<T> {
    if writable(dir) {
        return f();
    }
    let mode = fs::metadata(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .permissions()
        .mode();
    open_dir(dir)?;
    let out = f();
    fs::set_permissions(dir, Permissions::from_mode(mode))
        .with_context(|| format!("chmod {:04o} {}", mode & 0o7777, dir.display()))?;
    out
}

/// Whether this process may write into `dir` (root may, whatever the mode).
fn writable(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `path` is a NUL-terminated string that outlives the call; access(2) only
    // reads it.
    unsafe { libc::access(path.as_ptr(), libc::W_OK) == 0 }
}

/// [`open_dir`] for `dir` and every directory below it (before removing or rewriting a
/// whole subtree).
pub fn open_tree(dir: &Path) -> Result<()> {
    open_dir(dir)?;
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e.with_context(|| format!("reading {}", dir.display()))?;
        if e.file_type()?.is_dir() {
            open_tree(&e.path())?;
        }
    }
    Ok(())
}

/// Removes a tree whatever its modes (a sealed rootfs, as another user than root).
pub fn remove_tree(path: &Path) -> Result<()> {
    if fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        open_tree(path)?;
        if let Some(parent) = path.parent() {
            open_dir(parent)?;
        }
        fs::remove_dir_all(path).with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(())
}

/// Seals `out` as `plan` has it: every planned directory and the root 0555, every planned
/// or generated file its sealed mode, the manifest 0444. Returns how many modes changed.
pub fn seal(out: &Path, plan: &Plan) -> Result<usize> {
    let mut changed = 0;
    let mut set = |path: &Path, mode: u32| -> Result<()> {
        let meta =
            fs::symlink_metadata(path).with_context(|| format!("reading {}", path.display()))?;
        if meta.permissions().mode() & 0o7777 != mode {
            fs::set_permissions(path, Permissions::from_mode(mode))
                .with_context(|| format!("chmod {mode:04o} {}", path.display()))?;
            changed += 1;
        }
        Ok(())
    };
    for (rel, entry) in plan.entries() {
        let path = out.join(rel);
        match entry {
            Entry::Dir => set(&path, DIR_MODE)?,
            Entry::File { mode, .. } => set(&path, file_mode(*mode))?,
            // `.pyc` files, written by compileall with their source's mode plus u+w.
            Entry::Generated => set(&path, 0o444)?,
            Entry::Symlink { .. } => {}
        }
    }
    if out.join(MANIFEST).exists() {
        set(&out.join(MANIFEST), 0o444)?;
    }
    set(out, DIR_MODE)?;
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(file_mode(0o644), 0o444);
        assert_eq!(file_mode(0o755), 0o555);
    }

    #[test]
    fn a_sealed_tree_is_opened_and_removed() {
        let t = tempfile::tempdir().unwrap();
        let top = t.path().join("top");
        fs::create_dir_all(top.join("a/b")).unwrap();
        fs::write(top.join("a/b/f"), "x").unwrap();
        for d in ["a/b", "a", ""] {
            fs::set_permissions(top.join(d), Permissions::from_mode(DIR_MODE)).unwrap();
        }
        open_dir(&top.join("a")).unwrap();
        // Writable now, whoever we are.
        fs::write(top.join("a/g"), "y").unwrap();
        remove_tree(&top).unwrap();
        assert!(!top.exists());
        remove_tree(&top).unwrap();
    }
}
