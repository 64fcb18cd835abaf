//! Sealing a staged layer once its installer sandbox has ended: only directories,
//! regular files and links that stay inside it; at most the size limit; owned by codebox
//! and read-only; and its content address, a digest of what it holds.
//!
//! The digest covers, per entry in path order, its kind, its path relative to the layer,
//! whether it is executable, and the SHA-256 of its bytes (a file) or its target (a
//! link): two installs that produced the same tree have the same address, and no report
//! from inside the sandbox can make a different tree take an existing layer's place.

use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use sha2::{Digest, Sha256};

use super::store::{io, Error, Result};

/// Entries (files, directories, links) a layer may hold: numpy, pandas and matplotlib
/// together are about 5,000; a wheel of a million empty files would exhaust inodes that
/// the byte-based eviction never counts.
pub const MAX_ENTRIES: usize = 100_000;

/// What a sealed layer holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// Bytes of its regular files.
    pub bytes: u64,
    /// Its content address (hex SHA-256).
    pub digest: String,
}

/// Checks, takes over, makes read-only and digests the tree at `root` (the installer
/// sandbox that wrote it has ended: nothing changes it meanwhile).
pub fn seal(root: &Path, me: (u32, u32), limit: u64) -> Result<Sealed> {
    // The root itself first: a link there (the installer may leave `layer -> ../..`)
    // would have the walk below take over and expose whatever it points to.
    let root_meta = std::fs::symlink_metadata(root).map_err(io("inspect", root))?;
    if !root_meta.file_type().is_dir() {
        return Err(Error::Unexpected {
            what: "a layer that is not a directory (a link?)",
            path: ".".into(),
        });
    }
    let mut bytes = 0u64;
    let mut entries = 0usize;
    let mut stack = vec![root.to_path_buf()];
    let mut dirs = Vec::new();
    // (relative path, record) per entry; sorted before hashing.
    let mut records: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).map_err(io("list", &dir))? {
            let entry = entry.map_err(io("list", &dir))?;
            entries += 1;
            if entries > MAX_ENTRIES {
                return Err(Error::TooManyEntries { limit: MAX_ENTRIES });
            }
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).map_err(io("inspect", &path))?;
            let ft = meta.file_type();
            let rel = path.strip_prefix(root).unwrap_or(&path);
            let shown = || rel.display().to_string();
            let rel_bytes = rel.as_os_str().as_encoded_bytes().to_vec();
            if ft.is_symlink() {
                let target = std::fs::read_link(&path).map_err(io("read", &path))?;
                if target.is_absolute() || escapes(&path, root, &target) {
                    return Err(Error::Unexpected {
                        what: "a link that points outside the layer",
                        path: shown(),
                    });
                }
                lchown(&path, me)?;
                let mut record = b"l\0".to_vec();
                record.extend_from_slice(target.as_os_str().as_encoded_bytes());
                records.push((rel_bytes, record));
                continue;
            }
            if ft.is_dir() {
                records.push((rel_bytes, b"d".to_vec()));
                stack.push(path.clone());
                dirs.push(path);
                continue;
            }
            if !ft.is_file() {
                return Err(Error::Unexpected {
                    what: "a special file",
                    path: shown(),
                });
            }
            bytes = bytes.saturating_add(meta.len());
            if bytes > limit {
                return Err(Error::TooLarge { bytes, limit });
            }
            lchown(&path, me)?;
            let exec = meta.mode() & 0o111 != 0;
            let mode = if exec { 0o555 } else { 0o444 };
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(io("set the mode of", &path))?;
            let mut record = if exec {
                b"x\0".to_vec()
            } else {
                b"f\0".to_vec()
            };
            record.extend_from_slice(&file_sha256(&path)?);
            records.push((rel_bytes, record));
        }
    }
    // Directories last, deepest first: their own write bit is needed until then. The root
    // keeps its write bit for the caller's rename into place (moving a directory to
    // another parent rewrites its `..`, which an unprivileged owner may do only while it
    // is writable); [`finish_root`] clears it after.
    for dir in dirs.iter().rev() {
        lchown(dir, me)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555))
            .map_err(io("set the mode of", dir))?;
    }
    lchown(root, me)?;
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755))
        .map_err(io("set the mode of", root))?;
    records.sort();
    let mut h = Sha256::new();
    for (rel, record) in &records {
        // Lengths first: no two different trees serialise alike.
        h.update((rel.len() as u64).to_le_bytes());
        h.update(rel);
        h.update((record.len() as u64).to_le_bytes());
        h.update(record);
    }
    Ok(Sealed {
        bytes,
        digest: crate::rootfs::manifest::hex(&h.finalize()),
    })
}

/// Makes a sealed layer's root read-only, once it is in place.
pub fn finish_root(root: &Path) -> Result<()> {
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o555))
        .map_err(io("set the mode of", root))
}

fn file_sha256(path: &Path) -> Result<[u8; 32]> {
    let mut file = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io("read", path))?;
    let mut h = Sha256::new();
    std::io::copy(&mut file, &mut h).map_err(io("read", path))?;
    Ok(h.finalize().into())
}

/// Whether `target`, relative to the link at `link`, leaves `root`.
fn escapes(link: &Path, root: &Path, target: &Path) -> bool {
    let Ok(rel) = link.parent().unwrap_or(root).strip_prefix(root) else {
        return true;
    };
    let mut depth: i64 = rel.components().count() as i64;
    for c in target.components() {
        match c {
            std::path::Component::ParentDir => depth -= 1,
            std::path::Component::Normal(_) => depth += 1,
            std::path::Component::CurDir => {}
            _ => return true,
        }
        if depth < 0 {
            return true;
        }
    }
    false
}

fn lchown(path: &Path, (uid, gid): (u32, u32)) -> Result<()> {
    let meta = std::fs::symlink_metadata(path).map_err(io("inspect", path))?;
    if meta.uid() == uid && meta.gid() == gid {
        return Ok(());
    }
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(io("take ownership of", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> (u32, u32) {
        (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    }

    fn tree(files: &[(&str, &str, u32)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text, mode) in files {
            let p = dir.path().join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).unwrap();
        }
        dir
    }

    fn unseal(dir: &Path) {
        super::super::store::remove_tree(dir).unwrap();
    }

    #[test]
    fn the_digest_is_the_content_and_nothing_else() {
        let base = [("a/b.py", "x = 1", 0o644), ("bin/t", "#!", 0o755)];
        let one = tree(&base);
        let two = tree(&base);
        // Same content written in another order and at other times: same address.
        let a = seal(one.path(), me(), 1 << 20).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = seal(two.path(), me(), 1 << 20).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.bytes, 7);
        let differs = |files: &[(&str, &str, u32)]| {
            let t = tree(files);
            let d = seal(t.path(), me(), 1 << 20).unwrap().digest;
            unseal(t.path());
            d != a.digest
        };
        assert!(differs(&[
            ("a/b.py", "x = 2", 0o644),
            ("bin/t", "#!", 0o755)
        ]));
        assert!(differs(&[
            ("a/b.py", "x = 1", 0o644),
            ("bin/t", "#!", 0o644)
        ]));
        assert!(differs(&[
            ("a/c.py", "x = 1", 0o644),
            ("bin/t", "#!", 0o755)
        ]));
        assert!(differs(&[("a/b.py", "x = 1", 0o644)]));
        // A path and a content cannot trade bytes.
        assert!(differs(&[
            ("a/b.pyx", " = 1", 0o644),
            ("bin/t", "#!", 0o755)
        ]));
        unseal(one.path());
        unseal(two.path());
    }

    #[test]
    fn a_linked_root_is_refused_and_what_it_points_to_is_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), "s").unwrap();
        std::fs::set_permissions(
            outside.join("secret"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let layer = dir.path().join("layer");
        std::os::unix::fs::symlink("outside", &layer).unwrap();
        let err = seal(&layer, me(), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");
        let mode = std::fs::metadata(outside.join("secret"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn link_escapes() {
        let root = Path::new("/r");
        assert!(!escapes(Path::new("/r/a/b"), root, Path::new("c")));
        assert!(!escapes(Path::new("/r/a/b"), root, Path::new("../c")));
        assert!(escapes(Path::new("/r/a/b"), root, Path::new("../../c")));
        assert!(escapes(Path::new("/r/b"), root, Path::new("../c")));
    }
}
