//! The recipe's `[deno] packages` (`npm:` and `jsr:` specifiers), cached with `deno cache`
//! into a staging directory of the build directory, reused while the specifiers and the Deno
//! binary stay the same. The rootfs holds it read-only as the runtime's `DENO_DIR`, which
//! Deno reads with `--cached-only` (see `src/runtime/mod.rs`).
//!
//! No package code runs: `deno cache` downloads and analyses modules without executing them,
//! and npm lifecycle scripts (`preinstall`, `postinstall`, ...) run only with
//! `--allow-scripts`, which is never given.
//!
//! What is kept of Deno's cache directory: the packages (`npm/`) and remote modules
//! (`remote/`, where jsr packages land); Deno's analysis databases and emit cache are left
//! out (Deno keeps those in memory when `DENO_DIR` is read-only). Each npm package's
//! `registry.json` (the registry's list of versions, as fetched) is cut down to the versions
//! in the cache, so that an import without a version (`npm:lodash`) resolves to the cached
//! one and not to a newer release the registry had at build time.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::wheels::remove_all;

/// The file in the staging directory that says what it holds.
const STAMP: &str = ".codebox-packages";

/// The parts of a Deno cache directory the rootfs keeps.
const KEPT: &[&str] = &["npm", "remote"];

/// The staged cache and whether deno ran to fill it.
pub struct Staged {
    pub dir: PathBuf,
    pub installed: bool,
}

/// Caches `packages` with `deno` into `build_dir/deno-packages` (an empty directory when
/// there are none), or reuses it.
pub fn stage(deno: &Path, packages: &[String], build_dir: &Path) -> Result<Staged> {
    stage_with(deno, packages, build_dir, &[])
}

/// [`stage`] with extra environment for deno (tests: a loopback npm registry).
pub fn stage_with(
    deno: &Path,
    packages: &[String],
    build_dir: &Path,
    env: &[(&str, &OsStr)],
) -> Result<Staged> {
    let dir = build_dir.join("deno-packages");
    let meta = fs::metadata(deno).with_context(|| format!("reading {}", deno.display()))?;
    let stamp = format!(
        "{}\n{} {} {}\n{}\n",
        packages.join("\n"),
        deno.display(),
        meta.len(),
        meta.mtime(),
        env.iter()
            .map(|(k, v)| format!("{k}={}", v.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(" ")
    );
    if fs::read_to_string(dir.join(STAMP)).is_ok_and(|s| s == stamp) {
        return Ok(Staged {
            dir,
            installed: false,
        });
    }

    let tmp = build_dir.join("deno-packages.tmp");
    remove_all(&tmp)?;
    let out = tmp.join("out");
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    if !packages.is_empty() {
        eprintln!(
            "caching {} Deno package(s) into {}",
            packages.len(),
            dir.display()
        );
        let full = tmp.join("deno-dir");
        let output = Command::new(deno)
            .args(["cache", "--no-config", "--no-lock", "--quiet"])
            .args(packages)
            .env("DENO_DIR", &full)
            .env("DENO_NO_UPDATE_CHECK", "1")
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .output()
            .with_context(|| format!("running {} cache", deno.display()))?;
        if !output.status.success() {
            bail!(
                "`deno cache {}` failed ({}):\n{}",
                packages.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim_end()
            );
        }
        for part in KEPT {
            let from = full.join(part);
            if from.exists() {
                fs::rename(&from, out.join(part))
                    .with_context(|| format!("moving {}", from.display()))?;
            }
        }
        trim_npm_registry_files(&out.join("npm"))?;
    }
    fs::write(out.join(STAMP), &stamp)
        .with_context(|| format!("writing {}", out.join(STAMP).display()))?;
    remove_all(&dir)?;
    fs::rename(&out, &dir)
        .with_context(|| format!("renaming {} to {}", out.display(), dir.display()))?;
    remove_all(&tmp)?;
    Ok(Staged {
        dir,
        installed: !packages.is_empty(),
    })
}

/// Cuts every `npm/<registry>/[@scope/]<name>/registry.json` below `npm` down to the
/// versions cached beside it.
fn trim_npm_registry_files(npm: &Path) -> Result<()> {
    if !npm.exists() {
        return Ok(());
    }
    for registry in read_dirs(npm)? {
        for entry in read_dirs(&registry)? {
            let is_scope = entry
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('@'));
            let packages = if is_scope {
                read_dirs(&entry)?
            } else {
                vec![entry]
            };
            for package in packages {
                trim_packument(&package)?;
            }
        }
    }
    Ok(())
}

/// One package's directory: `registry.json` and a directory per cached version (`1.2.3`,
/// or `1.2.3_1` for a copy of it that Deno made for different peer dependencies).
fn trim_packument(package: &Path) -> Result<()> {
    let path = package.join("registry.json");
    if !path.is_file() {
        return Ok(());
    }
    let cached: Vec<String> = read_dirs(package)?
        .iter()
        .filter_map(|d| d.file_name()?.to_str())
        .map(|n| match n.rsplit_once('_') {
            Some((v, copy)) if copy.chars().all(|c| c.is_ascii_digit()) => v.to_owned(),
            _ => n.to_owned(),
        })
        .collect();
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut doc: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let obj = doc
        .as_object_mut()
        .with_context(|| format!("{} is not a JSON object", path.display()))?;
    if let Some(versions) = obj.get_mut("versions").and_then(|v| v.as_object_mut()) {
        versions.retain(|v, _| cached.contains(v));
    }
    let newest = cached.iter().max_by_key(|v| version_key(v)).cloned();
    let tags = obj
        .entry("dist-tags")
        .or_insert_with(|| serde_json::json!({}));
    if let Some(tags) = tags.as_object_mut() {
        tags.retain(|_, v| v.as_str().is_some_and(|v| cached.iter().any(|c| c == v)));
        if let (false, Some(newest)) = (tags.contains_key("latest"), newest) {
            tags.insert("latest".into(), newest.into());
        }
    }
    if let Some(time) = obj.get_mut("time").and_then(|v| v.as_object_mut()) {
        time.retain(|v, _| cached.contains(v) || v == "created" || v == "modified");
    }
    let text = serde_json::to_string(&doc)?;
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// A semver ordering good enough to pick the newest of a few cached versions: numeric
/// major.minor.patch, then a release above its pre-releases.
fn version_key(v: &str) -> (Vec<u64>, bool, String) {
    let v = v.split('+').next().unwrap_or(v);
    let (core, pre) = match v.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (v, None),
    };
    let nums = core.split('.').map(|p| p.parse().unwrap_or(0)).collect();
    (nums, pre.is_none(), pre.unwrap_or_default().to_owned())
}

/// The subdirectories of `dir`, sorted.
fn read_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e.with_context(|| format!("reading {}", dir.display()))?;
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.push(e.path());
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
#[path = "deno_cache_tests.rs"]
mod tests;
