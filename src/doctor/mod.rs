//! Host checks, layer by layer: can this host run codebox sandboxes, and with which
//! isolation layers in force?
//!
//! Each check really exercises the layer (a forked probe that unshares a namespace, a
//! sandbox that runs the interpreters) rather than reading configuration, so the report
//! says what works, not what should. Used by `codebox doctor`; the MCP health tool reports
//! the same list.
//!
//! Must run in a single-threaded process: the probes fork.

use std::time::Instant;

use serde::{Deserialize, Serialize};

pub mod deferred;
pub mod host_support;
pub mod microvm;

use crate::execution::{self, ExecutionRequest, Host};
use crate::profile::Profile;
use crate::rootfs;
use crate::runtime::Language;
use crate::sandbox::cgroup::{self, Backend};
use crate::sandbox::{self, CgroupManager, IdMapping, LandlockMode};

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    /// Works, with less than full strength (e.g. landlock partially enforced).
    Degraded,
    Missing,
}

/// One layer's check.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Check {
    pub layer: String,
    pub status: Status,
    pub detail: String,
    /// How to fix the host, when the layer is not fully there.
    pub fix: Option<String>,
    /// Whether the profile cannot run without this layer.
    pub required: bool,
}

impl Check {
    pub(crate) fn new(
        layer: &str,
        status: Status,
        detail: impl Into<String>,
        required: bool,
    ) -> Check {
        Check {
            layer: layer.to_string(),
            status,
            detail: detail.into(),
            fix: None,
            required,
        }
    }

    fn fix(mut self, fix: impl Into<String>) -> Check {
        if self.status != Status::Ok {
            self.fix = Some(fix.into());
        }
        self
    }

    /// A required layer that is missing.
    pub fn blocks(&self) -> bool {
        self.required && self.status == Status::Missing
    }
}

/// The full report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub profile: String,
    pub checks: Vec<Check>,
    /// Whether every hard requirement of the profile is met.
    pub ready: bool,
}

/// Runs every check for `profile` with the rootfs at `rootfs_dir` (if found).
pub fn run(profile: &Profile, rootfs_dir: Option<&std::path::Path>, root_host_id: u32) -> Report {
    let mut checks = host_layers(profile, root_host_id);
    if let Some(rootfs) = rootfs_check(rootfs_dir, &mut checks) {
        let host = Host::new(rootfs, IdMapping::for_current_process(root_host_id));
        checks.extend(sandbox_layers(&host, profile));
        checks.extend(microvm::checks(&host, profile, None));
    }
    Report::new(profile, checks)
}

/// The host's layers without running a sandbox: namespaces, cgroups, seccomp, landlock,
/// egress and session workspaces (forked probes, a few milliseconds).
pub fn host_layers(profile: &Profile, root_host_id: u32) -> Vec<Check> {
    let mut checks = vec![host_support::kernel_check(&host_support::running_release())];
    checks.extend(namespace_checks());
    let cgroups = CgroupManager::discover_host();
    checks.push(cgroup_check(&cgroups, profile));
    checks.push(seccomp_check(profile));
    checks.push(landlock_check(profile));
    checks.push(egress_check(profile));
    checks.push(session_workspace_check(root_host_id));
    checks
}

/// The rootfs line of a rootfs verified already.
pub fn rootfs_verified(r: &rootfs::Rootfs) -> Check {
    Check::new(
        "rootfs",
        Status::Ok,
        format!(
            "{}: {} entries, manifest sha256 {}…, {} verification, {}",
            r.path.display(),
            r.entries,
            &r.manifest_sha256[..12],
            r.verification,
            match &r.sealed {
                Ok(()) => "sealed".to_string(),
                Err(why) => format!("not sealed ({why}: every run checks every entry)"),
            }
        ),
        true,
    )
}

/// Real sandboxes: each runtime prints its version, and in proxy mode a program reaches
/// the listener its init handed over and nothing else. About 100 ms (Deno's start).
pub fn sandbox_layers(host: &Host, profile: &Profile) -> Vec<Check> {
    let mut checks: Vec<Check> = Language::ALL
        .iter()
        .map(|&lang| runtime_check(lang, host, profile))
        .collect();
    if let sandbox::NetworkAccess::Proxy { port } = profile.policy.network {
        checks.push(proxy_sandbox_check(host, profile, port));
    }
    checks
}

impl Report {
    pub fn new(profile: &Profile, checks: Vec<Check>) -> Report {
        Report {
            profile: profile.name.clone(),
            ready: !checks.iter().any(Check::blocks),
            checks,
        }
    }
}

const NAMESPACES: [(&str, libc::c_int); 6] = [
    ("mount namespace", libc::CLONE_NEWNS),
    ("pid namespace", libc::CLONE_NEWPID),
    ("network namespace", libc::CLONE_NEWNET),
    ("ipc namespace", libc::CLONE_NEWIPC),
    ("uts namespace", libc::CLONE_NEWUTS),
    ("cgroup namespace", libc::CLONE_NEWCGROUP),
];

fn namespace_checks() -> Vec<Check> {
    let root = nix::unistd::geteuid().is_root();
    let own = probe_unshare(None, 0);
    let unprivileged = if root {
        probe_unshare(Some(65534), 0)
    } else {
        probe_unshare(None, 0)
    };
    let userns_fix = host_support::UsernsSysctls::read().fix();
    let mut checks = vec![match (own, unprivileged) {
        (Ok(()), Ok(())) => Check::new(
            "user namespaces",
            Status::Ok,
            if root {
                "as root, and as an unprivileged user"
            } else {
                "rootless"
            },
            true,
        ),
        (Ok(()), Err(e)) => Check::new(
            "user namespaces",
            Status::Degraded,
            format!("root only; unprivileged users get {e}"),
            true,
        )
        .fix(userns_fix.clone()),
        (Err(e), _) => Check::new(
            "user namespaces",
            Status::Missing,
            format!("unshare(CLONE_NEWUSER): {e}"),
            true,
        )
        .fix(userns_fix),
    }];
    for (name, flag) in NAMESPACES {
        checks.push(match probe_unshare(None, flag) {
            Ok(()) => Check::new(name, Status::Ok, "unshared inside a user namespace", true),
            Err(e) => Check::new(name, Status::Missing, format!("unshare: {e}"), true)
                .fix("use a kernel built with this namespace type (CONFIG_*_NS)"),
        });
    }
    checks
}

/// Runs `probe` in a forked child and returns what it returned: `Ok` for 0, the errno
/// otherwise. The child ends with `_exit`.
fn fork_probe(probe: impl FnOnce() -> i32) -> Result<(), std::io::Error> {
    // SAFETY: doctor runs single-threaded (the CLI, or `serve` before its runtime), so the
    // child may run ordinary code; it ends with _exit and never returns into the parent's
    // frames.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            let code = probe();
            // SAFETY: ends the probe child without unwinding into the parent's frames.
            unsafe { libc::_exit(code) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            match nix::sys::wait::waitpid(child, None) {
                Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
                Ok(nix::sys::wait::WaitStatus::Exited(_, errno)) => {
                    Err(std::io::Error::from_raw_os_error(errno))
                }
                Ok(nix::sys::wait::WaitStatus::Signaled(_, sig, _)) => Err(std::io::Error::other(
                    format!("the probe was killed by signal {}", sig as i32),
                )),
                Ok(_) => Err(std::io::Error::other("the probe ended unexpectedly")),
                Err(e) => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// In a child: (optionally drops to `as_uid`,) unshares a user namespace and then `extra`.
fn probe_unshare(as_uid: Option<u32>, extra: libc::c_int) -> Result<(), std::io::Error> {
    fork_probe(|| {
        (|| -> Result<(), nix::errno::Errno> {
            if let Some(id) = as_uid {
                nix::unistd::setgroups(&[])?;
                let g = nix::unistd::Gid::from_raw(id);
                nix::unistd::setresgid(g, g, g)?;
                let u = nix::unistd::Uid::from_raw(id);
                nix::unistd::setresuid(u, u, u)?;
            }
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER)?;
            if extra != 0 {
                nix::sched::unshare(nix::sched::CloneFlags::from_bits_retain(extra))?;
            }
            Ok(())
        })()
        .map_or_else(|e| e as i32, |()| 0)
    })
}

/// Whether the workspace keeper can make a session's tmpfs and copy it (see
/// `session/keeper.rs`). Sessions need it; one-off runs do not.
fn session_workspace_check(root_host_id: u32) -> Check {
    let ids = IdMapping::for_current_process(root_host_id);
    let probe = crate::session::keeper::Keeper::start((ids.host_uid, ids.host_gid)).and_then(|k| {
        let fs = k.create(1024 * 1024, 10)?;
        k.clone_mount(std::os::fd::AsFd::as_fd(&fs)).map(drop)
    });
    match probe {
        Ok(()) => Check::new(
            "session workspaces",
            Status::Ok,
            "a tmpfs per session, limited by the kernel (size and inodes)",
            false,
        ),
        Err(e) => Check::new(
            "session workspaces",
            Status::Missing,
            format!("{:#}", anyhow::Error::new(e)),
            false,
        )
        .fix("sessions need fsopen/fsmount/open_tree (Linux 5.2+) and, rootless, user namespaces"),
    }
}

fn cgroup_check(found: &Result<CgroupManager, cgroup::Error>, profile: &Profile) -> Check {
    let needed = sandbox::cgroup_limits(&profile.limits).controllers();
    let required = !needed.is_empty();
    match found {
        Err(e) => Check::new("cgroups", Status::Missing, e.to_string(), required).fix(cgroup_fix()),
        Ok(m) => {
            let have = m.backend().controllers();
            let missing: Vec<String> = needed
                .iter()
                .filter(|c| !have.contains(c))
                .map(|c| c.name().to_string())
                .collect();
            let mut detail = m.backend().to_string();
            for note in m.notes() {
                detail.push_str("; ");
                detail.push_str(note);
            }
            if matches!(m.backend(), Backend::None) {
                Check::new("cgroups", Status::Missing, detail, required).fix(cgroup_fix())
            } else if missing.is_empty() {
                Check::new("cgroups", Status::Ok, detail, required)
            } else {
                Check::new(
                    "cgroups",
                    Status::Missing,
                    format!("{detail}; missing for this profile: {}", missing.join(", ")),
                    required,
                )
                .fix(cgroup_fix())
            }
        }
    }
}

/// How to get writable cgroups: as root, mount them; rootless, a delegation — from
/// systemd (`Delegate=yes`) or from `codebox setup-cgroups` — that this process runs in.
fn cgroup_fix() -> String {
    if nix::unistd::geteuid().is_root() {
        return "mount the cgroup hierarchies (cgroup2, or v1 memory, pids, cpu, cpuacct and \
                freezer under /sys/fs/cgroup)"
            .to_string();
    }
    let uid = nix::unistd::getuid();
    let user = nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map_or_else(|| uid.to_string(), |u| u.name);
    let name = cgroup::delegate::default_name(&user);
    let found = cgroup::delegate::existing(
        std::path::Path::new("/proc"),
        std::path::Path::new("/"),
        &name,
        uid.as_raw(),
    );
    let enter = format!(
        "as root `codebox setup-cgroups --user {user} --enter -- codebox …`, or yourself \
         `codebox setup-cgroups --enter -- codebox …` (v1 hierarchies only)"
    );
    if let Some(dir) = found.first() {
        format!(
            "a cgroup delegation for {user} exists ({}), but this process does not run in \
             it: start codebox inside it, {enter}",
            dir.display()
        )
    } else {
        format!(
            "rootless needs a delegated cgroup: with systemd, run codebox as a service with \
             Delegate=yes (cgroup v2); without systemd, have root run `codebox setup-cgroups \
             --user {user}` once and start codebox inside it, {enter}"
        )
    }
}

fn seccomp_check(profile: &Profile) -> Check {
    let Some(filter) = &profile.policy.seccomp else {
        return Check::new(
            "seccomp",
            Status::Missing,
            "the profile installs no filter",
            true,
        );
    };
    match probe_seccomp(filter) {
        Ok(()) => Check::new(
            "seccomp",
            Status::Ok,
            format!(
                "policy {}: {} BPF instructions, installs and refuses keyctl",
                filter.policy(),
                filter.instructions()
            ),
            true,
        ),
        Err(e) => Check::new(
            "seccomp",
            Status::Missing,
            format!("policy {}: {e}", filter.policy()),
            true,
        )
        .fix("use a kernel built with CONFIG_SECCOMP_FILTER"),
    }
}

/// Installs the filter in a forked child and checks that keyctl is refused with EPERM.
fn probe_seccomp(filter: &sandbox::seccomp::CompiledFilter) -> Result<(), std::io::Error> {
    /// The child's exit code when the filter installed but keyctl went through.
    const NOT_REFUSED: i32 = 200;
    let r = fork_probe(|| {
        // SAFETY: prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
        if let Err(e) = filter.install() {
            return e.raw_os_error().unwrap_or(libc::EIO);
        }
        // SAFETY: keyctl(KEYCTL_GET_KEYRING_ID, 0, 0): integer arguments only.
        let r = unsafe { libc::syscall(libc::SYS_keyctl, 0, 0, 0) };
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        if r == -1 && errno == libc::EPERM {
            0
        } else {
            NOT_REFUSED
        }
    });
    match r {
        Err(e) if e.raw_os_error() == Some(NOT_REFUSED) => Err(std::io::Error::other(
            "installed, but keyctl was not refused",
        )),
        other => other,
    }
}

fn landlock_check(profile: &Profile) -> Check {
    let required = profile.policy.landlock == Some(LandlockMode::Required);
    let target = sandbox::landlock::TARGET_ABI as u32;
    match sandbox::landlock::kernel_abi() {
        Some(abi) if abi >= target => Check::new(
            "landlock",
            Status::Ok,
            format!("kernel ABI {abi} (ruleset written for ABI {target}): fully enforced"),
            required,
        ),
        Some(abi) => Check::new(
            "landlock",
            Status::Degraded,
            format!("kernel ABI {abi} < {target}: partially enforced"),
            required,
        )
        .fix("a kernel ≥ 6.12 enforces every landlock rule codebox sets"),
        None => Check::new("landlock", Status::Missing, "not available", required)
            .fix("boot with landlock in the LSM list (lsm=landlock,...) on a kernel ≥ 5.13"),
    }
}

/// Proxy mode's door: landlock's TCP rules (ABI ≥ 4) let the program connect to the
/// egress port and nowhere else. A hard requirement in proxy mode; information otherwise.
fn egress_check(profile: &Profile) -> Check {
    let proxy = matches!(profile.policy.network, sandbox::NetworkAccess::Proxy { .. });
    let mode = match profile.policy.network {
        sandbox::NetworkAccess::None => "none",
        sandbox::NetworkAccess::Loopback => "loopback",
        sandbox::NetworkAccess::Proxy { .. } => "proxy",
    };
    let need = sandbox::landlock::NET_ABI;
    match sandbox::landlock::kernel_abi() {
        Some(abi) if abi >= need => Check::new(
            "egress",
            Status::Ok,
            format!(
                "network mode {mode}; landlock ABI {abi} has TCP port rules: in proxy mode the \
                 program can connect to the egress proxy's port and nowhere else"
            ),
            proxy,
        ),
        found => Check::new(
            "egress",
            if proxy {
                Status::Missing
            } else {
                Status::Degraded
            },
            format!(
                "network mode {mode}; landlock ABI {} has no TCP port rules (needs {need}): \
                 proxy mode cannot confine the program to the egress port",
                found.map_or("none".to_string(), |a| a.to_string())
            ),
            proxy,
        )
        .fix("a kernel ≥ 6.7 with landlock in the LSM list; or network mode \"none\""),
    }
}

fn rootfs_check(dir: Option<&std::path::Path>, checks: &mut Vec<Check>) -> Option<rootfs::Rootfs> {
    let stamps = rootfs::default_stamp_dir();
    let verified = match dir {
        None => Err("no rootfs found".to_string()),
        // The doctor looks deeper than a run: a sealed tree's every entry too.
        Some(d) => rootfs::verify(d, stamps.as_deref())
            .and_then(|mut r| {
                if r.verification == rootfs::Verification::Sealed {
                    rootfs::recheck(&mut r, stamps.as_deref())?;
                }
                Ok(r)
            })
            .map_err(|e| e.to_string()),
    };
    match verified {
        Ok(r) => {
            checks.push(rootfs_verified(&r));
            Some(r)
        }
        Err(e) => {
            checks.push(
                Check::new("rootfs", Status::Missing, e, true)
                    .fix("build it with `cargo xtask rootfs` (or set CODEBOX_ROOTFS)"),
            );
            None
        }
    }
}

/// A real proxy-mode sandbox: its init hands over the listener, the program connects to
/// it, and landlock refuses another port. The check accepts on the listener itself (no
/// proxy): a thread does, after the sandbox was cloned, and is joined before returning.
fn proxy_sandbox_check(host: &Host, profile: &Profile, port: u16) -> Check {
    const LAYER: &str = "egress in sandbox";
    let code = format!(
        "import socket\nfor p in ({port}, {other}):\n    s = socket.socket()\n    try:\n        \
         s.connect(('127.0.0.1', p)); print(p, 'connected')\n    except OSError as e:\n        \
         print(p, 'refused', e.errno)\n",
        other = port.wrapping_add(1)
    );
    let mut program = match Language::Python.program() {
        Ok(p) => p,
        Err(e) => return Check::new(LAYER, Status::Missing, e.to_string(), true),
    };
    let _ = program.set_env(&crate::runtime::egress_env(port, false));
    let spec = host.spec(program, None, &profile.limits, &profile.policy);
    let mut sb = match sandbox::spawn(&spec, host.cgroups.as_ref()) {
        Ok(sb) => sb,
        Err(e) => {
            return Check::new(LAYER, Status::Missing, setup_failure(&e), true)
                .fix("see the layers above; run with -v for the failing setup step")
        }
    };
    let Some(listener) = sb.io.egress.take() else {
        return Check::new(LAYER, Status::Missing, "no egress listener came back", true);
    };
    let listener = std::net::TcpListener::from(listener);
    let accepted = std::thread::spawn(move || {
        let _ = listener.set_nonblocking(true);
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while Instant::now() < deadline {
            match listener.accept() {
                Ok(_) => return true,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        }
        false
    });
    let frame = crate::runtime::ephemeral(crate::runtime::boot_frame(&code));
    let outcome = sb.run_to_completion(&frame, &profile.limits, &mut sandbox::Discard);
    let accepted = accepted.join().unwrap_or(false);
    let stdout = match &outcome {
        Ok(o) => String::from_utf8_lossy(&o.stdout.bytes).into_owned(),
        Err(e) => return Check::new(LAYER, Status::Missing, e.to_string(), true),
    };
    let refused = stdout.contains(&format!(
        "{} refused {}",
        port.wrapping_add(1),
        libc::EACCES
    ));
    if accepted && stdout.contains(&format!("{port} connected")) && refused {
        Check::new(
            LAYER,
            Status::Ok,
            format!("the program reaches 127.0.0.1:{port} (the proxy's listener) and landlock refuses any other port"),
            true,
        )
    } else {
        Check::new(
            LAYER,
            Status::Missing,
            format!("unexpected: {}", stdout.trim().replace('\n', "; ")),
            true,
        )
        .fix("a kernel ≥ 6.7 with landlock TCP rules (ABI ≥ 4), as root and rootless")
    }
}

fn runtime_check(lang: Language, host: &Host, profile: &Profile) -> Check {
    let (code, layer) = match lang {
        Language::Python => (
            "import sys; print('Python', sys.version.split()[0])",
            "python in sandbox",
        ),
        Language::TypeScript => (
            "console.log('Deno', Deno.version.deno)",
            "typescript in sandbox",
        ),
    };
    let request = ExecutionRequest {
        language: lang,
        code: code.into(),
        files: Default::default(),
        workspace: None,
        limits: profile.limits.clone(),
        // The runtimes alone; proxy mode has its own check (it needs its listener served).
        policy: if matches!(profile.policy.network, sandbox::NetworkAccess::Proxy { .. }) {
            let mut p = profile.clone();
            match p.set_network(Default::default()) {
                Ok(()) => p.policy,
                Err(e) => return Check::new(layer, Status::Missing, e, true),
            }
        } else {
            profile.policy.clone()
        },
        egress: None,
        zygote: false,
    };
    let started = Instant::now();
    let result = execution::execute(host, &request, &mut sandbox::Discard);
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    match result {
        Ok(r) if !r.failed() => {
            let landlock = match r.landlock {
                Some(s) => format!(", landlock {s:?}"),
                None => String::new(),
            };
            let mem = r
                .peak_memory_bytes
                .map(|b| format!(", peak {} MiB", b >> 20))
                .unwrap_or_default();
            Check::new(
                layer,
                Status::Ok,
                format!("{} in {ms:.0} ms{landlock}{mem}", r.stdout.trim()),
                true,
            )
        }
        Ok(r) => Check::new(
            layer,
            Status::Missing,
            format!("{}: {}", r.ending(), r.stderr.lines().last().unwrap_or("")),
            true,
        )
        .fix("rebuild the rootfs with `cargo xtask rootfs`"),
        Err(e) => Check::new(layer, Status::Missing, setup_failure(&e), true)
            .fix("see the layers above; run with -v for the failing setup step"),
    }
}

/// A sandbox that could not be set up, with its causes, in doctor's own words.
fn setup_failure(e: &dyn std::error::Error) -> String {
    crate::error_chain::error_chain(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::cgroup::{Controller, Error as CgroupError};

    /// Doctor's own lines never send the reader to `codebox doctor`, and name the cause.
    #[test]
    fn a_sandbox_that_cannot_be_set_up_is_explained_without_sending_to_doctor() {
        for cause in [
            CgroupError::ControllerUnavailable {
                controller: Controller::Memory,
            },
            CgroupError::NoHierarchy,
        ] {
            let e = execution::Error::Sandbox(crate::sandbox::Error::Cgroup(cause));
            let text = setup_failure(&e);
            assert!(
                text.starts_with("cannot set up the sandbox's cgroup: "),
                "{text}"
            );
            assert!(!text.contains("codebox doctor"), "{text}");
        }
        let memory = setup_failure(&crate::sandbox::Error::Cgroup(
            CgroupError::ControllerUnavailable {
                controller: Controller::Memory,
            },
        ));
        assert!(memory.contains("memory controller"), "{memory}");
    }
}
