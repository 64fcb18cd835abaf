//! Discovery, path planning, stale detection and stats against fake `/proc` and cgroup
//! trees in temp directories (no root, no real cgroups).

use std::path::{Path, PathBuf};

use super::*;

const PID: i32 = 4242;
const START: u64 = 1000;

/// A fake host: `proc/` and `fs/` (the root the mount points are relative to).
pub(super) struct FakeHost {
    tmp: tempfile::TempDir,
}

impl FakeHost {
    pub(super) fn new(self_cgroup: &str, mountinfo: &str) -> FakeHost {
        let host = FakeHost {
            tmp: tempfile::tempdir().unwrap(),
        };
        host.write("proc/self/cgroup", self_cgroup);
        host.write("proc/self/mountinfo", mountinfo);
        let stat = format!("{PID} (codebox) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {START} 0 0\n");
        host.write("proc/self/stat", &stat);
        host.write(&format!("proc/{PID}/stat"), &stat);
        host
    }

    /// This development machine's layout (see discover.rs).
    pub(super) fn hybrid() -> FakeHost {
        let host = FakeHost::new(HYBRID_CGROUP, HYBRID_MOUNTINFO);
        for d in [
            "cpu",
            "cpuacct",
            "cpuset",
            "memory/process_api/abc",
            "devices",
            "freezer",
            "blkio",
            "pids",
            "systemd",
        ] {
            host.write(&format!("fs/sys/fs/cgroup/{d}/cgroup.procs"), "");
        }
        host.write("fs/sys/fs/cgroup/unified/cgroup.procs", "1\n");
        host.write("fs/sys/fs/cgroup/unified/cgroup.controllers", "hugetlb\n");
        host.write("fs/sys/fs/cgroup/unified/cgroup.subtree_control", "\n");
        host
    }

    /// A systemd v2 host, codebox in a unit with Delegate=yes.
    fn v2_delegated(own: &str) -> FakeHost {
        let host = FakeHost::new(
            &format!("0::{own}\n"),
            "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n",
        );
        let base = "fs/sys/fs/cgroup/user.slice/codebox.service";
        host.write(
            &format!("{base}/cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        );
        host.write(&format!("{base}/cgroup.subtree_control"), "\n");
        host.write(&format!("{base}/cgroup.type"), "domain\n");
        host.write(&format!("{base}/cgroup.procs"), &format!("{PID}\n4243\n"));
        host.write(&format!("{base}/{SUPERVISOR_LEAF}/cgroup.procs"), "");
        // 4243: a child of the supervisor (the spawner, say).
        host.write(
            "proc/4243/stat",
            &format!("4243 (spawner) S {PID} 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 2000 0 0\n"),
        );
        host
    }

    pub(super) fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    pub(super) fn write(&self, rel: &str, text: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    pub(super) fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap()
    }

    fn manager(&self) -> CgroupManager {
        CgroupManager::discover(&self.path("proc"), &self.path("fs")).unwrap()
    }
}

pub(super) const HYBRID_CGROUP: &str = "9:name=systemd:/\n8:pids:/\n7:blkio:/\n6:freezer:/\n\
    5:devices:/\n4:memory:/process_api/abc\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n";
pub(super) const HYBRID_MOUNTINFO: &str = "\
25 1 0:22 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

const ALL_V1: [Controller; 5] = [
    Controller::Memory,
    Controller::Pids,
    Controller::Cpu,
    Controller::CpuAcct,
    Controller::Freezer,
];

/// Forgets the on-disk side of a handle made on a fake tree (rmdir cannot remove
/// directories holding the regular files the tests put there).
fn discard(cg: SandboxCgroup) {
    for p in cg.paths() {
        let _ = std::fs::remove_dir_all(p);
    }
    cg.remove().unwrap();
}

#[test]
fn hybrid_host_is_discovered_per_controller() {
    let host = FakeHost::hybrid();
    let m = host.manager();
    assert_eq!(
        m.backend(),
        Backend::Hybrid {
            v2: vec![],
            v1: ALL_V1.to_vec()
        }
    );
    assert_eq!(m.backend().controllers(), ALL_V1.to_vec());
    let cg = host.path("fs/sys/fs/cgroup");
    let bases: Vec<(u8, PathBuf, Vec<Controller>)> = m
        .hierarchies()
        .into_iter()
        .map(|h| (h.version, h.base, h.controllers))
        .collect();
    assert_eq!(
        bases,
        vec![
            (2, cg.join("unified"), vec![]),
            (1, cg.join("pids"), vec![Controller::Pids]),
            (1, cg.join("freezer"), vec![Controller::Freezer]),
            (
                1,
                cg.join("memory/process_api/abc"),
                vec![Controller::Memory]
            ),
            (1, cg.join("cpuacct"), vec![Controller::CpuAcct]),
            (1, cg.join("cpu"), vec![Controller::Cpu]),
        ]
    );
    assert!(m.notes().is_empty(), "{:?}", m.notes());
    assert!(m.backend().to_string().starts_with("cgroups: hybrid"));
}

#[test]
fn create_plans_one_directory_per_hierarchy() {
    let host = FakeHost::hybrid();
    let m = host.manager();
    let limits = CgroupLimits {
        memory_bytes: Some(64 << 20),
        pids: Some(16),
        cpu_quota: None,
    };
    let cg = m.create("python", &limits).unwrap();
    let name = cg.name().to_string();
    assert!(
        name.starts_with(&format!("codebox-{PID}-{START}-")),
        "{name}"
    );
    assert!(name.ends_with("-python"), "{name}");
    let root = host.path("fs/sys/fs/cgroup");
    let expect: Vec<PathBuf> = [
        "unified",
        "pids",
        "freezer",
        "memory/process_api/abc",
        "cpuacct",
        "cpu",
    ]
    .iter()
    .map(|h| root.join(h).join(&name))
    .collect();
    assert_eq!(
        cg.paths(),
        expect.iter().map(PathBuf::as_path).collect::<Vec<_>>()
    );
    assert!(expect.iter().all(|p| p.is_dir()));
    assert!(
        cg.clone_into_fd().is_some(),
        "v2 directory fd for CLONE_INTO_CGROUP"
    );
    assert_eq!(
        host.read(&format!(
            "fs/sys/fs/cgroup/memory/process_api/abc/{name}/memory.limit_in_bytes"
        )),
        "67108864"
    );
    assert_eq!(
        host.read(&format!("fs/sys/fs/cgroup/pids/{name}/pids.max")),
        "16"
    );
    // Nothing written where the controller is not.
    assert!(!root.join("unified").join(&name).join("memory.max").exists());
    assert!(!root.join("cpu").join(&name).join("pids.max").exists());
    discard(cg);
    assert!(expect.iter().all(|p| !p.exists()));
}

#[test]
fn names_are_unique_and_hints_checked() {
    let host = FakeHost::hybrid();
    let m = host.manager();
    let a = m.create("", &CgroupLimits::default()).unwrap();
    let b = m.create("", &CgroupLimits::default()).unwrap();
    assert_ne!(a.name(), b.name());
    assert!(matches!(
        m.create("../escape", &CgroupLimits::default()),
        Err(Error::InvalidName(_))
    ));
    discard(a);
    discard(b);
}

#[test]
fn add_process_skips_v2_when_clone_into_placed_it() {
    let host = FakeHost::hybrid();
    let m = host.manager();
    let cg = m.create("", &CgroupLimits::default()).unwrap();
    for p in cg.paths() {
        std::fs::write(p.join("cgroup.procs"), "").unwrap();
    }
    // The child sits in the v2 cgroup already (CLONE_INTO_CGROUP), v1 not yet.
    host.write(
        "proc/777/cgroup",
        &format!("8:pids:/\n4:memory:/process_api/abc\n0::/{}\n", cg.name()),
    );
    cg.add_process(777).unwrap();
    let v2 = cg.v2_path().unwrap().to_path_buf();
    assert_eq!(
        std::fs::read_to_string(v2.join("cgroup.procs")).unwrap(),
        ""
    );
    for p in &cg.paths()[1..] {
        assert_eq!(
            std::fs::read_to_string(p.join("cgroup.procs")).unwrap(),
            "777"
        );
    }
    // Not placed yet: written to v2 as well.
    cg.add_process(778).unwrap();
    assert_eq!(
        std::fs::read_to_string(v2.join("cgroup.procs")).unwrap(),
        "778"
    );
    discard(cg);
}

#[test]
fn stats_come_from_the_controllers_hierarchies() {
    let host = FakeHost::hybrid();
    let m = host.manager();
    let cg = m.create("", &CgroupLimits::default()).unwrap();
    let n = cg.name().to_string();
    let root = "fs/sys/fs/cgroup";
    host.write(
        &format!("{root}/memory/process_api/abc/{n}/memory.max_usage_in_bytes"),
        "67108864\n",
    );
    host.write(
        &format!("{root}/memory/process_api/abc/{n}/memory.oom_control"),
        "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
    );
    host.write(&format!("{root}/pids/{n}/pids.events"), "max 4\n");
    host.write(
        &format!("{root}/unified/{n}/cpu.stat"),
        "usage_usec 1500\nuser_usec 1000\n",
    );
    host.write(&format!("{root}/cpuacct/{n}/cpuacct.usage"), "9999000\n");
    assert_eq!(
        cg.stats().unwrap(),
        CgroupStats {
            peak_memory_bytes: Some(64 << 20),
            cpu_usec: Some(1500),
            oom_killed: true,
            pids_limited: true,
        }
    );
    discard(cg);
}

#[test]
fn a_limit_without_its_controller_is_an_error() {
    let mountinfo: String = HYBRID_MOUNTINFO
        .lines()
        .filter(|l| !l.contains("rw,pids"))
        .map(|l| format!("{l}\n"))
        .collect();
    let host = FakeHost::new(HYBRID_CGROUP, &mountinfo);
    host.write("fs/sys/fs/cgroup/unified/cgroup.controllers", "");
    host.write("fs/sys/fs/cgroup/memory/process_api/abc/cgroup.procs", "");
    for d in ["cpu", "cpuacct", "freezer"] {
        host.write(&format!("fs/sys/fs/cgroup/{d}/cgroup.procs"), "");
    }
    let m = host.manager();
    assert!(!m.backend().controllers().contains(&Controller::Pids));
    assert!(
        m.notes().iter().any(|n| n.contains("pids")),
        "{:?}",
        m.notes()
    );
    let limits = CgroupLimits {
        pids: Some(16),
        ..Default::default()
    };
    assert!(matches!(
        m.create("", &limits),
        Err(Error::ControllerUnavailable {
            controller: Controller::Pids
        })
    ));
    assert!(matches!(
        m.create(
            "",
            &CgroupLimits {
                memory_bytes: Some(0),
                ..Default::default()
            }
        ),
        Err(Error::InvalidLimit(_))
    ));
}

#[test]
fn nothing_usable_is_backend_none() {
    let host = FakeHost::new("0::/\n", "25 1 0:22 / / rw - ext4 /dev/vda rw\n");
    let m = host.manager();
    assert_eq!(m.backend(), Backend::None);
    assert!(!m.notes().is_empty());
    assert!(matches!(
        m.create("", &CgroupLimits::default()),
        Err(Error::NoHierarchy)
    ));
}

#[test]
fn delegated_v2_subtree_moves_into_a_leaf_then_enables_controllers() {
    let own = "/user.slice/codebox.service";
    let host = FakeHost::v2_delegated(own);
    let base = "fs/sys/fs/cgroup/user.slice/codebox.service";
    let mut m = host.manager();
    assert_eq!(
        m.backend(),
        Backend::V2 {
            controllers: vec![]
        }
    );
    assert!(
        m.notes().iter().any(|n| n.contains("not enabled")),
        "{:?}",
        m.notes()
    );

    let enabled = m.enable_v2_controllers().unwrap();
    assert_eq!(
        enabled,
        vec![Controller::Memory, Controller::Pids, Controller::Cpu]
    );
    // Every process of the unit's cgroup went to the leaf (the fake file keeps the last).
    assert_eq!(
        host.read(&format!("{base}/{SUPERVISOR_LEAF}/cgroup.procs")),
        "4243"
    );
    assert_eq!(
        host.read(&format!("{base}/cgroup.subtree_control")),
        "+memory +pids +cpu"
    );
    assert_eq!(
        m.backend(),
        Backend::V2 {
            controllers: vec![Controller::Memory, Controller::Pids, Controller::Cpu]
        }
    );
    assert!(m.notes().is_empty(), "{:?}", m.notes());
    assert!(
        m.enable_v2_controllers().unwrap().is_empty(),
        "second call is a no-op"
    );

    // A supervisor already in the leaf still creates sandboxes next to it. (The kernel
    // reads subtree_control back without the '+'.)
    host.write("proc/self/cgroup", &format!("0::{own}/{SUPERVISOR_LEAF}\n"));
    host.write(
        &format!("{base}/cgroup.subtree_control"),
        "cpu memory pids\n",
    );
    let again = host.manager();
    assert_eq!(again.hierarchies()[0].base, host.path(base));
    assert_eq!(
        again.backend(),
        Backend::V2 {
            controllers: vec![Controller::Memory, Controller::Pids, Controller::Cpu]
        }
    );
    let cg = again
        .create(
            "deno",
            &CgroupLimits {
                pids: Some(8),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(cg.paths(), vec![host.path(base).join(cg.name()).as_path()]);
    assert_eq!(
        std::fs::read_to_string(cg.paths()[0].join("pids.max")).unwrap(),
        "8"
    );
    assert_eq!(
        cg.v2.as_ref().unwrap().cgroup_path,
        format!("{own}/{}", cg.name())
    );
    discard(cg);
}

#[test]
fn a_shared_v2_cgroup_is_left_alone() {
    let host = FakeHost::v2_delegated("/user.slice/codebox.service");
    let base = "fs/sys/fs/cgroup/user.slice/codebox.service";
    // 900: the login shell, not ours.
    host.write(&format!("{base}/cgroup.procs"), &format!("900\n{PID}\n"));
    host.write(
        "proc/900/stat",
        "900 (bash) S 1 900 900 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 50 0 0\n",
    );
    let mut m = host.manager();
    match m.enable_v2_controllers() {
        Err(Error::SharedCgroup { pids, .. }) => assert_eq!(pids, vec![900]),
        other => panic!("expected SharedCgroup, got {other:?}"),
    }
    assert_eq!(
        host.read(&format!("{base}/{SUPERVISOR_LEAF}/cgroup.procs")),
        ""
    );
    assert_eq!(host.read(&format!("{base}/cgroup.subtree_control")), "\n");
    assert_eq!(
        m.backend(),
        Backend::V2 {
            controllers: vec![]
        }
    );
}

#[test]
fn the_real_root_cgroup_needs_no_leaf() {
    let host = FakeHost::new(
        "0::/\n",
        "30 23 0:26 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw\n",
    );
    host.write("fs/sys/fs/cgroup/cgroup.controllers", "memory pids\n");
    host.write("fs/sys/fs/cgroup/cgroup.subtree_control", "pids\n");
    host.write("fs/sys/fs/cgroup/cgroup.procs", "1\n");
    let mut m = host.manager();
    assert_eq!(
        m.backend(),
        Backend::V2 {
            controllers: vec![Controller::Pids]
        }
    );
    assert_eq!(m.enable_v2_controllers().unwrap(), vec![Controller::Memory]);
    assert!(!host
        .path(&format!("fs/sys/fs/cgroup/{SUPERVISOR_LEAF}"))
        .exists());
    assert_eq!(
        host.read("fs/sys/fs/cgroup/cgroup.subtree_control"),
        "+memory"
    );
}

#[test]
fn stale_cgroups_are_those_of_dead_supervisors() {
    let host = FakeHost::hybrid();
    let m = host.manager();
    let root = "fs/sys/fs/cgroup";
    let make = |hier: &str, name: &str| {
        std::fs::create_dir_all(host.path(&format!("{root}/{hier}/{name}"))).unwrap();
    };
    // Dead supervisor 31337: in two hierarchies.
    make("unified", "codebox-31337-5-1-python");
    make("pids", "codebox-31337-5-1-python");
    // Our own pid but another start time: a previous process with our pid.
    make("memory/process_api/abc", "codebox-4242-999-2");
    // Ours (alive), and names that are not sandbox cgroups.
    make("pids", "codebox-4242-1000-3");
    make("unified", SUPERVISOR_LEAF);
    make("pids", "codebox-delegated-codebox-test");
    make("cpu", "user.slice");
    host.write(
        &format!("{root}/pids/codebox-9-9-9"),
        "a file, not a cgroup",
    );

    let mut stale = m.stale().unwrap();
    let summary: Vec<(String, Option<PathBuf>, Vec<PathBuf>)> = stale
        .iter()
        .map(|cg| {
            (
                cg.name.clone(),
                cg.v2_path().map(Path::to_path_buf),
                cg.v1.iter().map(|d| d.path.clone()).collect(),
            )
        })
        .collect();
    let p = |rel: &str| host.path(&format!("{root}/{rel}"));
    assert_eq!(
        summary,
        vec![
            (
                "codebox-31337-5-1-python".to_string(),
                Some(p("unified/codebox-31337-5-1-python")),
                vec![p("pids/codebox-31337-5-1-python")],
            ),
            (
                "codebox-4242-999-2".to_string(),
                None,
                vec![p("memory/process_api/abc/codebox-4242-999-2")],
            ),
        ]
    );
    assert_eq!(
        stale[0].v2.as_ref().unwrap().cgroup_path,
        "/codebox-31337-5-1-python"
    );
    // The empty fake directories can be removed for real.
    assert_eq!(m.cleanup_stale().unwrap(), 2);
    assert!(!p("unified/codebox-31337-5-1-python").exists());
    assert!(!p("memory/process_api/abc/codebox-4242-999-2").exists());
    assert!(p("pids/codebox-4242-1000-3").exists());
    assert!(p(&format!("unified/{SUPERVISOR_LEAF}")).exists());
    for cg in stale.iter_mut() {
        cg.removed = true;
    }
}

#[test]
fn delegation_creates_and_chowns_in_every_hierarchy() {
    let host = FakeHost::hybrid();
    let m = host.manager();
    let name = "codebox-delegated-someone";
    let root = "fs/sys/fs/cgroup";
    // The kernel would create these files with the directory.
    for h in [
        "unified",
        "pids",
        "freezer",
        "memory/process_api/abc",
        "cpuacct",
        "cpu",
    ] {
        host.write(&format!("{root}/{h}/{name}/cgroup.procs"), "");
        let extra: &[&str] = if h == "unified" {
            &["cgroup.threads", "cgroup.subtree_control"]
        } else {
            &["tasks"]
        };
        for f in extra {
            host.write(&format!("{root}/{h}/{name}/{f}"), "");
        }
    }
    // As root any user but root; otherwise the only uid a chown may give files to.
    let (uid, gid) = if nix::unistd::geteuid().is_root() {
        (1001, 1001)
    } else {
        (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        )
    };
    let procs = m.delegate_for_user(name, uid, gid).unwrap();
    assert_eq!(procs.len(), 6);
    assert_eq!(
        procs[3],
        host.path(&format!(
            "{root}/memory/process_api/abc/{name}/cgroup.procs"
        ))
    );
    assert!(m.delegate_for_user("../x", uid, gid).is_err());
    // Delegated directories are not sandbox cgroups.
    assert!(m.stale().unwrap().is_empty());
}

#[test]
fn limits_validation() {
    let ok = CgroupLimits {
        memory_bytes: Some(1 << 20),
        pids: Some(1),
        cpu_quota: Some((1_000, 1_000_000)),
    };
    ok.validate().unwrap();
    for bad in [
        CgroupLimits {
            pids: Some(0),
            ..ok
        },
        CgroupLimits {
            cpu_quota: Some((999, 100_000)),
            ..ok
        },
        CgroupLimits {
            cpu_quota: Some((50_000, 999)),
            ..ok
        },
        CgroupLimits {
            cpu_quota: Some((50_000, 1_000_001)),
            ..ok
        },
    ] {
        assert!(
            matches!(bad.validate(), Err(Error::InvalidLimit(_))),
            "{bad:?}"
        );
    }
    assert_eq!(
        ok.controllers(),
        vec![Controller::Memory, Controller::Pids, Controller::Cpu]
    );
    assert!(as_i64("memory", u64::MAX).is_err());
}
