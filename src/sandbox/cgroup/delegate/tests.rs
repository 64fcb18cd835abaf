//! Delegation plans against fake `/proc` and cgroup trees (no root, no real cgroups).

use std::os::unix::fs::{chown, MetadataExt};
use std::path::{Path, PathBuf};

use super::super::tests::FakeHost;
use super::*;

const NAME: &str = "codebox-delegated-alice";
const UID: u32 = 1001;
const GID: u32 = 1002;

fn parent(version: u8, dir: &str, controllers: &[Controller]) -> ParentDir {
    ParentDir {
        version,
        controllers: controllers.to_vec(),
        enabled: Vec::new(),
        dir: PathBuf::from(dir),
        cgroup_path: "/".into(),
        read_only: false,
        with_cpuset: false,
    }
}

/// The hybrid development machine: root's own cgroups (the tops, but memory's own is
/// `/process_api/abc`: the delegation stays below it, within root's memory bounds).
fn hybrid_roots(host: &FakeHost) -> Roots {
    at_roots(&host.path("proc"), &host.path("fs")).unwrap()
}

#[test]
fn parents_are_this_process_s_own_cgroups_in_the_hierarchies_codebox_uses() {
    let host = FakeHost::hybrid();
    let roots = hybrid_roots(&host);
    let top = |h: &str| host.path(&format!("fs/sys/fs/cgroup/{h}"));
    let found: Vec<(u8, PathBuf, Vec<Controller>)> = roots
        .parents
        .iter()
        .map(|p| (p.version, p.dir.clone(), p.controllers.clone()))
        .collect();
    assert_eq!(
        found,
        vec![
            // hugetlb is no controller codebox uses.
            (2, top("unified"), vec![]),
            (1, top("pids"), vec![Controller::Pids]),
            (1, top("freezer"), vec![Controller::Freezer]),
            (1, top("memory/process_api/abc"), vec![Controller::Memory]),
            (1, top("cpuacct"), vec![Controller::CpuAcct]),
            (1, top("cpu"), vec![Controller::Cpu]),
        ]
    );
    let paths: Vec<&str> = roots
        .parents
        .iter()
        .map(|p| p.cgroup_path.as_str())
        .collect();
    assert_eq!(paths, ["/", "/", "/", "/process_api/abc", "/", "/"]);
    assert!(roots.notes.is_empty());
}

#[test]
fn hybrid_plan_chowns_what_the_user_writes() {
    let host = FakeHost::hybrid();
    let plan = plan(&hybrid_roots(&host).parents, NAME, UID, GID).unwrap();
    assert_eq!((plan.uid, plan.gid, plan.name.as_str()), (UID, GID, NAME));
    let v2 = &plan.dirs[0];
    let dir = host.path(&format!("fs/sys/fs/cgroup/unified/{NAME}"));
    assert_eq!(v2.hierarchy(), "v2");
    assert_eq!(v2.dir, dir);
    assert_eq!(v2.cgroup_path, format!("/{NAME}"));
    assert_eq!(
        v2.chown,
        vec![
            dir.clone(),
            dir.join("cgroup.procs"),
            dir.join("cgroup.threads"),
            dir.join("cgroup.subtree_control")
        ]
    );
    assert_eq!(v2.leaf, Some(dir.join(SUPERVISOR_LEAF)));
    assert_eq!(v2.entry(), dir.join(SUPERVISOR_LEAF).join("cgroup.procs"));
    assert!(v2.enable_in_parent.is_empty(), "no v2 controllers here");
    let memory = &plan.dirs[3];
    let dir = host.path(&format!("fs/sys/fs/cgroup/memory/process_api/abc/{NAME}"));
    assert_eq!(memory.hierarchy(), "v1 memory");
    assert_eq!(
        memory.chown,
        vec![dir.clone(), dir.join("cgroup.procs"), dir.join("tasks")]
    );
    assert_eq!(memory.entry(), dir.join("cgroup.procs"));
    assert_eq!(memory.leaf, None);
    assert!(plan.dirs.iter().all(|d| !d.copy_cpuset));
}

#[test]
fn v2_plan_enables_what_the_parent_does_not_pass_down_yet() {
    let mut p = parent(
        2,
        "/sys/fs/cgroup",
        &[Controller::Memory, Controller::Pids, Controller::Cpu],
    );
    p.enabled = vec![Controller::Memory];
    let planned = plan(&[p.clone()], NAME, UID, GID).unwrap();
    assert_eq!(
        planned.dirs[0].enable_in_parent,
        vec![Controller::Pids, Controller::Cpu]
    );
    assert_eq!(planned.dirs[0].hierarchy(), "v2");
    p.enabled = p.controllers.clone();
    let planned = plan(&[p], NAME, UID, GID).unwrap();
    assert!(planned.dirs[0].enable_in_parent.is_empty());
}

#[test]
fn co_mounted_cpuset_is_copied_and_named() {
    let mut p = parent(
        1,
        "/sys/fs/cgroup/cpu,cpuacct",
        &[Controller::Cpu, Controller::CpuAcct],
    );
    p.with_cpuset = true;
    let planned = plan(&[p], NAME, UID, GID).unwrap();
    assert!(planned.dirs[0].copy_cpuset);
    assert_eq!(planned.dirs[0].hierarchy(), "v1 cpu,cpuacct");
}

#[test]
fn a_container_delegates_below_what_its_mount_shows() {
    let host = FakeHost::new(
        "0::/\n",
        "30 23 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
    );
    host.write(
        "fs/sys/fs/cgroup/cgroup.controllers",
        "cpuset cpu io memory pids\n",
    );
    host.write("fs/sys/fs/cgroup/cgroup.subtree_control", "cpu\n");
    let roots = hybrid_roots(&host);
    assert_eq!(roots.parents[0].dir, host.path("fs/sys/fs/cgroup"));
    assert_eq!(roots.parents[0].enabled, vec![Controller::Cpu]);
    let planned = plan(&roots.parents, NAME, UID, GID).unwrap();
    assert_eq!(planned.dirs[0].cgroup_path, format!("/docker/abc/{NAME}"));
    assert_eq!(
        planned.dirs[0].enable_in_parent,
        vec![Controller::Memory, Controller::Pids]
    );
}

#[test]
fn unmounted_hierarchies_are_noted() {
    let host = FakeHost::new("4:memory:/\n0::/\n", "");
    let roots = hybrid_roots(&host);
    assert!(roots.parents.is_empty());
    assert_eq!(
        roots.notes,
        vec!["v1 memory: not mounted", "v2: not mounted"]
    );
    assert!(matches!(
        plan(&roots.parents, NAME, UID, GID),
        Err(DelegationError::NoHierarchy)
    ));
}

#[test]
fn bad_input_is_refused_before_anything_changes() {
    let ok = [parent(1, "/sys/fs/cgroup/pids", &[Controller::Pids])];
    for name in [
        "",
        "a/b",
        "/abs",
        "..",
        ".",
        "a..b",
        ".hidden",
        "sp ace",
        "new\nline",
        "codebox-12-34-5",
        "codebox-12-34-5-python",
        SUPERVISOR_LEAF,
        &"x".repeat(65),
    ] {
        let e = plan(&ok, name, UID, GID).unwrap_err();
        assert!(
            matches!(e, DelegationError::InvalidName { .. }),
            "{name:?}: {e}"
        );
    }
    for name in [
        "codebox-delegated-alice",
        "team_a@example.org",
        "x.y-z",
        &"x".repeat(64),
    ] {
        check_name(name).unwrap();
    }
    assert!(matches!(
        plan(&ok, NAME, 0, 0),
        Err(DelegationError::ToRoot)
    ));
    let mut ro = parent(1, "/sys/fs/cgroup/memory", &[Controller::Memory]);
    ro.read_only = true;
    let e = plan(&[ok[0].clone(), ro], NAME, UID, GID).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, DelegationError::ReadOnly { .. }), "{e}");
    assert!(
        text.contains("v1 memory") && text.contains("/sys/fs/cgroup/memory"),
        "{text}"
    );
}

#[test]
fn read_only_mounts_are_found_in_mountinfo() {
    let host = FakeHost::new(
        "8:pids:/\n",
        "39 31 0:36 / /sys/fs/cgroup/pids ro,relatime - cgroup cgroup rw,pids\n",
    );
    let roots = hybrid_roots(&host);
    assert!(roots.parents[0].read_only);
    assert!(matches!(
        plan(&roots.parents, NAME, UID, GID),
        Err(DelegationError::ReadOnly { .. })
    ));
}

/// Who a fake delegation can go to: as root anyone but root; otherwise the user running
/// the test (the only uid a non-root process may chown to).
fn test_user() -> (u32, u32) {
    if nix::unistd::geteuid().is_root() {
        (UID, GID)
    } else {
        (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    }
}

/// The plan for this fake host, with the files the kernel would create in place.
fn fake_applied(host: &FakeHost) -> DelegationPlan {
    let (uid, gid) = test_user();
    let planned = plan(&hybrid_roots(host).parents, NAME, uid, gid).unwrap();
    for d in &planned.dirs {
        for f in d.chown.iter().skip(1) {
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, "").unwrap();
        }
    }
    planned
}

#[test]
fn apply_twice_changes_nothing_and_someone_elses_dir_is_refused() {
    let host = FakeHost::hybrid();
    let planned = fake_applied(&host);
    for _ in 0..2 {
        let done = apply(&planned).unwrap();
        assert_eq!(done.len(), 6);
        assert!(done.iter().all(|a| !a.created && a.enabled.is_empty()));
    }
    for d in &planned.dirs {
        for p in &d.chown {
            assert_eq!(std::fs::metadata(p).unwrap().uid(), planned.uid);
        }
    }
    // A new directory is made; the fake kernel makes no files in it, so the chown of
    // the first one fails, naming it.
    let other = plan(
        &hybrid_roots(&host).parents,
        "other",
        planned.uid,
        planned.gid,
    )
    .unwrap();
    let e = apply(&other).unwrap_err();
    assert!(other.dirs[0].dir.is_dir());
    assert!(e.to_string().contains("other/cgroup.procs"), "{e}");
    if nix::unistd::geteuid().is_root() {
        chown(&planned.dirs[2].dir, Some(4242), None).unwrap();
        let e = apply(&planned).unwrap_err();
        assert!(
            matches!(e, DelegationError::OwnedByOther { owner: 4242, .. }),
            "{e}"
        );
        let e = remove(&planned).unwrap_err();
        assert!(matches!(e, DelegationError::OwnedByOther { .. }), "{e}");
    }
}

#[test]
fn the_user_enters_v1_alone_and_root_enters_everything() {
    let host = FakeHost::hybrid();
    let planned = fake_applied(&host);
    apply(&planned).unwrap();
    let proc_root = host.path("proc");
    let out = enter_self(&planned, &proc_root, false).unwrap();
    assert!(matches!(&out[0].1, Entered::Skipped(why) if why.contains("only root")));
    let pid = std::process::id().to_string();
    for (d, (dir, e)) in planned.dirs.iter().zip(&out).skip(1) {
        assert_eq!(dir, &d.dir);
        assert_eq!(e, &Entered::Joined(d.dir.join("cgroup.procs")));
        assert_eq!(std::fs::read_to_string(d.entry()).unwrap(), pid);
    }
    // Root makes the v2 leaf (here a plain directory, so its files are made first).
    let leaf = planned.dirs[0].leaf.clone().unwrap();
    std::fs::create_dir(&leaf).unwrap();
    for f in ["cgroup.procs", "cgroup.threads"] {
        std::fs::write(leaf.join(f), "").unwrap();
    }
    let out = enter_self(&planned, &proc_root, true).unwrap();
    assert_eq!(out[0].1, Entered::Joined(leaf.join("cgroup.procs")));
    assert_eq!(
        std::fs::read_to_string(leaf.join("cgroup.procs")).unwrap(),
        pid
    );
}

#[test]
fn nothing_to_enter_says_why() {
    let host = FakeHost::hybrid();
    let mut planned = fake_applied(&host);
    planned.dirs.truncate(1);
    let e = enter_self(&planned, &host.path("proc"), false).unwrap_err();
    assert!(matches!(e, DelegationError::NothingToEnter { .. }), "{e}");
    assert!(e.to_string().contains("only root"), "{e}");
}

#[test]
fn a_process_inside_is_recognised() {
    let own = |text: &str| discover::parse_proc_cgroup(Path::new("cgroup"), text).unwrap();
    let host = FakeHost::hybrid();
    let planned = plan(&hybrid_roots(&host).parents, NAME, UID, GID).unwrap();
    let (v2, memory) = (&planned.dirs[0], &planned.dirs[3]);
    let leaf = format!("0::/{NAME}/{SUPERVISOR_LEAF}\n4:memory:/process_api/abc/{NAME}\n");
    assert!(inside(&own(&leaf), v2));
    assert!(inside(&own(&leaf), memory));
    let elsewhere = format!("0::/{NAME}x\n4:memory:/{NAME}\n");
    assert!(!inside(&own(&elsewhere), v2));
    assert!(!inside(&own(&elsewhere), memory));
    assert!(!inside(&own("1:cpu:/\n"), memory));
}

#[test]
fn processes_anywhere_below_make_it_busy() {
    let host = FakeHost::hybrid();
    let planned = fake_applied(&host);
    let dir = &planned.dirs[1].dir;
    assert!(processes_inside([dir.as_path()].into_iter())
        .unwrap()
        .is_empty());
    host.write(
        &format!("fs/sys/fs/cgroup/pids/{NAME}/codebox-1-2-3/cgroup.procs"),
        "77\n78\n",
    );
    let busy = processes_inside([dir.as_path()].into_iter()).unwrap();
    assert_eq!(busy, vec![(dir.join("codebox-1-2-3"), vec![77, 78])]);
    let e = remove(&planned).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("processes [77, 78] (in ") && text.contains("codebox-1-2-3)"),
        "{text}"
    );
    assert!(dir.exists(), "nothing is removed while busy");
}
