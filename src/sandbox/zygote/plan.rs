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
/// or a session's own mount (the child would have to bind or attach it), proxy-mode
/// networking (its listener is made by a cold sandbox's init; see `netns.rs`), and
/// numerical thread pools of more than one thread (`runtime::thread_env`): a zygote must
/// stay single-threaded, since each child is made in its memory (`runtime/zygote/fork.c`).
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
        || runs_thread_pools(spec)
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

/// Whether `spec`'s environment lets numerical libraries (OpenBLAS, OpenMP) start worker
/// threads at import: more than one thread in `OPENBLAS_NUM_THREADS` or `OMP_NUM_THREADS`.
fn runs_thread_pools(spec: &SandboxSpec) -> bool {
    spec.program.env.iter().any(|e| {
        let e = e.to_string_lossy();
        let Some((name, value)) = e.split_once('=') else {
            return false;
        };
        matches!(name, "OPENBLAS_NUM_THREADS" | "OMP_NUM_THREADS")
            && value.trim().parse::<u32>().map_or(true, |n| n > 1)
    })
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
/// directories' `tasks` / `cgroup.procs`) follow the seven fixed ones. Sent as
/// [`ForkRequest::to_bytes`]: the zygote's native loop (`runtime/zygote/fork.c`) reads it
/// without running any Python.
#[derive(Debug, Clone, PartialEq)]
pub struct ForkRequest {
    pub mounts: Vec<ChildMount>,
    pub rlimits: Rlimits,
    pub joins: usize,
    /// The child runs boot.py's program path once before it says ready
    /// ([`FLAG_WARM_UP`]): a pooled sandbox, which waits for its code anyway.
    pub warm_up: bool,
}

/// `ForkRequest::to_bytes`'s first word ("CZBZ" little-endian), then its version.
pub const REQUEST_MAGIC: u32 = 0x5a42_5a43;
pub const REQUEST_VERSION: u32 = 1;
/// The request's flag: run the warm-up before ready.
pub const FLAG_WARM_UP: u32 = 1;
/// The most mounts and joins the native loop takes (`MAX_MOUNTS`, `MAX_JOINS` there).
pub const MAX_MOUNTS: usize = 16;
pub const MAX_JOINS: usize = 16;

#[derive(Debug, Clone, PartialEq)]
pub struct ChildMount {
    /// `proc` or `tmpfs`.
    pub kind: MountKind,
    /// Inside the sandbox.
    pub target: String,
    pub flags: u64,
    /// The tmpfs options (size, mode, owner).
    pub data: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountKind {
    Proc = 1,
    Tmpfs = 2,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rlimits {
    pub nofile: u64,
    pub fsize: u64,
}

impl ForkRequest {
    /// The request as the native loop reads it, little-endian: magic, version, flags,
    /// joins, nofile, fsize, the mount count, then per mount its kind, flags, the lengths
    /// of target and data, target, data (no terminating NUL).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + self.mounts.len() * 80);
        let u32le = |b: &mut Vec<u8>, v: u32| b.extend_from_slice(&v.to_le_bytes());
        u32le(&mut b, REQUEST_MAGIC);
        u32le(&mut b, REQUEST_VERSION);
        u32le(&mut b, if self.warm_up { FLAG_WARM_UP } else { 0 });
        u32le(&mut b, self.joins as u32);
        b.extend_from_slice(&self.rlimits.nofile.to_le_bytes());
        b.extend_from_slice(&self.rlimits.fsize.to_le_bytes());
        u32le(&mut b, self.mounts.len() as u32);
        for m in &self.mounts {
            u32le(&mut b, m.kind as u32);
            b.extend_from_slice(&m.flags.to_le_bytes());
            u32le(&mut b, m.target.len() as u32);
            u32le(&mut b, m.data.len() as u32);
            b.extend_from_slice(m.target.as_bytes());
            b.extend_from_slice(m.data.as_bytes());
        }
        b
    }
}

/// The fork request for `child`: the procfs and every tmpfs of its cold mount plan but
/// `/dev` (the zygote's, read-only and holding only device binds), at the same paths,
/// sizes, modes and flags.
pub fn fork_request(child: &SandboxSpec, joins: usize, warm_up: bool) -> ForkRequest {
    let plan = MountPlan::for_spec(child, LockedFlags::default());
    let inside = |target: &Path| {
        let rel = target.strip_prefix(&child.rootfs).unwrap_or(target);
        format!("/{}", rel.display())
    };
    let mut mounts = Vec::new();
    for step in &plan.steps {
        match step {
            MountStep::Proc { target } => mounts.push(ChildMount {
                kind: MountKind::Proc,
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
                kind: MountKind::Tmpfs,
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
        warm_up,
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
            |s: &mut SandboxSpec| {
                s.program
                    .set_env(&[("OPENBLAS_NUM_THREADS", "2"), ("OMP_NUM_THREADS", "2")])
                    .unwrap()
            },
            |s: &mut SandboxSpec| s.program.set_env(&[("OMP_NUM_THREADS", "many")]).unwrap(),
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
            |s: &mut SandboxSpec| {
                s.program
                    .set_env(&[("OPENBLAS_NUM_THREADS", "1"), ("OMP_NUM_THREADS", "1")])
                    .unwrap()
            },
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
        let r = fork_request(&child, 5, true);
        let targets: Vec<&str> = r.mounts.iter().map(|m| m.target.as_str()).collect();
        assert_eq!(targets, ["/proc", "/dev/shm", "/tmp", "/workspace"]);
        assert_eq!(r.mounts[0].kind, MountKind::Proc);
        assert_eq!(r.mounts[2].data, "size=5242880,mode=1777,uid=1000,gid=1000");
        assert_eq!(r.mounts[1].data, "size=3145728,mode=1777,uid=1000,gid=1000");
        let writable = crate::sandbox::plan::WRITABLE_FLAGS.bits();
        for m in &r.mounts[1..] {
            assert_eq!(m.flags & writable, writable, "{m:?}: nosuid, nodev, noexec");
        }
        assert_eq!((r.rlimits.nofile, r.joins, r.warm_up), (77, 5, true));
        assert!(r.mounts.len() <= MAX_MOUNTS);
    }

    #[test]
    fn a_fork_request_is_laid_out_as_the_native_loop_reads_it() {
        let r = ForkRequest {
            mounts: vec![
                ChildMount {
                    kind: MountKind::Proc,
                    target: "/proc".into(),
                    flags: 14,
                    data: String::new(),
                },
                ChildMount {
                    kind: MountKind::Tmpfs,
                    target: "/tmp".into(),
                    flags: 6,
                    data: "size=1".into(),
                },
            ],
            rlimits: Rlimits {
                nofile: 0x0102,
                fsize: 1 << 40,
            },
            joins: 3,
            warm_up: true,
        };
        let b = r.to_bytes();
        let word = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let long = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        assert_eq!(&b[..4], b"CZBZ");
        assert_eq!(
            (word(0), word(4), word(8), word(12)),
            (REQUEST_MAGIC, 1, 1, 3)
        );
        assert_eq!((long(16), long(24), word(32)), (0x0102, 1 << 40, 2));
        // proc: kind, flags, target length, data length, "/proc"
        assert_eq!((word(36), long(40), word(48), word(52)), (1, 14, 5, 0));
        assert_eq!(&b[56..61], b"/proc");
        assert_eq!((word(61), long(65), word(73), word(77)), (2, 6, 4, 6));
        assert_eq!(&b[81..], b"/tmpsize=1");
        let cold = ForkRequest {
            warm_up: false,
            ..r.clone()
        };
        assert_eq!(word_of(&cold.to_bytes(), 8), 0);
        // The C side checks the same numbers.
        let c = include_str!("../../runtime/zygote/fork.c");
        assert!(
            c.contains(&format!("#define REQUEST_MAGIC {REQUEST_MAGIC:#x}u")),
            "magic"
        );
        assert!(c.contains(&format!("#define REQUEST_VERSION {REQUEST_VERSION}u")));
        assert!(c.contains(&format!("#define MAX_MOUNTS {MAX_MOUNTS}\n")));
        assert!(c.contains(&format!("#define MAX_JOINS {MAX_JOINS}\n")));
        assert!(c.contains("#define MOUNT_PROC 1u") && c.contains("#define MOUNT_TMPFS 2u"));
        let py = include_str!("../../runtime/python/zygote.py");
        assert!(py.contains(&format!("FLAG_WARM_UP = {FLAG_WARM_UP}\n")));
    }

    fn word_of(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
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
