//! Per-process temporary directories (`<prefix><pid>-<random>`) and the removal of those
//! whose process is gone: a supervisor killed with SIGKILL cannot clean up after itself,
//! so the next one started on the host does.

use std::path::Path;

/// Removes every `<prefix><pid>-*` directory in `base` whose pid names no running
/// process (never this process's own). Symlinks inside are removed, not followed.
pub fn remove_of_dead_processes(base: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        match crate::session::disk::remove_tree(&e.path()) {
            Ok(()) => {
                tracing::info!(dir = %e.path().display(), "removed a dead supervisor's directory")
            }
            Err(left) => {
                tracing::warn!(dir = %e.path().display(), %left, "cannot remove a dead supervisor's directory")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_of_dead_processes_are_removed() {
        let base = tempfile::tempdir().unwrap();
        let stale = base.path().join("x-999999999-a");
        std::fs::create_dir_all(stale.join("deep")).unwrap();
        // What an earlier version's session left: names that are not UTF-8, deep trees.
        use std::os::unix::ffi::OsStrExt;
        let bad = std::ffi::OsStr::from_bytes(b"\xff\xfe");
        let mut deep = stale.join(bad);
        for _ in 0..100 {
            deep.push(bad);
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join(bad), "x").unwrap();
        let mine = base.path().join(format!("x-{}-b", std::process::id()));
        std::fs::create_dir(&mine).unwrap();
        let other = base.path().join("y-999999999-c");
        std::fs::create_dir(&other).unwrap();
        remove_of_dead_processes(base.path(), "x-");
        assert!(!stale.exists());
        assert!(mine.exists());
        assert!(other.exists(), "another prefix is left alone");
    }

    /// Anyone may create `/tmp/<prefix><dead pid>-x`: a directory another user made is
    /// neither emptied nor removed, whatever it holds.
    #[test]
    fn a_directory_planted_by_another_user_is_left_alone() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to make a directory owned by another user");
            return;
        }
        let base = tempfile::tempdir().unwrap();
        let planted = base.path().join("x-999999999-planted");
        std::fs::create_dir_all(planted.join("sub")).unwrap();
        std::fs::write(planted.join("sub/theirs"), "x").unwrap();
        for p in [&planted, &planted.join("sub"), &planted.join("sub/theirs")] {
            std::os::unix::fs::lchown(p, Some(65534), Some(65534)).unwrap();
        }
        let left = crate::session::disk::remove_tree(&planted).unwrap_err();
        assert!(left.to_string().contains("not by us"), "{left}");
        remove_of_dead_processes(base.path(), "x-");
        assert!(planted.join("sub/theirs").exists());
    }
}
