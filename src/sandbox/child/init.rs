//! The sandbox init: pid 1 of the new pid namespace.
//!
//! It runs right after `clone3`, as a single-threaded copy of the spawning process, and
//! does the privileged part of the setup with the capabilities it holds in its new user
//! namespace. Then it forks the program (pid 2), reaps everything, reports the program's
//! status and exits; or it exits early when its deadline passes or the process that
//! spawned it is gone (`lifeline.rs`). Its exit makes the kernel kill whatever else is
//! left in the pid namespace, so nothing the program started outlives the program.
//!
//! Every failure is reported as a [`report`] record on the errors pipe, followed by
//! `_exit(127)`; nothing here returns.

use std::os::fd::{BorrowedFd, RawFd};

use nix::unistd::{ForkResult, Gid, Uid};

use crate::sandbox::cgroup::TasksFds;
use crate::sandbox::child::fds::{self, slot};
use crate::sandbox::child::mounts;
use crate::sandbox::child::netns;
use crate::sandbox::child::program;
use crate::sandbox::child::syscalls::Linux;
use crate::sandbox::idmap::SANDBOX_ID;
use crate::sandbox::lifeline;
use crate::sandbox::plan::MountPlan;
use crate::sandbox::report::{self, caps_io, check, errno_result, errors_fd, ProgramStatus, Stage};
use crate::sandbox::spec::{NetworkAccess, SandboxSpec};

/// The child's ends of the pipes and socketpair, as inherited from the parent.
#[derive(Debug, Clone, Copy)]
pub struct ChildFds {
    pub sync: RawFd,
    pub errors: RawFd,
    pub status: RawFd,
    pub stdout: RawFd,
    pub stderr: RawFd,
    pub channel: RawFd,
    /// The read end of the spawning process's lifeline (see `lifeline.rs`).
    pub lifeline: RawFd,
    /// The read end of this sandbox's control pipe (deadline records).
    pub control: RawFd,
    /// A detached workspace mount to attach at `/workspace`, or -1.
    pub workspace: RawFd,
    /// The socket to hand the egress listener over on (proxy mode), or -1.
    pub egress: RawFd,
    /// The `tasks` files of the sandbox's v1 cgroups, opened by the parent (see
    /// `cgroup/join.rs`); closed in step 0.
    pub cgroup_tasks: TasksFds,
}

/// The init procedure. Called in the child of `clone3`; never returns.
pub fn run(fds: ChildFds, plan: &MountPlan, spec: &SandboxSpec) -> ! {
    // 0. Into the v1 cgroups before anything else, so all the sandbox does is counted and
    //    limited (v2 placed us at clone time). This thread moves itself (`0` to `tasks`),
    //    which spares the kernel's global threadgroup lock. The errors pipe is not in its
    //    slot yet, so a failure is reported on the inherited descriptor.
    if let Err((index, e)) = fds.cgroup_tasks.join_self() {
        // SAFETY: `fds.errors` is the inherited write end of the errors pipe, open here.
        let errors = unsafe { BorrowedFd::borrow_raw(fds.errors) };
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        report::fail(errors, Stage::JoinCgroup, index, errno)
    }

    // 1. Put the inherited descriptors into fixed slots and close everything else the
    //    spawning process had open, so no host descriptor reaches the sandbox. Until the
    //    errors pipe is in its slot, failures can only be signalled by the exit status.
    let fixed = [
        (fds.sync, slot::SYNC),
        (fds.errors, slot::ERRORS),
        (fds.status, slot::STATUS),
        (fds.stdout, slot::STDOUT),
        (fds.stderr, slot::STDERR),
        (fds.channel, slot::CHANNEL),
        (fds.lifeline, slot::LIFELINE),
        (fds.control, slot::CONTROL),
    ];
    let inherited = &spec.program.inherit;
    let mut pairs = [(-1, -1); 10 + crate::sandbox::spec::MAX_INHERITED];
    pairs[..fixed.len()].copy_from_slice(&fixed);
    let mut used = fixed.len();
    for (fd, target) in [(fds.workspace, slot::WORKSPACE), (fds.egress, slot::EGRESS)] {
        if fd >= 0 {
            pairs[used] = (fd, target);
            used += 1;
        }
    }
    // The program's inherited descriptors (validated: at most MAX_INHERITED).
    for (i, &fd) in inherited.iter().enumerate() {
        pairs[used] = (fd, slot::INHERITED + i as i32);
        used += 1;
    }
    if fds::arrange(&pairs[..used], 64).is_err() {
        // SAFETY: _exit is async-signal-safe and skips the parent's copied destructors.
        unsafe { libc::_exit(126) }
    }
    // Close everything above the slots, and the optional slots left unused: whatever the
    // spawning process had open at such a number would stay open here otherwise (its sync
    // write end, say: the read in step 3 would then never see end of file).
    const _: () = assert!(slot::END == slot::EGRESS + 1 && slot::EGRESS == slot::WORKSPACE + 1);
    check(
        fds::close_from(slot::INHERITED + inherited.len() as i32),
        Stage::ArrangeFds,
        0,
    );
    for (fd, unused_slot) in [(fds.workspace, slot::WORKSPACE), (fds.egress, slot::EGRESS)] {
        if fd < 0 {
            // SAFETY: closing a descriptor number this process does not use (EBADF when
            // nothing is open there, which is fine).
            unsafe { libc::close(unused_slot) };
        }
    }

    // 1b. Default dispositions for the signals a spawner ignores (an ignored signal stays
    //     ignored across exec): the program gets what a fresh process has.
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: signal(2) with SIG_DFL installs no handler code.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }

    // 2. (The parent-death signal is set in step 4b: a credential change clears it.)

    // 3. Wait until the supervisor has written our uid/gid maps. End of file instead of a
    //    byte means it gave up on us.
    let mut byte = [0u8; 1];
    // SAFETY: slot::SYNC is open (step 1).
    let sync = unsafe { BorrowedFd::borrow_raw(slot::SYNC) };
    match fds::read_full(sync, &mut byte) {
        Ok(1) => {}
        Ok(_) => report::fail(errors_fd(), Stage::WaitForParent, 0, libc::EPIPE),
        Err(e) => check(Err::<(), _>(e), Stage::WaitForParent, 0),
    }
    // SAFETY: closing a descriptor this process owns and no longer needs.
    unsafe { libc::close(slot::SYNC) };

    // 3b. We are in our own cgroup in every hierarchy by now (v2 at clone time, v1 in
    //     step 0): a fresh cgroup namespace makes that cgroup the root we see.
    check(
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP),
        Stage::CgroupNamespace,
        0,
    );

    // 4. Become the sandbox user. In both modes the capabilities held in the new user
    //    namespace survive (no uid there is "root", so setuid does not clear them); they
    //    are re-raised anyway so the mounts below never depend on that detail.
    let id = SANDBOX_ID;
    if spec.id_mapping.must_clear_groups() {
        check(nix::unistd::setgroups(&[]), Stage::ClearGroups, 0);
    }
    let gid = Gid::from_raw(id);
    check(nix::unistd::setresgid(gid, gid, gid), Stage::SetGid, 0);
    let uid = Uid::from_raw(id);
    check(nix::unistd::setresuid(uid, uid, uid), Stage::SetUid, 0);
    let permitted = check(
        caps::read(None, caps::CapSet::Permitted).map_err(caps_io),
        Stage::RaiseCaps,
        0,
    );
    check(
        caps::set(None, caps::CapSet::Effective, &permitted).map_err(caps_io),
        Stage::RaiseCaps,
        0,
    );

    // 4b. Die with the spawning process, now that no credential change follows (the
    //     kernel clears the parent-death signal on every uid/gid change). Then check it
    //     is still there: if it died before the signal was set, nothing would arrive. In
    //     a new pid namespace getppid() reads 0, so the lifeline tells (see lifeline.rs);
    //     the loop in step 11 keeps watching it.
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes integers only.
    let r = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    check(errno_result(r), Stage::ParentDeathSignal, 0);
    if lifeline::cut(slot::LIFELINE) {
        // SAFETY: _exit ends the init; nobody is left to report to.
        unsafe { libc::_exit(0) }
    }

    // 5. Keep the program (same uid) from ptracing us or reading our /proc entries.
    // SAFETY: prctl(PR_SET_DUMPABLE) takes integers only.
    let r = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    check(errno_result(r), Stage::NotDumpable, 0);

    // 6. Build the filesystem view and switch root (see mounts.rs).
    if let Err((index, e)) = mounts::execute(plan, &Linux) {
        check(Err::<(), _>(e), Stage::Mount, index as u32);
    }

    // 7. Our own hostname in our own UTS namespace.
    check(nix::unistd::sethostname(&spec.hostname), Stage::Hostname, 0);

    // 7b. Proxy mode: `lo` up and the egress listener on 127.0.0.1:port, handed to the
    //     spawning process; this process keeps no copy, so the program (forked below)
    //     can connect to it but never accept on it (see netns.rs).
    if let NetworkAccess::Proxy { port } = spec.policy.network {
        check(netns::loopback_up(), Stage::LoopbackUp, 0);
        let listener = check(netns::listen_on_loopback(port), Stage::EgressListener, 0);
        check(
            netns::send_fd(slot::EGRESS, std::os::fd::AsRawFd::as_raw_fd(&listener)),
            Stage::EgressListener,
            1,
        );
        drop(listener);
        // SAFETY: closing the handover socket this process owns and no longer needs.
        unsafe { libc::close(slot::EGRESS) };
    }

    // 8. Drop the host terminal (or whatever stdio the supervisor had).
    let null = check(
        nix::fcntl::open(
            "/dev/null",
            nix::fcntl::OFlag::O_RDWR,
            nix::sys::stat::Mode::empty(),
        ),
        Stage::InitStdio,
        0,
    );
    check(
        fds::arrange(
            &[
                (std::os::fd::AsRawFd::as_raw_fd(&null), 0),
                (std::os::fd::AsRawFd::as_raw_fd(&null), 1),
                (std::os::fd::AsRawFd::as_raw_fd(&null), 2),
            ],
            64,
        ),
        Stage::InitStdio,
        0,
    );
    drop(null);

    // 9. Start the program as pid 2.
    // SAFETY: this process is single-threaded (a fork-style clone of a single-threaded
    // process), so the child may run arbitrary code.
    let child = match check(unsafe { nix::unistd::fork() }, Stage::ForkProgram, 0) {
        ForkResult::Child => program::run(spec),
        ForkResult::Parent { child } => child,
    };

    // 10. Let go of everything the program owns: once it execs, the supervisor sees end
    //     of file on the errors pipe, and its pipes close when the program's side does.
    for fd in [slot::ERRORS, slot::STDOUT, slot::STDERR, slot::CHANNEL] {
        // SAFETY: closing descriptors this process owns.
        unsafe { libc::close(fd) };
    }
    // The inherited descriptors are the program's alone: its peer must see them close
    // when the program ends, not when the init does.
    let _ = fds::close_range(
        slot::INHERITED,
        (slot::INHERITED + inherited.len() as i32 - 1) as libc::c_uint,
    );

    // 11. Reap until the program itself ends (orphans it leaves are reaped on the way),
    //     the deadline passes or the spawning process is gone.
    let status = match lifeline::watch(child.as_raw()) {
        lifeline::End::Program(status) => status,
        lifeline::End::Deadline => ProgramStatus::Signaled(libc::SIGKILL),
        // SAFETY: _exit ends the init; the kernel kills the rest of the namespace.
        lifeline::End::Orphaned => unsafe { libc::_exit(0) },
    };

    // 12. Report and exit; the kernel kills every process still in the namespace.
    let _ = fds::write_all_raw(slot::STATUS, &report::encode_status(status));
    // SAFETY: _exit ends the init without running destructors copied from the parent.
    unsafe { libc::_exit(0) }
}
