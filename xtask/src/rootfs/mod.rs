//! `cargo xtask rootfs`: build the minimal read-only root filesystem the sandboxes run in.
//!
//! # Layout
//! - [`recipe`]: `rootfs/recipe.toml`, what goes in, as data;
//! - [`python`], [`deno`]: where the interpreters come from, and the `.pyc` step;
//! - [`wheels`], [`deno_cache`]: the package sets (binary wheels; npm/jsr packages in a Deno
//!   cache) and the installer's pip, staged in the build directory;
//! - [`elf`], [`ldso`]: the shared libraries they need, found as the dynamic loader would;
//! - [`plan`]: every rootfs path and what it should be, decided before writing anything;
//! - [`sync`]: make the output match the plan, copying only what changed;
//! - [`state`]: hash and `.pyc` caches kept between runs, so a no-op rebuild reads little;
//! - [`seal`]: no write bit anywhere in the built tree (codebox checks a sealed tree in
//!   O(1) per run), directories opened only while written;
//! - [`manifest`]: read the tree back, check permissions, write `.manifest`;
//! - [`glob`]: `*`/`?` wildcards for the recipe and `ld.so.conf`;
//! - [`native`]: codebox's own C programs (`[[native]]`), compiled with the host's compiler.

mod deno;
mod deno_cache;
mod elf;
mod glob;
mod ldso;
pub(crate) mod manifest;
mod native;
pub(crate) mod plan;
mod python;
mod recipe;
pub mod seal;
pub(crate) mod state;
pub(crate) mod sync;
pub mod wheels;

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use plan::{relative_to, Entry, Plan};
use recipe::Recipe;
use state::State;

const HELP: &str = "\
cargo xtask rootfs [--out DIR] [--slim]

Build codebox's minimal root filesystem from rootfs/recipe.toml: Debian's CPython
(/usr/bin/python3) with its standard library byte-compiled, Deno, the package sets
([python] packages from binary wheels, [deno] packages in a Deno cache), pip for the
package installer, the shared libraries all of them load, a minimal /etc, the codebox
runtime files (src/runtime; its C programs compiled with the host's C compiler, `cc` or
$CC) and empty mount points, listed with modes, sizes and SHA-256 in DIR/.manifest. The
tree is sealed: no write bit anywhere (directories 0555, files 0444 or 0555), so codebox
checks it in O(1) per run; remove it as a user other than root with `chmod -R u+w DIR &&
rm -rf DIR`. A rebuild copies only what changed and removes what the recipe no longer has.

Options:
  --out DIR    where to build (default: $CODEBOX_ROOTFS, else target/rootfs)
  --slim       leave the package sets out (numpy, pandas, ... and npm/jsr packages)
  -h, --help   print this help

Environment:
  CODEBOX_ROOTFS   the default output directory
  DENO             use this deno binary instead of installing the `deno` wheel

Needs Debian's python3 (`apt-get install python3`) and a python3 with pip on PATH to
fetch wheels (Deno's too, unless DENO is set); pip's own configuration (index, proxy)
applies. target/rootfs-build keeps the pip installs, the Deno cache and the build state
between runs, each reused while its part of the recipe is unchanged.
";

#[derive(Debug)]
struct Options {
    out: Option<PathBuf>,
    slim: bool,
    help: bool,
}

impl Options {
    fn parse(args: &[OsString]) -> Result<Self> {
        let mut opts = Options {
            out: None,
            slim: false,
            help: false,
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let s = arg.to_string_lossy();
            if s == "-h" || s == "--help" {
                opts.help = true;
            } else if s == "--slim" {
                opts.slim = true;
            } else if s == "--out" {
                opts.out = Some(args.next().context("--out needs a directory")?.into());
            } else if let Some(dir) = s.strip_prefix("--out=") {
                opts.out = Some(dir.into());
            } else {
                bail!("unexpected argument {s:?}; see `cargo xtask rootfs --help`");
            }
        }
        Ok(opts)
    }
}

/// A file the dynamic loader opens to start a program on this host: the path it looks
/// for (`found`, e.g. `/lib/x86_64-linux-gnu/libc.so.6`) and the host file there
/// (`real`, symlinks resolved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLibrary {
    pub found: PathBuf,
    pub real: PathBuf,
}

/// The interpreter and every shared library `binary` needs on this host, directly or
/// through another library, found as the loader finds them (the rootfs's own search, run
/// over the host as it is).
pub fn host_libraries(binary: &Path) -> Result<Vec<HostLibrary>> {
    let root = ldso::Root {
        rel: PathBuf::from("/").join(binary.file_name().context("the binary has no name")?),
        src: binary.to_path_buf(),
    };
    let libs = ldso::closure(&ldso::SearchPath::host()?, &ldso::HostView, &[root])?;
    Ok(libs
        .into_iter()
        .map(|l| HostLibrary {
            real: l.at.source().to_path_buf(),
            found: l.found,
        })
        .collect())
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits inside the workspace")
        .to_path_buf()
}

pub fn run(args: &[OsString]) -> Result<()> {
    let opts = Options::parse(args)?;
    if opts.help {
        print!("{HELP}");
        return Ok(());
    }
    let start = Instant::now();
    let root = workspace_root();
    let out = opts
        .out
        .or_else(|| std::env::var_os("CODEBOX_ROOTFS").map(PathBuf::from))
        .unwrap_or_else(|| root.join("target/rootfs"));
    let build_dir = root.join("target/rootfs-build");
    fs::create_dir_all(&build_dir).with_context(|| format!("creating {}", build_dir.display()))?;
    let _lock = lock(&build_dir)?;

    let mut recipe = Recipe::load(&root.join("rootfs/recipe.toml"))?;
    if opts.slim {
        recipe.slim();
    }
    let py = python::Python::locate(&recipe.python.interpreter)?;
    let deno = deno::locate(&recipe.deno, &build_dir)?;
    let target = wheels::Target::for_rootfs(&py.version)?;
    let installer = wheels::stage(
        &build_dir,
        "python-installer",
        std::slice::from_ref(&recipe.python.installer),
        &target,
        &[],
    )?;
    let packages = wheels::stage(
        &build_dir,
        "python-packages",
        &recipe.python.packages,
        &target,
        &[],
    )?;
    let dists = wheels::check_all_wheels(&packages.dir)?;
    let deno_cache = deno_cache::stage(&deno.binary, &recipe.deno.packages, &build_dir)?;

    let mut plan = Plan::default();
    for (link, target) in &recipe.symlinks {
        plan.symlink(link, target)?;
    }
    for dir in &recipe.mount_points {
        plan.dir(dir)?;
    }
    for copy in &recipe.copy {
        let src = root.join(&copy.from);
        if !src.is_dir() {
            if !copy.optional {
                bail!(
                    "{} is missing (rootfs/recipe.toml copies it to /{})",
                    src.display(),
                    copy.to.display()
                );
            }
            plan.dir(&copy.to)?;
            continue;
        }
        let include = |rel: &str, _is_dir: bool| !rel.split('/').any(|c| c == "__pycache__");
        plan.tree(&src, &copy.to, &include, false)?;
    }
    let staged_include = |rel: &str, _is_dir: bool| {
        let name = rel.rsplit('/').next().unwrap_or(rel);
        !rel.starts_with(".codebox-")
            && name != "__pycache__"
            && !recipe
                .python
                .exclude_names
                .iter()
                .any(|p| glob::matches(p, name))
            && !recipe
                .python
                .packages_exclude
                .iter()
                .any(|p| glob::matches_path(p, rel))
    };
    plan.tree(
        &packages.dir,
        &recipe.python.packages_dir,
        &staged_include,
        true,
    )?;
    plan.tree(
        &installer.dir,
        &recipe.python.installer_dir,
        &staged_include,
        true,
    )?;
    for (to, built) in native::build(&root, &build_dir, &recipe.native)? {
        plan.file(&to, &built)?;
    }
    let not_stamp = |rel: &str, _is_dir: bool| !rel.starts_with(".codebox-");
    plan.tree(&deno_cache.dir, &recipe.deno.cache_dir, &not_stamp, false)?;
    let mut compile = recipe.python.compile.clone();
    compile.extend([
        recipe.python.packages_dir.clone(),
        recipe.python.installer_dir.clone(),
    ]);
    let modules = python::plan(&py, &recipe.python, &compile, &mut plan)?;
    plan.file(&recipe.deno.dest, &deno.binary)?;
    let libs = plan_libraries_counted(&mut plan)?;
    plan.check_links()?;

    let out = prepare_out(&out)?;
    let state_path = build_dir.join(format!(
        "state-{}.tsv",
        &state::hex(&sha_of(out.as_os_str()))[..16]
    ));
    let mut state = State::load(&state_path);
    let stats = sync::sync(&plan, &out, &mut state)?;
    let compiled = python::compile(&py, &out, &modules, &mut state)?;
    let resealed = seal::seal(&out, &plan)?;
    let lines = manifest::scan(&out, &plan, &mut state)?;
    let written = manifest::write(&out, &manifest::render(&lines))?;
    state.retain(|p| plan.get(p).is_some());
    state.save()?;

    let t = manifest::totals(&lines);
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "rootfs {}: {} files ({:.1} MiB), {} symlinks, {} directories; {} shared libraries ({} from the host)",
        out.display(),
        t.files,
        mib(t.bytes),
        t.symlinks,
        t.dirs,
        libs.total,
        libs.host
    );
    println!(
        "  python packages{}: {}; deno packages: {}",
        if opts.slim { " (--slim)" } else { "" },
        if dists.is_empty() {
            "none".into()
        } else {
            dists.join(" ")
        },
        if recipe.deno.packages.is_empty() {
            "none".into()
        } else {
            recipe.deno.packages.join(" ")
        },
    );
    println!(
        "  copied {} ({:.1} MiB), unchanged {}, removed {}, compiled {} .pyc, sealed {}, hashed {}{}{}; manifest {}; {:.2}s",
        stats.copied,
        mib(stats.copied_bytes),
        stats.unchanged,
        stats.removed,
        compiled,
        resealed,
        state.hashed,
        if deno.installed { ", installed deno with pip" } else { "" },
        match (installer.installed || packages.installed, deno_cache.installed) {
            (true, true) => ", installed wheels and cached deno packages",
            (true, false) => ", installed wheels",
            (false, true) => ", cached deno packages",
            (false, false) => "",
        },
        if written { "written" } else { "unchanged" },
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The recipe's `[python] packages` (for the benchmark's host comparison).
pub fn recipe_packages(path: &Path) -> Result<Vec<String>> {
    Ok(Recipe::load(path)?.python.packages)
}

/// How many library files the rootfs holds, and how many of them came from the host (the
/// others are planned already: libraries vendored by wheels).
struct Libraries {
    total: usize,
    host: usize,
}

/// The plan as the loader in the rootfs will see it: a planned file (following planned
/// symlinks), else the host's file at the same path.
struct PlanView<'a>(&'a Plan);

impl ldso::View for PlanView<'_> {
    fn locate(&self, path: &Path) -> Option<ldso::Located> {
        let mut rel = self.0.resolve(path).ok()?;
        for _ in 0..40 {
            match self.0.get(&rel) {
                Some(Entry::File { src, .. }) => {
                    return Some(ldso::Located::Planned {
                        rel,
                        src: src.clone(),
                    })
                }
                Some(Entry::Symlink { target }) => {
                    let base = rel.parent().unwrap_or(Path::new("")).join(target);
                    rel = self.0.resolve(&base).ok()?;
                }
                Some(Entry::Dir | Entry::Generated) => return None,
                None => return ldso::host_file(path),
            }
        }
        None
    }
}

/// Plan every shared library the planned ELF files need. A library the plan already places
/// (vendored by a wheel, found through the wheel's `$ORIGIN` run path) stays where it is; one
/// from the host goes to its real path, with a link for each other name the loader finds it
/// under.
pub(crate) fn plan_libraries(plan: &mut Plan) -> Result<usize> {
    plan_libraries_counted(plan).map(|l| l.total)
}

fn plan_libraries_counted(plan: &mut Plan) -> Result<Libraries> {
    let mut roots = Vec::new();
    for (rel, entry) in plan.entries() {
        let Entry::File { src, .. } = entry else {
            continue;
        };
        if elf::is_elf(src)? {
            roots.push(ldso::Root {
                rel: rel.clone(),
                src: src.clone(),
            });
        }
    }
    let libs = ldso::closure(&ldso::SearchPath::host()?, &PlanView(plan), &roots)?;
    let mut files = std::collections::BTreeSet::new();
    let mut host = 0;
    for lib in &libs {
        let real = match &lib.at {
            ldso::Located::Planned { rel, .. } => rel.clone(),
            ldso::Located::Host { real } => plan.host_file(real)?,
        };
        if !files.insert(real.clone()) {
            continue;
        }
        if matches!(lib.at, ldso::Located::Host { .. }) {
            host += 1;
        }
    }
    for lib in &libs {
        let ldso::Located::Host { real } = &lib.at else {
            continue; // found at a planned path: nothing to link
        };
        let real = plan.resolve(real)?;
        let dir = lib
            .found
            .parent()
            .context("library path has no directory")?;
        let dir = fs::canonicalize(dir).with_context(|| format!("resolving {}", dir.display()))?;
        let link =
            plan.resolve(&dir.join(lib.found.file_name().context("library path has no name")?))?;
        if link != real {
            plan.symlink(
                &link,
                relative_to(link.parent().unwrap_or(Path::new("")), &real),
            )?;
        }
    }
    Ok(Libraries {
        total: files.len(),
        host,
    })
}

/// Create the output directory, refusing one that holds something other than an earlier build
/// (the build deletes what it does not plan). Returns its canonical path.
fn prepare_out(out: &Path) -> Result<PathBuf> {
    if out.exists() {
        let mut entries =
            fs::read_dir(out).with_context(|| format!("reading {}", out.display()))?;
        if entries.next().is_some() && !out.join(sync::MANIFEST).is_file() {
            bail!(
                "refusing to build into {}: it is not empty and has no {} from an earlier build",
                out.display(),
                sync::MANIFEST
            );
        }
    }
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let out = fs::canonicalize(out).with_context(|| format!("resolving {}", out.display()))?;
    if out == Path::new("/") {
        bail!("refusing to build into /");
    }
    Ok(out)
}

/// One build at a time: they share the pip install and the build state. The lock goes with
/// the returned file.
fn lock(build_dir: &Path) -> Result<fs::File> {
    let path = build_dir.join("lock");
    let file = fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    if file.try_lock().is_err() {
        eprintln!(
            "waiting for another `cargo xtask rootfs` to finish ({})",
            path.display()
        );
        file.lock()
            .with_context(|| format!("locking {}", path.display()))?;
    }
    Ok(file)
}

fn sha_of(s: &std::ffi::OsStr) -> state::Sha {
    use sha2::Digest;
    sha2::Sha256::digest(s.as_encoded_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let a = |v: &[&str]| Options::parse(&v.iter().map(OsString::from).collect::<Vec<_>>());
        assert_eq!(a(&["--out", "x"]).unwrap().out, Some(PathBuf::from("x")));
        assert_eq!(a(&["--out=y"]).unwrap().out, Some(PathBuf::from("y")));
        assert!(a(&["--help"]).unwrap().help);
        assert!(a(&["--slim"]).unwrap().slim);
        assert!(!a(&[]).unwrap().slim);
        assert!(a(&["--out"]).is_err());
        assert!(a(&["--bogus"]).unwrap_err().to_string().contains("--bogus"));
    }

    #[test]
    fn foreign_non_empty_directories_are_refused() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("precious"), "").unwrap();
        let err = prepare_out(t.path()).unwrap_err().to_string();
        assert!(err.contains("refusing"), "{err}");
        fs::write(t.path().join(sync::MANIFEST), "").unwrap();
        prepare_out(t.path()).unwrap();
        prepare_out(&t.path().join("new/dir")).unwrap();
    }
}
