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

/// Device nodes a jailed VMM may open read-write and ioctl when they are there: only a
/// KVM jail's `/dev` has one (`microvm/jail.rs`); no language sandbox's does, and a path
/// that is not there gets no rule.
pub const VMM_DEVICES: &[&str] = &["/dev/kvm"];

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
        .add_rules(path_beneath_rules(DEVICES, device_access))?
        .add_rules(path_beneath_rules(
            VMM_DEVICES
                .iter()
                .filter(|p| std::path::Path::new(p).exists()),
            device_access,
        ))?;
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

/// The ruleset [`restrict_self`] builds, resolved for a kernel's Landlock ABI as plain
/// numbers: what a process that cannot link the landlock crate (the Python zygote's
/// children, `sandbox/zygote/`) needs to make the same three syscalls. Best effort is
/// resolved here as the crate resolves it: every right the kernel does not know is left
/// out of both the handled set and the rules.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LandlockPlan {
    pub handled_fs: u64,
    pub handled_net: u64,
    pub scoped: u64,
    /// Bytes of `struct landlock_ruleset_attr` the kernel knows (8, 16 or 24).
    pub attr_size: usize,
    /// `(path, allowed access)` path-beneath rules.
    pub paths: Vec<(String, u64)>,
    /// `(port, allowed access)` TCP port rules.
    pub ports: Vec<(u16, u64)>,
    /// The status code ([`LandlockStatus::code`]) the kernel will enforce.
    pub status: u32,
}

/// The plan for a kernel whose Landlock ABI is `kernel_abi` (`None`: no Landlock):
/// `Ok(None)` when there is nothing to enforce, an error when `mode` requires more than
/// the kernel can enforce.
pub fn plan_for_kernel(
    mode: LandlockMode,
    network: NetworkAccess,
    kernel_abi: Option<u32>,
) -> Result<Option<LandlockPlan>, String> {
    let target = TARGET_ABI as u32;
    let level = kernel_abi.unwrap_or(0).min(target);
    let status = match level {
        0 => LandlockStatus::NotEnforced,
        l if l == target => LandlockStatus::FullyEnforced,
        _ => LandlockStatus::PartiallyEnforced,
    };
    if mode == LandlockMode::Required && status != LandlockStatus::FullyEnforced {
        return Err(format!(
            "the profile requires Landlock ABI {target}; this kernel has {}",
            kernel_abi.unwrap_or(0)
        ));
    }
    if level == 0 {
        return Ok(None);
    }
    let abi = ABI::from(level as i32);
    let all = AccessFs::from_all(abi);
    let device = (AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev) & all;
    let net_rules = level >= NET_ABI && network != NetworkAccess::Loopback;
    let handled_net = if net_rules {
        (AccessNet::BindTcp | AccessNet::ConnectTcp).bits()
    } else {
        0
    };
    let scoped = (Scope::AbstractUnixSocket | Scope::Signal) & Scope::from_all(abi);
    let mut paths: Vec<(String, u64)> = Vec::new();
    for (set, access) in [
        (READ_EXEC, AccessFs::from_read(abi)),
        (READ_WRITE, all),
        (DEVICES, device),
    ] {
        paths.extend(set.iter().map(|p| (p.to_string(), access.bits())));
    }
    let ports = match network {
        NetworkAccess::Proxy { port } if net_rules => vec![(port, AccessNet::ConnectTcp as u64)],
        _ => vec![],
    };
    Ok(Some(LandlockPlan {
        handled_fs: all.bits(),
        handled_net,
        scoped: scoped.bits(),
        attr_size: match level {
            1..=3 => 8,
            4 | 5 => 16,
            _ => 24,
        },
        paths,
        ports,
        status: status.code(),
    }))
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
    fn a_plan_resolves_best_effort_per_kernel_abi() {
        let none = NetworkAccess::None;
        let full = plan_for_kernel(LandlockMode::BestEffort, none, Some(7))
            .unwrap()
            .unwrap();
        assert_eq!(full.status, LandlockStatus::FullyEnforced.code());
        assert_eq!(full.attr_size, 24);
        assert_eq!(full.handled_fs, AccessFs::from_all(ABI::V6).bits());
        assert_ne!(
            full.handled_net, 0,
            "TCP is handled: denied but for the rules"
        );
        assert_ne!(full.scoped, 0);
        assert!(full.ports.is_empty());
        let (root, root_access) = &full.paths[0];
        assert_eq!(root, "/");
        assert_eq!(*root_access, AccessFs::from_read(ABI::V6).bits());
        for (path, access) in &full.paths {
            assert_eq!(access & !full.handled_fs, 0, "{path}: only handled rights");
        }

        let old = plan_for_kernel(LandlockMode::BestEffort, none, Some(3))
            .unwrap()
            .unwrap();
        assert_eq!(old.status, LandlockStatus::PartiallyEnforced.code());
        assert_eq!((old.attr_size, old.handled_net, old.scoped), (8, 0, 0));
        assert_eq!(
            plan_for_kernel(LandlockMode::BestEffort, none, None).unwrap(),
            None
        );
        assert!(plan_for_kernel(LandlockMode::Required, none, Some(5)).is_err());
    }

    #[test]
    fn a_plan_in_proxy_mode_allows_connecting_to_the_egress_port_only() {
        let proxy = NetworkAccess::Proxy { port: 3128 };
        let p = plan_for_kernel(LandlockMode::BestEffort, proxy, Some(6))
            .unwrap()
            .unwrap();
        assert_eq!(p.ports, vec![(3128, AccessNet::ConnectTcp as u64)]);
        let lo = plan_for_kernel(LandlockMode::BestEffort, NetworkAccess::Loopback, Some(6))
            .unwrap()
            .unwrap();
        assert_eq!(
            (lo.handled_net, lo.ports.len()),
            (0, 0),
            "loopback: TCP unrestricted"
        );
    }

    #[test]
    fn writable_paths_are_only_scratch_space() {
        for p in READ_WRITE {
            assert!(["/tmp", "/dev/shm", "/workspace"].contains(p), "{p}");
        }
        assert!(!READ_WRITE.contains(&"/"));
    }
}
