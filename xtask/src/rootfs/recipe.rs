//! `rootfs/recipe.toml`: what goes into the rootfs, as data.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    pub mount_points: Vec<PathBuf>,
    pub symlinks: BTreeMap<PathBuf, PathBuf>,
    pub python: Python,
    pub deno: Deno,
    pub copy: Vec<Copy>,
    /// Programs of codebox's own in C, compiled at build time (`native.rs`).
    #[serde(default)]
    pub native: Vec<super::native::Native>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Python {
    pub interpreter: PathBuf,
    pub exclude: Vec<String>,
    pub exclude_names: Vec<String>,
    /// Rootfs directories byte-compiled besides the standard library.
    #[serde(default)]
    pub compile: Vec<PathBuf>,
    /// Third-party packages for the program: pip requirement strings, installed from
    /// binary wheels only (see `wheels.rs`).
    #[serde(default)]
    pub packages: Vec<String>,
    /// Where they go in the rootfs; boot.py puts it on the program's `sys.path`.
    pub packages_dir: PathBuf,
    /// Left out of the installed packages: paths relative to `packages_dir`, matched like
    /// `exclude` (`exclude_names` applies too).
    #[serde(default)]
    pub packages_exclude: Vec<String>,
    /// pip for the package installer: one pinned requirement of a pure-Python wheel,
    /// installed at `installer_dir`, which is not on the program's `sys.path`.
    pub installer: String,
    pub installer_dir: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deno {
    pub pip: String,
    pub binary: PathBuf,
    pub dest: PathBuf,
    /// `npm:` and `jsr:` specifiers cached into `cache_dir` (see `deno_cache.rs`).
    #[serde(default)]
    pub packages: Vec<String>,
    /// The Deno cache in the rootfs: the runtime's `DENO_DIR` (`src/runtime/mod.rs`).
    pub cache_dir: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Copy {
    pub from: PathBuf,
    pub to: PathBuf,
    #[serde(default)]
    pub optional: bool,
}

impl Recipe {
    pub fn load(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("parsing {}", path.display()))
    }

    fn parse(text: &str) -> Result<Self> {
        let recipe: Recipe = toml::from_str(text)?;
        recipe.check()?;
        Ok(recipe)
    }

    /// What serde cannot say: requirements and specifiers are handed to pip and deno as
    /// arguments, so none may look like an option.
    fn check(&self) -> Result<()> {
        let python = &self.python;
        for req in python.packages.iter().chain([&python.installer]) {
            if req.trim().is_empty() || req.trim_start().starts_with('-') {
                bail!("python: {req:?} is not a requirement (an option or empty)");
            }
        }
        for spec in &self.deno.packages {
            if !(spec.starts_with("npm:") || spec.starts_with("jsr:")) || spec.len() <= 4 {
                bail!("deno.packages: {spec:?} is neither an npm: nor a jsr: specifier");
            }
        }
        Ok(())
    }

    /// The recipe without its package sets (`cargo xtask rootfs --slim`): the interpreters,
    /// their standard libraries and the installer's pip stay.
    pub fn slim(&mut self) {
        self.python.packages.clear();
        self.deno.packages.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECIPE: &str = include_str!("../../../rootfs/recipe.toml");

    #[test]
    fn the_workspace_recipe_parses() {
        let r = Recipe::parse(RECIPE).unwrap();
        assert!(r.mount_points.contains(&PathBuf::from("workspace")));
        assert_eq!(r.symlinks[Path::new("lib")], Path::new("usr/lib"));
        assert!(r.python.exclude.iter().any(|e| e == "lib-dynload/_test*"));
        assert!(r
            .copy
            .iter()
            .any(|c| c.to == Path::new("etc") && !c.optional));
        // The zygote's native fork path and its children's init.
        let native: Vec<&Path> = r.native.iter().map(|n| n.to.as_path()).collect();
        assert_eq!(
            native,
            [
                Path::new("opt/codebox/zygote/fork.so"),
                Path::new("opt/codebox/zygote/init")
            ]
        );
        // The data set, pinned; pip for the installer, pinned and off the program's path.
        for name in ["numpy==", "pandas==", "matplotlib==", "requests=="] {
            assert!(
                r.python.packages.iter().any(|p| p.starts_with(name)),
                "{name} {:?}",
                r.python.packages
            );
        }
        assert!(r.python.installer.starts_with("pip=="));
        assert_ne!(r.python.installer_dir, r.python.packages_dir);
        assert!(!r.python.compile.contains(&r.python.installer_dir));
    }

    #[test]
    fn slim_drops_the_package_sets_only() {
        let mut r = Recipe::parse(RECIPE).unwrap();
        r.slim();
        assert!(r.python.packages.is_empty() && r.deno.packages.is_empty());
        assert!(r.python.installer.starts_with("pip=="));
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let text = RECIPE.replace("[deno]", "[deno]\nversion = 2");
        let err = format!("{:#}", Recipe::parse(&text).unwrap_err());
        assert!(err.contains("version"), "{err}");
    }

    /// A recipe with only what is required, plus `python` and `deno` lines.
    fn minimal(python: &str, deno: &str) -> Result<Recipe> {
        Recipe::parse(&format!(
            "mount_points = []\ncopy = []\n[symlinks]\n\
             [python]\ninterpreter = \"/usr/bin/python3\"\nexclude = []\nexclude_names = []\n\
             packages_dir = \"opt/p\"\ninstaller = \"pip==1\"\ninstaller_dir = \"opt/i\"\n{python}\n\
             [deno]\npip = \"deno==2\"\nbinary = \"bin/deno\"\ndest = \"usr/bin/deno\"\n\
             cache_dir = \"opt/d\"\n{deno}\n"
        ))
    }

    #[test]
    fn package_lists_parse_and_options_are_refused() {
        let r = minimal(
            "packages = [\"rich==13.*\", \"attrs>=23\"]",
            "packages = [\"npm:lodash-es@4\", \"jsr:@std/path@1\"]",
        )
        .unwrap();
        assert_eq!(r.python.packages, ["rich==13.*", "attrs>=23"]);
        assert_eq!(r.deno.packages, ["npm:lodash-es@4", "jsr:@std/path@1"]);
        assert!(r.python.packages_exclude.is_empty());
        let r = minimal("", "").unwrap();
        assert!(r.python.packages.is_empty() && r.deno.packages.is_empty());
        for bad in ["\"--index-url=http://x\"", "\" -e .\"", "\"\""] {
            let err = format!(
                "{:#}",
                minimal(&format!("packages = [{bad}]"), "").unwrap_err()
            );
            assert!(err.contains("not a requirement"), "{bad}: {err}");
        }
        let err = format!(
            "{:#}",
            minimal("", "").and_then(|_| Recipe::parse("")).unwrap_err()
        );
        assert!(err.contains("missing field"), "{err}");
        for bad in ["\"lodash\"", "\"https://x/mod.ts\"", "\"npm:\""] {
            let err = format!(
                "{:#}",
                minimal("", &format!("packages = [{bad}]")).unwrap_err()
            );
            assert!(err.contains("neither an npm: nor a jsr:"), "{bad}: {err}");
        }
    }
}
