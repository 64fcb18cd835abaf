//! Where the rootfs is looked for, as data: [`candidates`] takes the flag, the
//! environment's value and the executable's path and returns the places in order, so the
//! rule is unit-tested without a filesystem; [`locate`] applies it to this process.
//!
//! Order:
//! 1. `--rootfs DIR` (or a config file's `rootfs`), else `$CODEBOX_ROOTFS` when set and
//!    not empty. A location the operator named is the only one looked at: silently using
//!    another tree than the one named would hide the mistake.
//! 2. `<dir of the executable>/../share/codebox/rootfs`: a release unpacked anywhere
//!    (`bin/codebox` next to `share/codebox/rootfs`), and the Debian package
//!    (`/usr/bin/codebox`, `/usr/share/codebox/rootfs`). The executable's path is the
//!    kernel's (`/proc/self/exe`, symlinks resolved), so a symlink to the binary in
//!    `/usr/local/bin` still finds the tree next to the real file.
//! 3. `rootfs` one or two levels above the executable's directory: `target/rootfs` seen
//!    from `target/<profile>/codebox` and from test executables in `target/<profile>/deps/`.
//!
//! A place found (2 and 3), not named, is used only when no other user could have put it
//! there ([`trusted`]): its manifest proves the tree intact, not whose it is, and a binary
//! copied to `/tmp/mine/codebox` would otherwise run code in a `/tmp/share/codebox/rootfs`
//! any local user can create.

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::error::{Error, Result};
use super::manifest;

/// Where the release layout keeps the rootfs, relative to the executable's directory.
pub const RELEASE_RELATIVE: &str = "../share/codebox/rootfs";

/// Why a place is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `--rootfs` or the config file.
    Flag,
    /// `$CODEBOX_ROOTFS`.
    Env,
    /// The release layout next to the executable.
    Release,
    /// The build tree (`target/rootfs`).
    BuildTree,
}

impl Source {
    fn describe(self) -> &'static str {
        match self {
            Source::Flag => "named",
            Source::Env => "named by CODEBOX_ROOTFS",
            Source::Release => "next to the executable",
            Source::BuildTree => "build tree",
        }
    }
}

/// One place to look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub path: PathBuf,
    pub source: Source,
}

/// The places to look, in order (see the module's documentation).
pub fn candidates(
    explicit: Option<&Path>,
    env: Option<&OsStr>,
    exe: Option<&Path>,
) -> Vec<Candidate> {
    if let Some(p) = explicit {
        return vec![Candidate {
            path: p.to_path_buf(),
            source: Source::Flag,
        }];
    }
    if let Some(p) = env.filter(|v| !v.is_empty()) {
        return vec![Candidate {
            path: PathBuf::from(p),
            source: Source::Env,
        }];
    }
    let mut out = Vec::new();
    let Some(dir) = exe.and_then(Path::parent) else {
        return out;
    };
    // `bin/..` is lexical here: `dir` is the kernel's resolved path, so its parent is
    // the real parent (no symlink in between to make `..` mean something else).
    if let Some(prefix) = dir.parent() {
        out.push(Candidate {
            path: prefix.join("share/codebox/rootfs"),
            source: Source::Release,
        });
    }
    for up in dir.ancestors().skip(1).take(2) {
        out.push(Candidate {
            path: up.join("rootfs"),
            source: Source::BuildTree,
        });
    }
    out
}

/// Finds the rootfs: the first candidate holding a manifest, made absolute.
pub fn locate(explicit: Option<&Path>) -> Result<PathBuf> {
    let env = std::env::var_os("CODEBOX_ROOTFS");
    // /proc/self/exe: the kernel's path of the running file, symlinks resolved.
    // canonicalize cleans it further (and fails for a deleted file: then as it is).
    let exe = std::env::current_exe()
        .ok()
        .map(|e| std::fs::canonicalize(&e).unwrap_or(e));
    let euid = nix::unistd::geteuid().as_raw();
    locate_among(candidates(explicit, env.as_deref(), exe.as_deref()), euid)
}

/// The first of `list` holding a manifest (and, when found rather than named,
/// [`trusted`] by `euid`), made absolute.
fn locate_among(list: Vec<Candidate>, euid: u32) -> Result<PathBuf> {
    let mut looked = Vec::new();
    for c in list {
        if c.path.join(manifest::FILE_NAME).exists() {
            let named = matches!(c.source, Source::Flag | Source::Env);
            match if named {
                Ok(())
            } else {
                trusted(&c.path, euid)
            } {
                Ok(()) => {
                    return std::path::absolute(&c.path).map_err(|source| Error::Io {
                        path: c.path,
                        source,
                    })
                }
                Err(why) => {
                    tracing::warn!(path = %c.path.display(), %why, "rootfs not used: another user could have put it there");
                    looked.push(format!(
                        "{} ({}, not used: {why})",
                        c.path.display(),
                        c.source.describe()
                    ));
                    continue;
                }
            }
        }
        looked.push(format!("{} ({})", c.path.display(), c.source.describe()));
    }
    tracing::debug!(looked = %looked.join(", "), "no rootfs found");
    Err(Error::NotFound {
        looked: if looked.is_empty() {
            "nowhere: the executable's path is unknown".to_string()
        } else {
            looked.join(", ")
        },
    })
}

/// Whether only root or `euid` could have made `path` what it is: `path` (symlinks
/// resolved) and every directory above it are owned by root or `euid`, and none is
/// group- or world-writable, except a sticky directory above (`/tmp`), whose entries
/// others cannot replace (the entry below it is checked in turn).
pub fn trusted(path: &Path, euid: u32) -> std::result::Result<(), String> {
    let real = std::fs::canonicalize(path).map_err(|e| format!("cannot resolve it: {e}"))?;
    for (i, dir) in real.ancestors().enumerate() {
        let meta =
            std::fs::metadata(dir).map_err(|e| format!("cannot stat {}: {e}", dir.display()))?;
        if meta.uid() != 0 && meta.uid() != euid {
            return Err(format!("{} is owned by uid {}", dir.display(), meta.uid()));
        }
        let mode = meta.mode();
        let sticky_above = i > 0 && mode & 0o1000 != 0;
        if mode & 0o022 != 0 && !sticky_above {
            return Err(format!(
                "{} is group- or world-writable (mode {:04o})",
                dir.display(),
                mode & 0o7777
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(c: &[Candidate]) -> Vec<(&Path, Source)> {
        c.iter().map(|c| (c.path.as_path(), c.source)).collect()
    }

    #[test]
    fn a_flag_is_the_only_place_looked_at() {
        let c = candidates(
            Some(Path::new("/srv/rootfs")),
            Some(OsStr::new("/env/rootfs")),
            Some(Path::new("/opt/codebox/bin/codebox")),
        );
        assert_eq!(paths(&c), [(Path::new("/srv/rootfs"), Source::Flag)]);
    }

    #[test]
    fn the_environment_wins_over_the_executable_and_empty_counts_as_unset() {
        let exe = Some(Path::new("/opt/codebox/bin/codebox"));
        let c = candidates(None, Some(OsStr::new("/env/rootfs")), exe);
        assert_eq!(paths(&c), [(Path::new("/env/rootfs"), Source::Env)]);
        let c = candidates(None, Some(OsStr::new("")), exe);
        assert_eq!(c[0].source, Source::Release);
    }

    #[test]
    fn release_layout_comes_before_the_build_tree() {
        let c = candidates(None, None, Some(Path::new("/opt/codebox/bin/codebox")));
        assert_eq!(
            paths(&c),
            [
                (
                    Path::new("/opt/codebox/share/codebox/rootfs"),
                    Source::Release
                ),
                (Path::new("/opt/codebox/rootfs"), Source::BuildTree),
                (Path::new("/opt/rootfs"), Source::BuildTree),
            ]
        );
        // The Debian package's layout is the same rule.
        let c = candidates(None, None, Some(Path::new("/usr/bin/codebox")));
        assert_eq!(c[0].path, Path::new("/usr/share/codebox/rootfs"));
    }

    #[test]
    fn build_tree_paths_stay_as_before() {
        let c = candidates(None, None, Some(Path::new("/w/target/debug/codebox")));
        assert!(c.iter().any(|c| c.path == Path::new("/w/target/rootfs")));
        let c = candidates(None, None, Some(Path::new("/w/target/debug/deps/cli-0123")));
        assert!(c.iter().any(|c| c.path == Path::new("/w/target/rootfs")));
    }

    #[test]
    fn an_executable_at_the_top_yields_no_release_candidate_and_no_panic() {
        assert!(candidates(None, None, Some(Path::new("/codebox")))
            .iter()
            .all(|c| c.source == Source::BuildTree));
        assert!(candidates(None, None, Some(Path::new("codebox"))).is_empty());
        assert!(candidates(None, None, None).is_empty());
    }

    #[test]
    fn the_release_layout_is_found_from_a_real_tree_and_a_named_miss_does_not_fall_through() {
        let t = tempfile::tempdir().unwrap();
        let rootfs = t.path().join("share/codebox/rootfs");
        std::fs::create_dir_all(&rootfs).unwrap();
        std::fs::create_dir_all(t.path().join("bin")).unwrap();
        std::fs::write(rootfs.join(manifest::FILE_NAME), "").unwrap();
        let exe = t.path().join("bin/codebox");
        let found = candidates(None, None, Some(&exe))
            .into_iter()
            .find(|c| c.path.join(manifest::FILE_NAME).exists())
            .unwrap();
        assert_eq!(found.path, rootfs);
        let named = candidates(None, Some(OsStr::new("/nonexistent")), Some(&exe));
        assert!(named
            .iter()
            .all(|c| !c.path.join(manifest::FILE_NAME).exists()));
    }

    /// A rootfs tree with a manifest at `dir`.
    fn plant(dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(manifest::FILE_NAME), "").unwrap();
    }

    fn chmod(p: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_tree_planted_in_a_world_writable_prefix_is_not_used() {
        // A binary copied to <t>/mine/codebox: Release is <t>/share/codebox/rootfs.
        let t = tempfile::tempdir().unwrap();
        let exe = t.path().join("mine/codebox");
        std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
        plant(&t.path().join("share/codebox/rootfs"));
        chmod(t.path(), 0o777); // not sticky: anyone could have made share/
        let euid = nix::unistd::geteuid().as_raw();
        let err = locate_among(candidates(None, None, Some(&exe)), euid).unwrap_err();
        assert!(err.to_string().contains("not used"), "{err}");
        // The same prefix made sticky (like /tmp) with share/ the user's own: used.
        chmod(t.path(), 0o1777);
        let found = locate_among(candidates(None, None, Some(&exe)), euid).unwrap();
        assert_eq!(found, t.path().join("share/codebox/rootfs"));
        // A world-writable tree itself is refused even below a sticky directory.
        chmod(&t.path().join("share/codebox/rootfs"), 0o777);
        assert!(trusted(&t.path().join("share/codebox/rootfs"), euid).is_err());
        // A named tree is the operator's choice: not second-guessed.
        let named = candidates(Some(&t.path().join("share/codebox/rootfs")), None, None);
        assert!(locate_among(named, euid).is_ok());
    }

    #[test]
    fn a_tree_owned_by_another_user_is_skipped_for_the_next_candidate() {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var_os("CODEBOX_TEST_STRICT").is_none(),
                "CODEBOX_TEST_STRICT: chown needs root"
            );
            eprintln!("skipped: chown to another user needs root");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let exe = t.path().join("a/bin/codebox");
        std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
        let planted = t.path().join("a/share/codebox/rootfs");
        plant(&planted);
        // Another user owns share/ (as if they had created it in a shared prefix).
        std::os::unix::fs::chown(t.path().join("a/share"), Some(4242), Some(4242)).unwrap();
        let good = t.path().join("a/rootfs");
        plant(&good);
        let found = locate_among(candidates(None, None, Some(&exe)), 0).unwrap();
        assert_eq!(found, good);
        assert!(trusted(&planted, 0).unwrap_err().contains("uid 4242"));
        // Reached through a symlink, the real place is what is checked.
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&planted, &link).unwrap();
        assert!(trusted(&link, 0).is_err());
    }
}
