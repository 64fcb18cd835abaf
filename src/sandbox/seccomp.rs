//! The seccomp layer: a syscall deny-list installed right before the sandboxed program's
//! `execve`.
//!
//! The filters are data: `policies/seccomp/<profile>.json` in seccompiler's JSON format
//! (one file per [`SeccompProfile`], a `comment` on every rule), embedded in the binary
//! and compiled once per process, on first use, into one classic-BPF program
//! ([`CompiledFilter`]). `policies/README.md` explains the choices (deny-list, actions,
//! the ABI guard); `policy.rs` holds the schema checks and `bpf.rs` the assembly.
//!
//! Order in the child (see `program.rs`): … drop capabilities, `no_new_privs`, landlock,
//! **seccomp**, `execve`. The filter is installed last so nothing codebox itself does is
//! subject to it; it then holds for the program and everything it starts, and cannot be
//! removed.
//!
//! Refused calls get `EPERM` or `ENOSYS`; a foreign-ABI syscall (i386 `int 0x80`, x32) or a
//! `kill_process` rule kills the whole process with `SIGSYS` ([`SECCOMP_KILL_SIGNAL`]): a
//! run that ends with signal 31 was killed by the seccomp policy.

mod bpf;
mod policy;
#[cfg(test)]
mod tests;

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use seccompiler::TargetArch;

pub use bpf::{LAST_REVIEWED_SYSCALL, MAX_INSTRUCTIONS};
pub use policy::MAX_POLICY_BYTES;

/// The signal a process killed by the seccomp policy dies of (`SECCOMP_RET_KILL_PROCESS`
/// delivers `SIGSYS`, 31 on x86_64/aarch64/riscv64). Run results report it as "killed by
/// seccomp policy".
pub const SECCOMP_KILL_SIGNAL: i32 = libc::SIGSYS;

/// Errors of the seccomp layer. `policy` names the profile ("default", "network") or the
/// file a policy came from.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("seccomp policy {policy} is {size} bytes, over the limit of {max}")]
    PolicyTooLarge {
        policy: String,
        size: usize,
        max: usize,
    },
    #[error("seccomp policy {policy} does not parse")]
    PolicyJson {
        policy: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("seccomp policy {policy} is invalid: {problem}")]
    PolicyInvalid { policy: String, problem: String },
    #[error("seccomp policy {policy} does not compile for {}", arch_name(arch))]
    Compile {
        policy: String,
        arch: TargetArch,
        #[source]
        source: seccompiler::Error,
    },
    #[error(
        "seccomp policy {policy} compiles to {instructions} BPF instructions; the kernel takes \
         at most {max}"
    )]
    TooManyInstructions {
        policy: String,
        instructions: usize,
        max: usize,
    },
    #[error("seccomp filters are not supported on {arch}")]
    UnsupportedArch {
        arch: &'static str,
        #[source]
        source: seccompiler::BackendError,
    },
    #[error("unknown seccomp profile {0:?}: expected default, network or egress")]
    UnknownProfile(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// A seccomp profile: which policy file applies.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum SeccompProfile {
    /// No network: only `AF_UNIX` sockets.
    #[default]
    Default,
    /// As `Default`, plus `AF_INET` and `AF_INET6` sockets.
    Network,
    /// As `Network`, but only TCP (no UDP, raw, ICMP or SCTP sockets) and no TCP Fast
    /// Open sends: the proxy mode's filter, where the only way out is TCP to one port.
    Egress,
}

impl SeccompProfile {
    pub const ALL: [SeccompProfile; 3] = [
        SeccompProfile::Default,
        SeccompProfile::Network,
        SeccompProfile::Egress,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SeccompProfile::Default => "default",
            SeccompProfile::Network => "network",
            SeccompProfile::Egress => "egress",
        }
    }

    /// The profile's policy file, as embedded at build time.
    pub fn policy_json(self) -> &'static str {
        match self {
            SeccompProfile::Default => include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/policies/seccomp/default.json"
            )),
            SeccompProfile::Network => include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/policies/seccomp/network.json"
            )),
            SeccompProfile::Egress => include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/policies/seccomp/egress.json"
            )),
        }
    }

    fn index(self) -> usize {
        match self {
            SeccompProfile::Default => 0,
            SeccompProfile::Network => 1,
            SeccompProfile::Egress => 2,
        }
    }
}

impl fmt::Display for SeccompProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SeccompProfile {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        SeccompProfile::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| Error::UnknownProfile(s.to_string()))
    }
}

/// A compiled, checked seccomp program, ready to install. Cloning shares the program.
#[derive(Clone)]
pub struct CompiledFilter {
    policy: Arc<str>,
    program: Arc<[libc::sock_filter]>,
}

/// One compiled program per profile, built on first use.
static COMPILED: [OnceLock<CompiledFilter>; 3] =
    [OnceLock::new(), OnceLock::new(), OnceLock::new()];

/// The same for the zygote variant of each profile.
static COMPILED_ZYGOTE: [OnceLock<CompiledFilter>; 3] =
    [OnceLock::new(), OnceLock::new(), OnceLock::new()];

/// What the Python zygote (`sandbox/zygote/`) may call that its programs may not: its
/// children unshare their own namespaces and mount their own `/proc`, `/tmp`, `/dev/shm`
/// and `/workspace` before they install the profile's full filter on top of this one
/// (filters stack; the stricter answer wins). The zygote itself runs no program.
pub const ZYGOTE_ALLOWS: [&str; 2] = ["unshare", "mount"];

impl CompiledFilter {
    /// The filter of a built-in profile. The first call per profile and process compiles
    /// it (well under a millisecond, and it allocates: make it before forking from a
    /// multi-threaded process); later calls only clone an `Arc`.
    pub fn for_profile(profile: SeccompProfile) -> Result<CompiledFilter> {
        let cell = &COMPILED[profile.index()];
        if let Some(filter) = cell.get() {
            return Ok(filter.clone());
        }
        let filter = Self::from_json(profile.name(), profile.policy_json().as_bytes())?;
        Ok(cell.get_or_init(|| filter).clone())
    }

    /// Checks and compiles a policy in codebox's seccomp JSON format for the host
    /// architecture. `policy` names it in errors (a profile name or a path).
    pub fn from_json(policy: &str, json: &[u8]) -> Result<CompiledFilter> {
        let arch = host_arch()?;
        let program = compile(policy, json, arch)?;
        Ok(CompiledFilter {
            policy: policy.into(),
            program: program.into(),
        })
    }

    /// The zygote's filter for `profile`: the profile's rules without those of
    /// [`ZYGOTE_ALLOWS`], compiled once per process.
    pub fn zygote_variant(profile: SeccompProfile) -> Result<CompiledFilter> {
        let cell = &COMPILED_ZYGOTE[profile.index()];
        if let Some(filter) = cell.get() {
            return Ok(filter.clone());
        }
        let name = format!("{}+zygote", profile.name());
        let mut policy: serde_json::Value =
            serde_json::from_str(profile.policy_json()).map_err(|source| Error::PolicyJson {
                policy: name.clone(),
                source,
            })?;
        for filter in policy
            .as_object_mut()
            .into_iter()
            .flat_map(|m| m.values_mut())
        {
            if let Some(rules) = filter.get_mut("filter").and_then(|f| f.as_array_mut()) {
                rules.retain(|r| {
                    !r.get("syscall")
                        .and_then(|s| s.as_str())
                        .is_some_and(|s| ZYGOTE_ALLOWS.contains(&s))
                });
            }
        }
        let json = serde_json::to_vec(&policy).expect("a JSON value serializes");
        let filter = Self::from_json(&name, &json)?;
        Ok(cell.get_or_init(|| filter).clone())
    }

    /// The program as the kernel's `struct sock_filter` array in memory (8 bytes per
    /// instruction, native byte order): what a process without this type installs.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.program.len() * 8);
        for i in self.program.iter() {
            out.extend_from_slice(&i.code.to_ne_bytes());
            out.push(i.jt);
            out.push(i.jf);
            out.extend_from_slice(&i.k.to_ne_bytes());
        }
        out
    }

    /// Number of BPF instructions (at most [`MAX_INSTRUCTIONS`]).
    pub fn instructions(&self) -> usize {
        self.program.len()
    }

    /// The policy this filter was compiled from.
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// Installs the filter on the calling thread (no `SECCOMP_FILTER_FLAG_TSYNC`: it is
    /// meant for the single-threaded child right before `execve`, and `execve` leaves only
    /// the calling thread anyway).
    ///
    /// Safe between fork and exec in a multi-threaded parent: it builds a `sock_fprog` on
    /// the stack that points at the already-built program and makes one raw `seccomp(2)`
    /// call; it neither allocates nor takes a lock (the error, if any, is a plain errno).
    ///
    /// Requires `no_new_privs` to be set already (or `CAP_SYS_ADMIN`); otherwise the kernel
    /// answers `EACCES`.
    pub fn install(&self) -> std::io::Result<()> {
        let prog = libc::sock_fprog {
            // Checked against MAX_INSTRUCTIONS (4096) when compiled: fits in u16.
            len: self.program.len() as libc::c_ushort,
            filter: self.program.as_ptr().cast_mut(),
        };
        // SAFETY: seccomp(SECCOMP_SET_MODE_FILTER, 0, &prog): `prog` lives on this stack
        // frame for the whole call and points at `self.program`, which the kernel only
        // reads (it copies the program); the length is that of the slice.
        let r = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::c_ulong::from(libc::SECCOMP_SET_MODE_FILTER),
                0 as libc::c_ulong,
                &prog as *const libc::sock_fprog,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    #[cfg(test)]
    fn program(&self) -> &[libc::sock_filter] {
        &self.program
    }
}

impl fmt::Debug for CompiledFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledFilter")
            .field("policy", &self.policy)
            .field("instructions", &self.program.len())
            .finish()
    }
}

/// x86_64 system calls the newer architectures never had (their libc uses the `*at`
/// forms, which the policies also name). A rule for one of them is kept on x86_64 only;
/// seccompiler would refuse the name elsewhere.
const X86_64_ONLY_SYSCALLS: &[&str] = &["chmod", "open", "creat", "mknod"];

/// `json` with the rules for [`X86_64_ONLY_SYSCALLS`] removed when `arch` has no such
/// calls; unchanged on x86_64.
fn without_legacy_syscalls(
    json: &[u8],
    arch: TargetArch,
) -> std::result::Result<std::borrow::Cow<'_, [u8]>, serde_json::Error> {
    if matches!(arch, TargetArch::x86_64) {
        return Ok(std::borrow::Cow::Borrowed(json));
    }
    let mut doc: serde_json::Value = serde_json::from_slice(json)?;
    if let Some(filters) = doc.as_object_mut() {
        for filter in filters.values_mut() {
            if let Some(rules) = filter.get_mut("filter").and_then(|f| f.as_array_mut()) {
                rules.retain(|rule| {
                    let name = rule.get("syscall").and_then(|n| n.as_str());
                    !name.is_some_and(|n| X86_64_ONLY_SYSCALLS.contains(&n))
                });
            }
        }
    }
    serde_json::to_vec(&doc).map(std::borrow::Cow::Owned)
}

/// The architecture as `uname -m` spells it, for messages.
fn arch_name(arch: &TargetArch) -> &'static str {
    match arch {
        TargetArch::x86_64 => "x86_64",
        TargetArch::aarch64 => "aarch64",
        TargetArch::riscv64 => "riscv64",
    }
}

fn host_arch() -> Result<TargetArch> {
    let arch = std::env::consts::ARCH;
    TargetArch::try_from(arch).map_err(|source| Error::UnsupportedArch { arch, source })
}

/// Checks `json` against the schema and compiles it for `arch`.
fn compile(policy: &str, json: &[u8], arch: TargetArch) -> Result<Vec<libc::sock_filter>> {
    if json.len() > MAX_POLICY_BYTES {
        return Err(Error::PolicyTooLarge {
            policy: policy.into(),
            size: json.len(),
            max: MAX_POLICY_BYTES,
        });
    }
    let doc = policy::check(json).map_err(|p| match p {
        policy::Problem::Json(source) => Error::PolicyJson {
            policy: policy.into(),
            source,
        },
        policy::Problem::Rule(problem) => Error::PolicyInvalid {
            policy: policy.into(),
            problem,
        },
    })?;
    let compile_error = |source| Error::Compile {
        policy: policy.into(),
        arch,
        source,
    };
    let json = without_legacy_syscalls(json, arch).map_err(|source| Error::PolicyJson {
        policy: policy.into(),
        source,
    })?;
    let mut by_name = seccompiler::compile_from_json(&json[..], arch).map_err(compile_error)?;
    let mut filters = Vec::new();
    for (action, _) in doc.filters() {
        let program = by_name.remove(action.filter_name()).ok_or_else(|| {
            // The schema check and seccompiler read the same bytes; they cannot disagree
            // on which filters exist unless one of them changed.
            Error::PolicyInvalid {
                policy: policy.into(),
                problem: format!("seccompiler did not return filter {}", action.filter_name()),
            }
        })?;
        filters.push(program);
    }
    let program = bpf::assemble(arch, &filters);
    if program.len() > MAX_INSTRUCTIONS {
        return Err(Error::TooManyInstructions {
            policy: policy.into(),
            instructions: program.len(),
            max: MAX_INSTRUCTIONS,
        });
    }
    Ok(program)
}
