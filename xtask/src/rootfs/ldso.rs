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
//! The search runs in the rootfs's namespace: paths are what the loader in the sandbox opens,
//! and a [`View`] says which host file will be there: one the plan already places (a file of
//! a wheel, wherever it lands), else the host's file at the same path (a system library,
//! which the build then places at its host path). So `$ORIGIN` expands to the directory the
//! object has *in the rootfs*, and a wheel's `$ORIGIN/../../numpy.libs` finds the vendored
//! library where the wheel put it, once, whatever the staging directory was called.
//!
//! `LD_LIBRARY_PATH` plays no part: the sandbox does not set it. `glibc-hwcaps/`
//! subdirectories are not searched: the baseline library found instead is what the loader in
//! the rootfs will find too, as no hwcaps directory is copied.

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

/// What the loader in the rootfs finds at a path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Located {
    /// A file the plan places at `rel` (rootfs path), a copy of the host file `src`.
    Planned { rel: PathBuf, src: PathBuf },
    /// Nothing planned there: the host's file at that path, whose canonical path is `real`.
    Host { real: PathBuf },
}

impl Located {
    /// The host file to read.
    pub fn source(&self) -> &Path {
        match self {
            Located::Planned { src, .. } => src,
            Located::Host { real } => real,
        }
    }

    /// Where the file sits in the rootfs (a host library lands at its canonical path).
    fn key(&self) -> Result<PathBuf> {
        match self {
            Located::Planned { rel, .. } => Ok(rel.clone()),
            Located::Host { real } => super::plan::normalize(real),
        }
    }
}

/// Which file the loader in the rootfs finds at an absolute rootfs path, if a regular one.
pub trait View {
    fn locate(&self, path: &Path) -> Option<Located>;
}

/// The host as it is: every path is the host's own (the rootfs places nothing elsewhere).
pub struct HostView;

impl View for HostView {
    fn locate(&self, path: &Path) -> Option<Located> {
        host_file(path)
    }
}

/// The host's regular file at `path` (symlinks followed), if there is one.
pub fn host_file(path: &Path) -> Option<Located> {
    let real = fs::canonicalize(path).ok()?;
    real.is_file().then_some(Located::Host { real })
}

/// An ELF file the plan places at `rel` (rootfs path), a copy of the host file `src`.
#[derive(Debug, Clone)]
pub struct Root {
    pub rel: PathBuf,
    pub src: PathBuf,
}

/// A library the roots need: the absolute rootfs path the loader finds it under, and what is
/// there.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Lib {
    pub found: PathBuf,
    pub at: Located,
}

struct Pending {
    /// The host file to read.
    src: PathBuf,
    /// What `$ORIGIN` means for it: its directory in the rootfs.
    origin: PathBuf,
    /// `DT_RPATH` directories of the objects that loaded this one.
    inherited: Vec<PathBuf>,
}

/// Every library (and interpreter) the roots need, directly or through other libraries,
/// each once.
pub fn closure(search: &SearchPath, view: &dyn View, roots: &[Root]) -> Result<BTreeSet<Lib>> {
    let mut libs = BTreeSet::new();
    let mut seen = HashSet::new();
    let mut queue = VecDeque::new();
    for root in roots {
        let rel = super::plan::normalize(&root.rel)?;
        let origin = Path::new("/").join(rel.parent().unwrap_or(Path::new("")));
        if seen.insert(rel) {
            queue.push_back(Pending {
                src: root.src.clone(),
                origin,
                inherited: vec![],
            });
        }
    }

    while let Some(obj) = queue.pop_front() {
        let (kind, deps) = elf::read(&obj.src)?;
        let mut found_libs = Vec::new();

        if let Some(interp) = &deps.interp {
            let found = PathBuf::from(interp);
            if !found.is_absolute() {
                bail!(
                    "interpreter {interp} of {} is not an absolute path",
                    obj.src.display()
                );
            }
            let at = view.locate(&found).with_context(|| {
                format!("interpreter {interp} of {} not found", obj.src.display())
            })?;
            found_libs.push((found, at));
        }

        let expand = |entries: &[String]| -> Result<Vec<PathBuf>> {
            let mut dirs = Vec::new();
            for e in entries {
                dirs.extend(expand_origin(e, &obj.origin, &obj.src)?);
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
                let p = expand_origin(name, &obj.origin, &obj.src)?
                    .with_context(|| format!("empty DT_NEEDED in {}", obj.src.display()))?;
                view.locate(&p).map(|at| (p, at))
            } else {
                dirs.iter().find_map(|d| {
                    let c = d.join(name);
                    let at = view.locate(&c)?;
                    (elf::kind(at.source()) == Some(kind)).then_some((c, at))
                })
            };
            let found = found.ok_or_else(|| {
                let list: Vec<_> = dirs.iter().map(|d| d.display().to_string()).collect();
                anyhow!(
                    "{name}, needed by {}, not found (searched {})",
                    obj.src.display(),
                    list.join(":")
                )
            })?;
            found_libs.push(found);
        }

        for (found, at) in found_libs {
            if seen.insert(at.key()?) {
                queue.push_back(Pending {
                    src: at.source().to_path_buf(),
                    origin: found.parent().map(Path::to_path_buf).unwrap_or_default(),
                    inherited: chain_rpath.clone(),
                });
            }
            libs.insert(Lib { found, at });
        }
    }
    Ok(libs)
}

/// Expand `$ORIGIN` / `${ORIGIN}` in one search-path entry of `obj`, whose directory in the
/// rootfs is `origin`. Empty entries give `None` (glibc would search the current directory,
/// which has no meaning for the rootfs).
fn expand_origin(entry: &str, origin: &Path, obj: &Path) -> Result<Option<PathBuf>> {
    if entry.is_empty() {
        return Ok(None);
    }
    let mut s = entry.to_owned();
    if s.contains("$ORIGIN") || s.contains("${ORIGIN}") {
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

    /// A root at its host path.
    fn at_host(path: &Path) -> Root {
        Root {
            rel: crate::rootfs::plan::normalize(path).unwrap(),
            src: path.to_path_buf(),
        }
    }

    fn host(real: &Path) -> Located {
        Located::Host {
            real: real.to_path_buf(),
        }
    }

    /// The rootfs as a map from rootfs paths to host files, then the host at the same path.
    struct MapView(std::collections::BTreeMap<PathBuf, PathBuf>);

    impl View for MapView {
        fn locate(&self, path: &Path) -> Option<Located> {
            let rel = crate::rootfs::plan::normalize(path).ok()?;
            match self.0.get(&rel) {
                Some(src) => Some(Located::Planned {
                    rel,
                    src: src.clone(),
                }),
                None => host_file(path),
            }
        }
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
        let libs = closure(&SearchPath::host().unwrap(), &HostView, &[at_host(py)]).unwrap();
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
            let Located::Host { real } = &lib.at else {
                panic!("{lib:?} is not a host file")
            };
            assert_eq!(&fs::canonicalize(real).unwrap(), real);
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

        let libs = closure(
            &SearchPath::new(vec![]),
            &HostView,
            &[at_host(&t.join("bin/app"))],
        )
        .unwrap();
        let want: BTreeSet<Lib> = [
            Lib {
                found: t.join("bin/../lib/libfoo.so.1"),
                at: host(&t.join("lib/libfoo.so.1.0")),
            },
            Lib {
                found: t.join("bin/../lib/private/libbar.so"),
                at: host(&t.join("lib/private/libbar.so")),
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
        let root = at_host(&t.join("bin/app"));
        let err = closure(
            &SearchPath::new(vec![]),
            &HostView,
            std::slice::from_ref(&root),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("libfoo.so, needed by") && err.contains("bin/app"),
            "{err}"
        );
        // The same directory as a system directory is found.
        let libs = closure(&SearchPath::new(vec![t.join("a")]), &HostView, &[root]).unwrap();
        assert_eq!(names(&libs), ["libfoo.so"]);
    }

    #[test]
    fn missing_library_names_the_needing_file() {
        let t = tempfile::tempdir().unwrap();
        write_elf(&t.path().join("libx.so"), &["libnope.so.7"], &[], &[]);
        let root = at_host(&t.path().join("libx.so"));
        let err = closure(&SearchPath::new(vec![t.path().into()]), &HostView, &[root])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("libnope.so.7, needed by ") && err.contains("libx.so"),
            "{err}"
        );
    }

    /// A wheel's layout, placed somewhere else in the rootfs than in the staging directory:
    /// `$ORIGIN` is the extension's directory in the rootfs, the vendored libraries are found
    /// where the plan puts them (each once, the one needed by two objects too), and a system
    /// library they need comes from the host.
    #[test]
    fn origin_is_the_directory_in_the_rootfs() {
        let t = tempfile::tempdir().unwrap();
        let t = fs::canonicalize(t.path()).unwrap();
        let stage = t.join("stage");
        write_elf(
            &stage.join("pkg/_core/_ext.so"),
            &["libblas-1a2b.so", "libsys.so.1"],
            &[],
            &["$ORIGIN/../../pkg.libs"],
        );
        write_elf(
            &stage.join("pkg/linalg/_lin.so"),
            &["libblas-1a2b.so"],
            &[],
            &["${ORIGIN}/../../pkg.libs"],
        );
        write_elf(
            &stage.join("pkg.libs/libblas-1a2b.so"),
            &["libgfortran-3c4d.so.5"],
            &[],
            &["$ORIGIN"],
        );
        write_elf(&stage.join("pkg.libs/libgfortran-3c4d.so.5"), &[], &[], &[]);
        write_elf(&t.join("sys/libsys.so.1"), &[], &[], &[]);

        let site = Path::new("opt/site");
        let mut map = std::collections::BTreeMap::new();
        for f in [
            "pkg/_core/_ext.so",
            "pkg/linalg/_lin.so",
            "pkg.libs/libblas-1a2b.so",
            "pkg.libs/libgfortran-3c4d.so.5",
        ] {
            map.insert(site.join(f), stage.join(f));
        }
        let roots: Vec<Root> = map
            .iter()
            .map(|(rel, src)| Root {
                rel: rel.clone(),
                src: src.clone(),
            })
            .collect();
        let view = MapView(map);
        let libs = closure(&SearchPath::new(vec![t.join("sys")]), &view, &roots).unwrap();
        let planned = |f: &str| Located::Planned {
            rel: site.join(f),
            src: stage.join(f),
        };
        let want: BTreeSet<Lib> = [
            Lib {
                found: "/opt/site/pkg/_core/../../pkg.libs/libblas-1a2b.so".into(),
                at: planned("pkg.libs/libblas-1a2b.so"),
            },
            Lib {
                found: "/opt/site/pkg/linalg/../../pkg.libs/libblas-1a2b.so".into(),
                at: planned("pkg.libs/libblas-1a2b.so"),
            },
            Lib {
                found: "/opt/site/pkg.libs/libgfortran-3c4d.so.5".into(),
                at: planned("pkg.libs/libgfortran-3c4d.so.5"),
            },
            Lib {
                found: t.join("sys/libsys.so.1"),
                at: host(&t.join("sys/libsys.so.1")),
            },
        ]
        .into();
        assert_eq!(libs, want);
        // The staging directory's own path never appears as a place the loader looks.
        assert!(
            !libs.iter().any(|l| l.found.starts_with(&stage)),
            "{libs:?}"
        );

        // Without the plan's files the same $ORIGIN path finds nothing on the host.
        let err = closure(&SearchPath::new(vec![]), &HostView, &roots[..1])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("libblas-1a2b.so, needed by ")
                && err.contains("/opt/site/pkg/_core/../../pkg.libs"),
            "{err}"
        );
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
        let root = at_host(&t.join("app"));
        let search = SearchPath::new(vec![t.join("a"), t.join("b")]);
        let libs = closure(&search, &HostView, &[root]).unwrap();
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
        let o = Path::new("/usr/bin");
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
            expand_origin("/opt/lib", o, obj).unwrap(),
            Some("/opt/lib".into())
        );
        assert_eq!(expand_origin("", o, obj).unwrap(), None);
        assert!(expand_origin("$LIB/x", o, obj).is_err());
        assert!(expand_origin("lib", o, obj).is_err());
    }
}
