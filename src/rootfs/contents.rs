//! The full verification's contents check: every file's SHA-256 against the manifest,
//! and no entry the manifest does not list.

use std::collections::HashSet;
use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::error::{Error, Result};
use super::manifest::{self, Entry, Manifest};
use super::quick::host_path;

/// Hashes every file and looks for entries the manifest does not list.
pub(super) fn check_contents(root: &Path, manifest: &Manifest) -> Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    for entry in &manifest.entries {
        let Entry::File {
            path: rel, sha256, ..
        } = entry
        else {
            continue;
        };
        let path = host_path(root, rel);
        let io = |source| Error::Io {
            path: path.clone(),
            source,
        };
        let mut file = std::fs::File::open(&path).map_err(io)?;
        let mut hasher = Sha256::new();
        loop {
            let n = file.read(&mut buf).map_err(io)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        if hasher.finalize().as_slice() != sha256 {
            return Err(Error::Tampered {
                root: root.to_path_buf(),
                entry: rel.clone(),
                what: "has different contents (SHA-256 mismatch)".into(),
            });
        }
    }
    let listed: HashSet<&str> = manifest.entries.iter().map(Entry::path).collect();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let rd = std::fs::read_dir(&dir).map_err(|source| Error::Io {
            path: dir.clone(),
            source,
        })?;
        for item in rd {
            let item = item.map_err(|source| Error::Io {
                path: dir.clone(),
                source,
            })?;
            let path = item.path();
            let rel = format!("/{}", path.strip_prefix(root).unwrap_or(&path).display());
            if rel == format!("/{}", manifest::FILE_NAME) {
                continue;
            }
            if !listed.contains(rel.as_str()) {
                return Err(Error::Tampered {
                    root: root.to_path_buf(),
                    entry: rel,
                    what: "is not listed in the manifest".into(),
                });
            }
            if item.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path);
            }
        }
    }
    Ok(())
}
