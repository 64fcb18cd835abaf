//! Whether the sandbox user can reach a host directory a sandbox binds (skills, the
//! egress trust bundle, the package cache): checked at start-up, so a directory it
//! cannot reach is a clear error instead of sandboxes that fail to start.

/// The setting that names the skills directory, for [`reachable_by`]'s message.
pub(in crate::server) const SKILLS_DIR: &str = "skills_dir (CODEBOX_SKILLS_DIR)";

/// Whether the sandbox user (host ids `ids`) can pass through every directory above
/// `dir` and read `dir` itself: the sandbox's init binds it, with the sandbox user's
/// rights. A directory it cannot reach would make every sandbox fail to start.
pub fn reachable_by(
    dir: &std::path::Path,
    (uid, gid): (u32, u32),
    setting: &str,
) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    for (i, d) in dir.ancestors().enumerate() {
        let m = std::fs::metadata(d).map_err(|e| format!("{}: {e}", d.display()))?;
        let mode = m.mode();
        let bits = if m.uid() == uid {
            mode >> 6
        } else if m.gid() == gid {
            mode >> 3
        } else {
            mode
        };
        let needed = if i == 0 { 0o5 } else { 0o1 };
        if bits & needed != needed {
            return Err(format!(
                "the sandbox user (host uid {uid}) cannot reach {}: {} has mode {:o}; set \
                 {setting} to a directory it can read",
                dir.display(),
                d.display(),
                mode & 0o7777
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{reachable_by, SKILLS_DIR};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn a_directory_behind_a_private_parent_is_unreachable() {
        let base = tempfile::tempdir().unwrap();
        let open = base.path().join("open");
        std::fs::create_dir_all(open.join("skills")).unwrap();
        let closed = base.path().join("closed");
        std::fs::create_dir_all(closed.join("skills")).unwrap();
        for d in [
            base.path(),
            &open,
            &open.join("skills"),
            &closed.join("skills"),
        ] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        // Someone who owns nothing here.
        let owner = std::fs::metadata(base.path()).unwrap().uid();
        let stranger = (owner + 12345, owner + 12345);
        reachable_by(&open.join("skills"), stranger, SKILLS_DIR).unwrap();
        let why = reachable_by(&closed.join("skills"), stranger, SKILLS_DIR).unwrap_err();
        assert!(why.contains("mode 700"), "{why}");
        reachable_by(&closed.join("skills"), (owner, owner), SKILLS_DIR).unwrap();
    }
}
