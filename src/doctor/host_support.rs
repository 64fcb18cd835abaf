//! The supported-host rules the README states, as data: the kernel's version against what
//! codebox calls, and the sysctls that gate unprivileged user namespaces. Reading the
//! host (`uname`, `/proc/sys`) is separate from judging it, so every rule is unit-tested
//! with made-up values.
//!
//! What the kernel must have, from the code:
//! - 5.9: `close_range(2)` (every sandbox program closes its inherited descriptors with
//!   it; `sandbox/fds.rs`), and with it the older `clone3(2)` with `CLONE_PIDFD` (5.3,
//!   `sandbox/clone.rs`), `CLONE_INTO_CGROUP` (5.7, cgroup v2) and the new mount API
//!   `fsopen`/`fsmount`/`open_tree` (5.2, session workspaces).
//! - 6.7: Landlock ABI 4 (TCP port rules), which proxy mode needs; the `egress` line
//!   checks the ABI itself.
//! - 6.12: Landlock ABI 6 (scoped signals and abstract sockets), the ruleset's target;
//!   older kernels enforce part of it (the `landlock` line).

use super::{Check, Status};

/// The oldest kernel every sandbox can start on.
pub const MIN_KERNEL: (u32, u32) = (5, 9);
/// The kernel whose Landlock has every rule codebox writes.
pub const FULL_KERNEL: (u32, u32) = (6, 12);

/// `major.minor` from a `uname -r` string such as `6.1.0-18-amd64` or `5.15.0+`.
pub fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-', '+', '_']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The `kernel` line for the release string `uname -r` gave.
pub fn kernel_check(release: &str) -> Check {
    let (min_major, min_minor) = MIN_KERNEL;
    match parse_release(release) {
        None => Check::new(
            "kernel",
            Status::Degraded,
            format!("cannot read a version from {release:?}; the layers below are probed anyway"),
            false,
        ),
        Some(v) if v < MIN_KERNEL => Check::new(
            "kernel",
            Status::Missing,
            format!(
                "Linux {release}: older than {min_major}.{min_minor} (sandboxes need \
                 close_range, clone3 with CLONE_PIDFD and the new mount API)"
            ),
            true,
        )
        .fix(format!(
            "run on Linux ≥ {min_major}.{min_minor}; ≥ {}.{} enforces every Landlock rule",
            FULL_KERNEL.0, FULL_KERNEL.1
        )),
        Some(v) if v < FULL_KERNEL => Check::new(
            "kernel",
            Status::Ok,
            format!(
                "Linux {release} (≥ {min_major}.{min_minor}; Landlock's newest rules need {}.{}: see below)",
                FULL_KERNEL.0, FULL_KERNEL.1
            ),
            true,
        ),
        Some(_) => Check::new(
            "kernel",
            Status::Ok,
            format!("Linux {release} (≥ {}.{}: every feature codebox uses)", FULL_KERNEL.0, FULL_KERNEL.1),
            true,
        ),
    }
}

/// The kernel's running release (`uname -r`).
pub fn running_release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The sysctls that can refuse user namespaces; `None` where the file does not exist
/// (the knob is not in this kernel) or cannot be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsernsSysctls {
    /// `user.max_user_namespaces`: 0 refuses every new user namespace, root's too.
    pub max_user_namespaces: Option<u64>,
    /// `kernel.unprivileged_userns_clone` (Debian's and older Ubuntu kernels' patch):
    /// 0 refuses them to unprivileged users.
    pub unprivileged_userns_clone: Option<u64>,
    /// `kernel.apparmor_restrict_unprivileged_userns` (Ubuntu 23.10+): 1 gives an
    /// unprivileged process's user namespace no capabilities unless an AppArmor profile
    /// allows `userns`, so mounts inside fail.
    pub apparmor_restrict_unprivileged_userns: Option<u64>,
}

impl UsernsSysctls {
    /// Reads them from `/proc/sys`.
    pub fn read() -> UsernsSysctls {
        let read = |path: &str| {
            std::fs::read_to_string(path)
                .ok()
                .and_then(|s| s.trim().parse().ok())
        };
        UsernsSysctls {
            max_user_namespaces: read("/proc/sys/user/max_user_namespaces"),
            unprivileged_userns_clone: read("/proc/sys/kernel/unprivileged_userns_clone"),
            apparmor_restrict_unprivileged_userns: read(
                "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
            ),
        }
    }

    /// The settings that refuse user namespaces to everyone (`all`) or to unprivileged
    /// users, each with the command that lifts it.
    pub fn blockers(&self) -> Vec<(&'static str, &'static str)> {
        let mut out = Vec::new();
        if self.max_user_namespaces == Some(0) {
            out.push((
                "user.max_user_namespaces = 0 refuses every user namespace",
                "sysctl -w user.max_user_namespaces=15000",
            ));
        }
        if self.unprivileged_userns_clone == Some(0) {
            out.push((
                "kernel.unprivileged_userns_clone = 0 refuses them to unprivileged users",
                "sysctl -w kernel.unprivileged_userns_clone=1",
            ));
        }
        if self.apparmor_restrict_unprivileged_userns == Some(1) {
            out.push((
                "kernel.apparmor_restrict_unprivileged_userns = 1 leaves an unprivileged \
                 user's namespace without capabilities",
                "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 (or an AppArmor \
                 profile for codebox with `userns,`)",
            ));
        }
        out
    }

    /// The fix line of the `user namespaces` check: what is set, and how to lift it; when
    /// no sysctl refuses, what else does (a container runtime's seccomp or LSM profile).
    pub fn fix(&self) -> String {
        let blockers = self.blockers();
        if blockers.is_empty() {
            return "no sysctl refuses user namespaces here, so something around this process \
                    does: inside a container, run it with seccomp and AppArmor unconfined (or \
                    profiles allowing unshare/clone of user namespaces and mount) and an \
                    unmasked /proc (see docs/src/operations/deploy.md)"
                .to_string();
        }
        let (why, how): (Vec<&str>, Vec<&str>) = blockers.into_iter().unzip();
        format!(
            "{}; as root: {} (persist it in /etc/sysctl.d/)",
            why.join("; "),
            how.join("; ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_parse_as_distributions_write_them() {
        assert_eq!(parse_release("6.1.0-18-amd64"), Some((6, 1)));
        assert_eq!(parse_release("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(parse_release("6.18.0+"), Some((6, 18)));
        assert_eq!(parse_release("4.19.0_custom"), Some((4, 19)));
        assert_eq!(parse_release("6"), None);
        assert_eq!(parse_release(""), None);
        assert_eq!(parse_release("x.y"), None);
        assert_eq!(parse_release("99999999999.1"), None);
    }

    #[test]
    fn kernels_below_the_minimum_block_and_name_the_version() {
        let c = kernel_check("5.4.0-150-generic");
        assert_eq!(c.status, Status::Missing);
        assert!(c.blocks());
        assert!(c.fix.as_deref().unwrap().contains("5.9"), "{c:?}");
        // 5.10 > 5.9 numerically, not as strings.
        assert_eq!(kernel_check("5.10.0").status, Status::Ok);
        assert_eq!(kernel_check("5.9.0").status, Status::Ok);
        assert_eq!(kernel_check("5.8.18").status, Status::Missing);
        let full = kernel_check("6.12.0");
        assert!(full.detail.contains("every feature"), "{full:?}");
        assert!(kernel_check("6.11.9").detail.contains("Landlock"));
    }

    #[test]
    fn an_unreadable_release_does_not_block() {
        let c = kernel_check("garbage");
        assert_eq!(c.status, Status::Degraded);
        assert!(!c.blocks());
    }

    #[test]
    fn each_refusing_sysctl_is_named_with_its_command() {
        let s = UsernsSysctls {
            max_user_namespaces: Some(0),
            unprivileged_userns_clone: Some(0),
            apparmor_restrict_unprivileged_userns: Some(1),
        };
        let fix = s.fix();
        for needle in [
            "user.max_user_namespaces=15000",
            "kernel.unprivileged_userns_clone=1",
            "kernel.apparmor_restrict_unprivileged_userns=0",
            "/etc/sysctl.d/",
        ] {
            assert!(fix.contains(needle), "{needle} missing from {fix}");
        }
        let allowing = UsernsSysctls {
            max_user_namespaces: Some(15000),
            unprivileged_userns_clone: Some(1),
            apparmor_restrict_unprivileged_userns: Some(0),
        };
        assert!(allowing.blockers().is_empty());
        assert!(allowing.fix().contains("container"), "{}", allowing.fix());
        // Knobs absent from this kernel are not blockers.
        assert!(UsernsSysctls::default().blockers().is_empty());
    }
}
