//! The program process (pid 2): the last, unprivileged steps before `execve`.
//!
//! In order: new session, stdio and fd 3, close everything else, rlimits, drop every
//! capability, `no_new_privs`, parent-death signal, landlock, working directory, seccomp,
//! exec. Seccomp goes last so that none of the setup calls needs to be allowed by it.

use nix::sys::resource::{setrlimit, Resource};

use crate::sandbox::child::fds::{self, slot, PROGRAM_CHANNEL_FD};
use crate::sandbox::report::{self, caps_io, check, errno_result, errors_fd, Stage};
use crate::sandbox::spec::SandboxSpec;

/// Runs the program. Called in the child of the init's fork; never returns.
pub fn run(spec: &SandboxSpec) -> ! {
    // 1. No controlling terminal, own process group.
    check(nix::unistd::setsid(), Stage::Setsid, 0);

    // 2. (The parent-death signal is set in step 7b, after the capability changes.)

    // 3. stdin stays /dev/null (set by the init); stdout, stderr and the proxy channel
    //    go to 1, 2 and 3. The errors pipe stays in its slot, close-on-exec.
    check(
        fds::arrange(
            &[
                (slot::STDOUT, 1),
                (slot::STDERR, 2),
                (slot::CHANNEL, PROGRAM_CHANNEL_FD),
            ],
            64,
        ),
        Stage::ProgramStdio,
        0,
    );
    check(fds::set_cloexec_raw(slot::ERRORS), Stage::ProgramStdio, 1);

    // 4. Nothing else stays open: 0-3 for the program, the errors pipe until exec, and
    //    the inherited descriptors (if any) where the init put them.
    let inherited = spec.program.inherit.len() as i32;
    check(
        fds::close_range(slot::ERRORS + 1, (slot::INHERITED - 1) as libc::c_uint),
        Stage::CloseFds,
        0,
    );
    check(
        fds::close_from(slot::INHERITED + inherited),
        Stage::CloseFds,
        1,
    );

    // 5. Resource limits.
    let limits = &spec.limits;
    for (i, (resource, value)) in [
        (Resource::RLIMIT_CORE, 0),
        (Resource::RLIMIT_NOFILE, limits.open_files),
        (Resource::RLIMIT_FSIZE, limits.file_size_bytes),
    ]
    .into_iter()
    .enumerate()
    {
        check(setrlimit(resource, value, value), Stage::Rlimit, i as u32);
    }

    // 6. Drop every capability: bounding set first (needs CAP_SETPCAP), then ambient,
    //    inheritable, effective and permitted.
    for (i, set) in [
        caps::CapSet::Bounding,
        caps::CapSet::Ambient,
        caps::CapSet::Inheritable,
        caps::CapSet::Effective,
        caps::CapSet::Permitted,
    ]
    .into_iter()
    .enumerate()
    {
        check(
            caps::clear(None, set).map_err(caps_io),
            Stage::DropCaps,
            i as u32,
        );
    }

    // 7. Nothing executed from here on can gain privileges (setuid bits, file caps).
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes integers only.
    let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    check(errno_result(r), Stage::NoNewPrivs, 0);

    // 7b. Die with the init, set after the last credential change (capabilities
    //     included), which would clear it. The init is pid 1 here: any other parent means
    //     it died before the signal was set (its death kills the namespace anyway).
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes integers only.
    let r = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    check(errno_result(r), Stage::ParentDeathSignal, 1);
    if nix::unistd::getppid().as_raw() != 1 {
        report::fail(errors_fd(), Stage::ParentDeathSignal, 2, libc::ESRCH)
    }

    // 8. Landlock: filesystem, TCP and scope restrictions, reported to the supervisor.
    if let Some(mode) = spec.policy.landlock {
        match crate::sandbox::landlock::restrict_self(mode, spec.policy.network) {
            Ok(status) => report::info(errors_fd(), report::Info::Landlock(status)),
            Err(_) if mode == crate::sandbox::landlock::LandlockMode::BestEffort => report::info(
                errors_fd(),
                report::Info::Landlock(crate::sandbox::landlock::LandlockStatus::NotEnforced),
            ),
            Err(_) => report::fail(errors_fd(), Stage::Landlock, 0, libc::EPERM),
        }
    }

    // 9. Working directory.
    check(
        nix::unistd::chdir(spec.program.cwd.as_c_str()),
        Stage::Chdir,
        0,
    );

    // 10. Seccomp, last: one seccomp(2) call with the filter compiled before the fork (no
    //     allocation). From here on every call of the program, and of everything it
    //     starts, goes through it.
    if let Some(filter) = &spec.policy.seccomp {
        check(filter.install(), Stage::Seccomp, 0);
    }

    // 11. Exec with exactly the environment of the spec.
    let p = &spec.program;
    let err = match nix::unistd::execve(&p.path, &p.argv, &p.env) {
        Err(e) => e,
        Ok(never) => match never {},
    };
    report::fail(errors_fd(), Stage::Exec, 0, err as i32)
}
