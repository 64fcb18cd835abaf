//! CPython in the rootfs: Debian's interpreter at its own path, its standard library less
//! what the recipe excludes, and every module byte-compiled ahead of time. The rootfs is
//! read-only at run time, so the `.pyc` files must be there, and they use unchecked hash-based
//! invalidation so nothing depends on mtimes.

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use super::glob;
use super::plan::{normalize, relative_to, Entry, Plan};
use super::recipe;
use super::state::{Key, PycStamp, State};

/// Above this many stale `.pyc` files, compile the whole directories in parallel (`-j0` only
/// parallelises directories) rather than file by file.
const WHOLE_TREE_THRESHOLD: usize = 100;

#[derive(Debug)]
pub struct Python {
    /// The interpreter as the recipe names it: `/usr/bin/python3`.
    pub link: PathBuf,
    /// The real file: `/usr/bin/python3.11`.
    pub exe: PathBuf,
    /// `3.11`
    pub version: String,
    /// `/usr/lib/python3.11`
    pub stdlib: PathBuf,
}

/// The modules to byte-compile, and the rootfs directories they are in.
#[derive(Debug)]
pub struct Modules {
    pub dirs: Vec<PathBuf>,
    pub list: Vec<Module>,
}

/// A module's source and its `.pyc`, both as rootfs paths.
#[derive(Debug, Clone)]
pub struct Module {
    pub source: PathBuf,
    pub pyc: PathBuf,
}

impl Python {
    pub fn locate(interpreter: &Path) -> Result<Self> {
        if !interpreter.exists() {
            bail!(
                "{} not found: the rootfs takes Debian's Python, install it with `apt-get install python3`",
                interpreter.display()
            );
        }
        let exe = fs::canonicalize(interpreter)
            .with_context(|| format!("resolving {}", interpreter.display()))?;
        let name = exe.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let version = name
            .strip_prefix("python")
            .filter(|v| v.split('.').count() == 2 && v.split('.').all(|p| p.parse::<u32>().is_ok()))
            .with_context(|| format!("{} is not named pythonX.Y", exe.display()))?
            .to_owned();
        let prefix = exe
            .parent()
            .and_then(Path::parent)
            .context("interpreter has no prefix")?;
        let stdlib = prefix.join("lib").join(format!("python{version}"));
        if !stdlib.join("os.py").is_file() {
            bail!(
                "{} has no standard library at {}",
                exe.display(),
                stdlib.display()
            );
        }
        Ok(Self {
            link: interpreter.to_path_buf(),
            exe,
            version,
            stdlib,
        })
    }

    /// `cpython-311`, the tag in `.pyc` file names.
    pub fn cache_tag(&self) -> String {
        format!("cpython-{}", self.version.replace('.', ""))
    }
}

/// Plan the interpreter, its link, the standard library and one `.pyc` per module in it and
/// in the `compile` directories (the recipe's, the package sets'; planned already).
pub fn plan(
    py: &Python,
    recipe: &recipe::Python,
    compile: &[PathBuf],
    plan: &mut Plan,
) -> Result<Modules> {
    let exe = plan.host_file(&py.exe)?;
    let link_dir = py
        .link
        .parent()
        .context("interpreter link has no directory")?;
    let link_dir =
        fs::canonicalize(link_dir).with_context(|| format!("resolving {}", link_dir.display()))?;
    let link = normalize(&link_dir.join(py.link.file_name().context("no file name")?))?;
    if link != exe {
        plan.symlink(
            &link,
            relative_to(link.parent().unwrap_or(Path::new("")), &exe),
        )?;
    }

    let include = |rel: &str, _is_dir: bool| {
        let name = rel.rsplit('/').next().unwrap_or(rel);
        !recipe.exclude.iter().any(|p| glob::matches_path(p, rel))
            && !recipe.exclude_names.iter().any(|p| glob::matches(p, name))
    };
    let stdlib = normalize(&py.stdlib)?;
    plan.tree(&py.stdlib, &stdlib, &include, true)?;

    let mut dirs = vec![stdlib];
    for dir in compile {
        let dir = plan.resolve(dir)?;
        if plan.get(&dir) != Some(&Entry::Dir) {
            bail!(
                "rootfs/recipe.toml compiles /{}, which is not a planned directory",
                dir.display()
            );
        }
        dirs.push(dir);
    }
    let tag = py.cache_tag();
    let mut list = Vec::new();
    for dir in &dirs {
        let sources: Vec<PathBuf> = plan
            .entries()
            .range(dir.clone()..)
            .take_while(|(p, _)| p.starts_with(dir))
            .filter(|(p, e)| {
                p.extension() == Some("py".as_ref())
                    && matches!(e, Entry::File { .. } | Entry::Symlink { .. })
            })
            .map(|(p, _)| p.clone())
            .collect();
        for source in sources {
            let stem = source
                .file_stem()
                .and_then(|s| s.to_str())
                .context("module name is not UTF-8")?;
            let pyc = source
                .with_file_name("__pycache__")
                .join(format!("{stem}.{tag}.pyc"));
            let pyc = plan.generated(pyc)?;
            list.push(Module { source, pyc });
        }
    }
    Ok(Modules { dirs, list })
}

/// Byte-compile the modules whose `.pyc` is missing or was not compiled from the current
/// source; returns how many were compiled. `out` must be absolute and canonical, so that
/// `-s out -p /` turns it into the paths the sandbox sees.
pub fn compile(py: &Python, out: &Path, modules: &Modules, state: &mut State) -> Result<usize> {
    let (dirs, modules) = (&modules.dirs, &modules.list);
    let mut shas = Vec::with_capacity(modules.len());
    let mut stale = Vec::new();
    for (i, m) in modules.iter().enumerate() {
        let sha = state.sha(out, &m.source)?;
        let fresh = state.pyc_stamp(&m.pyc).is_some_and(|s| {
            s.source == sha
                && fs::symlink_metadata(out.join(&m.pyc)).is_ok_and(|meta| Key::of(&meta) == s.pyc)
        });
        if !fresh {
            stale.push(i);
        }
        shas.push(sha);
    }
    if stale.is_empty() {
        return Ok(0);
    }

    let whole = stale.len() > WHOLE_TREE_THRESHOLD;
    // compileall writes each .pyc through a temporary file in its __pycache__: open
    // those sealed directories (a user other than root; `seal` closes them again).
    if whole {
        for d in dirs {
            super::seal::open_tree(&out.join(d))?;
        }
    } else {
        for &i in &stale {
            if let Some(cache) = modules[i].pyc.parent() {
                super::seal::open_dir(&out.join(cache))?;
            }
        }
    }
    let mut cmd = Command::new(&py.exe);
    cmd.args([
        "-I",
        "-m",
        "compileall",
        "-q",
        "--invalidation-mode",
        "unchecked-hash",
    ]);
    cmd.arg("-s").arg(out).args(["-p", "/"]);
    if whole {
        cmd.arg("-j0").args(dirs.iter().map(|d| out.join(d)));
        cmd.stdin(Stdio::null());
    } else {
        cmd.args(["-i", "-"]).stdin(Stdio::piped());
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("running {} -m compileall", py.exe.display()))?;
    if !whole {
        let mut list = OsString::new();
        for &i in &stale {
            list.push(out.join(&modules[i].source));
            list.push("\n");
        }
        let mut stdin = child.stdin.take().context("compileall has no stdin")?;
        stdin
            .write_all(list.as_encoded_bytes())
            .context("writing the file list to compileall")?;
    }
    let status = child.wait().context("waiting for compileall")?;
    if !status.success() {
        bail!(
            "{} -m compileall failed ({status}) in {}",
            py.exe.display(),
            out.display()
        );
    }

    // Compiling the whole tree rewrote every .pyc.
    let compiled = if whole {
        (0..modules.len()).collect()
    } else {
        stale
    };
    for &i in &compiled {
        let path = out.join(&modules[i].pyc);
        let meta = fs::symlink_metadata(&path)
            .with_context(|| format!("compileall did not write {}", path.display()))?;
        if meta.permissions().mode() & 0o7777 != 0o644 {
            fs::set_permissions(&path, fs::Permissions::from_mode(0o644))
                .with_context(|| format!("chmod {}", path.display()))?;
        }
        state.set_pyc_stamp(
            &modules[i].pyc,
            PycStamp {
                source: shas[i],
                pyc: Key::of(&meta),
            },
        );
    }
    Ok(compiled.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_interpreter_says_how_to_install() {
        let err = Python::locate(Path::new("/nonexistent/bin/python3"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("apt-get install python3"), "{err}");
    }

    #[test]
    fn host_python_is_located_and_planned_without_excluded_parts() {
        let Ok(py) = Python::locate(Path::new("/usr/bin/python3")) else {
            eprintln!("skipped: Debian's /usr/bin/python3 is not installed");
            return;
        };
        assert!(py.exe.is_absolute() && py.version.starts_with("3."));
        let recipe = recipe::Recipe::load(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../rootfs/recipe.toml"
        )))
        .unwrap()
        .python;
        let mut p = Plan::default();
        p.dir("opt/codebox/python").unwrap();
        p.file("opt/codebox/python/codebox.py", &py.stdlib.join("abc.py"))
            .unwrap();
        let modules = plan(&py, &recipe, &recipe.compile, &mut p).unwrap().list;
        assert!(modules
            .iter()
            .any(|m| m.pyc == Path::new("opt/codebox/python/__pycache__/codebox.cpython-311.pyc")));
        let lib = normalize(&py.stdlib).unwrap();
        let has = |rel: &str| p.get(&lib.join(rel)).is_some();
        assert!(has("os.py") && has("json/__init__.py") && has("lib-dynload"));
        assert!(!has("test") && !has("idlelib") && !has("turtle.py") && !has("sitecustomize.py"));
        let dynload: Vec<_> = p
            .entries()
            .keys()
            .filter(|k| k.starts_with(lib.join("lib-dynload")))
            .filter_map(|k| k.file_name()?.to_str().map(str::to_owned))
            .collect();
        assert!(
            dynload.iter().any(|n| n.starts_with("_ssl.")),
            "{dynload:?}"
        );
        assert!(
            !dynload
                .iter()
                .any(|n| n.starts_with("_test") || n.starts_with("xxlimited")),
            "{dynload:?}"
        );
        let os = modules
            .iter()
            .find(|m| m.source == lib.join("os.py"))
            .unwrap();
        assert_eq!(
            os.pyc,
            lib.join(format!("__pycache__/os.{}.pyc", py.cache_tag()))
        );
        assert!(!p
            .entries()
            .keys()
            .any(|k| k.ends_with("__pycache__") && !modules.iter().any(|m| m.pyc.starts_with(k))));
        p.check_links().unwrap();
    }
}
