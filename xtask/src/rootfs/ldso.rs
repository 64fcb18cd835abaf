//! The dynamic loader's search, done ahead of time: which files must be in the rootfs so that
//! every ELF file in it can be loaded. It follows what glibc's `ld.so` does on a Debian host:
//!
//! 1. the interpreter named by `PT_INTERP` is taken by its path;
//! 2. a `DT_NEEDED` name with a `/` in it is taken as a path;
//! 3. otherwise the name is looked up in `DT_RPATH` of the object and of the objects that
//!    loaded it (unless the object has `DT_RUNPATH`, which disables `DT_RPATH`), then in the
//!    object's `DT_RUNPATH`, then in the directories of `/etc/ld.so.conf` (what `ldconfig`
//!    puts in `ld.so.cache`), then in the default directories;
//! 4. a candidate whose class, byte order or machine differs from the needing object's is
//!    skipped, as the loader skips it.
//!
//! `$ORIGIN` expands to the directory the object was found in. `LD_LIBRARY_PATH` plays no part:
//! the sandbox does not set it. `glibc-hwcaps/` subdirectories are not searched: the baseline
//! library found instead is what the loader in the rootfs will find too, as no hwcaps
//! directory is copied.

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

use super::elf;
use super::glob;

/// The system part of the search: `ld.so.conf` directories, then the default ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchPath {
    dirs: Vec<PathBuf>,
}

impl SearchPath {
    /// The search path of this host.
    pub fn host() -> Result<Self> {
        Self::from_conf(Path::new("/etc/ld.so.conf"), &default_dirs())
    }

    /// `conf` (with its `include`s) followed by `defaults`; a missing `conf` adds nothing.
    pub fn from_conf(conf: &Path, defaults: &[PathBuf]) -> Result<Self> {
        let mut dirs = Vec::new();
        if conf.exists() {
            read_conf(conf, 0, &mut dirs)?;
        }
        dirs.extend(defaults.iter().cloned());
        Ok(Self::new(dirs))
    }

    /// Exactly these directories, in this order (duplicates dropped).
    pub fn new(dirs: Vec<PathBuf>) -> Self {
        let mut seen = HashSet::new();
        let dirs = dirs
            .into_iter()
            .filter(|d| seen.insert(d.clone()))
            .collect();
        Self { dirs }
    }

    #[cfg(test)]
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }
}

/// The loader's built-in directories on a multiarch Debian host.
pub fn default_dirs() -> Vec<PathBuf> {
    let triplet = format!("{}-linux-gnu", std::env::consts::ARCH);
    [
        format!("/lib/{triplet}"),
        format!("/usr/lib/{triplet}"),
        "/lib64".into(),
        "/usr/lib64".into(),
        "/lib".into(),
        "/usr/lib".into(),
    ]
    .into_iter()
    .map(PathBuf::from)
    .collect()
}

/// One `ld.so.conf` file: directory lines, `include GLOB...` lines (relative to the file's
/// directory), `hwcap` lines (ignored, as modern glibc does), `#` comments.
fn read_conf(path: &Path, depth: usize, dirs: &mut Vec<PathBuf>) -> Result<()> {
    if depth > 16 {
        bail!("{}: includes nest deeper than 16 levels", path.display());
    }
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let base = path.parent().unwrap_or(Path::new("/"));
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default().trim();
        let mut words = line.split_whitespace();
        match words.next() {
            None => {}
            Some("include") => {
                for pattern in words {
                    for file in expand_glob(&base.join(pattern))? {
                        read_conf(&file, depth + 1, dirs)?;
                    }
                }
            }
            Some("hwcap") => {}
            Some(_) => {
                let entries = line.split(|c: char| c.is_whitespace() || c == ':' || c == ',');
                dirs.extend(entries.filter(|d| d.starts_with('/')).map(PathBuf::from));
            }
        }
    }
    Ok(())
}

/// Files matching an absolute path pattern with wildcards in any component, sorted.
fn expand_glob(pattern: &Path) -> Result<Vec<PathBuf>> {
    let mut found = vec![PathBuf::from("/")];
    for comp in pattern.components().skip(1) {
        let comp = comp.as_os_str().to_string_lossy();
        let mut next = Vec::new();
        for base in &found {
            if !glob::has_wildcard(&comp) {
                next.push(base.join(&*comp));
                continue;
            }
            let Ok(rd) = fs::read_dir(base) else { continue };
            let mut names: Vec<String> = rd
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    glob::matches(&comp, n) && (comp.starts_with('.') || !n.starts_with('.'))
                })
                .collect();
            names.sort();
            next.extend(names.into_iter().map(|n| base.join(n)));
        }
        found = next;
    }
    found.retain(|p| p.is_file());
    Ok(found)
}

/// An ELF file to start from. `origin` is what `$ORIGIN` means for it in the rootfs, or `None`
/// when it sits in the rootfs somewhere other than on the host, so `$ORIGIN` cannot be honoured.
#[derive(Debug, Clone)]
pub struct Root {
    pub path: PathBuf,
    pub origin: Option<PathBuf>,
}

/// A library the roots need: the path the loader finds it under, and the real file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Lib {
    pub found: PathBuf,
    pub real: PathBuf,
}

struct Pending {
    path: PathBuf,
    origin: Option<PathBuf>,
    /// `DT_RPATH` directories of the objects that loaded this one.
    inherited: Vec<PathBuf>,
}

/// Every library (and interpreter) the roots need, directly or through other libraries.
pub fn closure(search: &SearchPath, roots: &[Root]) -> Result<BTreeSet<Lib>> {
    let mut libs = BTreeSet::new();
    let mut seen = HashSet::new();
    let mut queue = VecDeque::new();
    for root in roots {
        let real = fs::canonicalize(&root.path)
            .with_context(|| format!("resolving {}", root.path.display()))?;
        if seen.insert(real) {
            queue.push_back(Pending {
                path: root.path.clone(),
                origin: root.origin.clone(),
                inherited: vec![],
            });
        }
    }

    while let Some(obj) = queue.pop_front() {
        let (kind, deps) = elf::read(&obj.path)?;
        let mut found_libs = Vec::new();

        if let Some(interp) = &deps.interp {
            let found = PathBuf::from(interp);
            if !found.is_absolute() {
                bail!(
                    "interpreter {interp} of {} is not an absolute path",
                    obj.path.display()
                );
            }
            found_libs.push(found);
        }

        let expand = |entries: &[String]| -> Result<Vec<PathBuf>> {
            let mut dirs = Vec::new();
            for e in entries {
                dirs.extend(expand_origin(e, obj.origin.as_deref(), &obj.path)?);
            }
            Ok(dirs)
        };
        let own_rpath = if deps.runpath.is_empty() {
            expand(&deps.rpath)?
        } else {
            vec![]
        };
        let chain_rpath: Vec<PathBuf> = own_rpath.iter().chain(&obj.inherited).cloned().collect();
        let dirs: Vec<PathBuf> = chain_rpath
            .iter()
            .cloned()
            .chain(expand(&deps.runpath)?)
            .chain(search.dirs.iter().cloned())
            .collect();

        for name in &deps.needed {
            let found = if name.contains('/') {
                let p = expand_origin(name, obj.origin.as_deref(), &obj.path)?
                    .with_context(|| format!("empty DT_NEEDED in {}", obj.path.display()))?;
                p.exists().then_some(p)
            } else {
                dirs.iter()
                    .map(|d| d.join(name))
                    .find(|c| elf::kind(c) == Some(kind))
            };
            let found = found.ok_or_else(|| {
                let list: Vec<_> = dirs.iter().map(|d| d.display().to_string()).collect();
                anyhow!(
                    "{name}, needed by {}, not found (searched {})",
                    obj.path.display(),
                    list.join(":")
                )
            })?;
            found_libs.push(found);
        }

        for found in found_libs {
            let real = fs::canonicalize(&found).with_context(|| {
                format!(
                    "resolving {}, needed by {}",
                    found.display(),
                    obj.path.display()
                )
            })?;
            if seen.insert(real.clone()) {
                queue.push_back(Pending {
                    path: real.clone(),
                    origin: found.parent().map(Path::to_path_buf),
                    inherited: chain_rpath.clone(),
                });
            }
            libs.insert(Lib { found, real });
        }
    }
    Ok(libs)
}

/// Expand `$ORIGIN` / `${ORIGIN}` in one search-path entry of `obj`. Empty entries give `None`
/// (glibc would search the current directory, which has no meaning for the rootfs).
fn expand_origin(entry: &str, origin: Option<&Path>, obj: &Path) -> Result<Option<PathBuf>> {
    if entry.is_empty() {
        return Ok(None);
    }
    let mut s = entry.to_owned();
    if s.contains("$ORIGIN") || s.contains("${ORIGIN}") {
        let origin = origin.with_context(|| {
            format!(
                "{} uses $ORIGIN ({entry}) but is not placed at its host path in the rootfs",
                obj.display()
            )
        })?;
        let o = origin
            .to_str()
            .with_context(|| format!("{} is not UTF-8", origin.display()))?;
        s = s.replace("${ORIGIN}", o).replace("$ORIGIN", o);
    }
    if s.contains('$') {
        bail!(
            "{}: unsupported dynamic string token in {entry:?}",
            obj.display()
        );
    }
    if !s.starts_with('/') {
        bail!(
            "{}: relative search path {entry:?} is not supported",
            obj.display()
        );
    }
    Ok(Some(PathBuf::from(s)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rootfs::elf::{fake, Deps};
    use std::os::unix::fs::symlink;

    fn write_elf(path: &Path, needed: &[&str], rpath: &[&str], runpath: &[&str]) {
        let deps = Deps {
            interp: None,
            needed: needed.iter().map(|s| s.to_string()).collect(),
            rpath: rpath.iter().map(|s| s.to_string()).collect(),
            runpath: runpath.iter().map(|s| s.to_string()).collect(),
        };
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, fake::build(&deps)).unwrap();
    }

    fn names(libs: &BTreeSet<Lib>) -> Vec<String> {
        libs.iter()
            .map(|l| l.found.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn host_python_closure() {
        let py = Path::new("/usr/bin/python3.11");
        if !py.exists() {
            eprintln!("skipped: {} is not installed", py.display());
            return;
        }
        let libs = closure(
            &SearchPath::host().unwrap(),
            &[Root {
                path: py.into(),
                origin: Some("/usr/bin".into()),
            }],
        )
        .unwrap();
        let names = names(&libs);
        for want in [
            "libc.so.6",
            "libz.so.1",
            "libexpat.so.1",
            "libm.so.6",
            "ld-linux-x86-64.so.2",
        ] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing from {names:?}"
            );
        }
        // PT_INTERP by its path; libc also needs it by name, found in the search path.
        assert!(
            libs.iter()
                .any(|l| l.found == Path::new("/lib64/ld-linux-x86-64.so.2")),
            "{libs:?}"
        );
        for lib in &libs {
            assert_eq!(fs::canonicalize(&lib.real).unwrap(), lib.real);
        }
    }

    #[test]
    fn origin_runpath_rpath_and_symlinked_names() {
        let t = tempfile::tempdir().unwrap();
        let t = fs::canonicalize(t.path()).unwrap();
        write_elf(
            &t.join("bin/app"),
            &["libfoo.so.1"],
            &[],
            &["$ORIGIN/../lib"],
        );
        write_elf(
            &t.join("lib/libfoo.so.1.0"),
            &["libbar.so"],
            &["${ORIGIN}/private"],
            &[],
        );
        symlink("libfoo.so.1.0", t.join("lib/libfoo.so.1")).unwrap();
        write_elf(&t.join("lib/private/libbar.so"), &[], &[], &[]);

        let root = Root {
            path: t.join("bin/app"),
            origin: Some(t.join("bin")),
        };
        let libs = closure(&SearchPath::new(vec![]), &[root]).unwrap();
        let want: BTreeSet<Lib> = [
            Lib {
                found: t.join("bin/../lib/libfoo.so.1"),
                real: t.join("lib/libfoo.so.1.0"),
            },
            Lib {
                found: t.join("bin/../lib/private/libbar.so"),
                real: t.join("lib/private/libbar.so"),
            },
        ]
        .into();
        assert_eq!(libs, want);
    }

    #[test]
    fn runpath_disables_rpath() {
        let t = tempfile::tempdir().unwrap();
        let t = t.path();
        write_elf(
            &t.join("bin/app"),
            &["libfoo.so"],
            &[t.join("a").to_str().unwrap()],
            &["/nonexistent"],
        );
        write_elf(&t.join("a/libfoo.so"), &[], &[], &[]);
        let root = Root {
            path: t.join("bin/app"),
            origin: None,
        };
        let err = closure(&SearchPath::new(vec![]), std::slice::from_ref(&root))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("libfoo.so, needed by") && err.contains("bin/app"),
            "{err}"
        );
        // The same directory as a system directory is found.
        let libs = closure(&SearchPath::new(vec![t.join("a")]), &[root]).unwrap();
        assert_eq!(names(&libs), ["libfoo.so"]);
    }

    #[test]
    fn missing_library_names_the_needing_file() {
        let t = tempfile::tempdir().unwrap();
        write_elf(&t.path().join("libx.so"), &["libnope.so.7"], &[], &[]);
        let root = Root {
            path: t.path().join("libx.so"),
            origin: None,
        };
        let err = closure(&SearchPath::new(vec![t.path().into()]), &[root])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("libnope.so.7, needed by ") && err.contains("libx.so"),
            "{err}"
        );
    }

    #[test]
    fn origin_without_host_placement_is_refused() {
        let t = tempfile::tempdir().unwrap();
        write_elf(&t.path().join("app"), &["libfoo.so"], &["$ORIGIN"], &[]);
        let root = Root {
            path: t.path().join("app"),
            origin: None,
        };
        let err = format!(
            "{:#}",
            closure(&SearchPath::new(vec![]), &[root]).unwrap_err()
        );
        assert!(err.contains("uses $ORIGIN"), "{err}");
    }

    #[test]
    fn wrong_class_candidates_are_skipped() {
        let t = tempfile::tempdir().unwrap();
        let t = t.path();
        write_elf(&t.join("app"), &["libfoo.so"], &[], &[]);
        write_elf(&t.join("a/libfoo.so"), &[], &[], &[]);
        let mut bytes = fs::read(t.join("a/libfoo.so")).unwrap();
        bytes[4] = 1; // ELFCLASS32
        fs::write(t.join("a/libfoo.so"), bytes).unwrap();
        write_elf(&t.join("b/libfoo.so"), &[], &[], &[]);
        let root = Root {
            path: t.join("app"),
            origin: None,
        };
        let libs = closure(&SearchPath::new(vec![t.join("a"), t.join("b")]), &[root]).unwrap();
        assert_eq!(libs.iter().next().unwrap().found, t.join("b/libfoo.so"));
    }

    #[test]
    fn ld_so_conf_includes_globs_and_comments() {
        let t = tempfile::tempdir().unwrap();
        let t = t.path();
        fs::create_dir_all(t.join("conf.d")).unwrap();
        fs::write(
            t.join("ld.so.conf"),
            "# top\n/opt/first\ninclude conf.d/*.conf\nhwcap 0 nosegneg\n",
        )
        .unwrap();
        fs::write(t.join("conf.d/b.conf"), "/opt/b1 /opt/b2 # two on a line\n").unwrap();
        fs::write(t.join("conf.d/a.conf"), "/opt/a\n/usr/lib\n").unwrap();
        fs::write(t.join("conf.d/ignored.txt"), "/opt/never\n").unwrap();
        let sp = SearchPath::from_conf(&t.join("ld.so.conf"), &["/lib".into(), "/usr/lib".into()])
            .unwrap();
        let want: Vec<PathBuf> = [
            "/opt/first",
            "/opt/a",
            "/usr/lib",
            "/opt/b1",
            "/opt/b2",
            "/lib",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(sp.dirs(), want);
        let none = SearchPath::from_conf(&t.join("missing.conf"), &["/lib".into()]).unwrap();
        assert_eq!(none.dirs(), [PathBuf::from("/lib")]);
    }

    #[test]
    fn origin_expansion() {
        let o = Some(Path::new("/usr/bin"));
        let obj = Path::new("/usr/bin/x");
        assert_eq!(
            expand_origin("$ORIGIN/../lib", o, obj).unwrap(),
            Some("/usr/bin/../lib".into())
        );
        assert_eq!(
            expand_origin("${ORIGIN}", o, obj).unwrap(),
            Some("/usr/bin".into())
        );
        assert_eq!(
            expand_origin("/opt/lib", None, obj).unwrap(),
            Some("/opt/lib".into())
        );
        assert_eq!(expand_origin("", o, obj).unwrap(), None);
        assert!(expand_origin("$LIB/x", o, obj).is_err());
        assert!(expand_origin("lib", o, obj).is_err());
    }
}
