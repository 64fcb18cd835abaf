//! Landlock: the program may read and execute the rootfs, read and write only its scratch
//! space, and (ABI ≥ 4) make no TCP bind, and no TCP connect except, in proxy mode, to
//! the egress port; (ABI ≥ 6) it may not reach abstract unix sockets or signal processes
//! outside its own domain, such as the sandbox init.
//!
//! Applied by the program process after `no_new_privs` and before seccomp, with paths as
//! the sandbox sees them (after `pivot_root`). Best effort by default: the kernel enforces
//! what it supports, and the status (fully / partially / not enforced) is reported back to
//! the supervisor. A profile may make it a hard requirement, and then a kernel that cannot
//! enforce all of it fails the sandbox setup.

use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetError, RulesetStatus, Scope, ABI,
};

use super::spec::NetworkAccess;

/// The first Landlock ABI with TCP rules (bind and connect by port): what proxy mode
/// needs for its one way out.
pub const NET_ABI: u32 = 4;

/// The Landlock ABI the ruleset is written for: every filesystem right, TCP, and scopes.
pub const TARGET_ABI: ABI = ABI::V6;

/// Paths the program may read, list and execute.
pub const READ_EXEC: &[&str] = &["/"];
/// Paths the program may read and write (create, remove, rename, truncate ...).
pub const READ_WRITE: &[&str] = &["/tmp", "/dev/shm", "/workspace"];
/// Device nodes the program may write to (and ioctl, e.g. isatty on /dev/null).
pub const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// How strictly landlock is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LandlockMode {
    /// Enforce what the kernel supports; report the status.
    BestEffort,
    /// Fail the sandbox setup unless everything is enforced.
    Required,
}

/// What the kernel enforced.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum LandlockStatus {
    FullyEnforced,
    PartiallyEnforced,
    NotEnforced,
}

impl LandlockStatus {
    pub fn code(self) -> u32 {
        match self {
            LandlockStatus::FullyEnforced => 2,
            LandlockStatus::PartiallyEnforced => 1,
            LandlockStatus::NotEnforced => 0,
        }
    }

    pub fn from_code(code: u32) -> Option<Self> {
        match code {
            2 => Some(LandlockStatus::FullyEnforced),
            1 => Some(LandlockStatus::PartiallyEnforced),
            0 => Some(LandlockStatus::NotEnforced),
            _ => None,
        }
    }
}

/// Restricts the calling process (and everything it execs or forks).
pub fn restrict_self(
    mode: LandlockMode,
    network: NetworkAccess,
) -> Result<LandlockStatus, RulesetError> {
    let abi = TARGET_ABI;
    let compat = match mode {
        LandlockMode::BestEffort => CompatLevel::BestEffort,
        LandlockMode::Required => CompatLevel::HardRequirement,
    };
    let mut ruleset = Ruleset::default()
        .set_compatibility(compat)
        .handle_access(AccessFs::from_all(abi))?;
    if network != NetworkAccess::Loopback {
        // Handled: every TCP bind and connect is denied but what a rule below allows.
        ruleset = ruleset.handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)?;
    }
    let device_access = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev;
    let mut created = ruleset
        .scope(Scope::AbstractUnixSocket | Scope::Signal)?
        .create()?
        .add_rules(path_beneath_rules(READ_EXEC, AccessFs::from_read(abi)))?
        .add_rules(path_beneath_rules(READ_WRITE, AccessFs::from_all(abi)))?
        .add_rules(path_beneath_rules(DEVICES, device_access))?;
    if let NetworkAccess::Proxy { port } = network {
        // The one way out: connect to the egress port (any address, but the namespace's
        // only listener on it is the supervisor's, on 127.0.0.1). No bind rule: the
        // program cannot listen, nor take a port of its own before connecting.
        created = created.add_rule(NetPort::new(port, AccessNet::ConnectTcp))?;
    }
    let status = created.restrict_self()?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => LandlockStatus::FullyEnforced,
        RulesetStatus::PartiallyEnforced => LandlockStatus::PartiallyEnforced,
        RulesetStatus::NotEnforced => LandlockStatus::NotEnforced,
    })
}

/// The Landlock ABI version of the running kernel, or `None` when Landlock is unavailable.
pub fn kernel_abi() -> Option<u32> {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) only returns
    // the ABI version (or an error); no memory is passed.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    (v > 0).then_some(v as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_round_trip() {
        for s in [
            LandlockStatus::FullyEnforced,
            LandlockStatus::PartiallyEnforced,
            LandlockStatus::NotEnforced,
        ] {
            assert_eq!(LandlockStatus::from_code(s.code()), Some(s));
        }
        assert_eq!(LandlockStatus::from_code(7), None);
    }

    #[test]
    fn writable_paths_are_only_scratch_space() {
        for p in READ_WRITE {
            assert!(["/tmp", "/dev/shm", "/workspace"].contains(p), "{p}");
        }
        assert!(!READ_WRITE.contains(&"/"));
    }
}
