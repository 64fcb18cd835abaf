//! Creating a sandbox: the supervisor's side of `clone3`.
//!
//! 1. Plan everything (mount plan, program image) while still single-threaded parent code.
//! 2. Create the pipes: sync (parent → init), errors (init/program → parent), status
//!    (init → parent), stdout, stderr, and the fd-3 socketpair.
//! 3. `clone3` into new user, mount, pid, net, ipc, uts and cgroup namespaces.
//! 4. Write the child's `setgroups`, `uid_map` and `gid_map`, then release it.
//! 5. Wait for end of file on the errors pipe: the program has exec'd (close-on-exec) —
//!    or a failure record arrives and the sandbox is killed and reaped.

use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::time::Instant;

use nix::unistd::Pid;

use super::cgroup::{CgroupLimits, CgroupManager};
use super::clone::{clone_into_namespaces, Forked, NAMESPACES};
use super::error::{Error, Result};
use super::fds;
use super::init::{self, ChildFds};
use super::plan::{LockedFlags, MountPlan};
use super::report::{self, FAILURE_LEN};
use super::spec::{Limits, SandboxSpec};
use super::{Sandbox, SandboxIo, Watch};

/// Creates a sandbox running `spec.program`; returns once the program has been exec'd.
///
/// Must be called from a single-threaded process (see `clone.rs`).
pub fn spawn(spec: &SandboxSpec, cgroups: Option<&CgroupManager>) -> Result<Sandbox> {
    spec.validate()?;
    let t0 = Instant::now();
    // The cgroup exists, with its limits, before the process does.
    let cgroup = match (cgroups, cgroup_limits(&spec.limits)) {
        (Some(manager), limits) => Some(manager.create("sandbox", &limits)?),
        (None, limits) if limits.controllers().is_empty() => None,
        (None, _) => return Err(Error::NoCgroups),
    };
    let cgroup_created = t0.elapsed();
    let locked = LockedFlags::of(&spec.rootfs).map_err(|source| Error::Io {
        doing: "reading the rootfs mount flags",
        source,
    })?;
    let plan = MountPlan::for_spec(spec, locked);

    let fd_err = |what| move |source| Error::CreateFd { what, source };
    let (sync_r, sync_w) = fds::pipe().map_err(fd_err("sync pipe"))?;
    let (errors_r, errors_w) = fds::pipe().map_err(fd_err("errors pipe"))?;
    let (status_r, status_w) = fds::pipe().map_err(fd_err("status pipe"))?;
    let (stdout_r, stdout_w) = fds::pipe().map_err(fd_err("stdout pipe"))?;
    let (stderr_r, stderr_w) = fds::pipe().map_err(fd_err("stderr pipe"))?;
    let (channel, channel_child) = fds::socketpair().map_err(fd_err("fd-3 socketpair"))?;
    let child_fds = ChildFds {
        sync: sync_r.as_raw_fd(),
        errors: errors_w.as_raw_fd(),
        status: status_w.as_raw_fd(),
        stdout: stdout_w.as_raw_fd(),
        stderr: stderr_w.as_raw_fd(),
        channel: channel_child.as_raw_fd(),
    };

    // SAFETY: the caller guarantees a single-threaded process; the child branch below
    // never returns (init::run ends in _exit or execve, and a panic ends in _exit).
    let forked = unsafe {
        clone_into_namespaces(NAMESPACES, cgroup.as_ref().and_then(|c| c.clone_into_fd()))
    };
    let (pid, pidfd) = match forked {
        Err(source) => return Err(classify_clone_error(source)),
        Ok(Forked::Child) => {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                init::run(child_fds, &plan, spec)
            }));
            // SAFETY: _exit never unwinds into the parent's frames copied by the clone.
            unsafe { libc::_exit(101) }
        }
        Ok(Forked::Parent { pid, pidfd }) => (pid, pidfd),
    };
    drop((
        sync_r,
        errors_w,
        status_w,
        stdout_w,
        stderr_w,
        channel_child,
    ));
    let cloned = t0.elapsed();
    let started = Instant::now();
    let mut sandbox = Sandbox {
        io: SandboxIo {
            stdout: stdout_r,
            stderr: stderr_r,
            channel,
            landlock: None,
        },
        watch: Watch {
            pid,
            pidfd,
            status: status_r,
            cgroup,
            reaped: false,
        },
        started,
    };

    // v1 hierarchies (and v2 without CLONE_INTO_CGROUP): move the init in while it still
    // waits for the release, so nothing of the sandbox ever runs outside its limits.
    if let Some(cg) = &sandbox.watch.cgroup {
        cg.add_process(pid.as_raw())?;
    }

    let joined = t0.elapsed();
    if let Err(e) = write_id_maps(pid, spec) {
        tracing::error!(?e, pid = pid.as_raw(), "writing id maps failed");
        return Err(e);
    }
    fds::write_all_raw(sync_w.as_raw_fd(), b"1").map_err(|source| Error::Release { source })?;
    drop(sync_w);
    let released = t0.elapsed();

    // Info records may come first; end of file means the program was exec'd.
    let mut record = [0u8; FAILURE_LEN];
    let got = loop {
        let got = fds::read_full(errors_r.as_fd(), &mut record).map_err(|source| Error::Io {
            doing: "waiting for the program to start",
            source,
        })?;
        match (got, report::decode_info(&record)) {
            (FAILURE_LEN, Some(report::Info::Landlock(status))) => {
                sandbox.io.landlock = Some(status)
            }
            _ => break got,
        }
    };
    tracing::debug!(
        cgroup_us = cgroup_created.as_micros() as u64,
        cloned_us = cloned.as_micros() as u64,
        joined_us = joined.as_micros() as u64,
        released_us = released.as_micros() as u64,
        exec_us = t0.elapsed().as_micros() as u64,
        "spawn steps"
    );
    match got {
        0 => Ok(sandbox.started_now()),
        FAILURE_LEN => {
            let failure = report::decode_failure(&record, &plan.steps);
            drop(sandbox);
            match failure {
                Some(failure) => {
                    let source = std::io::Error::from_raw_os_error(failure.errno);
                    tracing::error!(%failure, ?source, "sandbox setup failed");
                    Err(Error::Setup { failure, source })
                }
                None => Err(Error::SetupCutOff),
            }
        }
        _ => Err(Error::SetupCutOff),
    }
}

/// The cgroup limits of a sandbox's limits.
pub fn cgroup_limits(limits: &Limits) -> CgroupLimits {
    const PERIOD_US: u64 = 100_000;
    CgroupLimits {
        memory_bytes: limits.memory_bytes,
        pids: limits.pids,
        cpu_quota: limits
            .cpu_millicores
            .map(|m| ((m * PERIOD_US / 1000).max(1000), PERIOD_US)),
    }
}

/// `setgroups`, then `uid_map` and `gid_map` of the new user namespace.
fn write_id_maps(pid: Pid, spec: &SandboxSpec) -> Result<()> {
    let proc = PathBuf::from(format!("/proc/{}", pid.as_raw()));
    let map = &spec.id_mapping;
    let write = |name: &str, contents: &str| {
        let path = proc.join(name);
        std::fs::write(&path, contents).map_err(|source| Error::WriteIdMap { path, source })
    };
    if let Some(value) = map.setgroups() {
        write("setgroups", value)?;
    }
    write("uid_map", &map.uid_map())?;
    write("gid_map", &map.gid_map())
}

/// Turns a failed clone into an error that says how to fix the host when user
/// namespaces are the problem.
fn classify_clone_error(source: std::io::Error) -> Error {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let errno = source.raw_os_error();
    if errno == Some(libc::ENOSPC)
        || read("/proc/sys/user/max_user_namespaces").as_deref() == Some("0")
    {
        return Error::UserNamespacesUnavailable {
            reason: "user.max_user_namespaces is 0 or exhausted".into(),
            fix: "run `sysctl -w user.max_user_namespaces=15000`",
            source,
        };
    }
    if errno == Some(libc::EPERM) {
        let reason = if read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
            "kernel.unprivileged_userns_clone is 0".to_string()
        } else if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref()
            == Some("1")
        {
            "AppArmor restricts unprivileged user namespaces".to_string()
        } else {
            "clone3(CLONE_NEWUSER) was refused".to_string()
        };
        return Error::UserNamespacesUnavailable {
            reason,
            fix: "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, \
                  or kernel.apparmor_restrict_unprivileged_userns=0), or run codebox as root",
            source,
        };
    }
    Error::Clone { source }
}
