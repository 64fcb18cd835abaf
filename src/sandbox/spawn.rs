//! Creating a sandbox: the supervisor's side of `clone3`.
//!
//! 1. Create the cgroup with its limits and open its v1 `tasks` files; plan everything
//!    (mount plan, program image) while still single-threaded parent code.
//! 2. Create the pipes: sync (parent → init), errors (init/program → parent), status
//!    (init → parent), control (parent → init: deadlines), stdout, stderr, and the fd-3
//!    socketpair; the init also gets this process's lifeline (see `lifeline.rs`).
//! 3. `clone3` into new user, mount, pid, net, ipc, uts and cgroup namespaces (on v2
//!    straight into the cgroup); the init's first act is to join its v1 hierarchies.
//! 4. Write the child's `setgroups`, `uid_map` and `gid_map`, then release it.
//! 5. Wait for end of file on the errors pipe: the program has exec'd (close-on-exec) —
//!    or a failure record arrives and the sandbox is killed and reaped.
//!
//! Every step is timed; `RUST_LOG=codebox=debug` shows them in one "spawn steps" event.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Instant;

use nix::unistd::Pid;

use super::cgroup::{CgroupLimits, CgroupManager, SandboxCgroup, TasksFds};
use super::clone::{clone_into_namespaces, Forked, NAMESPACES};
use super::error::{Error, Result};
use super::lifeline;
use super::plan::{LockedFlags, MountPlan};
use super::report::{self, SetupFailure, Stage, FAILURE_LEN};
use super::spec::{Limits, NetworkAccess, SandboxSpec};
use super::{Sandbox, SandboxIo, Watch};
use crate::sandbox::child::fds;
use crate::sandbox::child::init::{self, ChildFds};
use crate::sandbox::child::netns;
use crate::stopwatch::Stopwatch;

/// Creates a sandbox running `spec.program`; returns once the program has been exec'd.
///
/// Must be called from a single-threaded process (see `clone.rs`).
pub fn spawn(spec: &SandboxSpec, cgroups: Option<&CgroupManager>) -> Result<Sandbox> {
    spawn_with(spec, cgroups, fds::ChannelKind::Stream)
}

/// [`spawn`] with host device nodes bound into the sandbox's `/dev` besides the usual
/// ones: `/dev/kvm` for a jailed VMM that uses KVM (`microvm/jail.rs`), nothing for any
/// language sandbox. Each name is a node under the host's `/dev`.
pub fn spawn_with_devices(
    spec: &SandboxSpec,
    cgroups: Option<&CgroupManager>,
    devices: &[&str],
) -> Result<Sandbox> {
    spawn_planned(spec, cgroups, fds::ChannelKind::Stream, devices)
}

/// [`spawn`], with the program's fd 3 of the given kind (the zygote's is a
/// `SOCK_SEQPACKET` socket: its requests carry descriptors).
pub(super) fn spawn_with(
    spec: &SandboxSpec,
    cgroups: Option<&CgroupManager>,
    channel_kind: fds::ChannelKind,
) -> Result<Sandbox> {
    spawn_planned(spec, cgroups, channel_kind, &[])
}

fn spawn_planned(
    spec: &SandboxSpec,
    cgroups: Option<&CgroupManager>,
    channel_kind: fds::ChannelKind,
    devices: &[&str],
) -> Result<Sandbox> {
    spec.validate()?;
    let mut sw = Stopwatch::start();
    // The cgroup exists, with its limits, before the process does.
    let cgroup = match (cgroups, cgroup_limits(&spec.limits)) {
        (Some(manager), limits) => Some(manager.create("sandbox", &limits)?),
        (None, limits) if limits.controllers().is_empty() => None,
        (None, _) => return Err(Error::NoCgroups),
    };
    let cgroup_us = sw.lap_us();
    // Opened here, written by the child (see cgroup/join.rs); closed in the parent
    // right after the clone.
    let tasks: Vec<OwnedFd> = match &cgroup {
        Some(cg) => cg.open_v1_tasks()?,
        None => Vec::new(),
    };
    let tasks_us = sw.lap_us();
    let locked = LockedFlags::of(&spec.rootfs).map_err(|source| Error::Io {
        doing: "reading the rootfs mount flags",
        source,
    })?;
    let mut plan = MountPlan::for_spec(spec, locked);
    for dev in devices {
        plan.add_device(&spec.rootfs, dev);
    }
    let plan_us = sw.lap_us();

    let fd_err = |what| move |source| Error::CreateFd { what, source };
    let (sync_r, sync_w) = fds::pipe().map_err(fd_err("sync pipe"))?;
    let (errors_r, errors_w) = fds::pipe().map_err(fd_err("errors pipe"))?;
    let (status_r, status_w) = fds::pipe().map_err(fd_err("status pipe"))?;
    let (stdout_r, stdout_w) = fds::pipe().map_err(fd_err("stdout pipe"))?;
    let (stderr_r, stderr_w) = fds::pipe().map_err(fd_err("stderr pipe"))?;
    let (channel, channel_child) =
        fds::socketpair_of(channel_kind).map_err(fd_err("fd-3 socketpair"))?;
    let (control_r, control_w) = fds::pipe().map_err(fd_err("control pipe"))?;
    // An arm never blocks the (single-threaded) spawning process.
    fds::set_nonblocking(control_w.as_fd(), true).map_err(fd_err("control pipe"))?;
    let lifeline = lifeline::read_end().map_err(fd_err("lifeline pipe"))?;
    // Proxy mode: the init hands the egress listener over on this pair (see netns.rs).
    let egress_pair = match spec.policy.network {
        NetworkAccess::Proxy { .. } => {
            Some(fds::socketpair().map_err(fd_err("egress handover socketpair"))?)
        }
        _ => None,
    };
    let child_fds = ChildFds {
        sync: sync_r.as_raw_fd(),
        errors: errors_w.as_raw_fd(),
        status: status_w.as_raw_fd(),
        stdout: stdout_w.as_raw_fd(),
        stderr: stderr_w.as_raw_fd(),
        channel: channel_child.as_raw_fd(),
        lifeline,
        control: control_r.as_raw_fd(),
        workspace: spec.workspace_mount.unwrap_or(-1),
        egress: egress_pair
            .as_ref()
            .map_or(-1, |(_, child)| child.as_raw_fd()),
        cgroup_tasks: TasksFds::of(&tasks),
    };
    let pipes_us = sw.lap_us();

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
        control_r,
        tasks,
    ));
    let egress_handover = egress_pair.map(|(ours, _child)| ours);
    let clone_us = sw.lap_us();
    let mut sandbox = Sandbox {
        io: SandboxIo {
            stdout: stdout_r,
            stderr: stderr_r,
            channel,
            landlock: None,
            egress: None,
        },
        watch: Watch {
            pid,
            pidfd,
            status: status_r,
            cgroup,
            control: lifeline::Control::new(control_w),
            reaped: false,
            reaper: super::Reaper::Us,
        },
        started: Instant::now(),
    };

    // v2 without CLONE_INTO_CGROUP (a handle without a directory fd): move the init in
    // while it still waits for the release. v1 hierarchies: the init joins them itself.
    if let Some(cg) = &sandbox.watch.cgroup {
        if cg.clone_into_fd().is_none() {
            cg.add_process_v2(pid.as_raw())?;
        }
    }
    let join_us = sw.lap_us();

    let maps = write_id_maps(pid, spec);
    let idmap_us = sw.lap_us();
    let released = maps.and_then(|()| {
        fds::write_all_raw(sync_w.as_raw_fd(), b"1").map_err(|source| Error::Release { source })
    });
    drop(sync_w);
    let release_us = sw.lap_us();
    if let Err(e) = released {
        // The init may have failed before it could read the release (joining its cgroup,
        // say): its own record says why better than our failed write does.
        tracing::error!(
            ?e,
            pid = pid.as_raw(),
            "handing over to the sandbox init failed"
        );
        return Err(early_failure(sandbox, &errors_r, &plan).unwrap_or(e));
    }

    let (got, record) = read_start_records(&errors_r, &mut sandbox)?;
    // From the release to the exec: the init's and the program's setup (mounts, pivot,
    // fork, rlimits, caps, landlock, seccomp) and the exec itself.
    let child_setup_us = sw.lap_us();
    tracing::debug!(
        cgroup_us,
        tasks_us,
        plan_us,
        pipes_us,
        clone_us,
        join_us,
        idmap_us,
        release_us,
        child_setup_us,
        total_us = sw.total_us(),
        landlock = ?sandbox.io.landlock,
        "spawn steps"
    );
    match got {
        0 => {
            if let Some(handover) = &egress_handover {
                match netns::receive_fd(handover.as_fd()) {
                    Ok(listener) => sandbox.io.egress = Some(listener),
                    Err(source) => {
                        tracing::error!(?source, pid = pid.as_raw(), "no egress listener");
                        return Err(Error::Io {
                            doing: "receiving the egress listener from the sandbox init",
                            source,
                        });
                    }
                }
            }
            Ok(sandbox.started_now())
        }
        FAILURE_LEN => {
            let failure = report::decode_failure(&record, &plan.steps);
            Err(setup_error(sandbox, failure))
        }
        _ => Err(Error::SetupCutOff),
    }
}

/// Reads the errors pipe until end of file (the program was exec'd, or a zygote's child
/// is ready) or a failure record; info records on the way (landlock's status) go into
/// `sandbox`. Returns the bytes of the last read and the record.
pub(super) fn read_start_records(
    errors: &OwnedFd,
    sandbox: &mut Sandbox,
) -> Result<(usize, [u8; FAILURE_LEN])> {
    let mut record = [0u8; FAILURE_LEN];
    loop {
        let got = fds::read_full(errors.as_fd(), &mut record).map_err(|source| Error::Io {
            doing: "waiting for the program to start",
            source,
        })?;
        match (got, report::decode_info(&record)) {
            (FAILURE_LEN, Some(report::Info::Landlock(status))) => {
                sandbox.io.landlock = Some(status)
            }
            _ => return Ok((got, record)),
        }
    }
}

/// After a failed hand-over: kills the sandbox and returns the failure the init
/// reported before it died, if it reported one.
fn early_failure(sandbox: Sandbox, errors: &OwnedFd, plan: &MountPlan) -> Option<Error> {
    if let Err(e) = sandbox.watch.kill() {
        tracing::warn!(?e, "killing the sandbox init failed");
    }
    // Once the init is dead no write end is left: this read ends.
    let mut record = [0u8; FAILURE_LEN];
    let got = fds::read_full(errors.as_fd(), &mut record).ok()?;
    let failure = (got == FAILURE_LEN)
        .then(|| report::decode_failure(&record, &plan.steps))
        .flatten()?;
    Some(setup_error(sandbox, Some(failure)))
}

/// A setup failure the sandbox reported, logged (with the cgroup directory when joining
/// it failed); the sandbox is killed and reaped.
pub(super) fn setup_error(sandbox: Sandbox, failure: Option<SetupFailure>) -> Error {
    let cgroup = failure
        .as_ref()
        .filter(|f| f.stage == Stage::JoinCgroup)
        .and_then(|f| v1_dir(sandbox.watch.cgroup.as_ref()?, f.detail));
    drop(sandbox);
    match failure {
        Some(failure) => {
            let source = std::io::Error::from_raw_os_error(failure.errno);
            tracing::error!(%failure, ?source, ?cgroup, "sandbox setup failed");
            Error::Setup { failure, source }
        }
        None => Error::SetupCutOff,
    }
}

fn v1_dir(cg: &SandboxCgroup, index: u32) -> Option<PathBuf> {
    cg.v1_path(index as usize).map(|p| p.to_path_buf())
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
