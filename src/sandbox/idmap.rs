//! User and group id mapping between the host and the sandbox's user namespace.
//!
//! Inside, the program always runs as the `sandbox` user (uid/gid 1000 in the rootfs's
//! `/etc/passwd`). Outside, that id is:
//! - rootless: the caller's own uid/gid (the only id an unprivileged user may map);
//! - as root: an unprivileged host id (default 65534, `nobody`), so that host root is
//!   never root-equivalent inside.

/// The uid and gid the program has inside the sandbox.
pub const SANDBOX_ID: u32 = 1000;

/// The host id root maps the sandbox user to by default (`nobody`/`nogroup`).
pub const DEFAULT_ROOT_HOST_ID: u32 = 65534;

/// How the sandbox user maps to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMapping {
    pub host_uid: u32,
    pub host_gid: u32,
    /// Whether the caller is privileged (may write arbitrary maps and keep `setgroups`).
    pub privileged: bool,
}

impl IdMapping {
    /// Mapping for an unprivileged caller.
    pub fn rootless(uid: u32, gid: u32) -> Self {
        IdMapping {
            host_uid: uid,
            host_gid: gid,
            privileged: false,
        }
    }

    /// Mapping for a root caller: the sandbox user becomes `host_id` on the host.
    pub fn for_root(host_id: u32) -> Self {
        IdMapping {
            host_uid: host_id,
            host_gid: host_id,
            privileged: true,
        }
    }

    /// The mapping for the current process: rootless unless euid is 0.
    pub fn for_current_process(root_host_id: u32) -> Self {
        let uid = nix::unistd::geteuid().as_raw();
        let gid = nix::unistd::getegid().as_raw();
        if uid == 0 {
            Self::for_root(root_host_id)
        } else {
            Self::rootless(uid, gid)
        }
    }

    /// Contents of `/proc/<pid>/uid_map`.
    pub fn uid_map(&self) -> String {
        format!("{SANDBOX_ID} {} 1\n", self.host_uid)
    }

    /// Contents of `/proc/<pid>/gid_map`.
    pub fn gid_map(&self) -> String {
        format!("{SANDBOX_ID} {} 1\n", self.host_gid)
    }

    /// Contents of `/proc/<pid>/setgroups`, if it must be written before `gid_map`.
    ///
    /// An unprivileged writer must deny `setgroups` (user_namespaces(7)). A privileged
    /// writer leaves it allowed so the child can drop root's supplementary groups, which
    /// would otherwise follow it into the sandbox.
    pub fn setgroups(&self) -> Option<&'static str> {
        (!self.privileged).then_some("deny")
    }

    /// Whether the child must clear its supplementary groups.
    pub fn must_clear_groups(&self) -> bool {
        self.privileged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rootless_maps_caller_and_denies_setgroups() {
        let m = IdMapping::rootless(1001, 1002);
        assert_eq!(m.uid_map(), "1000 1001 1\n");
        assert_eq!(m.gid_map(), "1000 1002 1\n");
        assert_eq!(m.setgroups(), Some("deny"));
        assert!(!m.must_clear_groups());
    }

    #[test]
    fn root_maps_to_unprivileged_host_id() {
        let m = IdMapping::for_root(DEFAULT_ROOT_HOST_ID);
        assert_eq!(m.uid_map(), "1000 65534 1\n");
        assert_eq!(m.gid_map(), "1000 65534 1\n");
        assert_eq!(m.setgroups(), None);
        assert!(m.must_clear_groups());
    }

    #[test]
    fn host_root_is_never_mapped() {
        for m in [IdMapping::for_root(65534), IdMapping::for_root(100_000)] {
            assert!(!m.uid_map().split_whitespace().nth(1).unwrap().eq("0"));
        }
    }
}
