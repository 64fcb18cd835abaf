use super::*;
use std::io::Read;

const ID: &str = "cbx_0a0b0c0d_00112233445566778899aabbccddeeff";
const ID2: &str = "cbx_0a0b0c0d_ffeeddccbbaa99887766554433221100";

fn key(b: u8) -> Arc<SnapshotKey> {
    let mut raw = [b; 32];
    raw[0] = 0;
    Arc::new(SnapshotKey::from_bytes(&raw))
}

fn holder(name: &str) -> Holder {
    Holder {
        replica: Some(name.into()),
        instance: format!("{name}-run"),
        boot: "another-host".into(),
        pid: 1,
        pid_ns: 0,
    }
}

fn bounds() -> Bounds {
    Bounds {
        max_per_client: 4,
        max_bytes_per_client: 64 << 20,
        keep_for: Duration::from_secs(3600),
    }
}

fn store(dir: &Path, name: &str) -> Store {
    Store::open(dir, key(1), holder(name), bounds()).unwrap()
}

fn meta() -> SnapshotMeta {
    SnapshotMeta {
        created_unix: 5,
        backend: "namespace".into(),
        state: StateKind::Files,
        languages: vec!["python".into()],
        keep_alive: vec![],
        workspace: WorkspaceFacts::default(),
        quota_bytes: 1 << 20,
        max_entries: 10,
    }
}

/// Pauses `id` with a workspace part holding `data`.
fn pause(
    s: &Store,
    id: &str,
    owner: &str,
    pos: Option<&LedgerPos>,
    data: &[u8],
) -> Result<PausedInfo> {
    let mut w = s.begin_pause(id, owner, pos)?;
    let mut p = w.part(PartKind::Workspace)?;
    p.write_all(data).unwrap();
    w.add(p)?;
    w.commit(meta())
}

/// Claims `id` and reads its workspace part whole.
fn resume(s: &Store, id: &str, owner: &str) -> Result<(Claimed, Vec<u8>)> {
    let c = s.claim(id, owner)?;
    let mut r = c
        .reader()
        .part(PartKind::Workspace)?
        .expect("a workspace part");
    let mut out = Vec::new();
    r.read_to_end(&mut out)
        .map_err(|e| part_error(PartKind::Workspace, e))?;
    r.finish().map_err(|e| part_error(PartKind::Workspace, e))?;
    Ok((c, out))
}

fn slot_dir(s: &Store, id: &str) -> PathBuf {
    s.dir().join(s.key().slot_of(id))
}

#[test]
fn pause_resume_pause_again_keeps_one_whole_snapshot_per_session() {
    let d = tempfile::tempdir().unwrap();
    let s = store(d.path(), "r1");
    let info = pause(&s, ID, "alice", None, b"first").unwrap();
    assert_eq!(info.generation, 1);
    assert_eq!(s.usage("alice"), (1, info.bytes));
    assert_eq!(s.usage("bob"), (0, 0));
    let listed = s.list("alice");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, ID);
    assert!(s.list("bob").is_empty());
    let (c, data) = resume(&s, ID, "alice").unwrap();
    assert_eq!(data, b"first");
    // Live now: not a paused session, but its fallback snapshot is still on disk.
    assert_eq!(s.usage("alice"), (0, info.bytes), "live now");
    assert_eq!(s.totals().live, 1);
    // Paused again from where it stands: generation 2, the first removed.
    let info = pause(&s, ID, "alice", Some(&c.pos), b"second").unwrap();
    assert_eq!(info.generation, 2);
    let snaps: Vec<String> = std::fs::read_dir(slot_dir(&s, ID))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("snap."))
        .collect();
    assert_eq!(snaps, [snap_name(2)]);
    let (_, data) = resume(&s, ID, "alice").unwrap();
    assert_eq!(data, b"second");
    // Nothing of an id or a client's name is in a file name.
    for e in walk(d.path()) {
        assert!(!e.contains("cbx_") && !e.contains("alice"), "{e}");
    }
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        out.push(e.file_name().to_string_lossy().into_owned());
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        }
    }
    out
}

#[test]
fn another_owner_never_finds_it_and_the_owner_is_told_what_became_of_it() {
    let d = tempfile::tempdir().unwrap();
    let s = store(d.path(), "r1");
    pause(&s, ID, "alice", None, b"x").unwrap();
    assert!(matches!(s.claim(ID, "bob"), Err(Error::NotFound)));
    assert!(matches!(
        s.end(ID, "bob", "closed", None),
        Err(Error::NotFound)
    ));
    assert!(s.state_of(ID, "bob").unwrap().is_none());
    s.end(ID, "alice", "closed", None).unwrap();
    assert!(matches!(s.claim(ID, "alice"), Err(Error::Ended { .. })));
    assert!(!walk(&slot_dir(&s, ID))
        .iter()
        .any(|n| n.starts_with("snap.")));
}

#[test]
fn tampered_truncated_and_foreign_snapshots_are_refused_by_name() {
    let d = tempfile::tempdir().unwrap();
    let s = store(d.path(), "r1");
    let data = vec![3u8; 200_000];
    pause(&s, ID, "alice", None, &data).unwrap();
    pause(&s, ID2, "alice", None, b"other session").unwrap();
    let snap = slot_dir(&s, ID).join(snap_name(1));
    let part = snap.join("workspace");
    let good = std::fs::read(&part).unwrap();

    // A flipped bit in the part: claimed (the manifest is fine), refused while read.
    let mut bad = good.clone();
    bad[100_000] ^= 1;
    std::fs::write(&part, &bad).unwrap();
    let e = resume(&s, ID, "alice").err().unwrap();
    assert!(matches!(e, Error::Forged { .. }), "{e}");
    s.release(&s.claim(ID, "alice").unwrap()).unwrap();

    // Truncated: refused before the claim, by its length.
    std::fs::write(&part, &good[..good.len() - 10]).unwrap();
    let e = s.claim(ID, "alice").err().unwrap();
    assert!(matches!(e, Error::Truncated { .. }), "{e}");
    std::fs::write(&part, &good).unwrap();

    // Another session's snapshot put in this one's place.
    let other = slot_dir(&s, ID2).join(snap_name(1));
    let saved = tempfile::tempdir().unwrap();
    std::fs::rename(&snap, saved.path().join("mine")).unwrap();
    copy_dir(&other, &snap);
    let e = s.claim(ID, "alice").err().unwrap();
    assert!(matches!(e, Error::OtherSession { .. }), "{e}");
    std::fs::remove_dir_all(&snap).unwrap();

    // One sealed by another server's key.
    let d2 = tempfile::tempdir().unwrap();
    let foreign = Store::open(d2.path(), key(2), holder("x"), bounds()).unwrap();
    pause(&foreign, ID, "alice", None, b"theirs").unwrap();
    copy_dir(&slot_dir(&foreign, ID).join(snap_name(1)), &snap);
    let e = s.claim(ID, "alice").err().unwrap();
    assert!(matches!(e, Error::OtherKey { .. }), "{e}");
    assert!(e.to_string().contains("another key"), "{e}");
    std::fs::remove_dir_all(&snap).unwrap();

    // A forged manifest.
    std::fs::rename(saved.path().join("mine"), &snap).unwrap();
    let m = snap.join("manifest");
    let mut mb = std::fs::read(&m).unwrap();
    let n = mb.len();
    mb[n - 20] ^= 4;
    std::fs::write(&m, &mb).unwrap();
    let e = s.claim(ID, "alice").err().unwrap();
    assert!(matches!(e, Error::Forged { .. }), "{e}");
    mb[n - 20] ^= 4;
    std::fs::write(&m, &mb).unwrap();
    let (_, back) = resume(&s, ID, "alice").unwrap();
    assert_eq!(back, data, "whole again once the bytes are back");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn a_store_made_with_another_key_is_refused_at_open() {
    let d = tempfile::tempdir().unwrap();
    store(d.path(), "r1");
    let e = Store::open(d.path(), key(2), holder("r2"), bounds()).unwrap_err();
    assert!(matches!(e, Error::OtherKey { .. }), "{e}");
    store(d.path(), "r2");
}

/// The key marker is never seen half-written (it is linked into place whole), and an
/// empty one (a crash of a version that wrote it in place) is refused, not taken as
/// agreeing with whatever key opens the directory.
#[test]
fn an_empty_key_marker_is_refused_and_none_is_left_half_written() {
    let d = tempfile::tempdir().unwrap();
    store(d.path(), "r1");
    let names: Vec<String> = std::fs::read_dir(d.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.ends_with(".part")), "{names:?}");
    let empty = tempfile::tempdir().unwrap();
    std::fs::write(empty.path().join("key-id"), b"").unwrap();
    for k in [1, 2] {
        let e = Store::open(empty.path(), key(k), holder("r1"), bounds()).unwrap_err();
        assert!(matches!(e, Error::EmptyKeyMarker { .. }), "{e}");
    }
}

#[test]
fn an_older_snapshot_put_back_is_refused_and_a_rolled_back_ledger_is_noticed() {
    let d = tempfile::tempdir().unwrap();
    let s = store(d.path(), "r1");
    pause(&s, ID, "alice", None, b"old").unwrap();
    let slot = slot_dir(&s, ID);
    let copy = tempfile::tempdir().unwrap();
    copy_dir(&slot.join(snap_name(1)), &copy.path().join("snap1"));
    let old_ledger: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&slot)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("log."))
        .map(|e| (e.path(), std::fs::read(e.path()).unwrap()))
        .collect();
    let (c, _) = resume(&s, ID, "alice").unwrap();
    pause(&s, ID, "alice", Some(&c.pos), b"new").unwrap();
    // The old snapshot in the new one's place.
    let snap2 = slot.join(snap_name(2));
    std::fs::remove_dir_all(&snap2).unwrap();
    copy_dir(&copy.path().join("snap1"), &snap2);
    let e = s.claim(ID, "alice").err().unwrap();
    assert!(
        matches!(
            e,
            Error::Replayed {
                found: 1,
                expected: 2
            }
        ),
        "{e}"
    );
    // Old ledger and old snapshot together: this server saw later entries.
    for e in std::fs::read_dir(&slot).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("log.") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    for (p, b) in &old_ledger {
        std::fs::write(p, b).unwrap();
    }
    copy_dir(&copy.path().join("snap1"), &slot.join(snap_name(1)));
    let e = s.claim(ID, "alice").err().unwrap();
    assert!(matches!(e, Error::RolledBack { .. }), "{e}");
    // A server that never saw the later state cannot tell (the documented limit): it
    // resumes the owner's own older files, nothing else.
    let fresh = store(d.path(), "r2");
    let (_, data) = resume(&fresh, ID, "alice").unwrap();
    assert_eq!(data, b"old");
}

#[test]
fn racing_claims_have_one_winner_and_the_loser_names_it() {
    let d = tempfile::tempdir().unwrap();
    let s = store(d.path(), "r0");
    pause(&s, ID, "alice", None, b"x").unwrap();
    let stores: Vec<Store> = (1..=6).map(|i| store(d.path(), &format!("r{i}"))).collect();
    let results: Vec<Result<Claimed>> = std::thread::scope(|sc| {
        let hs: Vec<_> = stores
            .iter()
            .map(|st| sc.spawn(|| st.claim(ID, "alice")))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let won: Vec<&Claimed> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(won.len(), 1);
    for r in &results {
        if let Err(e) = r {
            assert!(matches!(e, Error::LiveElsewhere { .. }), "{e}");
            assert!(e.to_string().contains("replica"), "{e}");
        }
    }
}

#[test]
fn a_live_holder_that_is_gone_leaves_its_last_pause_to_resume() {
    let d = tempfile::tempdir().unwrap();
    let a = store(d.path(), "r1");
    pause(&a, ID, "alice", None, b"kept").unwrap();
    resume(&a, ID, "alice").unwrap();
    // Another replica while r1 holds it (fresh lease): refused, naming r1.
    let b = store(d.path(), "r2");
    let e = b.claim(ID, "alice").err().unwrap();
    assert!(e.to_string().contains("\"r1\""), "{e}");
    // r1 restarted (same replica name, new run): its earlier run is gone.
    let a2 = Store::open(
        d.path(),
        key(1),
        Holder {
            instance: "r1-second-run".into(),
            ..holder("r1")
        },
        bounds(),
    )
    .unwrap();
    let (c, data) = resume(&a2, ID, "alice").unwrap();
    assert_eq!(data, b"kept");
    assert!(c.recovered_from.is_some());
    // A dead process on this host: its pid is gone.
    let me = Holder {
        replica: None,
        instance: "dead".into(),
        boot: boot_id(),
        pid: dead_pid(),
        pid_ns: pid_namespace(),
    };
    let dead = Store::open(d.path(), key(1), me, bounds()).unwrap();
    pause(&dead, ID2, "alice", None, b"y").unwrap();
    dead.claim(ID2, "alice").unwrap();
    let live = Store::open(
        d.path(),
        key(1),
        Holder {
            replica: None,
            instance: "live".into(),
            boot: boot_id(),
            pid: std::process::id(),
            pid_ns: pid_namespace(),
        },
        bounds(),
    )
    .unwrap();
    let (_, data) = resume(&live, ID2, "alice").unwrap();
    assert_eq!(data, b"y");
}

/// Servers in containers on one host share the boot id but not their pid namespaces: a
/// holder's pid that is free here says nothing about a holder in another namespace, so
/// its lease stands (hostile review F2: the session was taken over at once, and both
/// servers held it live).
#[test]
fn a_holder_in_another_pid_namespace_is_not_probed_by_pid() {
    let d = tempfile::tempdir().unwrap();
    let elsewhere = Holder {
        replica: None,
        instance: "in-another-container".into(),
        boot: boot_id(),
        pid: dead_pid(),
        pid_ns: pid_namespace() + 1,
    };
    let a = Store::open(d.path(), key(1), elsewhere, bounds()).unwrap();
    pause(&a, ID, "alice", None, b"x").unwrap();
    a.claim(ID, "alice").unwrap();
    let here = Holder {
        replica: None,
        instance: "here".into(),
        boot: boot_id(),
        pid: std::process::id(),
        pid_ns: pid_namespace(),
    };
    let b = Store::open(d.path(), key(1), here, bounds()).unwrap();
    match b.claim(ID, "alice") {
        Err(Error::LiveElsewhere { .. }) => {}
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a live session of another pid namespace was taken over"),
    }
}

/// A pid that belongs to no process (a child, reaped).
fn dead_pid() -> u32 {
    let child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    let mut child = child;
    child.wait().unwrap();
    pid
}

#[test]
fn what_a_crashed_pause_leaves_is_never_taken_for_a_snapshot() {
    let d = tempfile::tempdir().unwrap();
    let s = store(d.path(), "r1");
    pause(&s, ID, "alice", None, b"whole").unwrap();
    let (c, _) = resume(&s, ID, "alice").unwrap();
    // Crashed while writing: the temporary directory is dropped without commit (as a
    // killed process leaves it, minus the removal).
    {
        let mut w = s.begin_pause(ID, "alice", Some(&c.pos)).unwrap();
        let mut p = w.part(PartKind::Workspace).unwrap();
        p.write_all(b"half").unwrap();
        std::mem::forget(p);
        let tmp = w.tmp.clone();
        std::mem::forget(w);
        assert!(tmp.exists());
    }
    // Crashed between the rename and the ledger: an unreferenced newer snapshot.
    copy_dir(
        &slot_dir(&s, ID).join(snap_name(1)),
        &slot_dir(&s, ID).join(snap_name(2)),
    );
    // A restart (this server's earlier run is gone) resumes the last whole pause.
    let restarted = Store::open(
        d.path(),
        key(1),
        Holder {
            instance: "second".into(),
            ..holder("r1")
        },
        bounds(),
    )
    .unwrap();
    let (c, data) = resume(&restarted, ID, "alice").unwrap();
    assert_eq!(data, b"whole");
    // The next pause writes over the orphan.
    let info = pause(&restarted, ID, "alice", Some(&c.pos), b"next").unwrap();
    assert_eq!(info.generation, 2);
    assert_eq!(resume(&restarted, ID, "alice").unwrap().1, b"next");
}

#[test]
fn bounds_and_lifetime_are_enforced() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(
        d.path(),
        key(1),
        holder("r1"),
        Bounds {
            max_per_client: 2,
            max_bytes_per_client: 300_000,
            keep_for: Duration::from_secs(3600),
        },
    )
    .unwrap();
    pause(&s, ID, "alice", None, b"a").unwrap();
    pause(&s, ID2, "alice", None, b"b").unwrap();
    let e = pause(&s, "cbx_third", "alice", None, b"c").err().unwrap();
    assert!(e.to_string().contains("max_paused_per_client"), "{e}");
    pause(&s, "cbx_bobs", "bob", None, b"c").unwrap();
    let e = pause(&s, "cbx_big", "bob", None, &vec![0u8; 400_000])
        .err()
        .unwrap();
    assert!(e.to_string().contains("max_paused_bytes_per_client"), "{e}");
    // Refused pauses leave nothing behind.
    assert!(!slot_dir(&s, "cbx_big").join(snap_name(1)).exists());
    assert_eq!(s.usage("bob").0, 1);
    // Lifetime: an expired one is ended by the clean-up and told as such.
    let short = Store::open(
        d.path(),
        key(1),
        holder("r1"),
        Bounds {
            keep_for: Duration::ZERO,
            ..bounds()
        },
    )
    .unwrap();
    pause(&short, "cbx_short", "carol", None, b"x").unwrap();
    assert_eq!(short.gc(), 1);
    let e = short.claim("cbx_short", "carol").err().unwrap();
    assert!(
        matches!(e, Error::Ended { ref how, .. } if how == "expired"),
        "{e}"
    );
    // Past its lifetime before the clean-up came by: refused all the same.
    pause(&short, "cbx_short2", "carol", None, b"y").unwrap();
    let e = short.claim("cbx_short2", "carol").err().unwrap();
    assert!(
        matches!(e, Error::Ended { ref how, .. } if how.contains("keep_paused_for")),
        "{e}"
    );
    // Ended longer than the lifetime ago: the record goes too.
    short.gc();
    assert!(!slot_dir(&short, "cbx_short").exists());
}

#[test]
fn a_fork_of_a_paused_session_is_a_separate_paused_session() {
    let d = tempfile::tempdir().unwrap();
    let s = store(d.path(), "r1");
    pause(&s, ID, "alice", None, b"shared start").unwrap();
    let f = s.fork_paused(ID, "alice", ID2, 9).unwrap();
    assert_eq!(f.generation, 1);
    assert!(matches!(
        s.fork_paused(ID, "bob", "cbx_x", 9),
        Err(Error::NotFound)
    ));
    let (c1, a) = resume(&s, ID, "alice").unwrap();
    let (c2, b) = resume(&s, ID2, "alice").unwrap();
    assert_eq!(
        (a.as_slice(), b.as_slice()),
        (&b"shared start"[..], &b"shared start"[..])
    );
    assert_eq!(c2.manifest.session, ID2);
    pause(&s, ID, "alice", Some(&c1.pos), b"one").unwrap();
    pause(&s, ID2, "alice", Some(&c2.pos), b"two").unwrap();
    assert_eq!(resume(&s, ID, "alice").unwrap().1, b"one");
    assert_eq!(resume(&s, ID2, "alice").unwrap().1, b"two");
}

/// Run as a child by the test below: pauses a large part slowly, forever.
#[test]
#[ignore]
fn child_pauses_slowly() {
    let Ok(dir) = std::env::var("SNAPSHOT_CHILD_DIR") else {
        return;
    };
    let s = store(Path::new(&dir), "child");
    let pos = LedgerPos {
        slot: s.key().slot_of(ID),
        seq: std::env::var("SNAPSHOT_CHILD_SEQ")
            .unwrap()
            .parse()
            .unwrap(),
        gen: 1,
    };
    let mut w = s.begin_pause(ID, "alice", Some(&pos)).unwrap();
    let mut p = w.part(PartKind::Workspace).unwrap();
    loop {
        p.write_all(&[1u8; 1 << 16]).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_pause_killed_with_sigkill_leaves_the_last_whole_snapshot() {
    let d = tempfile::tempdir().unwrap();
    let s = store(d.path(), "r1");
    pause(&s, ID, "alice", None, b"last whole").unwrap();
    // A "child" replica holds it live and is killed while pausing it again.
    let child_holder = holder("child");
    let child = Store::open(d.path(), key(1), child_holder, bounds()).unwrap();
    let claimed = child.claim(ID, "alice").unwrap();
    let mut proc = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "snapshot::store::tests::child_pauses_slowly",
            "--ignored",
            "--nocapture",
        ])
        .env("SNAPSHOT_CHILD_DIR", d.path())
        .env("SNAPSHOT_CHILD_SEQ", claimed.pos.seq.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let slot = slot_dir(&s, ID);
    // Until its part has some bytes on disk (a step guard, not a clock).
    let mut steps = 0;
    loop {
        let written: u64 = std::fs::read_dir(&slot)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp.snap"))
            .filter_map(|e| std::fs::metadata(e.path().join("workspace")).ok())
            .map(|m| m.len())
            .sum();
        if written > 1 << 20 {
            break;
        }
        steps += 1;
        assert!(steps < 20_000, "the child never wrote");
        std::thread::sleep(Duration::from_millis(5));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(proc.id() as i32),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    proc.wait().unwrap();
    // The child's replica restarted: its last whole snapshot resumes, whole.
    let again = Store::open(
        d.path(),
        key(1),
        Holder {
            instance: "child-second-run".into(),
            ..holder("child")
        },
        bounds(),
    )
    .unwrap();
    let (_, data) = resume(&again, ID, "alice").unwrap();
    assert_eq!(data, b"last whole");
}

/// A session held live by a server that died keeps its fallback snapshot for as long as
/// a paused one is kept (`keep_paused_for`, counted from when the dead server last held
/// it), then it is expired like a paused one: gc ends it and a claim says so (hostile
/// review F3: it was restorable for ever).
#[test]
fn the_fallback_of_a_dead_servers_live_session_expires() {
    let d = tempfile::tempdir().unwrap();
    let short = Bounds {
        keep_for: Duration::from_secs(1),
        ..bounds()
    };
    let a = Store::open(d.path(), key(1), holder("r1"), short).unwrap();
    pause(&a, ID, "alice", None, b"secret v1").unwrap();
    drop(a.claim(ID, "alice").unwrap());
    drop(a); // the server dies holding it live
    std::thread::sleep(Duration::from_millis(2500));
    let mut next_run = holder("r1");
    next_run.instance = "r1-run2".into();
    let b = Store::open(d.path(), key(1), next_run, short).unwrap();
    match b.claim(ID, "alice") {
        Err(Error::Ended { .. }) => {}
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a fallback past keep_paused_for was claimed"),
    }
    assert_eq!(b.gc(), 1);
    let left: Vec<String> = std::fs::read_dir(slot_dir(&b, ID))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("snap."))
        .collect();
    assert_eq!(left, Vec::<String>::new());
}

/// Pauses of one client that began together (concurrent pause_session or fork_session
/// calls) commit one at a time against the bounds: only as many as fit are kept, the
/// rest are refused (hostile review F4: the count was checked only when a pause began).
#[test]
fn pauses_that_began_together_are_bounded_when_they_commit() {
    let d = tempfile::tempdir().unwrap();
    let one = Bounds {
        max_per_client: 1,
        ..bounds()
    };
    let s = Store::open(d.path(), key(1), holder("r1"), one).unwrap();
    let ids: Vec<String> = (0..3).map(|i| format!("cbx_0a0b0c0d_{i:032x}")).collect();
    let mut writers = Vec::new();
    for id in &ids {
        let mut w = s.begin_pause(id, "alice", None).unwrap();
        let mut p = w.part(PartKind::Workspace).unwrap();
        p.write_all(b"x").unwrap();
        w.add(p).unwrap();
        writers.push(w);
    }
    let kept = writers
        .into_iter()
        .map(|w| w.commit(meta()))
        .filter(|r| match r {
            Ok(_) => true,
            Err(Error::Limit(why)) => {
                assert!(why.contains("max_paused_per_client"), "{why}");
                false
            }
            Err(e) => panic!("{e}"),
        })
        .count();
    assert_eq!((kept, s.usage("alice").0), (1, 1));
}

/// A resumed session's snapshot stays on disk as its fallback: its bytes count against
/// the client's bound until a new pause replaces it or the session ends (hostile review
/// F5: resumed sessions' snapshots were not counted, so a client's bytes on disk passed
/// max_paused_bytes_per_client). Pausing the same session again is not counted twice.
#[test]
fn a_resumed_sessions_fallback_counts_against_the_bytes_bound() {
    let d = tempfile::tempdir().unwrap();
    let small = Bounds {
        max_bytes_per_client: 3 << 20,
        ..bounds()
    };
    let s = Store::open(d.path(), key(1), holder("r1"), small).unwrap();
    let data = vec![7u8; 2 << 20];
    pause(&s, ID, "alice", None, &data).unwrap();
    let (held, _) = resume(&s, ID, "alice").unwrap();
    let (count, bytes) = s.usage("alice");
    assert_eq!(count, 0);
    assert!(bytes >= 2 << 20, "{bytes}");
    match pause(&s, ID2, "alice", None, &data) {
        Err(Error::Limit(why)) => assert!(why.contains("max_paused_bytes_per_client"), "{why}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a second 2 MiB snapshot passed a 3 MiB bound"),
    }
    // The resumed one paused again: its old snapshot is replaced, not added to.
    pause(&s, ID, "alice", Some(&held.pos), &data).unwrap();
}
