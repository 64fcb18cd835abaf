//! `<rootfs>/.manifest`: what the built tree holds, read back from the tree itself. codebox
//! parses it, so the format is fixed:
//!
//! ```text
//! # codebox rootfs manifest v1
//! d\t0555\t/etc
//! f\t0444\t<size>\t<sha256 hex>\t/etc/passwd
//! l\tusr/lib\t/lib
//! ```
//!
//! One line per entry except the root and the manifest itself, sorted by path bytes, fields
//! separated by one tab. Walking the tree also checks the permission rules of a sealed tree
//! (`seal.rs`): directories 0555, files 0444 or 0555, nothing else (no write bit, no setuid,
//! setgid or sticky bit, no devices, fifos or sockets).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::plan::{Entry, Plan};
use super::state::{hex, write_atomic, Sha, State};
use super::sync::MANIFEST;

pub const HEADER: &str = "# codebox rootfs manifest v1";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Dir { mode: u32 },
    File { mode: u32, size: u64, sha: Sha },
    Symlink { target: String },
}

/// One manifest line: an absolute path in the rootfs and what is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub path: String,
    pub kind: Kind,
}

#[derive(Debug, Default)]
pub struct Totals {
    pub dirs: usize,
    pub files: usize,
    pub symlinks: usize,
    pub bytes: u64,
}

/// Walk `out`, check permissions and that the tree is exactly the plan, and list it.
pub fn scan(out: &Path, plan: &Plan, state: &mut State) -> Result<Vec<Line>> {
    check_mode(
        out,
        &fs::symlink_metadata(out).with_context(|| format!("reading {}", out.display()))?,
    )?;
    let mut lines = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(sub) = stack.pop() {
        let dir = out.join(&sub);
        for e in
            fs::read_dir(&dir).with_context(|| format!("reading directory {}", dir.display()))?
        {
            let e = e.with_context(|| format!("reading directory {}", dir.display()))?;
            let rel = sub.join(e.file_name());
            if rel == Path::new(MANIFEST) {
                continue;
            }
            let path = e.path();
            let name = rel
                .to_str()
                .with_context(|| format!("{} is not UTF-8", path.display()))?;
            if name.contains(['\t', '\n']) {
                bail!(
                    "refusing {}: the path contains a tab or newline",
                    path.display()
                );
            }
            let meta = fs::symlink_metadata(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let ft = meta.file_type();
            let kind = if ft.is_symlink() {
                let target = fs::read_link(&path)
                    .with_context(|| format!("reading link {}", path.display()))?;
                let target = target
                    .to_str()
                    .with_context(|| format!("link {} is not UTF-8", path.display()))?;
                if target.contains(['\t', '\n']) {
                    bail!(
                        "refusing link {}: its target contains a tab or newline",
                        path.display()
                    );
                }
                Kind::Symlink {
                    target: target.to_owned(),
                }
            } else if ft.is_dir() {
                check_mode(&path, &meta)?;
                stack.push(rel.clone());
                Kind::Dir { mode: mode(&meta) }
            } else if ft.is_file() {
                check_mode(&path, &meta)?;
                Kind::File {
                    mode: mode(&meta),
                    size: meta.len(),
                    sha: state.sha(out, &rel)?,
                }
            } else {
                bail!(
                    "{} is neither a file, a directory nor a symlink",
                    path.display()
                );
            };
            let planned = match plan.get(&rel) {
                Some(Entry::Dir) => matches!(kind, Kind::Dir { .. }),
                Some(Entry::File { .. } | Entry::Generated) => matches!(kind, Kind::File { .. }),
                Some(Entry::Symlink { target }) => {
                    matches!(&kind, Kind::Symlink { target: t } if Path::new(t) == target)
                }
                None => false,
            };
            if !planned {
                bail!(
                    "{} is in the rootfs but not planned as {kind:?}",
                    path.display()
                );
            }
            lines.push(Line {
                path: format!("/{name}"),
                kind,
            });
        }
    }
    if lines.len() != plan.entries().len() {
        let have: std::collections::HashSet<&str> = lines.iter().map(|l| &l.path[1..]).collect();
        let missing: Vec<_> = plan
            .entries()
            .keys()
            .filter(|k| !have.contains(k.to_str().unwrap_or("")))
            .collect();
        bail!("planned but missing from {}: {missing:?}", out.display());
    }
    lines.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
    Ok(lines)
}

fn mode(meta: &fs::Metadata) -> u32 {
    meta.permissions().mode() & 0o7777
}

fn check_mode(path: &Path, meta: &fs::Metadata) -> Result<()> {
    let m = mode(meta);
    let ok = if meta.is_dir() {
        m == 0o555
    } else {
        m == 0o444 || m == 0o555
    };
    if !ok {
        bail!(
            "{} has mode {m:04o}: a sealed tree's directories are 0555, its files 0444 or 0555",
            path.display()
        );
    }
    Ok(())
}

pub fn totals(lines: &[Line]) -> Totals {
    let mut t = Totals::default();
    for l in lines {
        match l.kind {
            Kind::Dir { .. } => t.dirs += 1,
            Kind::File { size, .. } => {
                t.files += 1;
                t.bytes += size;
            }
            Kind::Symlink { .. } => t.symlinks += 1,
        }
    }
    t
}

pub fn render(lines: &[Line]) -> String {
    let mut s = String::with_capacity(lines.len() * 100);
    s.push_str(HEADER);
    s.push('\n');
    for l in lines {
        match &l.kind {
            Kind::Dir { mode } => s.push_str(&format!("d\t{mode:04o}\t{}\n", l.path)),
            Kind::File { mode, size, sha } => s.push_str(&format!(
                "f\t{mode:04o}\t{size}\t{}\t{}\n",
                hex(sha),
                l.path
            )),
            Kind::Symlink { target } => s.push_str(&format!("l\t{target}\t{}\n", l.path)),
        }
    }
    s
}

/// Write the manifest atomically unless it already has exactly this text; true if written.
pub fn write(out: &Path, text: &str) -> Result<bool> {
    let path = out.join(MANIFEST);
    if fs::read(&path).is_ok_and(|old| old == text.as_bytes()) {
        return Ok(false);
    }
    super::seal::with_open_dir(out, || {
        write_atomic(&path, text.as_bytes())?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o444))
            .with_context(|| format!("chmod {}", path.display()))
    })?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn format_and_byte_order() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        let out = t.path().join("out");
        fs::create_dir(&src).unwrap();
        fs::write(src.join("f"), "abc").unwrap();
        let mut plan = Plan::default();
        plan.file("a/b", &src.join("f")).unwrap();
        plan.dir("a-b").unwrap();
        plan.symlink("lnk", "a/b").unwrap();
        let mut state = State::default();
        super::super::sync::sync(&plan, &out, &mut state).unwrap();
        super::super::seal::seal(&out, &plan).unwrap();
        let lines = scan(&out, &plan, &mut state).unwrap();
        let text = render(&lines);
        // '-' (0x2d) sorts before '/' (0x2f): byte order, not path-component order.
        assert_eq!(
            text,
            "# codebox rootfs manifest v1\n\
             d\t0555\t/a\n\
             d\t0555\t/a-b\n\
             f\t0444\t3\tba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\t/a/b\n\
             l\ta/b\t/lnk\n"
        );
        assert!(write(&out, &text).unwrap());
        assert!(!write(&out, &text).unwrap());
        assert_eq!(scan(&out, &plan, &mut state).unwrap(), lines); // the manifest is not listed
        let t = totals(&lines);
        assert_eq!((t.dirs, t.files, t.symlinks, t.bytes), (2, 1, 1, 3));
    }

    #[test]
    fn bad_modes_and_strays_fail() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        fs::create_dir(&out).unwrap();
        fs::write(out.join("f"), "").unwrap();
        let mut plan = Plan::default();
        plan.generated("f").unwrap();
        let scan_err = || {
            scan(&out, &plan, &mut State::default())
                .unwrap_err()
                .to_string()
        };
        // An unsealed root, then files with a write bit.
        fs::set_permissions(&out, fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(out.join("f"), fs::Permissions::from_mode(0o444)).unwrap();
        assert!(scan_err().contains("has mode 0755"), "{}", scan_err());
        fs::set_permissions(&out, fs::Permissions::from_mode(0o555)).unwrap();
        for bad in [0o664, 0o644, 0o4555] {
            fs::set_permissions(out.join("f"), fs::Permissions::from_mode(bad)).unwrap();
            assert!(
                scan_err().contains(&format!("has mode {bad:04o}")),
                "{}",
                scan_err()
            );
        }
        fs::set_permissions(out.join("f"), fs::Permissions::from_mode(0o444)).unwrap();
        scan(&out, &plan, &mut State::default()).unwrap();
        super::super::seal::open_dir(&out).unwrap();
        symlink("f", out.join("stray")).unwrap();
        fs::set_permissions(&out, fs::Permissions::from_mode(0o555)).unwrap();
        assert!(scan_err().contains("not planned"), "{}", scan_err());
        super::super::seal::remove_tree(&out).unwrap();
    }
}
