//! The build state kept between runs in the build directory, so that a rebuild with nothing
//! changed hashes nothing and compiles nothing:
//!
//! - `h` lines: rootfs path, size and mtime of the file there → its SHA-256;
//! - `p` lines: a `.pyc` path → the SHA-256 of the source it was compiled from, and the `.pyc`
//!   file's size and mtime right after compiling.
//!
//! A missing or unreadable state file only costs time: everything is hashed again.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

pub type Sha = [u8; 32];

/// What identifies a file's contents well enough for the cache: size and mtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub size: u64,
    pub mtime_ns: i128,
}

impl Key {
    pub fn of(meta: &fs::Metadata) -> Self {
        Self {
            size: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PycStamp {
    pub source: Sha,
    pub pyc: Key,
}

#[derive(Debug, Default)]
pub struct State {
    path: PathBuf,
    hashes: HashMap<PathBuf, (Key, Sha)>,
    pyc: HashMap<PathBuf, PycStamp>,
    /// Files hashed (not found in the cache) during this run.
    pub hashed: usize,
}

impl State {
    pub fn load(path: &Path) -> Self {
        let mut state = Self {
            path: path.to_path_buf(),
            ..Self::default()
        };
        let Ok(text) = fs::read_to_string(path) else {
            return state;
        };
        for line in text.lines() {
            if state.parse_line(line).is_none() {
                eprintln!("note: ignoring corrupt build state {}", path.display());
                return Self {
                    path: path.to_path_buf(),
                    ..Self::default()
                };
            }
        }
        state
    }

    fn parse_line(&mut self, line: &str) -> Option<()> {
        let f: Vec<&str> = line.split('\t').collect();
        let key = |size: &str, mtime: &str| {
            Some(Key {
                size: size.parse().ok()?,
                mtime_ns: mtime.parse().ok()?,
            })
        };
        match f.as_slice() {
            ["h", size, mtime, sha, path] => {
                self.hashes
                    .insert(path.into(), (key(size, mtime)?, from_hex(sha)?));
            }
            ["p", source, size, mtime, path] => {
                self.pyc.insert(
                    path.into(),
                    PycStamp {
                        source: from_hex(source)?,
                        pyc: key(size, mtime)?,
                    },
                );
            }
            _ => return None,
        }
        Some(())
    }

    /// Write the state atomically. Entries for paths no longer in the rootfs are dropped by
    /// `retain` beforehand.
    pub fn save(&self) -> Result<()> {
        let mut lines: Vec<String> = self
            .hashes
            .iter()
            .map(|(p, (k, sha))| {
                format!(
                    "h\t{}\t{}\t{}\t{}",
                    k.size,
                    k.mtime_ns,
                    hex(sha),
                    p.display()
                )
            })
            .chain(self.pyc.iter().map(|(p, s)| {
                format!(
                    "p\t{}\t{}\t{}\t{}",
                    hex(&s.source),
                    s.pyc.size,
                    s.pyc.mtime_ns,
                    p.display()
                )
            }))
            .collect();
        lines.sort();
        let mut text = lines.join("\n");
        text.push('\n');
        write_atomic(&self.path, text.as_bytes())
    }

    /// Keep only entries whose path satisfies `keep`.
    pub fn retain(&mut self, keep: impl Fn(&Path) -> bool) {
        self.hashes.retain(|p, _| keep(p));
        self.pyc.retain(|p, _| keep(p));
    }

    /// Record the hash of a file just written at `rel` with metadata `meta`.
    pub fn record(&mut self, rel: &Path, meta: &fs::Metadata, sha: Sha) {
        self.hashes.insert(rel.to_path_buf(), (Key::of(meta), sha));
    }

    /// The SHA-256 of the file at `root/rel` (following a final symlink), from the cache when
    /// its size and mtime are unchanged, else read and remembered.
    pub fn sha(&mut self, root: &Path, rel: &Path) -> Result<Sha> {
        let path = root.join(rel);
        let meta = fs::metadata(&path).with_context(|| format!("reading {}", path.display()))?;
        let key = Key::of(&meta);
        if let Some((k, sha)) = self.hashes.get(rel) {
            if *k == key {
                return Ok(*sha);
            }
        }
        let sha = hash_file(&path)?;
        self.hashed += 1;
        self.hashes.insert(rel.to_path_buf(), (key, sha));
        Ok(sha)
    }

    pub fn pyc_stamp(&self, rel: &Path) -> Option<PycStamp> {
        self.pyc.get(rel).copied()
    }

    pub fn set_pyc_stamp(&mut self, rel: &Path, stamp: PycStamp) {
        self.pyc.insert(rel.to_path_buf(), stamp);
    }
}

pub fn hash_file(path: &Path) -> Result<Sha> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().into())
}

pub fn hex(sha: &Sha) -> String {
    sha.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(s: &str) -> Option<Sha> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Write `path` by writing a temporary file beside it and renaming it over.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .context("path has no file name")?
        .to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_cached_by_size_and_mtime_and_survive_a_reload() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        fs::create_dir(&root).unwrap();
        fs::write(root.join("a"), "abc").unwrap();
        let state_path = t.path().join("state.tsv");
        let mut s = State::load(&state_path);
        let sha = s.sha(&root, Path::new("a")).unwrap();
        assert_eq!(
            hex(&sha),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        s.sha(&root, Path::new("a")).unwrap();
        assert_eq!(s.hashed, 1);
        let stamp = PycStamp {
            source: sha,
            pyc: Key {
                size: 1,
                mtime_ns: -5,
            },
        };
        s.set_pyc_stamp(Path::new("p.pyc"), stamp);
        s.save().unwrap();

        let mut s = State::load(&state_path);
        assert_eq!(s.sha(&root, Path::new("a")).unwrap(), sha);
        assert_eq!(s.hashed, 0);
        assert_eq!(s.pyc_stamp(Path::new("p.pyc")), Some(stamp));
        fs::write(root.join("a"), "abcd").unwrap();
        assert_ne!(s.sha(&root, Path::new("a")).unwrap(), sha);
        assert_eq!(s.hashed, 1);

        fs::write(&state_path, "garbage\n").unwrap();
        assert!(State::load(&state_path).hashes.is_empty());
    }
}
