//! Executing a [`MountPlan`]: one linear procedure, each step one or a few system calls.
//!
//! Runs in the sandbox init, inside the new user and mount namespaces, before the program
//! is started. The root switch follows the usual pattern: bind the new root onto itself so
//! it is a mount point, `chdir` into it, `pivot_root(".", ".")` stacks the old root on top
//! of the new one, and a lazy unmount of "." detaches the old root for good.

use std::io;
use std::path::Path;

use nix::mount::MsFlags;

use crate::sandbox::child::syscalls::Syscalls;
use crate::sandbox::plan::{MountPlan, MountStep};

/// Runs every step in order; on failure returns the index of the failed step.
pub fn execute(plan: &MountPlan, sys: &dyn Syscalls) -> Result<(), (usize, io::Error)> {
    for (index, step) in plan.steps.iter().enumerate() {
        execute_step(step, sys).map_err(|e| (index, e))?;
    }
    Ok(())
}

fn execute_step(step: &MountStep, sys: &dyn Syscalls) -> io::Result<()> {
    match step {
        MountStep::MakeRootPrivate => sys.mount(
            None,
            Path::new("/"),
            None,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None,
        ),
        MountStep::Bind { source, target } => {
            sys.mount(Some(source), target, None, MsFlags::MS_BIND, None)
        }
        MountStep::Remount { target, flags } => sys.mount(
            None,
            target,
            None,
            MsFlags::MS_REMOUNT | MsFlags::MS_BIND | *flags,
            None,
        ),
        MountStep::Proc { target } => sys.mount(
            Some(Path::new("proc")),
            target,
            Some("proc"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None,
        ),
        MountStep::Tmpfs {
            target,
            size_bytes,
            mode,
            flags,
        } => sys.mount(
            Some(Path::new("tmpfs")),
            target,
            Some("tmpfs"),
            *flags,
            Some(&MountPlan::tmpfs_options(*size_bytes, *mode)),
        ),
        MountStep::Mkdir { path, mode } => sys.mkdir(path, *mode),
        MountStep::CreateFile { path } => sys.create_file(path),
        MountStep::BindDevice { source, target } => {
            sys.mount(Some(source), target, None, MsFlags::MS_BIND, None)
        }
        MountStep::Symlink { target, link } => sys.symlink(target, link),
        MountStep::AttachMount { fd, target } => sys.attach_mount(*fd, target),
        MountStep::PivotRoot { new_root } => {
            // The new root is a mount point (bound onto itself earlier). With both
            // arguments ".", the old root ends up mounted on top of the new one; the lazy
            // unmount then detaches it, and nothing of the host's tree stays reachable.
            sys.chdir(new_root)?;
            sys.pivot_root(Path::new("."), Path::new("."))?;
            sys.umount_detach(Path::new("."))?;
            sys.chdir(Path::new("/"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::child::syscalls::Recorder;
    use crate::sandbox::idmap::IdMapping;
    use crate::sandbox::plan::LockedFlags;
    use crate::sandbox::spec::{Limits, Program, SandboxSpec};

    fn plan() -> MountPlan {
        let spec = SandboxSpec {
            rootfs: "/r".into(),
            workspace: Some("/w".into()),
            workspace_mount: None,
            servers: None,
            skills: None,
            trust: None,
            packages: None,
            program: Program::new("/usr/bin/python3", &["python3"], &[], "/").unwrap(),
            limits: Limits::default(),
            id_mapping: IdMapping::rootless(1000, 1000),
            hostname: "codebox".into(),
            policy: crate::sandbox::SecurityPolicy::default_profile().unwrap(),
        };
        MountPlan::for_spec(&spec, LockedFlags::default())
    }

    #[test]
    fn procedure_makes_private_then_pivots_and_detaches_old_root() {
        let rec = Recorder::new();
        execute(&plan(), &rec).unwrap();
        let calls = rec.calls.into_inner();
        assert!(
            calls[0].starts_with("mount None / None MsFlags(MS_REC | MS_PRIVATE)"),
            "{}",
            calls[0]
        );
        let tail: Vec<_> = calls[calls.len() - 4..].to_vec();
        assert_eq!(
            tail,
            [
                "chdir /r",
                "pivot_root . .",
                "umount2 . MNT_DETACH",
                "chdir /"
            ]
        );
    }

    #[test]
    fn rootfs_remount_is_a_read_only_bind_remount() {
        let rec = Recorder::new();
        execute(&plan(), &rec).unwrap();
        let calls = rec.calls.into_inner();
        let remount = &calls[calls.len() - 5];
        assert!(remount.starts_with("mount None /r None"), "{remount}");
        for flag in [
            "MS_RDONLY",
            "MS_NOSUID",
            "MS_NODEV",
            "MS_REMOUNT",
            "MS_BIND",
        ] {
            assert!(remount.contains(flag), "{remount} lacks {flag}");
        }
    }

    #[test]
    fn tmpfs_gets_size_mode_and_owner() {
        let rec = Recorder::new();
        execute(&plan(), &rec).unwrap();
        let calls = rec.calls.into_inner();
        let tmp = calls
            .iter()
            .find(|c| c.contains(" /r/tmp "))
            .expect("tmp mounted");
        assert!(tmp.contains("Some(\"tmpfs\")"));
        assert!(
            tmp.contains("size=67108864,mode=1777,uid=1000,gid=1000"),
            "{tmp}"
        );
    }

    #[test]
    fn failure_reports_the_failing_step_and_stops() {
        let mut rec = Recorder::new();
        rec.fail_on = Some("mount Some(\"proc\")");
        let (index, err) = execute(&plan(), &rec).unwrap_err();
        assert_eq!(
            plan().steps[index],
            MountStep::Proc {
                target: "/r/proc".into()
            }
        );
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
        assert!(rec.calls.borrow().last().unwrap().contains("proc"));
        assert_eq!(rec.calls.borrow().len(), index + 1);
    }
}
