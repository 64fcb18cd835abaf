//! What the zygote is told, as data: which sandboxes a zygote can serve (its key), the
//! zygote's own spec, the configuration it gets once, and one fork request per child.
//! Everything the Python side (`runtime/python/zygote.py`) does is decided here.

use std::path::Path;

use serde::Serialize;

use super::super::landlock::{self, LandlockPlan};
use super::super::plan::{LockedFlags, MountPlan, MountStep};
use super::super::seccomp::{CompiledFilter, SeccompProfile};
use super::super::spec::{NetworkAccess, Program, SandboxSpec, SecurityPolicy};
use super::Error;

/// The boot file a Python sandbox runs; a spec running anything else has no zygote.
pub const PYTHON_BOOT: &str = "/opt/codebox/python/boot.py";
/// The zygote's own program, beside it in the rootfs.
pub const ZYGOTE_PROGRAM: &str = "/opt/codebox/python/zygote.py";

/// Which zygote can serve `spec`: everything fixed in the zygote's mount namespace, its
/// environment and its policy, as one string; `None` when no zygote can serve it. What a
/// child gets per fork (its cgroup limits, tmpfs sizes, rlimits) is not part of it.
///
/// Not served: programs other than the Python boot, a workspace that is a host directory
/// or a session's own mount (the child would have to bind or attach it), and proxy-mode
/// networking (its listener is made by a cold sandbox's init; see `netns.rs`).
pub fn key(spec: &SandboxSpec) -> Option<String> {
    let boots_python = spec
        .program
        .argv
        .last()
        .is_some_and(|a| a.as_bytes() == PYTHON_BOOT.as_bytes());
    if !boots_python
        || !spec.program.inherit.is_empty()
        || spec.workspace.is_some()
        || spec.workspace_mount.is_some()
        || matches!(spec.policy.network, NetworkAccess::Proxy { .. })
    {
        return None;
    }
    let policy = &spec.policy;
    Some(format!(
        "{:?}",
        (
            &spec.rootfs,
            &spec.servers,
            &spec.skills,
            &spec.trust,
            &spec.packages,
            &spec.program,
            &spec.id_mapping,
            &spec.hostname,
            (policy.landlock, policy.network),
            policy.seccomp.as_ref().map(|f| f.policy().to_string()),
        )
    ))
}

/// The zygote's own sandbox: the child spec's rootfs, binds, environment and limits, with
/// `zygote.py` as the program, no landlock (a landlocked process may not change its
/// mounts: its children could not make their own) and the profile's filter without the
/// rules on `unshare` and `mount` ([`CompiledFilter::zygote_variant`]). Its children
/// apply both layers in full before any program code runs.
pub fn zygote_spec(child: &SandboxSpec) -> Result<SandboxSpec, Error> {
    let mut argv: Vec<&str> = Vec::new();
    let strings: Vec<String> = child
        .program
        .argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    for a in &strings {
        argv.push(if a == PYTHON_BOOT { ZYGOTE_PROGRAM } else { a });
    }
    let env: Vec<(String, String)> = child
        .program
        .env
        .iter()
        .filter_map(|e| {
            let e = e.to_string_lossy();
            let (k, v) = e.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let program = Program::new(
        &child.program.path.to_string_lossy(),
        &argv,
        &env,
        &child.program.cwd.to_string_lossy(),
    )
    .map_err(|e| Error::Spec(e.to_string()))?;
    let seccomp = match &child.policy.seccomp {
        Some(filter) => {
            let profile: SeccompProfile = filter
                .policy()
                .parse()
                .map_err(|e: super::super::seccomp::Error| Error::Spec(e.to_string()))?;
            Some(CompiledFilter::zygote_variant(profile).map_err(|e| Error::Spec(e.to_string()))?)
        }
        None => None,
    };
    Ok(SandboxSpec {
        rootfs: child.rootfs.clone(),
        workspace: None,
        workspace_mount: None,
        servers: child.servers.clone(),
        skills: child.skills.clone(),
        trust: child.trust.clone(),
        packages: child.packages.clone(),
        program,
        limits: child.limits.clone(),
        id_mapping: child.id_mapping,
        hostname: child.hostname.clone(),
        policy: SecurityPolicy {
            landlock: None,
            network: child.policy.network,
            seccomp,
        },
    })
}

/// Sent once, when the zygote starts: the layers every child applies.
#[derive(Debug, Clone, Serialize)]
pub struct ZygoteConfig {
    /// The child's full seccomp filter (`struct sock_filter` bytes), hex; empty: none.
    pub seccomp: String,
    /// The child's landlock ruleset for this kernel; `None`: not enforced.
    pub landlock: Option<LandlockPlan>,
    pub hostname: String,
    /// The sandbox uid and gid (the zygote's, mapped onto itself in each child).
    pub id: u32,
    /// Timings of every step on the zygote's stderr (`CODEBOX_ZYGOTE_TRACE=1` in the
    /// spawner's environment), logged by the spawner.
    pub trace: bool,
}

/// The configuration for children of `child`'s kind on a kernel with `kernel_abi`.
pub fn config(child: &SandboxSpec, kernel_abi: Option<u32>) -> Result<ZygoteConfig, Error> {
    let seccomp = child
        .policy
        .seccomp
        .as_ref()
        .map(|f| hex(&f.to_bytes()))
        .unwrap_or_default();
    let landlock = match child.policy.landlock {
        Some(mode) => landlock::plan_for_kernel(mode, child.policy.network, kernel_abi)
            .map_err(Error::Spec)?,
        None => None,
    };
    Ok(ZygoteConfig {
        seccomp,
        landlock,
        hostname: child.hostname.clone(),
        id: super::super::idmap::SANDBOX_ID,
        trace: std::env::var_os("CODEBOX_ZYGOTE_TRACE").is_some_and(|v| v == "1"),
    })
}

/// One fork: the child's own filesystems and rlimits; `joins` descriptors (its cgroup
/// directories' `tasks` / `cgroup.procs`) follow the seven fixed ones.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ForkRequest {
    pub mounts: Vec<ChildMount>,
    pub rlimits: Rlimits,
    pub joins: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChildMount {
    /// `proc` or `tmpfs`.
    pub kind: &'static str,
    /// Inside the sandbox.
    pub target: String,
    pub flags: u64,
    /// The tmpfs options (size, mode, owner).
    pub data: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rlimits {
    pub nofile: u64,
    pub fsize: u64,
}

/// The fork request for `child`: the procfs and every tmpfs of its cold mount plan but
/// `/dev` (the zygote's, read-only and holding only device binds), at the same paths,
/// sizes, modes and flags.
pub fn fork_request(child: &SandboxSpec, joins: usize) -> ForkRequest {
    let plan = MountPlan::for_spec(child, LockedFlags::default());
    let inside = |target: &Path| {
        let rel = target.strip_prefix(&child.rootfs).unwrap_or(target);
        format!("/{}", rel.display())
    };
    let mut mounts = Vec::new();
    for step in &plan.steps {
        match step {
            MountStep::Proc { target } => mounts.push(ChildMount {
                kind: "proc",
                target: inside(target),
                flags: (nix::mount::MsFlags::MS_NOSUID
                    | nix::mount::MsFlags::MS_NODEV
                    | nix::mount::MsFlags::MS_NOEXEC)
                    .bits(),
                data: String::new(),
            }),
            MountStep::Tmpfs {
                target,
                size_bytes,
                mode,
                flags,
            } if inside(target) != "/dev" => mounts.push(ChildMount {
                kind: "tmpfs",
                target: inside(target),
                flags: flags.bits(),
                data: MountPlan::tmpfs_options(*size_bytes, *mode),
            }),
            _ => {}
        }
    }
    ForkRequest {
        mounts,
        rlimits: Rlimits {
            nofile: child.limits.open_files,
            fsize: child.limits.file_size_bytes,
        },
        joins,
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Language;
    use crate::sandbox::{IdMapping, Limits};

    fn python_spec() -> SandboxSpec {
        SandboxSpec {
            rootfs: "/srv/rootfs".into(),
            workspace: None,
            workspace_mount: None,
            servers: Some("/tmp/codebox-servers-1/v3".into()),
            skills: None,
            trust: None,
            packages: None,
            program: Language::Python.program().unwrap(),
            limits: Limits::default(),
            id_mapping: IdMapping::rootless(1000, 1000),
            hostname: "codebox".into(),
            policy: SecurityPolicy::default_profile().unwrap(),
        }
    }

    #[test]
    fn only_python_boots_with_a_private_workspace_and_no_proxy_have_a_zygote() {
        let spec = python_spec();
        assert!(key(&spec).is_some());
        let mut limits = spec.clone();
        limits.limits.memory_bytes = Some(1 << 28);
        limits.limits.tmpfs_bytes = 1 << 20;
        assert_eq!(key(&spec), key(&limits), "per-child limits share a zygote");
        for change in [
            |s: &mut SandboxSpec| s.program = Language::TypeScript.program().unwrap(),
            |s: &mut SandboxSpec| s.workspace = Some("/srv/ws".into()),
            |s: &mut SandboxSpec| s.workspace_mount = Some(9),
            |s: &mut SandboxSpec| s.policy.network = NetworkAccess::Proxy { port: 3128 },
        ] {
            let mut s = python_spec();
            change(&mut s);
            assert_eq!(key(&s), None);
        }
        for change in [
            |s: &mut SandboxSpec| s.servers = Some("/tmp/codebox-servers-1/v4".into()),
            |s: &mut SandboxSpec| s.skills = Some("/srv/skills".into()),
            |s: &mut SandboxSpec| s.packages = Some("/srv/layer".into()),
            |s: &mut SandboxSpec| s.program.set_env(&[("CODEBOX_PRELOAD", "numpy")]).unwrap(),
            |s: &mut SandboxSpec| s.policy.network = NetworkAccess::Loopback,
        ] {
            let mut s = python_spec();
            change(&mut s);
            assert!(key(&s).is_some());
            assert_ne!(key(&s), key(&spec), "{:?}", s.program.env);
        }
    }

    #[test]
    fn the_zygote_runs_zygote_py_without_landlock_and_with_the_relaxed_filter() {
        let child = python_spec();
        let z = zygote_spec(&child).unwrap();
        let argv: Vec<String> = z
            .program
            .argv
            .iter()
            .map(|a| a.to_string_lossy().into())
            .collect();
        assert_eq!(argv.last().unwrap(), ZYGOTE_PROGRAM);
        assert_eq!(&argv[..argv.len() - 1], &["python3", "-I", "-S", "-B"]);
        assert_eq!(z.program.env, child.program.env);
        assert_eq!(z.policy.landlock, None);
        assert_eq!(
            z.policy.seccomp.as_ref().unwrap().policy(),
            "default+zygote"
        );
        assert_eq!((z.servers, z.workspace), (child.servers, None));
    }

    #[test]
    fn a_fork_request_remakes_every_writable_filesystem_of_the_cold_plan() {
        let mut child = python_spec();
        child.limits.tmpfs_bytes = 5 << 20;
        child.limits.shm_bytes = 3 << 20;
        child.limits.open_files = 77;
        let r = fork_request(&child, 5);
        let targets: Vec<&str> = r.mounts.iter().map(|m| m.target.as_str()).collect();
        assert_eq!(targets, ["/proc", "/dev/shm", "/tmp", "/workspace"]);
        assert_eq!(r.mounts[0].kind, "proc");
        assert_eq!(r.mounts[2].data, "size=5242880,mode=1777,uid=1000,gid=1000");
        assert_eq!(r.mounts[1].data, "size=3145728,mode=1777,uid=1000,gid=1000");
        let writable = crate::sandbox::plan::WRITABLE_FLAGS.bits();
        for m in &r.mounts[1..] {
            assert_eq!(m.flags & writable, writable, "{m:?}: nosuid, nodev, noexec");
        }
        assert_eq!((r.rlimits.nofile, r.joins), (77, 5));
    }

    #[test]
    fn the_config_carries_the_full_filter_and_this_kernels_landlock_plan() {
        let child = python_spec();
        let c = config(&child, Some(6)).unwrap();
        let full = child.policy.seccomp.as_ref().unwrap().to_bytes();
        assert_eq!(c.seccomp, hex(&full));
        assert_eq!(c.landlock.unwrap().status, 2);
        assert_eq!(c.id, 1000);
        assert!(
            config(&child, None).unwrap().landlock.is_none(),
            "best effort"
        );
    }
}
