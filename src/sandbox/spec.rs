//! What a sandbox is asked to run, and within which limits.
//!
//! A [`SandboxSpec`] is plain data: it is validated and turned into a mount plan and an
//! exec image before any process is created, so everything the child does after `clone3`
//! is already decided.

use std::ffi::CString;
use std::path::PathBuf;
use std::time::Duration;

use super::error::{Error, Result};
use super::idmap::IdMapping;
use super::landlock::LandlockMode;
use super::seccomp::{CompiledFilter, SeccompProfile};

/// Default cap on captured stdout, and separately on stderr.
pub const DEFAULT_OUTPUT_CAP: usize = 1024 * 1024;

/// Limits applied to one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// Wall-clock time from the program's start until the whole sandbox is killed.
    pub timeout: Duration,
    /// Bytes of stdout kept; the rest is counted and dropped.
    pub stdout_cap: usize,
    /// Bytes of stderr kept; the rest is counted and dropped.
    pub stderr_cap: usize,
    /// Size of the tmpfs mounted at `/tmp` (and of `/workspace` when no host directory is bound).
    pub tmpfs_bytes: u64,
    /// Size of the tmpfs mounted at `/dev/shm`.
    pub shm_bytes: u64,
    /// `RLIMIT_NOFILE` for the program.
    pub open_files: u64,
    /// `RLIMIT_FSIZE` for the program: the largest file it may write.
    pub file_size_bytes: u64,
    /// cgroup memory limit (no swap).
    pub memory_bytes: Option<u64>,
    /// cgroup task limit (processes and threads).
    pub pids: Option<u64>,
    /// cgroup CPU bandwidth, in thousandths of a core.
    pub cpu_millicores: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(30),
            stdout_cap: DEFAULT_OUTPUT_CAP,
            stderr_cap: DEFAULT_OUTPUT_CAP,
            tmpfs_bytes: 64 * 1024 * 1024,
            shm_bytes: 16 * 1024 * 1024,
            open_files: 256,
            file_size_bytes: 256 * 1024 * 1024,
            memory_bytes: None,
            pids: None,
            cpu_millicores: None,
        }
    }
}

/// What the program may do with the network namespace it gets (always its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkAccess {
    /// No TCP at all (landlock), no IP sockets (the seccomp profile); `lo` stays down.
    None,
    /// IP sockets and TCP inside the namespace, whose only interface (`lo`) is down.
    Loopback,
    /// The egress proxy's way out: the init brings `lo` up and binds a listening socket
    /// on `127.0.0.1:port`, which it hands to the spawning process and keeps no copy of;
    /// landlock lets the program connect to that port and nowhere else, and bind none.
    Proxy { port: u16 },
}

/// The kernel policy layers applied to the program.
///
/// Profiles always set both layers. `None` exists only so `benches/layers.rs` can measure
/// what each layer costs; nothing a user or a request controls can produce it.
#[derive(Debug, Clone)]
pub struct SecurityPolicy {
    pub landlock: Option<LandlockMode>,
    /// What landlock lets the program do over TCP, and how the init sets up the network
    /// namespace (seccomp's side is the filter's own: `network` and `egress` allow IP
    /// sockets).
    pub network: NetworkAccess,
    /// The seccomp filter installed last before exec, compiled before any fork.
    pub seccomp: Option<CompiledFilter>,
}

impl SecurityPolicy {
    /// The default profile's policy: best-effort landlock, no network, default filter.
    pub fn default_profile() -> std::result::Result<Self, super::seccomp::Error> {
        Ok(SecurityPolicy {
            landlock: Some(LandlockMode::BestEffort),
            network: NetworkAccess::None,
            seccomp: Some(CompiledFilter::for_profile(SeccompProfile::Default)?),
        })
    }
}

/// The program started inside the sandbox, with paths as the sandbox sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    pub path: CString,
    pub argv: Vec<CString>,
    /// The complete environment; nothing of the caller's environment is inherited.
    pub env: Vec<CString>,
    /// Working directory inside the sandbox.
    pub cwd: CString,
    /// Descriptors of the spawning process the program inherits, at
    /// [`super::fds::slot::INHERITED`]`+ i` in order (at most [`MAX_INHERITED`]): the
    /// jailed VMM's sockets (`microvm/jail.rs`). Empty for every language sandbox.
    pub inherit: Vec<std::os::fd::RawFd>,
}

/// The most descriptors a program may inherit.
pub const MAX_INHERITED: usize = 6;

impl Program {
    /// Builds a program from strings, refusing interior NUL bytes.
    pub fn new(path: &str, argv: &[&str], env: &[(&str, &str)], cwd: &str) -> Result<Self> {
        let c =
            |s: &str| CString::new(s).map_err(|_| Error::InvalidSpec(format!("NUL byte in {s:?}")));
        Ok(Program {
            path: c(path)?,
            argv: argv.iter().map(|a| c(a)).collect::<Result<_>>()?,
            env: env
                .iter()
                .map(|(k, v)| c(&format!("{k}={v}")))
                .collect::<Result<_>>()?,
            cwd: c(cwd)?,
            inherit: Vec::new(),
        })
    }
}

impl Program {
    /// Adds (or replaces) environment variables.
    pub fn set_env<K: AsRef<str>, V: AsRef<str>>(&mut self, vars: &[(K, V)]) -> Result<()> {
        for (k, v) in vars {
            let (k, v) = (k.as_ref(), v.as_ref());
            if k.is_empty() || k.contains('=') {
                return Err(Error::InvalidSpec(format!("bad environment name {k:?}")));
            }
            let entry = CString::new(format!("{k}={v}"))
                .map_err(|_| Error::InvalidSpec(format!("NUL byte in ${k}")))?;
            let prefix = format!("{k}=");
            self.env
                .retain(|e| !e.as_bytes().starts_with(prefix.as_bytes()));
            self.env.push(entry);
        }
        Ok(())
    }
}

/// Everything needed to create one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// Host path of the verified, read-only root filesystem.
    pub rootfs: PathBuf,
    /// Host directory bound read-write at `/workspace`; a private tmpfs when `None`.
    pub workspace: Option<PathBuf>,
    /// A detached mount (a descriptor open in the spawning process) attached at
    /// `/workspace` instead: a session's own size-limited filesystem.
    pub workspace_mount: Option<std::os::fd::RawFd>,
    /// Host directory of generated tool wrappers, bound read-only at `/servers`.
    pub servers: Option<PathBuf>,
    /// Host directory of saved skills, bound read-only at `/skills`.
    pub skills: Option<PathBuf>,
    /// Host directory holding the egress trust bundle (`ca-bundle.pem`), bound read-only
    /// at `/etc/codebox`.
    pub trust: Option<PathBuf>,
    /// An installed package layer (`packages::Layer`), bound read-only at `/packages`.
    pub packages: Option<PathBuf>,
    pub program: Program,
    pub limits: Limits,
    pub id_mapping: IdMapping,
    pub hostname: String,
    pub policy: SecurityPolicy,
}

impl SandboxSpec {
    /// Checks what can be checked before any process exists.
    pub fn validate(&self) -> Result<()> {
        if !self.rootfs.is_absolute() {
            return Err(Error::InvalidSpec(format!(
                "rootfs path {} is not absolute",
                self.rootfs.display()
            )));
        }
        for (what, dir) in [
            ("workspace", &self.workspace),
            ("servers", &self.servers),
            ("skills", &self.skills),
            ("trust", &self.trust),
            ("packages", &self.packages),
        ] {
            if let Some(dir) = dir {
                if !dir.is_absolute() {
                    return Err(Error::InvalidSpec(format!(
                        "{what} path {} is not absolute",
                        dir.display()
                    )));
                }
            }
        }
        if self.workspace.is_some() && self.workspace_mount.is_some() {
            return Err(Error::InvalidSpec(
                "a workspace directory and a workspace mount are exclusive".into(),
            ));
        }
        if self.hostname.is_empty()
            || self.hostname.len() > 64
            || !self
                .hostname
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(Error::InvalidSpec(format!(
                "hostname {:?} is not 1-64 characters of [A-Za-z0-9-]",
                self.hostname
            )));
        }
        if self.id_mapping.privileged
            && (self.id_mapping.host_uid == 0 || self.id_mapping.host_gid == 0)
        {
            return Err(Error::InvalidSpec(
                "the sandbox user may not map to host root (id 0)".into(),
            ));
        }
        if let NetworkAccess::Proxy { port } = self.policy.network {
            if port == 0 {
                return Err(Error::InvalidSpec("the egress port must not be 0".into()));
            }
            // The listening socket is the program's only way out; a filter without IP
            // sockets would make it useless, one with UDP would add another.
            if let Some(filter) = &self.policy.seccomp {
                if filter.policy() != super::seccomp::SeccompProfile::Egress.name() {
                    return Err(Error::InvalidSpec(format!(
                        "proxy network access needs the egress seccomp policy, not {}",
                        filter.policy()
                    )));
                }
            }
        }
        if self.program.inherit.len() > MAX_INHERITED
            || self.program.inherit.iter().any(|&fd| fd < 0)
        {
            return Err(Error::InvalidSpec(format!(
                "a program inherits at most {MAX_INHERITED} open descriptors"
            )));
        }
        if self.limits.timeout.is_zero() {
            return Err(Error::InvalidSpec("timeout must be positive".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SandboxSpec {
        SandboxSpec {
            rootfs: "/r".into(),
            workspace: None,
            workspace_mount: None,
            servers: None,
            skills: None,
            trust: None,
            packages: None,
            program: Program::new(
                "/usr/bin/python3",
                &["python3"],
                &[("PATH", "/usr/bin")],
                "/",
            )
            .unwrap(),
            limits: Limits::default(),
            id_mapping: IdMapping::rootless(1000, 1000),
            hostname: "codebox".into(),
            policy: SecurityPolicy::default_profile().unwrap(),
        }
    }

    #[test]
    fn root_mapping_to_host_root_is_refused() {
        let mut s = spec();
        s.id_mapping = IdMapping::for_root(0);
        assert!(s.validate().is_err());
    }

    #[test]
    fn valid_spec_passes() {
        spec().validate().unwrap();
    }

    #[test]
    fn relative_paths_are_refused() {
        let mut s = spec();
        s.rootfs = "rootfs".into();
        assert!(s.validate().is_err());
        let mut s = spec();
        s.workspace = Some("ws".into());
        assert!(s.validate().is_err());
    }

    #[test]
    fn bad_hostnames_are_refused() {
        for h in ["", "a b", "x/y", &"a".repeat(65)] {
            let mut s = spec();
            s.hostname = h.to_string();
            assert!(s.validate().is_err(), "{h:?}");
        }
    }

    #[test]
    fn proxy_access_needs_the_egress_filter_and_a_port() {
        use super::super::seccomp::{CompiledFilter, SeccompProfile};
        let mut s = spec();
        s.policy.network = NetworkAccess::Proxy { port: 3128 };
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("egress seccomp policy"), "{err}");
        s.policy.seccomp = Some(CompiledFilter::for_profile(SeccompProfile::Egress).unwrap());
        s.validate().unwrap();
        s.policy.network = NetworkAccess::Proxy { port: 0 };
        assert!(s.validate().is_err());
        let mut s = spec();
        s.trust = Some("relative".into());
        assert!(s.validate().is_err());
    }

    #[test]
    fn environment_is_set_once_per_name() {
        let mut p = Program::new("/bin/x", &[], &[("A", "1"), ("AB", "2")], "/").unwrap();
        p.set_env(&[("A", "3"), ("C", "4")]).unwrap();
        let env: Vec<_> = p.env.iter().map(|e| e.to_str().unwrap()).collect();
        assert_eq!(env, ["AB=2", "A=3", "C=4"]);
        assert!(p.set_env(&[("X=Y", "1")]).is_err());
        assert!(p.set_env(&[("X", "a\0b")]).is_err());
    }

    #[test]
    fn inherited_descriptors_are_bounded() {
        let mut s = spec();
        s.program.inherit = vec![5; MAX_INHERITED];
        s.validate().unwrap();
        s.program.inherit.push(5);
        assert!(s.validate().is_err());
        s.program.inherit = vec![-1];
        assert!(s.validate().is_err());
    }

    #[test]
    fn nul_bytes_are_refused() {
        assert!(Program::new("/bin/x\0", &[], &[], "/").is_err());
        assert!(Program::new("/bin/x", &["a\0b"], &[], "/").is_err());
    }
}
