//! Reading and writing cgroup files, each failure turned into a path-carrying [`Error`].

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::error::{Error, Result};

/// Reads a whole (small) file.
pub(super) fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a file that may legitimately be missing (an older kernel, an absent controller).
pub(super) fn read_optional(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes `value` to an existing file in one `write(2)`, as cgroup files require. The file is
/// never created: a missing cgroup file is an error, not something to make up.
pub(super) fn write(path: &Path, value: &str) -> Result<()> {
    write_io(path, value).map_err(|source| Error::Write {
        path: path.to_path_buf(),
        value: value.to_string(),
        source,
    })
}

/// [`write`] without the error conversion, for callers that look at the errno.
pub(super) fn write_io(path: &Path, value: &str) -> io::Result<()> {
    let mut f = OpenOptions::new().write(true).open(path)?;
    f.write_all(value.as_bytes())
}

/// The value of `key` in a flat keyed file (`key value` per line: `memory.events`,
/// `cpu.stat`, `pids.events`, `memory.oom_control`).
pub(super) fn keyed_value(path: &Path, text: &str, key: &str) -> Result<Option<u64>> {
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() == Some(key) {
            let value = words.next().unwrap_or("");
            return value.parse().map(Some).map_err(|_| Error::Parse {
                path: path.to_path_buf(),
                reason: format!("{key} has the value {value:?}"),
            });
        }
    }
    Ok(None)
}

/// A file holding one unsigned number (`memory.peak`, `cpuacct.usage`).
pub(super) fn single_value(path: &Path, text: &str) -> Result<u64> {
    text.trim().parse().map_err(|_| Error::Parse {
        path: path.to_path_buf(),
        reason: format!("expected a number, found {:?}", text.trim()),
    })
}

/// The process ids listed in a `cgroup.procs` file.
pub(super) fn parse_pids(path: &Path, text: &str) -> Result<Vec<i32>> {
    text.split_whitespace()
        .map(|w| {
            w.parse().map_err(|_| Error::Parse {
                path: path.to_path_buf(),
                reason: format!("{w:?} is not a pid"),
            })
        })
        .collect()
}

/// The cgroup directories below `dir` (not `dir` itself), deepest first, so they can be
/// removed in order.
pub(super) fn subdirs_deepest_first(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    collect_subdirs(dir, &mut out);
    out
}

fn collect_subdirs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            let path = entry.path();
            collect_subdirs(&path, out);
            out.push(path);
        }
    }
}

/// Whether this process may create entries in `dir` (`access(2)` with `W_OK`).
pub(super) fn writable(dir: &Path) -> bool {
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_values() {
        let p = Path::new("memory.events");
        let text = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(keyed_value(p, text, "oom_kill").unwrap(), Some(1));
        assert_eq!(keyed_value(p, text, "max").unwrap(), Some(12));
        assert_eq!(keyed_value(p, text, "absent").unwrap(), None);
        assert!(keyed_value(p, "oom_kill x\n", "oom_kill").is_err());
    }

    #[test]
    fn pids_and_single_values() {
        let p = Path::new("cgroup.procs");
        assert_eq!(parse_pids(p, "12\n345\n").unwrap(), vec![12, 345]);
        assert_eq!(parse_pids(p, "").unwrap(), Vec::<i32>::new());
        assert!(parse_pids(p, "12\nx\n").is_err());
        assert_eq!(single_value(p, "4096\n").unwrap(), 4096);
        assert!(single_value(p, "max\n").is_err());
    }

    #[test]
    fn write_never_creates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cgroup.kill");
        assert!(write(&path, "1").is_err());
        std::fs::write(&path, "").unwrap();
        write(&path, "1").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "1");
    }

    #[test]
    fn subdirs_come_deepest_first() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/cgroup.procs"), "").unwrap();
        let found = subdirs_deepest_first(dir.path());
        assert_eq!(found, vec![dir.path().join("a/b"), dir.path().join("a")]);
    }
}
