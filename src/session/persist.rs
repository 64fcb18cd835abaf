//! Sessions that outlive the process: pausing a session into the snapshot store
//! ([`crate::snapshot`]), resuming it (by its next call or `resume_session`), and ending
//! it there when it is closed.
//!
//! A pause waits for the session's run in progress, saves its workspace (read through the
//! session's mount descriptor, never following a link) as the `workspace` part of a new
//! snapshot, and only once the ledger says "paused" frees the session: its live sandboxes
//! are killed and its tmpfs emptied and released. A pause that fails (the disk is full, a
//! bound is reached, the workspace changed under it) publishes nothing and leaves the
//! session live as it was.
//!
//! A resume claims the snapshot (checked whole first: key, owner, session, generation,
//! lengths), restores the workspace into a fresh tmpfs of this server's quota (so a
//! snapshot larger than the quota is refused, and a bad stream leaves nothing: that
//! filesystem is thrown away and the claim given back), and opens the session under its
//! old id. Its first result says `state: "files"`.
//!
//! # The backend's state
//!
//! [`backend_state`] is the seam for the microVM backend: what of the live interpreter a
//! pause keeps. On the namespace backend it is nothing ([`StateKind::Files`]): the files
//! survive and the interpreter starts afresh. The microVM backend will write its
//! `vm-memory` and `vm-devices` parts next to `workspace` and report [`StateKind::Vm`].

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::snapshot::store::{LedgerPos, SnapshotMeta};
use crate::snapshot::{self, archive, OnIdle, PartKind, PausedInfo, StateKind};

use super::{disk, short, Error, LiveSlots, Result, Session, Sessions};

/// The snapshot store and what this server does with idle and stopping sessions.
pub struct Persist {
    pub store: snapshot::Store,
    pub on_idle: OnIdle,
    pub on_stop: OnIdle,
    /// Resumes are one at a time: a second call for the same session finds it open.
    resuming: tokio::sync::Mutex<()>,
    /// When the store's expired snapshots were last removed.
    last_gc: Mutex<Option<Instant>>,
}

/// What a pause keeps of the live interpreter on this backend: nothing (see the module
/// docs). The microVM backend answers [`StateKind::Vm`] and writes its parts.
pub fn backend_state() -> StateKind {
    StateKind::Files
}

fn snap(e: snapshot::Error) -> Error {
    Error::Snapshot(e)
}

impl Sessions {
    /// Keeps paused sessions in the store `settings` name (`None`: sessions end with the
    /// process).
    pub fn with_persist(
        mut self,
        settings: Option<snapshot::PersistSettings>,
    ) -> std::result::Result<Sessions, snapshot::Error> {
        let Some(s) = settings else {
            return Ok(self);
        };
        let me = snapshot::Holder {
            replica: self.replica.as_ref().map(|r| r.to_string()),
            instance: self.ended.instance().to_string(),
            boot: snapshot::store::boot_id(),
            pid: std::process::id(),
            pid_ns: snapshot::store::pid_namespace(),
        };
        let store = snapshot::Store::open(&s.dir, s.key.clone(), me, s.bounds)?;
        self.persist = Some(Arc::new(Persist {
            store,
            on_idle: s.on_idle,
            on_stop: s.on_stop,
            resuming: tokio::sync::Mutex::new(()),
            last_gc: Mutex::new(None),
        }));
        Ok(self)
    }

    pub fn persist(&self) -> Option<&Arc<Persist>> {
        self.persist.as_ref()
    }

    fn persist_or_refuse(&self) -> Result<Arc<Persist>> {
        self.persist.clone().ok_or(Error::NotKept)
    }

    /// Pauses `owner`'s open session `id`: saved, then freed. Waits for its run in
    /// progress. A failed pause leaves it live as it was.
    pub async fn pause(&self, id: &str, owner: &str) -> Result<PausedInfo> {
        let p = self.persist_or_refuse()?;
        let session = match self.get(id, owner) {
            Ok(s) => s,
            Err(e) => return Err(self.paused_or(id, owner, e).await),
        };
        let mut slots = session.slots.lock().await;
        if session.gone.load(Ordering::SeqCst) {
            return Err(Error::AlreadyPaused { id: id.to_string() });
        }
        let info = self.save(&p, &session, kept_of(&slots)).await?;
        self.free_paused(&session, &mut slots);
        tracing::info!(
            session = short(id),
            owner,
            generation = info.generation,
            bytes = info.bytes,
            "session paused"
        );
        Ok(info)
    }

    /// Writes `session`'s snapshot (its run lock held by the caller, who says which
    /// languages it kept interpreters for).
    async fn save(
        &self,
        p: &Arc<Persist>,
        session: &Arc<Session>,
        kept: Vec<String>,
    ) -> Result<PausedInfo> {
        let meta = SnapshotMeta {
            created_unix: session.created_unix,
            backend: "namespace".into(),
            state: backend_state(),
            languages: kept.clone(),
            keep_alive: kept,
            workspace: Default::default(),
            quota_bytes: self.limits.quota_bytes,
            max_entries: self.limits.max_entries,
        };
        let pos = session.ledger.lock().expect("session ledger").clone();
        self.save_as(p, session, session.id.clone(), pos, meta)
            .await
    }

    /// Writes `session`'s workspace as the snapshot of `target` (the session itself at
    /// `pos`, or a fork).
    async fn save_as(
        &self,
        p: &Arc<Persist>,
        session: &Arc<Session>,
        target: String,
        pos: Option<LedgerPos>,
        meta: SnapshotMeta,
    ) -> Result<PausedInfo> {
        let (p, s) = (p.clone(), session.clone());
        let saved = tokio::task::spawn_blocking(move || {
            let mut w = p.store.begin_pause(&target, &s.owner, pos.as_ref())?;
            let mut sink = w.part(PartKind::Workspace)?;
            let facts = archive::capture(s.workspace(), &mut sink)?;
            w.add(sink)?;
            w.commit(SnapshotMeta {
                workspace: facts,
                ..meta
            })
        })
        .await
        .map_err(|e| Error::Lost {
            why: format!("the pause stopped: {e}"),
        })?;
        saved.map_err(|e| {
            tracing::warn!(session = short(&session.id), error = %crate::error_chain::error_chain(&e), "a pause failed; the session stays live");
            Error::PauseFailed(e)
        })
    }

    /// After its snapshot is published: the session leaves the open ones, its live
    /// sandboxes are killed and its workspace emptied (the filesystem goes with the last
    /// descriptor).
    fn free_paused(&self, session: &Arc<Session>, slots: &mut LiveSlots) {
        self.open.lock().expect("sessions lock").remove(&session.id);
        session.gone.store(true, Ordering::SeqCst);
        slots.python = None;
        slots.typescript = None;
        if let Err(e) = disk::remove_contents(session.workspace()) {
            tracing::warn!(session = short(&session.id), %e, "cannot empty a paused session's workspace");
        }
    }

    /// Forks `owner`'s session `id`: a new session id of the same owner holding a copy of
    /// its files now, paused (its first call resumes it, with a new interpreter). A live
    /// session's workspace is read as a pause reads it (the session stays live); a paused
    /// one's snapshot parts are reflinked where the filesystem can, else copied.
    pub async fn fork(&self, id: &str, owner: &str) -> Result<(String, PausedInfo)> {
        let p = self.persist_or_refuse()?;
        let new_id = self.new_id()?;
        if let Ok(session) = self.get(id, owner) {
            let slots = session.slots.lock().await;
            if !session.gone.load(Ordering::SeqCst) {
                let meta = SnapshotMeta {
                    created_unix: snapshot::store::unix_now(),
                    backend: "namespace".into(),
                    state: backend_state(),
                    languages: kept_of(&slots),
                    keep_alive: kept_of(&slots),
                    workspace: Default::default(),
                    quota_bytes: self.limits.quota_bytes,
                    max_entries: self.limits.max_entries,
                };
                let info = self
                    .save_as(&p, &session, new_id.clone(), None, meta)
                    .await
                    .map_err(|e| match e {
                        Error::PauseFailed(e) => Error::ForkFailed(e),
                        other => other,
                    })?;
                drop(slots);
                tracing::info!(
                    session = short(id),
                    fork = short(&new_id),
                    owner,
                    "session forked"
                );
                return Ok((new_id, info));
            }
        }
        let (i, o, n) = (id.to_string(), owner.to_string(), new_id.clone());
        let forked = tokio::task::spawn_blocking(move || {
            p.store.fork_paused(&i, &o, &n, snapshot::store::unix_now())
        })
        .await
        .map_err(|e| Error::Lost {
            why: format!("the fork stopped: {e}"),
        })?;
        match forked {
            Ok(info) => {
                tracing::info!(
                    session = short(id),
                    fork = short(&new_id),
                    owner,
                    "paused session forked"
                );
                Ok((new_id, info))
            }
            Err(snapshot::Error::NotFound) => Err(match self.get(id, owner) {
                Err(e) => e,
                Ok(_) => Error::Unknown { id: id.to_string() },
            }),
            Err(e) => Err(Error::ForkFailed(e)),
        }
    }

    /// `e` for an id that is not open, unless the store holds it paused.
    async fn paused_or(&self, id: &str, owner: &str, e: Error) -> Error {
        if !matches!(e, Error::Unknown { .. } | Error::EarlierRun { .. }) {
            return e;
        }
        let Some(p) = self.persist.clone() else {
            return e;
        };
        let (i, o) = (id.to_string(), owner.to_string());
        let state = tokio::task::spawn_blocking(move || p.store.state_of(&i, &o)).await;
        match state {
            Ok(Ok(Some((snapshot::ledger::State::Paused { .. }, _)))) => {
                Error::AlreadyPaused { id: id.to_string() }
            }
            _ => e,
        }
    }

    /// `owner`'s session `id`: open, or resumed now from its snapshot (with the PII vault
    /// `vault` makes: a vault is not kept).
    pub async fn get_or_resume(
        &self,
        id: &str,
        owner: &str,
        vault: impl FnOnce() -> Arc<crate::pii::Vault>,
    ) -> Result<Arc<Session>> {
        match self.get(id, owner) {
            Ok(s) => Ok(s),
            // Another replica's id too: a paused session resumes on any server sharing
            // the store.
            Err(
                e @ (Error::Unknown { .. } | Error::EarlierRun { .. } | Error::Elsewhere { .. }),
            ) if self.persist.is_some() => match self.resume(id, owner, vault).await {
                Err(Error::Snapshot(snapshot::Error::NotFound)) => Err(e),
                Err(Error::Snapshot(snapshot::Error::Ended { how, ago_s })) => {
                    Err(Error::EndedKept {
                        id: id.to_string(),
                        how,
                        ago_s,
                    })
                }
                other => other,
            },
            Err(e) => Err(e),
        }
    }

    /// Resumes `owner`'s paused session `id` (an open one is returned as it is).
    pub async fn resume(
        &self,
        id: &str,
        owner: &str,
        vault: impl FnOnce() -> Arc<crate::pii::Vault>,
    ) -> Result<Arc<Session>> {
        let p = self.persist_or_refuse()?;
        let _one = p.resuming.lock().await;
        if let Ok(s) = self.open_here(id, owner) {
            return Ok(s);
        }
        // Nothing is made (no tmpfs) for an id the store does not hold for this client.
        let (pc, i, o) = (p.clone(), id.to_string(), owner.to_string());
        let held = tokio::task::spawn_blocking(move || pc.store.state_of(&i, &o))
            .await
            .map_err(|e| Error::Lost {
                why: format!("the resume stopped: {e}"),
            })?
            .map_err(snap)?;
        if held.is_none() {
            return Err(snap(snapshot::Error::NotFound));
        }
        {
            let open = self.open.lock().expect("sessions lock");
            if open.len() >= self.limits.max_sessions {
                return Err(Error::TooMany { open: open.len() });
            }
        }
        let limits = self.limits.clone();
        let (mount, epoch) = self.with_keeper(|keeper, epoch| {
            let inodes = limits.max_entries.saturating_add(2);
            Ok((keeper.create(limits.quota_bytes, inodes)?, epoch))
        })?;
        let owner_ids = self.owner_ids;
        let (pc, i, o) = (p.clone(), id.to_string(), owner.to_string());
        let restored = tokio::task::spawn_blocking(move || {
            let r = restore(&pc.store, &i, &o, &mount, owner_ids, &limits);
            (r, mount)
        })
        .await
        .map_err(|e| Error::Lost {
            why: format!("the resume stopped: {e}"),
        })?;
        let (pos, created_unix, mount) = match restored {
            (Ok((pos, created)), mount) => (pos, created, mount),
            (Err(e), _) => {
                if !matches!(e, snapshot::Error::NotFound) {
                    tracing::warn!(session = short(id), owner, error = %crate::error_chain::error_chain(&e), "a paused session cannot be resumed");
                }
                return Err(snap(e));
            }
        };
        let session = Arc::new(Session::new(
            id.to_string(),
            owner.to_string(),
            mount,
            epoch,
            vault(),
            created_unix,
        ));
        *session.ledger.lock().expect("session ledger") = Some(pos);
        session.resumed.store(true, Ordering::SeqCst);
        self.open
            .lock()
            .expect("sessions lock")
            .insert(id.to_string(), session.clone());
        tracing::info!(session = short(id), owner, "session resumed");
        Ok(session)
    }

    /// Ends `owner`'s session `id` in the store, if it has it (closed or expired).
    pub(super) async fn end_kept(&self, session: &Session, how: &str) {
        let Some(p) = self.persist.clone() else {
            return;
        };
        let pos = session.ledger.lock().expect("session ledger").take();
        if pos.is_none() {
            return;
        }
        let (i, o, h) = (session.id.clone(), session.owner.clone(), how.to_string());
        let ended =
            tokio::task::spawn_blocking(move || p.store.end(&i, &o, &h, pos.as_ref())).await;
        if let Ok(Err(e)) = ended {
            tracing::warn!(session = short(&session.id), error = %e, "cannot end a session's snapshot");
        }
    }

    /// Closes `owner`'s paused session `id` (not open here): its snapshot is removed.
    /// `Ok(false)`: the store has no such paused session.
    pub(super) async fn close_paused(&self, id: &str, owner: &str) -> Result<bool> {
        let Some(p) = self.persist.clone() else {
            return Ok(false);
        };
        let (i, o) = (id.to_string(), owner.to_string());
        tokio::task::spawn_blocking(move || match p.store.state_of(&i, &o)? {
            Some((snapshot::ledger::State::Paused { .. }, _)) => {
                p.store.end(&i, &o, "closed", None).map(|()| true)
            }
            _ => Ok(false),
        })
        .await
        .map_err(|e| Error::Lost {
            why: format!("the close stopped: {e}"),
        })?
        .map_err(Error::CloseFailed)
    }

    /// Pauses `session`, idle past the TTL (`on_idle = "pause"`). `true`: paused, or used
    /// meanwhile (it stays); `false`: the pause failed and it is to end.
    pub(super) async fn pause_idle(&self, session: &Arc<Session>) -> bool {
        let Some(p) = self.persist.clone() else {
            return false;
        };
        let mut slots = session.slots.lock().await;
        if session.gone.load(Ordering::SeqCst) || session.idle_for() < self.limits.idle_ttl {
            return true;
        }
        self.pause_held(
            &p,
            session,
            &mut slots,
            "idle session paused",
            "cannot pause an idle session; it expires",
        )
        .await
    }

    /// Pauses `session`, whose slots the caller holds, and frees it; logs `done` or,
    /// when the pause fails (the session then stays as it was), `failed`.
    async fn pause_held(
        &self,
        p: &Arc<Persist>,
        session: &Arc<Session>,
        slots: &mut LiveSlots,
        done: &'static str,
        failed: &'static str,
    ) -> bool {
        match self.save(p, session, kept_of(slots)).await {
            Ok(info) => {
                self.free_paused(session, slots);
                tracing::info!(session = short(&session.id), bytes = info.bytes, "{done}");
                true
            }
            Err(e) => {
                tracing::warn!(session = short(&session.id), %e, "{failed}");
                false
            }
        }
    }

    /// At shutdown: pauses `session` (`on_stop = "pause"`), else or when that fails ends
    /// it.
    pub(super) async fn pause_or_end(&self, session: Arc<Session>, pause: bool) {
        if pause && self.pause_idle_now(&session).await {
            return;
        }
        self.end_kept(&session, "closed").await;
        let _ = self.end(session).await;
    }

    async fn pause_idle_now(&self, session: &Arc<Session>) -> bool {
        let Some(p) = self.persist.clone() else {
            return false;
        };
        let mut slots = session.slots.lock().await;
        self.pause_held(
            &p,
            session,
            &mut slots,
            "session paused as the server stops",
            "cannot pause a session as the server stops; it ends",
        )
        .await
    }

    /// Keeps the leases of sessions resumed here, and removes expired snapshots (once a
    /// minute).
    pub(super) async fn tend_store(&self) {
        let Some(p) = self.persist.clone() else {
            return;
        };
        let held: Vec<LedgerPos> = {
            let open = self.open.lock().expect("sessions lock");
            open.values()
                .filter_map(|s| s.ledger.lock().expect("session ledger").clone())
                .collect()
        };
        let due = {
            let mut last = p.last_gc.lock().expect("gc clock");
            let due = last.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(60));
            if due {
                *last = Some(Instant::now());
            }
            due
        };
        let _ = tokio::task::spawn_blocking(move || {
            for pos in &held {
                if let Err(e) = p.store.renew(pos) {
                    tracing::warn!(error = %e, "cannot renew a resumed session's lease");
                }
            }
            if due {
                p.store.gc();
            }
        })
        .await;
    }

    /// The store's totals, for metrics (`None`: no store).
    pub fn store_totals(&self) -> Option<snapshot::store::Totals> {
        Some(self.persist.as_ref()?.store.totals())
    }

    /// The store's figures and bounds, for `health` (`None`: no store).
    pub fn store_health(&self) -> Option<serde_json::Value> {
        let p = self.persist.as_ref()?;
        let b = p.store.bounds();
        Some(serde_json::json!({
            "dir": p.store.dir(),
            "totals": p.store.totals(),
            "on_idle": p.on_idle,
            "on_stop": p.on_stop,
            "max_paused_per_client": b.max_per_client,
            "max_paused_bytes_per_client": b.max_bytes_per_client,
            "keep_paused_for_s": b.keep_for.as_secs(),
        }))
    }

    /// `owner`'s paused sessions and what they may still pause, for `codebox://sessions`
    /// (`None`: no store).
    pub fn paused_of(&self, owner: &str) -> Option<serde_json::Value> {
        let p = self.persist.as_ref()?;
        let b = p.store.bounds();
        let (count, bytes) = p.store.usage(owner);
        Some(serde_json::json!({
            "paused": p.store.list(owner),
            "paused_count": count,
            "paused_bytes": bytes,
            "max_paused": b.max_per_client,
            "max_paused_bytes": b.max_bytes_per_client,
            "keep_paused_for_s": b.keep_for.as_secs(),
        }))
    }

    pub fn on_idle(&self) -> OnIdle {
        self.persist.as_ref().map_or(OnIdle::Close, |p| p.on_idle)
    }

    pub fn on_stop(&self) -> OnIdle {
        self.persist.as_ref().map_or(OnIdle::Close, |p| p.on_stop)
    }
}

/// The languages whose interpreters the session keeps alive.
fn kept_of(slots: &LiveSlots) -> Vec<String> {
    crate::runtime::Language::ALL
        .into_iter()
        .filter(|l| slots.keep_alive(*l))
        .map(|l| l.to_string())
        .collect()
}

/// Claims `id` and restores its workspace into `mount` (fresh, of this server's quota);
/// gives the claim back on any error. Returns where its ledger stands and when it was
/// created.
fn restore(
    store: &snapshot::Store,
    id: &str,
    owner: &str,
    mount: &OwnedFd,
    owner_ids: (u32, u32),
    limits: &super::SessionLimits,
) -> snapshot::Result<(LedgerPos, u64)> {
    let claimed = store.claim(id, owner)?;
    let filled = (|| {
        let m = claimed.reader().manifest().clone();
        if m.state != StateKind::Files || m.backend != "namespace" {
            return Err(snapshot::Error::UnknownPart {
                kind: format!("{} state of the {} backend", m.state.as_str(), m.backend),
            });
        }
        if m.workspace.data_bytes > limits.quota_bytes
            || m.workspace.entries > limits.max_entries.saturating_add(1)
        {
            return Err(snapshot::Error::Limit(format!(
                "the paused workspace holds {} bytes in {} entries, more than this server's session quota ({} bytes, {} entries)",
                m.workspace.data_bytes, m.workspace.entries, limits.quota_bytes, limits.max_entries
            )));
        }
        let mut part =
            claimed
                .reader()
                .part(PartKind::Workspace)?
                .ok_or_else(|| snapshot::Error::Format {
                    why: "the snapshot has no workspace part".into(),
                })?;
        archive::restore(&mut part, mount.as_fd(), owner_ids).map_err(|e| match e {
            // The stream failed to authenticate (or ended early) under the restore.
            archive::ArchiveError::Read(io) => snapshot::store::part_error(PartKind::Workspace, io),
            other => other.into(),
        })?;
        part.finish()
            .map_err(|e| snapshot::store::part_error(PartKind::Workspace, e))?;
        match disk::make_out_dir(mount.as_fd(), owner_ids) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            Err(e) => Err(snapshot::Error::Io {
                doing: "make out/ in",
                path: "the resumed workspace".into(),
                source: e,
            }),
        }?;
        Ok(m.created_unix)
    })();
    match filled {
        Ok(created) => Ok((claimed.pos.clone(), created)),
        Err(e) => {
            if let Err(r) = store.release(&claimed) {
                tracing::warn!(error = %r, "cannot give back a claim after a failed resume");
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::ReplicaName;
    use std::time::Duration;

    fn vault() -> Arc<crate::pii::Vault> {
        Arc::new(crate::pii::Vault::new(Arc::new(
            crate::pii::Detector::builtin(),
        )))
    }

    fn replica(base: &std::path::Path, store: &std::path::Path, name: &str) -> Sessions {
        let ids = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        let mut raw = [0u8; 32];
        for (i, b) in raw.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37).wrapping_add(11);
        }
        let key = crate::snapshot::SnapshotKey::from_bytes(&raw);
        let settings = snapshot::PersistSettings {
            key: Arc::new(key),
            dir: store.to_path_buf(),
            on_idle: OnIdle::Pause,
            on_stop: OnIdle::Pause,
            bounds: snapshot::store::Bounds {
                max_per_client: 4,
                max_bytes_per_client: 64 << 20,
                keep_for: Duration::from_secs(3600),
            },
        };
        Sessions::new(base, super::super::SessionLimits::default(), ids)
            .unwrap()
            .with_replica(Some(ReplicaName::parse(name).unwrap()))
            .with_persist(Some(settings))
            .unwrap()
    }

    /// Replicas sharing a store: a session paused on one resumes on the other under its
    /// id (which names the first), with its files; while live there, the first cannot
    /// take it back, and says who holds it.
    #[tokio::test]
    async fn a_session_paused_on_one_replica_resumes_on_another() {
        let base = tempfile::tempdir().unwrap();
        let store = tempfile::tempdir().unwrap();
        let r1 = replica(base.path(), store.path(), "r1");
        let r2 = replica(base.path(), store.path(), "r2");
        let a = r1.create("alice", vault()).unwrap();
        let id = a.id().to_string();
        assert!(id.starts_with("r1."), "{id}");
        let fd = nix::fcntl::openat(
            a.workspace(),
            "f",
            nix::fcntl::OFlag::O_CREAT | nix::fcntl::OFlag::O_WRONLY,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        std::io::Write::write_all(&mut std::fs::File::from(fd), b"from r1").unwrap();
        drop(a);
        // Before the pause: another replica's id, as before.
        assert!(matches!(
            r2.get_or_resume(&id, "alice", vault).await,
            Err(Error::Elsewhere { .. })
        ));
        r1.pause(&id, "alice").await.unwrap();
        // Another client learns nothing.
        assert!(matches!(
            r2.get_or_resume(&id, "bob", vault).await,
            Err(Error::Elsewhere { .. })
        ));
        let b = r2.get_or_resume(&id, "alice", vault).await.unwrap();
        assert!(b.take_resumed());
        assert_eq!(
            disk::read_file(b.workspace(), "f", 100).unwrap(),
            b"from r1".to_vec()
        );
        let e = r1.get_or_resume(&id, "alice", vault).await.unwrap_err();
        assert!(e.to_string().contains("replica \"r2\""), "{e}");
        r2.shutdown().await;
        // r2 paused it as it stopped: r1 resumes it again.
        let c = r1.get_or_resume(&id, "alice", vault).await.unwrap();
        assert_eq!(disk::names(c.workspace()).unwrap().len(), 2, "f and out/");
        r1.shutdown().await;
    }
}
