use super::*;

fn vault() -> Arc<crate::pii::Vault> {
    Arc::new(crate::pii::Vault::new(Arc::new(
        crate::pii::Detector::builtin(),
    )))
}

fn sessions(base: &Path, ttl: Duration) -> Sessions {
    let limits = SessionLimits {
        idle_ttl: ttl,
        max_sessions: 3,
        ..SessionLimits::default()
    };
    let ids = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    Sessions::new(base, limits, ids).unwrap()
}

/// Writes `data` to `name` in the workspace through its descriptor.
fn write(session: &Session, name: &str, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let fd = nix::fcntl::openat(
        session.workspace(),
        name,
        nix::fcntl::OFlag::O_CREAT | nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )?;
    std::fs::File::from(fd).write_all(data)
}

#[tokio::test]
async fn a_replica_qualifies_its_ids_and_names_the_owner_of_another_replicas() {
    use crate::replica::ReplicaName;
    let base = tempfile::tempdir().unwrap();
    let r1 = sessions(base.path(), Duration::from_secs(60))
        .with_replica(Some(ReplicaName::parse("r1").unwrap()));
    let a = r1.create("alice", vault()).unwrap();
    assert!(a.id().starts_with("r1.cbx_"), "{}", a.id());
    r1.get(a.id(), "alice").unwrap();
    // Made elsewhere: a clear answer naming both replicas, for any client.
    let elsewhere = r1.get("r2.cbx_0123", "alice").unwrap_err();
    assert!(matches!(elsewhere, Error::Elsewhere { .. }), "{elsewhere}");
    let text = elsewhere.to_string();
    assert!(text.contains("\"r2\"") && text.contains("\"r1\""), "{text}");
    // An unqualified id, or another client's, is simply unknown.
    assert!(matches!(
        r1.get("cbx_0123", "alice"),
        Err(Error::Unknown { .. })
    ));
    assert!(matches!(r1.get(a.id(), "bob"), Err(Error::Unknown { .. })));
    // A single server never takes a qualified id for one of its own.
    let single = sessions(base.path(), Duration::from_secs(60));
    assert!(matches!(
        single.get(a.id(), "alice"),
        Err(Error::Unknown { .. })
    ));
    r1.shutdown().await;
}

#[tokio::test]
async fn ids_are_random_owned_and_limited() {
    let base = tempfile::tempdir().unwrap();
    let s = sessions(base.path(), Duration::from_secs(60));
    let a = s.create("alice", vault()).unwrap();
    let b = s.create("alice", vault()).unwrap();
    assert_ne!(a.id(), b.id());
    // `cbx_`, this run's instance mark and `_`, then 128 random bits.
    assert_eq!(a.id().len(), 4 + 9 + 32);
    s.get(a.id(), "alice").unwrap();
    let refused = s.get(a.id(), "bob").unwrap_err().to_string();
    let unknown = s.get("cbx_nope", "bob").unwrap_err().to_string();
    assert_eq!(
        refused.replace(a.id(), "X"),
        unknown.replace("cbx_nope", "X"),
        "another client's session looks like an unknown one"
    );
    s.create("bob", vault()).unwrap();
    assert!(matches!(
        s.create("bob", vault()),
        Err(Error::TooMany { open: 3 })
    ));
    assert!(s.close(a.id(), "bob").await.is_err());
    write(&a, "f", b"x").unwrap();
    s.close(a.id(), "alice").await.unwrap();
    assert_eq!(disk::names(a.workspace()).unwrap().len(), 0);
    // A closed session is told as such to its owner, and unknown to anyone else.
    let closed = s.get(a.id(), "alice").unwrap_err();
    assert!(matches!(closed, Error::Closed { .. }), "{closed}");
    assert!(closed.to_string().contains("was closed"), "{closed}");
    assert!(matches!(s.get(a.id(), "bob"), Err(Error::Unknown { .. })));
    s.shutdown().await;
    // Nothing of a session is on the host's disk.
    assert_eq!(std::fs::read_dir(base.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn the_kernel_enforces_the_quota_on_blocks_and_inodes() {
    let base = tempfile::tempdir().unwrap();
    let limits = SessionLimits {
        quota_bytes: 1024 * 1024,
        max_entries: 10,
        ..SessionLimits::default()
    };
    let ids = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    let s = Sessions::new(base.path(), limits, ids).unwrap();
    let a = s.create("alice", vault()).unwrap();
    let err = write(&a, "big", &vec![1u8; 2 * 1024 * 1024]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    assert!(disk::usage(a.workspace()).unwrap().full);
    nix::unistd::unlinkat(
        a.workspace(),
        "big",
        nix::unistd::UnlinkatFlags::NoRemoveDir,
    )
    .unwrap();
    let made = (0..20)
        .take_while(|i| write(&a, &format!("f{i}"), b"").is_ok())
        .count();
    assert_eq!(made, 10, "nr_inodes is the entry limit");
    let u = disk::usage(a.workspace()).unwrap();
    assert_eq!((u.entries, u.full), (10, true));
    // Directory times have the kernel's coarse clock (a tick); a run is longer.
    std::thread::sleep(Duration::from_millis(20));
    nix::unistd::unlinkat(a.workspace(), "f0", nix::unistd::UnlinkatFlags::NoRemoveDir).unwrap();
    assert_ne!(
        disk::usage(a.workspace()).unwrap().root_changed_ns,
        u.root_changed_ns
    );
    write(&a, "f0", b"").unwrap();
    // A copy of the mount is the same filesystem (its ten files and out/).
    let copy = s.mount_for_run(&a).unwrap();
    assert_eq!(disk::names(copy.as_fd()).unwrap().len(), 11);
    s.shutdown().await;
}

/// A keeper that dies (here killed while the session waits between runs) is replaced
/// by the next request, which does not fail for it; the replacement joins the dead
/// one's namespaces, so the open session's next run finds its files. `keeper_status`
/// tells the story.
#[tokio::test]
async fn a_dead_keeper_is_replaced_and_sessions_keep_their_workspaces() {
    let base = tempfile::tempdir().unwrap();
    let s = sessions(base.path(), Duration::from_secs(60));
    let a = s.create("alice", vault()).unwrap();
    write(&a, "f", b"x").unwrap();
    let before = s.keeper_status();
    assert!(before.alive && before.restarts == 0, "{before:?}");
    let first = before.pid.unwrap();
    let kill = |pid: i32| {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL).unwrap()
    };
    kill(first);
    // Right away: the request that finds it dead (or dying) is served by the new one.
    let copy = s.mount_for_run(&a).unwrap();
    assert_eq!(
        disk::names(copy.as_fd()).unwrap().len(),
        2,
        "the session's file and out/"
    );
    let after = s.keeper_status();
    assert!(after.alive, "{after:?}");
    assert_eq!(after.restarts, 1, "{after:?}");
    assert_ne!(after.pid, Some(first));
    assert!(
        after
            .last_reason
            .as_deref()
            .is_some_and(|r| r.contains("SIGKILL")),
        "{after:?}"
    );
    assert_eq!(after.lost_epochs, 0);
    // Again, noticed by health first this time.
    kill(after.pid.unwrap());
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while s.keeper_status().alive {
        assert!(std::time::Instant::now() < until, "the keeper did not die");
        std::thread::sleep(Duration::from_millis(10));
    }
    let b = s.create("alice", vault()).unwrap();
    s.mount_for_run(&b).unwrap();
    s.mount_for_run(&a).unwrap();
    assert_eq!(s.keeper_status().restarts, 2);
    s.shutdown().await;
}

#[tokio::test]
async fn idle_sessions_expire_and_their_workspace_goes() {
    let base = tempfile::tempdir().unwrap();
    let s = sessions(base.path(), Duration::from_millis(50));
    let a = s.create("alice", vault()).unwrap();
    write(&a, "f", b"x").unwrap();
    let busy = s.create("alice", vault()).unwrap();
    let held = busy.slots.lock().await;
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(s.sweep().await, 1, "the running session stays");
    assert_eq!(disk::names(a.workspace()).unwrap().len(), 0);
    let expired = s.get(a.id(), "alice").unwrap_err();
    assert!(matches!(expired, Error::Expired { .. }), "{expired}");
    assert!(expired.to_string().contains("session_ttl"), "{expired}");
    // A second server (a restart) knows the id for an earlier run's.
    let restarted = sessions(base.path(), Duration::from_millis(50));
    let earlier = restarted.get(busy.id(), "alice").unwrap_err();
    assert!(matches!(earlier, Error::EarlierRun { .. }), "{earlier}");
    assert!(earlier.to_string().contains("restarted"), "{earlier}");
    drop(held);
    s.shutdown().await;
}
