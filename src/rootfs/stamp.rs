//! The stamp a full verification leaves in the caller's private cache directory, and the
//! identity of a tree it is checked against.
//!
//! Format (text, one field per line, fields separated by one TAB, shown as a space here;
//! anything else, such as a stamp of an earlier codebox, reads as no stamp, so the next
//! verification is full):
//!
//! ```text
//! codebox rootfs stamp v2
//! root <dev> <ino> <ctime ns>
//! manifest <dev> <ino> <size> <ctime ns>
//! sha256 <manifest digest>
//! entries <n>
//! fingerprint <hex>
//! sealed yes
//! dir <dev> <ino> <ctime ns> </path>
//! ```
//!
//! `sealed` is `yes` or `no <why>`; a sealed stamp lists every directory of the tree
//! (`dir` lines, in manifest order). A change time is the one time users cannot set: the
//! kernel moves it to "now" on any write, chmod, chown, rename, link or unlink (of a
//! directory's entries, for a directory).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::sys::stat::FileStat;
use sha2::{Digest, Sha256};

use super::manifest::hex;

const HEADER: &str = "codebox rootfs stamp v2";

/// Which inode a path is, and when it last changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub ctime_ns: u64,
}

impl Identity {
    pub fn of(st: &FileStat) -> Identity {
        Identity {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size as u64,
            ctime_ns: ctime_ns(st),
        }
    }
}

/// The change time in nanoseconds (wrapping: only compared, never shown).
pub fn ctime_ns(st: &FileStat) -> u64 {
    (st.st_ctime as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(st.st_ctime_nsec as u64)
}

/// One directory of a sealed tree as the full verification saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirRecord {
    /// The manifest's path (absolute below the root).
    pub path: String,
    pub dev: u64,
    pub ino: u64,
    pub ctime_ns: u64,
}

/// Whether every entry of a tree is sealed (see the module documentation of `rootfs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seal {
    Sealed,
    /// Why not, naming the first entry that breaks it.
    Unsealed(String),
}

/// What a full verification leaves for the next runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// The root directory (its size is not compared: 0 here).
    pub root: Identity,
    pub manifest: Identity,
    pub manifest_sha256: String,
    pub entries: usize,
    /// SHA-256 over the manifest digest and every entry's `dev, ino, ctime`.
    pub fingerprint: String,
    pub seal: Seal,
    /// Every directory, for a sealed tree; empty otherwise.
    pub dirs: Vec<DirRecord>,
}

impl Stamp {
    /// The stamp at `path`, if there is a readable one of this format.
    pub fn read(path: &Path) -> Option<Stamp> {
        Self::parse(&std::fs::read_to_string(path).ok()?)
    }

    pub fn parse(text: &str) -> Option<Stamp> {
        let mut lines = text.lines();
        if lines.next()? != HEADER {
            return None;
        }
        let mut field = |name: &str| -> Option<Vec<&str>> {
            let line = lines.next()?;
            let mut parts = line.split('\t');
            (parts.next()? == name).then(|| parts.collect())
        };
        let num = |s: &str| s.parse::<u64>().ok();
        let root = match field("root")?.as_slice() {
            [dev, ino, ct] => Identity {
                dev: num(dev)?,
                ino: num(ino)?,
                size: 0,
                ctime_ns: num(ct)?,
            },
            _ => return None,
        };
        let manifest = match field("manifest")?.as_slice() {
            [dev, ino, size, ct] => Identity {
                dev: num(dev)?,
                ino: num(ino)?,
                size: num(size)?,
                ctime_ns: num(ct)?,
            },
            _ => return None,
        };
        let manifest_sha256 = match field("sha256")?.as_slice() {
            [h] if is_hex64(h) => h.to_string(),
            _ => return None,
        };
        let entries = match field("entries")?.as_slice() {
            [n] => n.parse().ok()?,
            _ => return None,
        };
        let fingerprint = match field("fingerprint")?.as_slice() {
            [h] if is_hex64(h) => h.to_string(),
            _ => return None,
        };
        let seal = match field("sealed")?.as_slice() {
            ["yes"] => Seal::Sealed,
            [why] if why.starts_with("no ") => Seal::Unsealed(why[3..].to_string()),
            _ => return None,
        };
        let mut dirs = Vec::new();
        for line in lines {
            match line.split('\t').collect::<Vec<_>>().as_slice() {
                ["dir", dev, ino, ct, path] if path.starts_with('/') => dirs.push(DirRecord {
                    path: path.to_string(),
                    dev: num(dev)?,
                    ino: num(ino)?,
                    ctime_ns: num(ct)?,
                }),
                _ => return None,
            }
        }
        if seal != Seal::Sealed && !dirs.is_empty() {
            return None;
        }
        Some(Stamp {
            root,
            manifest,
            manifest_sha256,
            entries,
            fingerprint,
            seal,
            dirs,
        })
    }

    pub fn render(&self) -> String {
        let mut s = String::with_capacity(256 + self.dirs.len() * 96);
        let (r, m) = (&self.root, &self.manifest);
        s.push_str(HEADER);
        s.push('\n');
        s.push_str(&format!("root\t{}\t{}\t{}\n", r.dev, r.ino, r.ctime_ns));
        s.push_str(&format!(
            "manifest\t{}\t{}\t{}\t{}\n",
            m.dev, m.ino, m.size, m.ctime_ns
        ));
        s.push_str(&format!("sha256\t{}\n", self.manifest_sha256));
        s.push_str(&format!("entries\t{}\n", self.entries));
        s.push_str(&format!("fingerprint\t{}\n", self.fingerprint));
        match &self.seal {
            Seal::Sealed => s.push_str("sealed\tyes\n"),
            // One line: a reason never holds a newline or tab (manifest paths cannot).
            Seal::Unsealed(why) => {
                s.push_str(&format!("sealed\tno {}\n", why.replace(['\n', '\t'], " ")))
            }
        }
        for d in &self.dirs {
            s.push_str(&format!(
                "dir\t{}\t{}\t{}\t{}\n",
                d.dev, d.ino, d.ctime_ns, d.path
            ));
        }
        s
    }
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Where the stamp of the tree at `root` lives in `dir`.
pub fn path(dir: &Path, root: &Path) -> PathBuf {
    let id = hex(&Sha256::digest(root.as_os_str().as_encoded_bytes()));
    dir.join(format!("rootfs-{}.verified", &id[..16]))
}

/// Writes `stamp` at `path` (atomically) in `dir`, created private if missing. A stamp
/// that cannot be written only costs the next run a full verification.
pub fn write(dir: &Path, path: &Path, stamp: &Stamp) {
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let meta = std::fs::metadata(dir)?;
        // Only trust a directory that is ours and private.
        if meta.uid() != nix::unistd::geteuid().as_raw() || meta.permissions().mode() & 0o022 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, stamp.render())?;
        std::fs::rename(&tmp, path)
    };
    if let Err(e) = write() {
        tracing::debug!(?e, dir = %dir.display(), "cannot write the rootfs verification stamp");
    }
}

/// The per-user directory for verification stamps (`$XDG_CACHE_HOME/codebox`, else
/// `~/.cache/codebox`).
pub fn default_dir() -> Option<PathBuf> {
    let home = || {
        std::env::var_os("HOME").map(PathBuf::from).or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::geteuid())
                .ok()
                .flatten()
                .map(|u| u.dir)
        })
    };
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| home().map(|h| h.join(".cache")))?;
    Some(base.join("codebox"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(seal: Seal, dirs: Vec<DirRecord>) -> Stamp {
        Stamp {
            root: Identity {
                dev: 1,
                ino: 2,
                size: 0,
                ctime_ns: 3,
            },
            manifest: Identity {
                dev: 1,
                ino: 5,
                size: 6,
                ctime_ns: 7,
            },
            manifest_sha256: "a".repeat(64),
            entries: 9,
            fingerprint: "b".repeat(64),
            seal,
            dirs,
        }
    }

    #[test]
    fn a_stamp_reads_back_as_written() {
        let dirs = vec![DirRecord {
            path: "/usr/lib/a b".into(),
            dev: 1,
            ino: 10,
            ctime_ns: u64::MAX,
        }];
        for s in [
            stamp(Seal::Sealed, dirs),
            stamp(Seal::Unsealed("/usr has a write bit".into()), vec![]),
        ] {
            assert_eq!(Stamp::parse(&s.render()), Some(s));
        }
    }

    #[test]
    fn anything_else_reads_as_no_stamp() {
        let good = stamp(Seal::Sealed, vec![]).render();
        let mut bad = vec![
            String::new(),
            // A stamp of the earlier format: manifest id, digest, fingerprint.
            format!("1:2:3:4.5\n{}\n{}\n", "a".repeat(64), "b".repeat(64)),
            good.replace("v2", "v3"),
            good.replace("sealed\tyes", "sealed\tmaybe"),
            good.replace(&"a".repeat(64), "A"),
            good.replace("entries\t9", "entries\tnine"),
            good.replace("root\t1\t2\t3", "root\t1\t2"),
            format!("{good}dir\t1\t2\t3\trelative\n"),
            format!("{good}junk\n"),
        ];
        // A dir line in an unsealed stamp.
        bad.push(format!(
            "{}dir\t1\t2\t3\t/x\n",
            stamp(Seal::Unsealed("x".into()), vec![]).render()
        ));
        for text in bad {
            assert_eq!(Stamp::parse(&text), None, "{text:?}");
        }
    }
}
