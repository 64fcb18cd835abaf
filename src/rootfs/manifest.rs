//! The rootfs manifest: every entry of the tree with its kind, mode, size and SHA-256.
//!
//! Written by `cargo xtask rootfs` as `<rootfs>/.manifest`. Format (UTF-8, one entry per
//! line, sorted by path, fields separated by one TAB, the manifest itself not listed):
//!
//! ```text
//! # codebox rootfs manifest v1
//! d<TAB>0755<TAB>/usr
//! f<TAB>0644<TAB><size><TAB><sha256 hex><TAB>/usr/lib/python3.11/os.py
//! l<TAB>python3.11<TAB>/usr/bin/python3
//! ```

use std::path::{Path, PathBuf};

use super::error::{Error, Result};

pub const HEADER: &str = "# codebox rootfs manifest v1";
pub const FILE_NAME: &str = ".manifest";

/// One entry of the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Dir {
        path: String,
        mode: u32,
    },
    File {
        path: String,
        mode: u32,
        size: u64,
        sha256: [u8; 32],
    },
    Symlink {
        path: String,
        target: PathBuf,
    },
}

impl Entry {
    pub fn path(&self) -> &str {
        match self {
            Entry::Dir { path, .. } | Entry::File { path, .. } | Entry::Symlink { path, .. } => {
                path
            }
        }
    }
}

/// A parsed manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub entries: Vec<Entry>,
}

impl Manifest {
    /// Parses manifest text; `source` names the file in errors.
    pub fn parse(text: &str, source: &Path) -> Result<Manifest> {
        let bad = |line: usize, reason: String| Error::ManifestMalformed {
            path: source.to_path_buf(),
            line,
            reason,
        };
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, HEADER)) => {}
            _ => return Err(bad(1, format!("first line is not {HEADER:?}"))),
        }
        // One entry per line after the header (the count is only a capacity hint).
        let mut entries: Vec<Entry> = Vec::with_capacity(text.len() / 64);
        for (i, line) in lines {
            let n = i + 1;
            let mut f = line.split('\t');
            let fields = [f.next(), f.next(), f.next(), f.next(), f.next(), f.next()];
            let entry = match fields {
                [Some("d"), Some(mode), Some(path), None, None, None] => Entry::Dir {
                    path: check_path(path).map_err(|r| bad(n, r))?,
                    mode: parse_mode(mode).map_err(|r| bad(n, r))?,
                },
                [Some("f"), Some(mode), Some(size), Some(sha), Some(path), None] => Entry::File {
                    path: check_path(path).map_err(|r| bad(n, r))?,
                    mode: parse_mode(mode).map_err(|r| bad(n, r))?,
                    size: size
                        .parse()
                        .map_err(|_| bad(n, format!("bad size {size:?}")))?,
                    sha256: parse_sha(sha).ok_or_else(|| bad(n, format!("bad sha256 {sha:?}")))?,
                },
                [Some("l"), Some(target), Some(path), None, None, None] if !target.is_empty() => {
                    Entry::Symlink {
                        path: check_path(path).map_err(|r| bad(n, r))?,
                        target: PathBuf::from(target),
                    }
                }
                _ => return Err(bad(n, "expected a d, f or l entry".into())),
            };
            if let Some(prev) = entries.last() {
                if prev.path() >= entry.path() {
                    return Err(bad(n, "entries are not sorted or repeat a path".into()));
                }
            }
            entries.push(entry);
        }
        Ok(Manifest { entries })
    }
}

fn check_path(p: &str) -> std::result::Result<String, String> {
    if !p.starts_with('/') || p == "/" {
        return Err(format!("path {p:?} is not absolute below the root"));
    }
    if p.split('/').any(|c| c == ".." || c == ".") || p.contains("//") {
        return Err(format!("path {p:?} is not normalised"));
    }
    Ok(p.to_string())
}

fn parse_mode(m: &str) -> std::result::Result<u32, String> {
    let mode = u32::from_str_radix(m, 8).map_err(|_| format!("bad mode {m:?}"))?;
    if m.len() != 4 || mode & !0o777 != 0 {
        return Err(format!(
            "mode {m:?} is not 4 octal digits without special bits"
        ));
    }
    if mode & 0o022 != 0 {
        return Err(format!("mode {m} is group- or world-writable"));
    }
    Ok(mode)
}

fn parse_sha(s: &str) -> Option<[u8; 32]> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = (nibble(b[2 * i])? << 4) | nibble(b[2 * i + 1])?;
    }
    Some(out)
}

/// Lower-case hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn parse(body: &str) -> Result<Manifest> {
        Manifest::parse(&format!("{HEADER}\n{body}"), Path::new("m"))
    }

    #[test]
    fn parses_all_kinds() {
        let m = parse(&format!(
            "d\t0755\t/usr\nf\t0644\t0\t{SHA}\t/usr/a\nl\ta\t/usr/b\n"
        ))
        .unwrap();
        assert_eq!(m.entries.len(), 3);
        assert_eq!(
            m.entries[1],
            Entry::File {
                path: "/usr/a".into(),
                mode: 0o644,
                size: 0,
                sha256: parse_sha(SHA).unwrap()
            }
        );
        assert_eq!(hex(&parse_sha(SHA).unwrap()), SHA);
    }

    #[test]
    fn refuses_bad_input_with_line_numbers() {
        for (body, line) in [
            ("x\t0755\t/usr\n", 2),
            ("d\t0755\t/usr\nd\t0755\t/usr\n", 3),
            ("d\t0757\t/usr\n", 2),
            ("d\t4755\t/usr\n", 2),
            ("d\t0755\tusr\n", 2),
            ("d\t0755\t/usr/../etc\n", 2),
            (&format!("f\t0644\tx\t{SHA}\t/a\n"), 2),
            ("f\t0644\t1\tabc\t/a\n", 2),
        ] {
            match parse(body) {
                Err(Error::ManifestMalformed { line: l, .. }) => assert_eq!(l, line, "{body:?}"),
                other => panic!("{body:?}: {other:?}"),
            }
        }
        assert!(Manifest::parse("nope\n", Path::new("m")).is_err());
    }
}
