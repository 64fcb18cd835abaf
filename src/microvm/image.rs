//! The guest tree (`cargo xtask guest`'s output): where it is, that it is intact, and what
//! it was made from.
//!
//! Looked for in order: the operator's `--guest DIR` (or `guest` in `codebox.toml`), else
//! `$CODEBOX_GUEST`; else next to the executable (`../share/codebox/guest`, a release),
//! else `guest` one or two levels above it (`target/guest` from `target/debug/codebox`
//! and from test executables). A place found rather than named must be owned by root or
//! by this user and writable by no one else. The tree is verified like the rootfs
//! (`rootfs::verify`: kinds, modes, sizes, and every file's SHA-256, quickly from a stamp
//! after the first full check): it holds QEMU, its libraries, the kernel, the initramfs
//! with the guest init, and the rootfs image.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::Error;
use crate::rootfs::{self, Verification};

/// `guest.toml`: what the tree was made from.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Description {
    pub kernel_package: String,
    pub kernel_version: String,
    pub kernel_release: String,
    pub modules: Vec<String>,
    /// The GNU build ID of the codebox binary that is the guest's `/init`.
    pub init_build_id: String,
    /// The rootfs manifest the image was made from.
    pub rootfs_manifest_sha256: String,
    /// QEMU's `--version` line.
    pub qemu: String,
}

/// A verified guest tree.
#[derive(Debug, Clone)]
pub struct GuestImage {
    pub dir: PathBuf,
    pub description: Description,
    pub verification: Verification,
}

/// The places to look, in order (see the module documentation).
pub fn candidates(
    explicit: Option<&Path>,
    env: Option<&std::ffi::OsStr>,
    exe: Option<&Path>,
) -> (Vec<PathBuf>, bool) {
    if let Some(p) = explicit {
        return (vec![p.to_path_buf()], true);
    }
    if let Some(p) = env.filter(|v| !v.is_empty()) {
        return (vec![PathBuf::from(p)], true);
    }
    let mut out = Vec::new();
    if let Some(dir) = exe.and_then(Path::parent) {
        out.push(dir.join("../share/codebox/guest"));
        out.push(dir.join("../guest"));
        out.push(dir.join("../../guest"));
    }
    (out, false)
}

/// Owned by root or `euid`, and writable by neither group nor others.
fn trusted(path: &Path, euid: u32) -> bool {
    std::fs::metadata(path)
        .map(|m| (m.uid() == 0 || m.uid() == euid) && m.mode() & 0o022 == 0)
        .unwrap_or(false)
}

/// Finds the guest tree.
pub fn locate(explicit: Option<&Path>) -> Result<PathBuf, Error> {
    let exe = std::fs::canonicalize("/proc/self/exe").ok();
    let env = std::env::var_os("CODEBOX_GUEST");
    let (places, named) = candidates(explicit, env.as_deref(), exe.as_deref());
    let euid = nix::unistd::geteuid().as_raw();
    for p in &places {
        if p.join(".manifest").is_file() && p.join("guest.toml").is_file() {
            if !named && !trusted(p, euid) {
                tracing::warn!(path = %p.display(), "ignoring a guest tree others could have written");
                continue;
            }
            return std::fs::canonicalize(p).map_err(|source| Error::Io {
                doing: "resolving the guest tree",
                source,
            });
        }
    }
    Err(Error::NoGuest {
        looked: places
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Verifies the tree and reads its description.
pub fn load(dir: &Path) -> Result<GuestImage, Error> {
    let verified = rootfs::verify(dir, rootfs::default_stamp_dir().as_deref())
        .map_err(|e| Error::GuestInvalid(format!("{}: {e}", dir.display())))?;
    let text = std::fs::read_to_string(dir.join("guest.toml")).map_err(|source| Error::Io {
        doing: "reading guest.toml",
        source,
    })?;
    let description: Description =
        toml::from_str(&text).map_err(|e| Error::GuestInvalid(format!("guest.toml: {e}")))?;
    Ok(GuestImage {
        dir: dir.to_path_buf(),
        description,
        verification: verified.verification,
    })
}

impl GuestImage {
    /// Refuses a guest whose init is another build than this binary.
    pub fn check_build(&self) -> Result<String, Error> {
        let own = super::build_id::own().ok_or_else(|| {
            Error::Unsupported("this codebox binary has no build ID to match its guest".into())
        })?;
        if own != self.description.init_build_id {
            return Err(Error::BuildMismatch {
                guest: self.description.init_build_id.clone(),
                host: own,
            });
        }
        Ok(own)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_place_is_the_only_one() {
        let (p, named) = candidates(Some(Path::new("/g")), Some("/e".as_ref()), None);
        assert_eq!(p, [PathBuf::from("/g")]);
        assert!(named);
        let (p, named) = candidates(None, Some("/e".as_ref()), Some(Path::new("/x/bin/codebox")));
        assert_eq!(p, [PathBuf::from("/e")]);
        assert!(named);
    }

    #[test]
    fn found_places_follow_the_executable() {
        let (p, named) = candidates(None, Some("".as_ref()), Some(Path::new("/t/debug/codebox")));
        assert!(!named);
        assert_eq!(
            p,
            [
                PathBuf::from("/t/debug/../share/codebox/guest"),
                PathBuf::from("/t/debug/../guest"),
                PathBuf::from("/t/debug/../../guest"),
            ]
        );
    }

    #[test]
    fn a_directory_others_can_write_is_not_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let euid = nix::unistd::geteuid().as_raw();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(trusted(t.path(), euid));
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!trusted(t.path(), euid));
    }

    #[test]
    fn descriptions_refuse_unknown_keys() {
        let good = r#"kernel_package = "k"
kernel_version = "1"
kernel_release = "r"
modules = ["erofs"]
init_build_id = "ab"
rootfs_manifest_sha256 = "cd"
qemu = "QEMU 7.2"
"#;
        toml::from_str::<Description>(good).unwrap();
        assert!(toml::from_str::<Description>(&format!("{good}extra = 1\n")).is_err());
    }
}
