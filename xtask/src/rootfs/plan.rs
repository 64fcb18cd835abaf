//! The plan: every path of the rootfs and what it should be, decided before anything is
//! written. Paths are relative to the rootfs root (`usr/bin/python3.11`); a path planned under
//! a planned symlink is moved to where the link points (`lib/x` lands at `usr/lib/x`), as it
//! would be on a real filesystem.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Dir,
    /// A copy of `src` (a host file) with `mode`.
    File {
        src: PathBuf,
        mode: u32,
    },
    Symlink {
        target: PathBuf,
    },
    /// A regular file written into the rootfs by a later step (the `.pyc` files).
    Generated,
}

#[derive(Debug, Default)]
pub struct Plan {
    entries: BTreeMap<PathBuf, Entry>,
}

/// 0755 if the source had any exec bit, else 0644.
pub fn file_mode(meta: &fs::Metadata) -> u32 {
    if meta.mode() & 0o111 != 0 {
        0o755
    } else {
        0o644
    }
}

impl Plan {
    pub fn entries(&self) -> &BTreeMap<PathBuf, Entry> {
        &self.entries
    }

    pub fn get(&self, rel: &Path) -> Option<&Entry> {
        self.entries.get(rel)
    }

    pub fn dir(&mut self, rel: impl AsRef<Path>) -> Result<PathBuf> {
        self.insert(rel.as_ref(), Entry::Dir)
    }

    /// A copy of the host file `src` at `rel`; returns where it landed.
    pub fn file(&mut self, rel: impl AsRef<Path>, src: &Path) -> Result<PathBuf> {
        let meta = fs::metadata(src).with_context(|| format!("reading {}", src.display()))?;
        if !meta.is_file() {
            bail!("{} is not a regular file", src.display());
        }
        self.insert(
            rel.as_ref(),
            Entry::File {
                src: src.to_path_buf(),
                mode: file_mode(&meta),
            },
        )
    }

    /// A host file at its own (canonical) path.
    pub fn host_file(&mut self, src: &Path) -> Result<PathBuf> {
        let real = fs::canonicalize(src).with_context(|| format!("resolving {}", src.display()))?;
        self.file(&real, &real)
    }

    pub fn symlink(
        &mut self,
        rel: impl AsRef<Path>,
        target: impl Into<PathBuf>,
    ) -> Result<PathBuf> {
        self.insert(
            rel.as_ref(),
            Entry::Symlink {
                target: target.into(),
            },
        )
    }

    pub fn generated(&mut self, rel: impl AsRef<Path>) -> Result<PathBuf> {
        self.insert(rel.as_ref(), Entry::Generated)
    }

    /// Copy the tree `src` to `dest`. `include(rel, is_dir)` decides per entry (`rel` is
    /// relative to `src`, `/`-separated). Symlinks are kept as they are when `keep_symlinks`
    /// (an absolute one is an error: it would point outside the rootfs's copy), else skipped,
    /// as are sockets, fifos and devices.
    pub fn tree(
        &mut self,
        src: &Path,
        dest: &Path,
        include: &dyn Fn(&str, bool) -> bool,
        keep_symlinks: bool,
    ) -> Result<()> {
        self.dir(dest)?;
        let mut stack = vec![PathBuf::new()];
        while let Some(sub) = stack.pop() {
            let dir = src.join(&sub);
            let rd = fs::read_dir(&dir)
                .with_context(|| format!("reading directory {}", dir.display()))?;
            let mut names = Vec::new();
            for e in rd {
                names.push(
                    e.with_context(|| format!("reading directory {}", dir.display()))?
                        .file_name(),
                );
            }
            names.sort();
            for name in names {
                let rel = sub.join(&name);
                let path = src.join(&rel);
                let rel_str = rel
                    .to_str()
                    .with_context(|| format!("{} is not UTF-8", path.display()))?;
                let ft = fs::symlink_metadata(&path)
                    .with_context(|| format!("reading {}", path.display()))?
                    .file_type();
                if !include(rel_str, ft.is_dir()) {
                    continue;
                }
                if ft.is_dir() {
                    self.dir(dest.join(&rel))?;
                    stack.push(rel);
                } else if ft.is_file() {
                    self.file(dest.join(&rel), &path)?;
                } else if ft.is_symlink() && keep_symlinks {
                    let target = fs::read_link(&path)
                        .with_context(|| format!("reading link {}", path.display()))?;
                    if target.is_absolute() {
                        bail!(
                            "{} links to {} outside its tree: exclude it in rootfs/recipe.toml",
                            path.display(),
                            target.display()
                        );
                    }
                    self.symlink(dest.join(&rel), target)?;
                }
            }
        }
        Ok(())
    }

    fn insert(&mut self, rel: &Path, entry: Entry) -> Result<PathBuf> {
        let rel = self.resolve_parents(rel)?;
        if rel.as_os_str().is_empty() {
            bail!("cannot plan the rootfs root itself as {entry:?}");
        }
        for c in rel.components() {
            let s = c
                .as_os_str()
                .to_str()
                .with_context(|| format!("{} is not UTF-8", rel.display()))?;
            if s.contains(['\t', '\n']) {
                bail!(
                    "refusing path {s:?} in {}: it contains a tab or newline",
                    rel.display()
                );
            }
        }
        let mut parent = PathBuf::new();
        for c in rel.parent().into_iter().flat_map(Path::components) {
            parent.push(c);
            match self.entries.entry(parent.clone()).or_insert(Entry::Dir) {
                Entry::Dir => {}
                other => bail!(
                    "{} needs {} as a directory, but it is planned as {other:?}",
                    rel.display(),
                    parent.display()
                ),
            }
        }
        match self.entries.get(&rel) {
            None => {
                self.entries.insert(rel.clone(), entry);
            }
            Some(old) if *old == entry => {}
            Some(old) => bail!(
                "{} planned twice: as {old:?} and as {entry:?}",
                rel.display()
            ),
        }
        Ok(rel)
    }

    /// Where `rel` lands: lexically normalised, with planned symlinks among its parents followed.
    pub fn resolve(&self, rel: &Path) -> Result<PathBuf> {
        self.resolve_parents(rel)
    }

    fn resolve_parents(&self, rel: &Path) -> Result<PathBuf> {
        let mut path = normalize(rel)?;
        'restart: for _ in 0..40 {
            let comps: Vec<Component> = path.components().collect();
            let mut prefix = PathBuf::new();
            for (i, c) in comps.iter().enumerate().take(comps.len().saturating_sub(1)) {
                prefix.push(c);
                if let Some(Entry::Symlink { target }) = self.entries.get(&prefix) {
                    let base = prefix.parent().unwrap_or(Path::new("")).join(target);
                    let rest: PathBuf = comps[i + 1..].iter().collect();
                    path = normalize(&base.join(rest))?;
                    continue 'restart;
                }
            }
            return Ok(path);
        }
        bail!("too many levels of symbolic links in {}", rel.display())
    }

    /// Every planned symlink must lead to a planned entry: nothing in the rootfs dangles.
    pub fn check_links(&self) -> Result<()> {
        for (rel, entry) in &self.entries {
            let Entry::Symlink { target } = entry else {
                continue;
            };
            let mut at = rel.clone();
            let mut target = target.clone();
            for hop in 0.. {
                if hop == 40 {
                    bail!("/{}: too many levels of symbolic links", rel.display());
                }
                let next =
                    self.resolve_parents(&at.parent().unwrap_or(Path::new("")).join(&target))?;
                match self.entries.get(&next) {
                    Some(Entry::Symlink { target: t }) => (at, target) = (next, t.clone()),
                    Some(_) => break,
                    None => bail!(
                        "/{} -> {} dangles: nothing is planned at /{}",
                        rel.display(),
                        target.display(),
                        next.display()
                    ),
                }
            }
        }
        Ok(())
    }
}

/// Lexically normalise a path into a relative one: drop `/` and `.`, apply `..`.
pub fn normalize(path: &Path) -> Result<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                if !out.pop() {
                    bail!("{} leaves the rootfs", path.display());
                }
            }
            Component::Prefix(_) => bail!("unexpected path prefix in {}", path.display()),
        }
    }
    Ok(out)
}

/// The relative symlink target that leads from the directory `from_dir` to `to` (both
/// normalised rootfs paths).
pub fn relative_to(from_dir: &Path, to: &Path) -> PathBuf {
    let from: Vec<_> = from_dir.components().collect();
    let to_c: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to_c).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    out.extend(&to_c[common..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_are_implied_and_conflicts_refused() {
        let mut p = Plan::default();
        p.generated("usr/lib/a/b.pyc").unwrap();
        assert_eq!(p.get(Path::new("usr")), Some(&Entry::Dir));
        assert_eq!(p.get(Path::new("usr/lib/a")), Some(&Entry::Dir));
        p.generated("usr/lib/a/b.pyc").unwrap(); // the same again is fine
        assert!(p.symlink("usr/lib/a/b.pyc", "x").is_err());
        assert!(p.dir("usr/lib/a/b.pyc/c").is_err());
        assert!(p.dir("../etc").is_err());
        let err = p.dir("etc/bad\tname").unwrap_err().to_string();
        assert!(err.contains("tab or newline"), "{err}");
        assert!(p.dir("etc/bad\nname").is_err());
    }

    #[test]
    fn paths_under_planned_symlinks_move_to_the_target() {
        let mut p = Plan::default();
        p.symlink("lib", "usr/lib").unwrap();
        p.symlink("lib64", "usr/lib64").unwrap();
        let at = p.generated("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        assert_eq!(at, Path::new("usr/lib/x86_64-linux-gnu/libc.so.6"));
        p.symlink("lib64/ld.so", relative_to(Path::new("usr/lib64"), &at))
            .unwrap();
        assert_eq!(
            p.get(Path::new("usr/lib64/ld.so")),
            Some(&Entry::Symlink {
                target: "../lib/x86_64-linux-gnu/libc.so.6".into()
            })
        );
        p.check_links().unwrap();
        p.symlink("usr/bin/python3", "python3.11").unwrap();
        let err = p.check_links().unwrap_err().to_string();
        assert!(
            err.contains("/usr/bin/python3 -> python3.11 dangles"),
            "{err}"
        );
    }

    #[test]
    fn relative_paths() {
        let r = |a: &str, b: &str| relative_to(Path::new(a), Path::new(b));
        assert_eq!(r("usr/bin", "usr/bin/python3.11"), Path::new("python3.11"));
        assert_eq!(
            r("usr/lib64", "usr/lib/x/ld.so"),
            Path::new("../lib/x/ld.so")
        );
        assert_eq!(r("", "usr/lib"), Path::new("usr/lib"));
    }

    #[test]
    fn trees_filter_and_refuse_absolute_links() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path();
        fs::create_dir_all(src.join("pkg/__pycache__")).unwrap();
        fs::write(src.join("pkg/a.py"), "").unwrap();
        fs::write(src.join("pkg/__pycache__/a.pyc"), "").unwrap();
        std::os::unix::fs::symlink("a.py", src.join("pkg/b.py")).unwrap();
        let mut p = Plan::default();
        let include = |rel: &str, _dir: bool| !rel.ends_with("__pycache__");
        p.tree(src, Path::new("opt/x"), &include, true).unwrap();
        let keys: Vec<_> = p.entries().keys().map(|k| k.to_str().unwrap()).collect();
        assert_eq!(
            keys,
            [
                "opt",
                "opt/x",
                "opt/x/pkg",
                "opt/x/pkg/a.py",
                "opt/x/pkg/b.py"
            ]
        );
        let mut q = Plan::default();
        q.tree(src, Path::new("opt/x"), &include, false).unwrap();
        assert_eq!(q.entries().len(), 4);
        std::os::unix::fs::symlink("/etc/passwd", src.join("pkg/c.py")).unwrap();
        let err = Plan::default()
            .tree(src, Path::new("opt/x"), &include, true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("outside its tree"), "{err}");
    }
}
