//! `rootfs/recipe.toml`: what goes into the rootfs, as data.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    pub mount_points: Vec<PathBuf>,
    pub symlinks: BTreeMap<PathBuf, PathBuf>,
    pub python: Python,
    pub deno: Deno,
    pub copy: Vec<Copy>,
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
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deno {
    pub pip: String,
    pub binary: PathBuf,
    pub dest: PathBuf,
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
        Ok(toml::from_str(text)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_recipe_parses() {
        let r = Recipe::parse(include_str!("../../../rootfs/recipe.toml")).unwrap();
        assert!(r.mount_points.contains(&PathBuf::from("workspace")));
        assert_eq!(r.symlinks[Path::new("lib")], Path::new("usr/lib"));
        assert!(r.python.exclude.iter().any(|e| e == "lib-dynload/_test*"));
        assert!(r
            .copy
            .iter()
            .any(|c| c.to == Path::new("etc") && !c.optional));
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let text =
            include_str!("../../../rootfs/recipe.toml").replace("[deno]", "[deno]\nversion = 2");
        let err = format!("{:#}", Recipe::parse(&text).unwrap_err());
        assert!(err.contains("version"), "{err}");
    }
}
