//! One image layer: `tar` (sorted names, numeric root ownership, GNU format) written to a
//! file, its SHA-256 (the `diff_id`), `gzip -n` of it, and that blob's SHA-256 and size,
//! stored under `blobs/sha256/` of the layout.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use super::oci::{Blob, Layer};
use crate::test::run_checked;

/// What one `tar` invocation adds to a layer.
#[derive(Debug, Clone)]
pub struct Part {
    /// The directory the member names are relative to.
    pub dir: PathBuf,
    /// Member names (relative to `dir`).
    pub members: Vec<String>,
    /// Prefix added to every member name (not to symlink targets), e.g. `opt/codebox/`.
    pub prefix: Option<String>,
    /// Owner and group of every entry.
    pub owner: u32,
    /// Set every mtime to 0 (files whose times carry no meaning).
    pub zero_mtime: bool,
    /// Member names left out (tar `--exclude` patterns, relative to `dir`).
    pub exclude: Vec<String>,
}

/// The `tar` arguments that create (`append` false) or extend an archive with `part`.
pub fn tar_args(part: &Part, archive: &Path, append: bool) -> Vec<String> {
    let mut a = vec![
        if append { "--append" } else { "--create" }.to_string(),
        "--format=gnu".into(),
        "--sort=name".into(),
        "--numeric-owner".into(),
        format!("--owner={}", part.owner),
        format!("--group={}", part.owner),
        format!("--file={}", archive.display()),
    ];
    if part.zero_mtime {
        a.push("--mtime=@0".into());
    }
    if let Some(p) = &part.prefix {
        // S: leave symlink targets alone (they point inside the sandbox's rootfs).
        a.push(format!("--transform=s,^,{p},S"));
    }
    for e in &part.exclude {
        a.push(format!("--exclude={e}"));
    }
    a.push(format!("--directory={}", part.dir.display()));
    a.push("--".into());
    a.extend(part.members.iter().cloned());
    a
}

/// Builds the layer from `parts` in `work`, stores its blob in `layout`.
pub fn build(parts: &[Part], work: &Path, layout: &Path, created_by: &str) -> Result<Layer> {
    let tar = work.join("layer.tar");
    if tar.exists() {
        std::fs::remove_file(&tar)?;
    }
    for (i, part) in parts.iter().enumerate() {
        run_checked(
            Command::new("tar").args(tar_args(part, &tar, i > 0)),
            &format!("tar ({created_by})"),
        )?;
    }
    let diff_id = format!("sha256:{}", sha256_file(&tar)?);
    let gz = work.join("layer.tar.gz");
    let out = File::create(&gz)?;
    run_checked(
        Command::new("gzip")
            .args(["-n", "-c"])
            .arg(&tar)
            .stdout(out),
        "gzip -n",
    )?;
    std::fs::remove_file(&tar)?;
    let blob = store(&gz, layout)?;
    Ok(Layer {
        blob,
        diff_id,
        created_by: created_by.to_string(),
    })
}

/// Moves `file` to `layout/blobs/sha256/<its digest>`.
pub fn store(file: &Path, layout: &Path) -> Result<Blob> {
    let hex = sha256_file(file)?;
    let size = std::fs::metadata(file)?.len();
    let dir = layout.join("blobs/sha256");
    std::fs::create_dir_all(&dir)?;
    std::fs::rename(file, dir.join(&hex))
        .with_context(|| format!("storing {} in {}", file.display(), dir.display()))?;
    Ok(Blob {
        digest: format!("sha256:{hex}"),
        size,
    })
}

/// Writes `bytes` as a blob.
pub fn store_bytes(bytes: &[u8], layout: &Path) -> Result<Blob> {
    let hex = hex(&Sha256::digest(bytes));
    let dir = layout.join("blobs/sha256");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(&hex), bytes)?;
    Ok(Blob {
        digest: format!("sha256:{hex}"),
        size: bytes.len() as u64,
    })
}

pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// Lower-case hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_arguments_keep_symlink_targets_and_end_options_before_members() {
        let part = Part {
            dir: "/t/tree".into(),
            members: vec!["share/codebox/rootfs".into(), "-weird".into()],
            prefix: Some("opt/codebox/".into()),
            owner: 0,
            zero_mtime: false,
            exclude: vec![],
        };
        let a = tar_args(&part, Path::new("/w/layer.tar"), false);
        assert_eq!(a[0], "--create");
        assert!(a.contains(&"--transform=s,^,opt/codebox/,S".to_string()));
        assert!(!a.iter().any(|x| x.starts_with("--mtime")));
        let dashdash = a.iter().position(|x| x == "--").unwrap();
        assert_eq!(&a[dashdash + 1..], ["share/codebox/rootfs", "-weird"]);
        let home = Part {
            owner: 65532,
            zero_mtime: true,
            prefix: None,
            ..part
        };
        let a = tar_args(&home, Path::new("/w/layer.tar"), true);
        assert_eq!(a[0], "--append");
        assert!(a.contains(&"--owner=65532".to_string()));
        assert!(a.contains(&"--mtime=@0".to_string()));
    }

    #[test]
    fn a_layer_is_stored_under_its_digest_with_the_uncompressed_diff_id() {
        let t = tempfile::tempdir().unwrap();
        let tree = t.path().join("tree");
        std::fs::create_dir_all(tree.join("etc")).unwrap();
        std::fs::write(tree.join("etc/hello"), "hi\n").unwrap();
        let layout = t.path().join("layout");
        let part = Part {
            dir: tree,
            members: vec!["etc".into()],
            prefix: None,
            owner: 0,
            zero_mtime: true,
            exclude: vec![],
        };
        let layer = build(std::slice::from_ref(&part), t.path(), &layout, "test").unwrap();
        let stored = layout
            .join("blobs/sha256")
            .join(layer.blob.digest.trim_start_matches("sha256:"));
        assert_eq!(
            format!("sha256:{}", sha256_file(&stored).unwrap()),
            layer.blob.digest
        );
        assert_eq!(std::fs::metadata(&stored).unwrap().len(), layer.blob.size);
        // The diff_id is the digest of the decompressed blob.
        let out = Command::new("gzip")
            .args(["-dc"])
            .arg(&stored)
            .output()
            .unwrap();
        assert_eq!(
            layer.diff_id,
            format!("sha256:{}", hex(&Sha256::digest(&out.stdout)))
        );
        // Same inputs, same digest (sorted names, fixed times, no gzip name or time).
        let again = build(&[part], t.path(), &t.path().join("layout2"), "test").unwrap();
        assert_eq!(again.blob.digest, layer.blob.digest);
    }
}
