//! The mount plan: which filesystems the sandbox sees, as data.
//!
//! [`MountPlan::for_spec`] decides every mount, in order, before any process exists; the
//! sandbox init only walks the list (see [`crate::sandbox::child::mounts::execute`]). Keeping the plan pure
//! lets the unit tests check the whole layout without root or namespaces.
//!
//! The layout (paths inside the sandbox):
//! - `/`          the rootfs, bound non-recursively, read-only, nosuid, nodev
//! - `/proc`      a fresh procfs of the sandbox's pid namespace
//! - `/dev`       a small tmpfs, read-only after setup, holding binds of the host's
//!   null, zero, full, random and urandom and the usual fd symlinks
//! - `/dev/shm`   a fresh size-limited tmpfs
//! - `/tmp`       a fresh size-limited tmpfs
//! - `/workspace` a session's own tmpfs (a detached mount passed in, see
//!   `session/keeper.rs`), a host directory bound read-write, or a private tmpfs
//! - `/servers`   the generated tool wrappers, when there are upstreams, and `/skills` the
//!   saved skills: host directories bound read-only, nosuid, nodev, noexec
//! - `/etc/codebox` in proxy mode, the egress trust bundle (`ca-bundle.pem`: the host's
//!   CA roots and codebox's own CA): a host directory bound the same way
//! - `/packages`  an installed package layer: bound read-only, nosuid, nodev, but not
//!   noexec (its native modules are mapped executable)
//!
//! Every writable mount is nosuid, nodev and noexec.

use std::path::{Path, PathBuf};

use nix::mount::MsFlags;

use super::idmap::SANDBOX_ID;
use super::spec::SandboxSpec;

/// Device nodes bound from the host into the sandbox's `/dev`.
pub const DEVICES: [&str; 5] = ["null", "zero", "full", "random", "urandom"];

/// Symlinks created in the sandbox's `/dev`: (link name, target).
pub const DEV_SYMLINKS: [(&str, &str); 4] = [
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
];

/// One step of the plan. Paths are host paths (the rootfs is not the root yet) until
/// [`MountStep::PivotRoot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountStep {
    /// `mount --make-rprivate /`: no mount event propagates back to the host.
    MakeRootPrivate,
    /// Bind a host directory (non-recursively): the rootfs onto itself, or the workspace.
    Bind { source: PathBuf, target: PathBuf },
    /// Re-apply a bind mount's flags, e.g. to make it read-only.
    Remount { target: PathBuf, flags: MsFlags },
    /// A fresh procfs of the sandbox's pid namespace.
    Proc { target: PathBuf },
    /// A fresh tmpfs owned by the sandbox user.
    Tmpfs {
        target: PathBuf,
        size_bytes: u64,
        mode: u32,
        flags: MsFlags,
    },
    /// An empty directory on a tmpfs created earlier in the plan.
    Mkdir { path: PathBuf, mode: u32 },
    /// An empty file to bind a device node onto.
    CreateFile { path: PathBuf },
    /// Bind a host device node.
    BindDevice { source: PathBuf, target: PathBuf },
    /// A symlink on a tmpfs created earlier in the plan.
    Symlink { target: PathBuf, link: PathBuf },
    /// Attach a detached mount received as descriptor `fd` (a session's workspace).
    AttachMount {
        fd: std::os::fd::RawFd,
        target: PathBuf,
    },
    /// Make `new_root` the root and detach the old one.
    PivotRoot { new_root: PathBuf },
}

/// In words, for error messages: `bind /a on /b`, `tmpfs on /tmp` ...
impl std::fmt::Display for MountStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MountStep::MakeRootPrivate => f.write_str("making / private"),
            MountStep::Bind { source, target } => {
                write!(f, "bind {} on {}", source.display(), target.display())
            }
            MountStep::Remount { target, .. } => write!(f, "remount {}", target.display()),
            MountStep::Proc { target } => write!(f, "proc on {}", target.display()),
            MountStep::Tmpfs { target, .. } => write!(f, "tmpfs on {}", target.display()),
            MountStep::Mkdir { path, .. } => write!(f, "mkdir {}", path.display()),
            MountStep::CreateFile { path } => write!(f, "create {}", path.display()),
            MountStep::BindDevice { source, target } => {
                write!(
                    f,
                    "bind device {} on {}",
                    source.display(),
                    target.display()
                )
            }
            MountStep::Symlink { target, link } => {
                write!(f, "symlink {} -> {}", link.display(), target.display())
            }
            MountStep::AttachMount { target, .. } => {
                write!(f, "attach the workspace mount on {}", target.display())
            }
            MountStep::PivotRoot { new_root } => write!(f, "pivot_root to {}", new_root.display()),
        }
    }
}

/// Flags for every writable mount.
pub const WRITABLE_FLAGS: MsFlags = MsFlags::MS_NOSUID
    .union(MsFlags::MS_NODEV)
    .union(MsFlags::MS_NOEXEC);

/// Mount flags of the filesystem the rootfs lives on that a user namespace may not clear
/// (the kernel locks them on mounts copied from a more privileged namespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockedFlags(pub MsFlags);

impl Default for LockedFlags {
    fn default() -> Self {
        LockedFlags(MsFlags::empty())
    }
}

impl LockedFlags {
    /// Reads the flags of the mount holding `path`.
    pub fn of(path: &Path) -> std::io::Result<Self> {
        use nix::sys::statvfs::{statvfs, FsFlags};
        let st = statvfs(path).map_err(std::io::Error::from)?;
        let f = st.flags();
        let mut out = MsFlags::empty();
        for (fs, ms) in [
            (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
            (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
            (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
            (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
        ] {
            if f.contains(fs) {
                out |= ms;
            }
        }
        Ok(LockedFlags(out))
    }
}

/// The ordered list of mount steps for one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPlan {
    pub steps: Vec<MountStep>,
}

impl MountPlan {
    /// Plans the layout described in the module documentation.
    pub fn for_spec(spec: &SandboxSpec, rootfs_flags: LockedFlags) -> MountPlan {
        let root = &spec.rootfs;
        let at = |p: &str| root.join(p);
        let limits = &spec.limits;
        let mut steps = vec![
            MountStep::MakeRootPrivate,
            MountStep::Bind {
                source: root.clone(),
                target: root.clone(),
            },
            MountStep::Proc { target: at("proc") },
            MountStep::Tmpfs {
                target: at("dev"),
                size_bytes: 64 * 1024,
                mode: 0o755,
                flags: MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            },
        ];
        for dev in DEVICES {
            steps.push(MountStep::CreateFile {
                path: at("dev").join(dev),
            });
            steps.push(MountStep::BindDevice {
                source: Path::new("/dev").join(dev),
                target: at("dev").join(dev),
            });
        }
        for (link, target) in DEV_SYMLINKS {
            steps.push(MountStep::Symlink {
                target: target.into(),
                link: at("dev").join(link),
            });
        }
        steps.push(MountStep::Mkdir {
            path: at("dev/shm"),
            mode: 0o755,
        });
        steps.push(MountStep::Remount {
            target: at("dev"),
            flags: MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        });
        steps.push(MountStep::Tmpfs {
            target: at("dev/shm"),
            size_bytes: limits.shm_bytes,
            mode: 0o1777,
            flags: WRITABLE_FLAGS,
        });
        steps.push(MountStep::Tmpfs {
            target: at("tmp"),
            size_bytes: limits.tmpfs_bytes,
            mode: 0o1777,
            flags: WRITABLE_FLAGS,
        });
        match &spec.workspace {
            // A session's own filesystem, already nosuid, nodev, noexec and limited.
            _ if spec.workspace_mount.is_some() => steps.push(MountStep::AttachMount {
                fd: crate::sandbox::child::fds::slot::WORKSPACE,
                target: at("workspace"),
            }),
            Some(dir) => {
                steps.push(MountStep::Bind {
                    source: dir.clone(),
                    target: at("workspace"),
                });
                steps.push(MountStep::Remount {
                    target: at("workspace"),
                    flags: WRITABLE_FLAGS,
                });
            }
            None => steps.push(MountStep::Tmpfs {
                target: at("workspace"),
                size_bytes: limits.tmpfs_bytes,
                mode: 0o755,
                flags: WRITABLE_FLAGS,
            }),
        }
        // Generated wrappers and saved skills: read by the sandbox, never written.
        for (dir, target) in [
            (&spec.servers, "servers"),
            (&spec.skills, "skills"),
            (&spec.trust, "etc/codebox"),
        ] {
            if let Some(dir) = dir {
                steps.push(MountStep::Bind {
                    source: dir.clone(),
                    target: at(target),
                });
                steps.push(MountStep::Remount {
                    target: at(target),
                    flags: MsFlags::MS_RDONLY | WRITABLE_FLAGS,
                });
            }
        }
        // An installed package layer: read-only, but executable: its native modules
        // (`.so` files) are mapped like the rootfs's own libraries. Nothing can write it.
        if let Some(dir) = &spec.packages {
            steps.push(MountStep::Bind {
                source: dir.clone(),
                target: at("packages"),
            });
            steps.push(MountStep::Remount {
                target: at("packages"),
                flags: MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            });
        }
        steps.push(MountStep::Remount {
            target: root.clone(),
            flags: MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | rootfs_flags.0,
        });
        steps.push(MountStep::PivotRoot {
            new_root: root.clone(),
        });
        MountPlan { steps }
    }

    /// Binds the host's `/dev/<name>` into the sandbox's `/dev` too, before `/dev` is made
    /// read-only (a plan without `/dev` gets nothing).
    pub fn add_device(&mut self, root: &Path, name: &str) {
        let dev = root.join("dev");
        let Some(at) = self
            .steps
            .iter()
            .position(|s| matches!(s, MountStep::Remount { target, .. } if *target == dev))
        else {
            return;
        };
        self.steps.splice(
            at..at,
            [
                MountStep::CreateFile {
                    path: dev.join(name),
                },
                MountStep::BindDevice {
                    source: Path::new("/dev").join(name),
                    target: dev.join(name),
                },
            ],
        );
    }

    /// The tmpfs mount options for a step, as passed to mount(2).
    pub fn tmpfs_options(size_bytes: u64, mode: u32) -> String {
        format!("size={size_bytes},mode={mode:o},uid={SANDBOX_ID},gid={SANDBOX_ID}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::idmap::IdMapping;
    use crate::sandbox::spec::{Limits, Program};

    fn spec(workspace: Option<&str>) -> SandboxSpec {
        SandboxSpec {
            rootfs: "/r".into(),
            workspace: workspace.map(PathBuf::from),
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
        }
    }

    fn plan(workspace: Option<&str>) -> Vec<MountStep> {
        MountPlan::for_spec(&spec(workspace), LockedFlags::default()).steps
    }

    fn position(steps: &[MountStep], pred: impl Fn(&MountStep) -> bool) -> usize {
        steps.iter().position(pred).expect("step present")
    }

    #[test]
    fn an_added_device_is_bound_before_dev_turns_read_only() {
        let mut p = MountPlan::for_spec(&spec(None), LockedFlags::default());
        let before = p.steps.len();
        p.add_device(Path::new("/r"), "kvm");
        assert_eq!(p.steps.len(), before + 2);
        let bind = position(
            &p.steps,
            |s| matches!(s, MountStep::BindDevice { source, .. } if source == Path::new("/dev/kvm")),
        );
        let ro = position(
            &p.steps,
            |s| matches!(s, MountStep::Remount { target, .. } if target == Path::new("/r/dev")),
        );
        assert!(bind < ro);
        // Nothing else changes for a language sandbox's plan.
        assert!(!plan(None).iter().any(|s| s.to_string().contains("kvm")));
    }

    #[test]
    fn steps_read_as_words_in_messages() {
        let step = MountStep::Bind {
            source: "/srv/ws".into(),
            target: "/new/workspace".into(),
        };
        assert_eq!(step.to_string(), "bind /srv/ws on /new/workspace");
        for step in plan(Some("/srv/ws")) {
            let text = step.to_string();
            assert!(!text.contains('{') && !text.contains("\""), "{text}");
        }
    }

    #[test]
    fn starts_private_and_ends_with_pivot() {
        let steps = plan(None);
        assert_eq!(steps[0], MountStep::MakeRootPrivate);
        assert_eq!(
            steps.last().unwrap(),
            &MountStep::PivotRoot {
                new_root: "/r".into()
            }
        );
    }

    #[test]
    fn rootfs_is_bound_then_made_read_only_nosuid_nodev() {
        let steps = plan(None);
        let bind = position(
            &steps,
            |s| matches!(s, MountStep::Bind { source, target } if source == Path::new("/r") && target == Path::new("/r")),
        );
        let remount = position(
            &steps,
            |s| matches!(s, MountStep::Remount { target, .. } if target == Path::new("/r")),
        );
        assert!(bind < remount);
        let MountStep::Remount { flags, .. } = &steps[remount] else {
            unreachable!()
        };
        assert!(flags.contains(MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV));
        // Every other mount happens below the rootfs before it turns read-only.
        assert_eq!(remount, steps.len() - 2);
    }

    #[test]
    fn locked_flags_are_preserved_on_remount() {
        let steps = MountPlan::for_spec(
            &spec(None),
            LockedFlags(MsFlags::MS_NOEXEC | MsFlags::MS_NOATIME),
        )
        .steps;
        let MountStep::Remount { flags, .. } = &steps[steps.len() - 2] else {
            panic!("remount expected")
        };
        assert!(flags.contains(MsFlags::MS_NOEXEC | MsFlags::MS_NOATIME));
    }

    #[test]
    fn dev_holds_exactly_the_minimal_devices_and_is_read_only() {
        let steps = plan(None);
        let devices: Vec<_> = steps
            .iter()
            .filter_map(|s| match s {
                MountStep::BindDevice { source, target } => Some((source.clone(), target.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(devices.len(), DEVICES.len());
        for (name, (source, target)) in DEVICES.iter().zip(&devices) {
            assert_eq!(source, &Path::new("/dev").join(name));
            assert_eq!(target, &Path::new("/r/dev").join(name));
        }
        let ro = position(
            &steps,
            |s| matches!(s, MountStep::Remount { target, flags } if target == Path::new("/r/dev") && flags.contains(MsFlags::MS_RDONLY)),
        );
        let last_dev_write = steps
            .iter()
            .rposition(|s| {
                matches!(
                    s,
                    MountStep::CreateFile { .. }
                        | MountStep::Symlink { .. }
                        | MountStep::Mkdir { .. }
                )
            })
            .unwrap();
        assert!(
            last_dev_write < ro,
            "/dev turns read-only after it is populated"
        );
    }

    #[test]
    fn writable_mounts_are_nosuid_nodev_noexec() {
        for steps in [plan(None), plan(Some("/home/u/ws"))] {
            for s in &steps {
                if let MountStep::Tmpfs { target, flags, .. } = s {
                    if target != Path::new("/r/dev") {
                        assert!(flags.contains(WRITABLE_FLAGS), "{target:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn workspace_is_bound_when_given_else_tmpfs() {
        let steps = plan(Some("/home/u/ws"));
        assert!(steps.contains(&MountStep::Bind {
            source: "/home/u/ws".into(),
            target: "/r/workspace".into()
        }));
        assert!(steps.contains(&MountStep::Remount {
            target: "/r/workspace".into(),
            flags: WRITABLE_FLAGS
        }));
        let steps = plan(None);
        assert!(steps.iter().any(
            |s| matches!(s, MountStep::Tmpfs { target, .. } if target == Path::new("/r/workspace"))
        ));
        assert!(!steps.iter().any(
            |s| matches!(s, MountStep::Bind { target, .. } if target == Path::new("/r/workspace"))
        ));
    }

    #[test]
    fn a_workspace_mount_is_attached_from_its_slot() {
        let mut s = spec(None);
        s.workspace_mount = Some(42);
        let steps = MountPlan::for_spec(&s, LockedFlags::default()).steps;
        assert!(steps.contains(&MountStep::AttachMount {
            fd: crate::sandbox::child::fds::slot::WORKSPACE,
            target: "/r/workspace".into()
        }));
        assert!(!steps.iter().any(|st| matches!(st,
            MountStep::Tmpfs { target, .. } | MountStep::Bind { target, .. }
                if target == Path::new("/r/workspace"))));
    }

    #[test]
    fn tmp_and_shm_sizes_follow_limits() {
        let mut s = spec(None);
        s.limits.tmpfs_bytes = 1234;
        s.limits.shm_bytes = 99;
        let steps = MountPlan::for_spec(&s, LockedFlags::default()).steps;
        assert!(steps.iter().any(|st| matches!(st, MountStep::Tmpfs { target, size_bytes: 1234, .. } if target == Path::new("/r/tmp"))));
        assert!(steps.iter().any(|st| matches!(st, MountStep::Tmpfs { target, size_bytes: 99, .. } if target == Path::new("/r/dev/shm"))));
    }

    #[test]
    fn nothing_but_devices_comes_from_the_host() {
        // Apart from the rootfs itself and the optional workspace, no host path is bound.
        for s in plan(None) {
            if let MountStep::Bind { source, .. } = s {
                assert_eq!(source, Path::new("/r"));
            }
        }
    }

    #[test]
    fn read_only_binds_are_read_only_and_noexec_before_the_root_is_sealed() {
        for (field, source, target) in [
            ("servers", "/gen/servers", "/r/servers"),
            ("skills", "/gen/skills", "/r/skills"),
            ("trust", "/state/egress-trust", "/r/etc/codebox"),
        ] {
            let mut s = spec(None);
            let dir = Some(PathBuf::from(source));
            match field {
                "servers" => s.servers = dir,
                "skills" => s.skills = dir,
                _ => s.trust = dir,
            }
            let steps = MountPlan::for_spec(&s, LockedFlags::default()).steps;
            let bind = steps
                .iter()
                .position(|st| {
                    st == &MountStep::Bind {
                        source: source.into(),
                        target: target.into(),
                    }
                })
                .unwrap_or_else(|| panic!("{field} bound"));
            assert_eq!(
                steps[bind + 1],
                MountStep::Remount {
                    target: target.into(),
                    flags: MsFlags::MS_RDONLY
                        | MsFlags::MS_NOSUID
                        | MsFlags::MS_NODEV
                        | MsFlags::MS_NOEXEC,
                }
            );
            let seal = steps
                .iter()
                .position(
                    |st| matches!(st, MountStep::Remount { target, .. } if target == Path::new("/r")),
                )
                .unwrap();
            assert!(bind < seal);
            assert!(!plan(None).iter().any(
                |st| matches!(st, MountStep::Bind { target: t, .. } if t == Path::new(target))
            ));
        }
    }

    #[test]
    fn a_package_layer_is_read_only_but_executable() {
        let mut s = spec(None);
        s.packages = Some("/cache/layers/python/k".into());
        let steps = MountPlan::for_spec(&s, LockedFlags::default()).steps;
        let bind = position(&steps, |st| {
            st == &MountStep::Bind {
                source: "/cache/layers/python/k".into(),
                target: "/r/packages".into(),
            }
        });
        assert_eq!(
            steps[bind + 1],
            MountStep::Remount {
                target: "/r/packages".into(),
                flags: MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            }
        );
        let seal = position(
            &steps,
            |st| matches!(st, MountStep::Remount { target, .. } if target == Path::new("/r")),
        );
        assert!(bind < seal);
    }

    #[test]
    fn tmpfs_options_name_the_sandbox_user() {
        assert_eq!(
            MountPlan::tmpfs_options(1024, 0o1777),
            "size=1024,mode=1777,uid=1000,gid=1000"
        );
    }
}
