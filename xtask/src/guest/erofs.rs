//! The guest's root filesystem: the same tree as the namespace sandboxes' rootfs
//! (`target/rootfs`), checked against its `.manifest` and packed into a read-only erofs
//! image the guest mounts from a virtio disk.
//!
//! The manifest is honoured, not trusted: before packing, every entry it lists is
//! compared with the tree (kind, mode, size, SHA-256 of every file) and the tree may hold
//! nothing the manifest does not list. The image is then made from that tree with what the
//! manifest cannot say fixed: every owner root (`--all-root`), every time 0 (`-T0`), no
//! extended attributes, a fixed UUID — the same tree gives the same image. Uncompressed:
//! under TCG every decompression is emulated; the page cache of a clone is shared anyway.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::rootfs::state::{hash_file, hex};

/// A manifest line, as `codebox` itself parses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    Dir { mode: u32 },
    File { mode: u32, size: u64, sha: String },
    Symlink { target: String },
}

/// Parses `.manifest` (see `xtask/src/rootfs/manifest.rs` for the format).
pub fn parse_manifest(text: &str) -> Result<BTreeMap<String, Expect>> {
    let mut lines = text.lines();
    if lines.next() != Some(crate::rootfs::manifest::HEADER) {
        bail!("not a codebox rootfs manifest (first line)");
    }
    let mut out = BTreeMap::new();
    for (i, line) in lines.enumerate() {
        let f: Vec<&str> = line.split('\t').collect();
        let mode = |s: &str| u32::from_str_radix(s, 8).ok();
        let (path, expect) = match f.as_slice() {
            ["d", m, p] => (
                *p,
                Expect::Dir {
                    mode: mode(m).context("bad mode")?,
                },
            ),
            ["f", m, size, sha, p] => (
                *p,
                Expect::File {
                    mode: mode(m).context("bad mode")?,
                    size: size.parse().context("bad size")?,
                    sha: sha.to_string(),
                },
            ),
            ["l", target, p] => (
                *p,
                Expect::Symlink {
                    target: target.to_string(),
                },
            ),
            _ => bail!("manifest line {}: {line:?}", i + 2),
        };
        let rel = path
            .strip_prefix('/')
            .filter(|r| !r.is_empty() && !r.split('/').any(|c| c == ".." || c.is_empty()))
            .with_context(|| format!("manifest line {}: bad path {path:?}", i + 2))?;
        if out.insert(rel.to_string(), expect).is_some() {
            bail!("manifest line {}: {path} listed twice", i + 2);
        }
    }
    Ok(out)
}

/// Compares the tree at `root` with its manifest, entry by entry, both ways.
pub fn check_tree(root: &Path) -> Result<String> {
    let manifest_path = root.join(".manifest");
    let text = fs::read_to_string(&manifest_path).with_context(|| {
        format!(
            "reading {} (run `cargo xtask rootfs`)",
            manifest_path.display()
        )
    })?;
    let expected = parse_manifest(&text)?;
    let mut seen = 0usize;
    let mut stack = vec![PathBuf::new()];
    while let Some(sub) = stack.pop() {
        let dir = root.join(&sub);
        for e in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let e = e?;
            let rel = sub.join(e.file_name());
            let name = rel
                .to_str()
                .context("a path that is not UTF-8")?
                .to_string();
            if name == ".manifest" {
                continue;
            }
            let meta = fs::symlink_metadata(e.path())?;
            let Some(want) = expected.get(&name) else {
                bail!(
                    "{} is in the tree but not in its manifest",
                    e.path().display()
                );
            };
            seen += 1;
            let mode = meta.permissions().mode() & 0o7777;
            let ok = match want {
                Expect::Dir { mode: m } => meta.is_dir() && mode == *m,
                Expect::File { mode: m, size, sha } => {
                    meta.is_file()
                        && mode == *m
                        && meta.len() == *size
                        && hex(&hash_file(&e.path())?) == *sha
                }
                Expect::Symlink { target } => {
                    meta.file_type().is_symlink()
                        && fs::read_link(e.path())?.to_str() == Some(target.as_str())
                }
            };
            if !ok {
                bail!(
                    "{} differs from its manifest entry (run `cargo xtask rootfs`)",
                    e.path().display()
                );
            }
            if meta.is_dir() {
                stack.push(rel);
            }
        }
    }
    if seen != expected.len() {
        bail!(
            "the manifest lists {} entries but the tree has {seen}",
            expected.len()
        );
    }
    Ok(hex(&Sha256::digest(text.as_bytes()).into()))
}

/// The arguments of `mkfs.erofs` for `image` from `tree`, as data.
pub fn mkfs_args(image: &Path, tree: &Path) -> Vec<String> {
    vec![
        "--quiet".into(),
        "--all-root".into(),
        "-T0".into(),
        // A negative tolerance: no extended attributes in the image.
        "-x-1".into(),
        // Fixed, so the same tree gives the same bytes.
        "-U6a1d7a52-7c3e-4f8b-9a31-2c0de0b0c0de".into(),
        "--exclude-path=.manifest".into(),
        image.display().to_string(),
        tree.display().to_string(),
    ]
}

/// The image of `tree` at `build_dir/rootfs.erofs`, remade only when the manifest changed.
pub fn build(tree: &Path, build_dir: &Path) -> Result<(PathBuf, String)> {
    let manifest_sha = check_tree(tree)?;
    let image = build_dir.join("rootfs.erofs");
    let stamp = build_dir.join("rootfs.erofs.stamp");
    let args = mkfs_args(&image, tree);
    let want = format!("{manifest_sha}\n{}\n", args.join(" "));
    if image.is_file() && fs::read_to_string(&stamp).ok().as_deref() == Some(want.as_str()) {
        return Ok((image, manifest_sha));
    }
    let _ = fs::remove_file(&image);
    let status = Command::new("mkfs.erofs")
        .args(&args)
        .status()
        .context("running mkfs.erofs (install erofs-utils)")?;
    if !status.success() {
        bail!("mkfs.erofs failed for {}", tree.display());
    }
    fs::set_permissions(&image, fs::Permissions::from_mode(0o644))?;
    fs::write(&stamp, want)?;
    Ok((image, manifest_sha))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree_with_manifest() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        fs::set_permissions(r, fs::Permissions::from_mode(0o755)).unwrap();
        fs::create_dir(r.join("etc")).unwrap();
        fs::set_permissions(r.join("etc"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(r.join("etc/hosts"), "x\n").unwrap();
        fs::set_permissions(r.join("etc/hosts"), fs::Permissions::from_mode(0o644)).unwrap();
        symlink("etc", r.join("e")).unwrap();
        let sha = hex(&hash_file(&r.join("etc/hosts")).unwrap());
        fs::write(
            r.join(".manifest"),
            format!(
                "{}\nl\tetc\t/e\nd\t0755\t/etc\nf\t0644\t2\t{sha}\t/etc/hosts\n",
                crate::rootfs::manifest::HEADER
            ),
        )
        .unwrap();
        t
    }

    #[test]
    fn a_tree_that_matches_its_manifest_passes() {
        let t = tree_with_manifest();
        check_tree(t.path()).unwrap();
    }

    #[test]
    fn changed_extra_and_missing_entries_are_refused() {
        let t = tree_with_manifest();
        fs::write(t.path().join("etc/hosts"), "y\n").unwrap();
        assert!(check_tree(t.path())
            .unwrap_err()
            .to_string()
            .contains("differs"));
        let t = tree_with_manifest();
        fs::write(t.path().join("extra"), "").unwrap();
        assert!(check_tree(t.path())
            .unwrap_err()
            .to_string()
            .contains("not in its manifest"));
        let t = tree_with_manifest();
        fs::remove_file(t.path().join("e")).unwrap();
        assert!(check_tree(t.path()).is_err());
        let t = tree_with_manifest();
        fs::set_permissions(
            t.path().join("etc/hosts"),
            fs::Permissions::from_mode(0o4755),
        )
        .unwrap();
        assert!(check_tree(t.path()).is_err());
    }

    #[test]
    fn manifest_paths_may_not_leave_the_tree() {
        let h = crate::rootfs::manifest::HEADER;
        for bad in [
            "d\t0755\t/../x",
            "d\t0755\trelative",
            "d\t0755\t/a//b",
            "x\ty",
        ] {
            assert!(parse_manifest(&format!("{h}\n{bad}\n")).is_err(), "{bad}");
        }
    }
}
