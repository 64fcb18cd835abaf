//! The Deno binary: `$DENO` if set, else the one in the `deno` wheel from PyPI, installed once
//! into the build directory with `python3 -m pip install --target` and reused while the recipe's
//! requirement stays the same.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::recipe;

/// The file in the install directory that says which requirement it holds.
const STAMP: &str = ".codebox-requirement";

/// Where the Deno binary comes from, and whether pip ran to get it.
pub struct Deno {
    pub binary: PathBuf,
    pub installed: bool,
}

pub fn locate(recipe: &recipe::Deno, build_dir: &Path) -> Result<Deno> {
    if let Some(path) = std::env::var_os("DENO") {
        let path = PathBuf::from(path);
        let binary = fs::canonicalize(&path)
            .with_context(|| format!("$DENO names {}, which is missing", path.display()))?;
        if !binary.is_file() {
            bail!("$DENO names {}, which is not a file", path.display());
        }
        return Ok(Deno {
            binary,
            installed: false,
        });
    }

    let target = build_dir.join("deno-pip");
    let binary = target.join(&recipe.binary);
    let stamp = fs::read_to_string(target.join(STAMP)).unwrap_or_default();
    if stamp == recipe.pip && binary.is_file() {
        return Ok(Deno {
            binary,
            installed: false,
        });
    }

    let tmp = build_dir.join("deno-pip.tmp");
    remove_all(&tmp)?;
    eprintln!(
        "installing {} from PyPI into {}",
        recipe.pip,
        target.display()
    );
    let output = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-input",
            "--no-compile",
            // The wheel carries the binary; never build an sdist.
            "--only-binary=:all:",
        ])
        .arg("--target")
        .arg(&tmp)
        .arg(&recipe.pip)
        .output()
        .context(
            "running `python3 -m pip`: is python3 with pip on PATH? (or set DENO=/path/to/deno)",
        )?;
    if !output.status.success() {
        bail!(
            "`python3 -m pip install --target {} {}` failed ({}):\n{}\n(set DENO=/path/to/deno to use a binary you have)",
            tmp.display(),
            recipe.pip,
            output.status,
            String::from_utf8_lossy(&output.stderr).trim_end()
        );
    }
    let tmp_binary = tmp.join(&recipe.binary);
    if !tmp_binary.is_file() {
        bail!(
            "pip installed {} but {} is not there",
            recipe.pip,
            tmp_binary.display()
        );
    }
    fs::write(tmp.join(STAMP), &recipe.pip)
        .with_context(|| format!("writing {}", tmp.join(STAMP).display()))?;
    remove_all(&target)?;
    fs::rename(&tmp, &target)
        .with_context(|| format!("renaming {} to {}", tmp.display(), target.display()))?;
    Ok(Deno {
        binary,
        installed: true,
    })
}

fn remove_all(path: &Path) -> Result<()> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}
