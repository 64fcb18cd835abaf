//! Sessions: a persistent workspace (and, on request, live interpreters) that several
//! executions of one client share.
//!
//! - A session is created by an execute call with `session: "new"`; its id is 128 bits
//!   from the kernel's CSPRNG, so it cannot be guessed, and it belongs to the client
//!   that created it: any other client asking for it is told it does not exist.
//! - Its workspace is a tmpfs of its own, `size=` the quota and `nr_inodes=` the entry
//!   limit ([`SessionLimits`]), root owned by the sandbox user's host ids with mode 0700,
//!   made by the [`keeper`] as a detached mount that is attached nowhere on the host. The
//!   kernel enforces the limits on allocated pages and inodes: a write past them fails
//!   with `ENOSPC` in the sandbox. Each run attaches a fresh copy of the mount at
//!   `/workspace`; the server reaches the files only through the session's descriptor
//!   ([`disk`]). Its pages are memory (or swap), charged to the memory cgroup of the
//!   sandbox that wrote them.
//! - Runs of one session are serialised (one holds [`Session::slots`] at a time).
//! - With `keep_alive`, a session keeps one live sandbox per language between runs
//!   ([`LiveSlots`]), so interpreter state survives.
//! - A session idle for longer than its TTL is removed by [`Sessions::sweep`]: its live
//!   sandboxes are killed, its files removed and its descriptor closed, which frees the
//!   filesystem. `close_session` does the same at once (and says what it could not
//!   remove, if anything), and shutdown for all.
//! - An id the server no longer holds is answered with what became of it ([`ended`]):
//!   closed or expired here (to its owner only), or made by an earlier run of the server.

pub mod disk;
pub mod ended;
pub mod keeper;
pub mod persist;

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::runtime::Language;
use crate::spawner::LiveSandbox;

/// Name prefix of the per-process sessions directories of earlier versions
/// (`codebox-sessions-<pid>-<random>`), removed when their process is gone.
const PREFIX: &str = "codebox-sessions-";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Also the answer for another client's session: its existence is not revealed.
    #[error("no session {id:?} for this client (it may have expired or been closed); start one with session \"new\"")]
    Unknown { id: String },
    #[error("session {id:?} was closed {ago} ago (close_session): its interpreter and workspace are gone; start a new one with session \"new\"")]
    Closed { id: String, ago: String },
    #[error("session {id:?} expired {ago} ago, after {idle_ttl} unused (the server's session_ttl): its interpreter and workspace are gone; start a new one with session \"new\"")]
    Expired {
        id: String,
        ago: String,
        idle_ttl: String,
    },
    #[error("session {id:?} was opened by an earlier run of this server, which has restarted since (this run started {ago} ago): its interpreter and workspace are gone; start a new one with session \"new\"")]
    EarlierRun { id: String, ago: String },
    /// An id another replica made (see [`crate::replica`]).
    #[error("{message}")]
    Elsewhere { message: String },
    #[error("{open} sessions are open, the most this server keeps; close one with close_session")]
    TooMany { open: usize },
    #[error("cannot {doing} {path}")]
    Io {
        doing: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot draw a random session id")]
    Random(#[source] getrandom::Error),
    #[error("the session's workspace is unavailable")]
    Keeper(#[from] keeper::Error),
    /// The keeper that made the session's workspace died and its namespaces could not be
    /// kept: nothing can copy that mount any more.
    #[error(
        "this session's workspace was lost with the workspace keeper ({why}); start a new session"
    )]
    Lost { why: String },
    #[error("the session is closed, but its workspace was not fully removed: {0}")]
    Leftover(#[source] disk::Leftover),
    #[error("this server keeps no paused sessions: its operator has not set [sessions] snapshot_key (sessions end with the server)")]
    NotKept,
    #[error("session {id:?} is paused: its next call (or resume_session) resumes it")]
    AlreadyPaused { id: String },
    #[error("the paused session cannot be resumed: {}", crate::error_chain::error_chain(.0))]
    Snapshot(#[source] crate::snapshot::Error),
    #[error("the session cannot be paused, and stays live as it was: {}", crate::error_chain::error_chain(.0))]
    PauseFailed(#[source] crate::snapshot::Error),
    #[error("the session cannot be forked: {}", crate::error_chain::error_chain(.0))]
    ForkFailed(#[source] crate::snapshot::Error),
    #[error("the paused session cannot be closed: {}", crate::error_chain::error_chain(.0))]
    CloseFailed(#[source] crate::snapshot::Error),
    /// Ended in the snapshot store (closed, or past keep_paused_for), maybe on another
    /// server sharing it.
    #[error("session {id:?} was {how} {ago_s} s ago: its workspace is gone; start a new one with session \"new\"")]
    EndedKept { id: String, how: String, ago_s: u64 },
}

pub type Result<T> = std::result::Result<T, Error>;

/// Limits of every session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionLimits {
    /// A session unused for this long is removed.
    pub idle_ttl: Duration,
    /// Size of the workspace filesystem: bytes of allocated blocks (tmpfs `size=`).
    pub quota_bytes: u64,
    /// Entries (files, directories, links) in the workspace (tmpfs `nr_inodes=`, plus
    /// one for its root).
    pub max_entries: u64,
    /// Sessions open at once, all clients together.
    pub max_sessions: usize,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            idle_ttl: Duration::from_secs(15 * 60),
            quota_bytes: 256 * 1024 * 1024,
            max_entries: 10_000,
            max_sessions: 64,
        }
    }
}

/// A live sandbox and what must outlive it (the wrapper tree bound at its `/servers`).
pub struct LiveEntry {
    pub sandbox: LiveSandbox,
    /// Proxy mode: the interpreter's egress listener, served anew for each run.
    pub egress_listener: Option<std::os::fd::OwnedFd>,
    /// The package layer the interpreter was started with (bound at its `/packages`).
    pub layer: Option<Arc<crate::packages::Layer>>,
    pub _servers: Option<Arc<crate::codegen::wrapper_dir::WrapperDir>>,
}

/// A session's live sandboxes, at most one per language, and whether the session asked
/// for them: keep-alive sticks until a call says `keep_alive: false`, so an interpreter
/// that died (timeout, exit) is replaced by the next run.
#[derive(Default)]
pub struct LiveSlots {
    pub python: Option<LiveEntry>,
    pub typescript: Option<LiveEntry>,
    keep_alive: [bool; 2],
    /// The package layer of the session's last set per language: later runs without
    /// `packages` keep it.
    layers: [Option<Arc<crate::packages::Layer>>; 2],
}

impl LiveSlots {
    /// Whether runs of `language` in this session use a live interpreter.
    pub fn keep_alive(&self, language: Language) -> bool {
        self.keep_alive[language as usize]
    }

    /// Sets keep-alive for `language`; turning it off ends the live interpreter.
    pub fn set_keep_alive(&mut self, language: Language, on: bool) {
        self.keep_alive[language as usize] = on;
        if !on {
            *self.slot(language) = None;
        }
    }

    pub fn slot(&mut self, language: Language) -> &mut Option<LiveEntry> {
        match language {
            Language::Python => &mut self.python,
            Language::TypeScript => &mut self.typescript,
        }
    }

    /// The layer the session's runs of `language` bind when they ask for no packages.
    pub fn layer(&self, language: Language) -> Option<Arc<crate::packages::Layer>> {
        self.layers[language as usize].clone()
    }

    pub fn set_layer(&mut self, language: Language, layer: Arc<crate::packages::Layer>) {
        self.layers[language as usize] = Some(layer);
    }

    pub fn live_count(&self) -> usize {
        self.python.is_some() as usize + self.typescript.is_some() as usize
    }
}

/// One session.
pub struct Session {
    id: String,
    owner: String,
    /// The session's detached tmpfs mount: every host-side access is relative to it, and
    /// closing it (with the session's sandboxes gone) frees the filesystem.
    mount: OwnedFd,
    /// The keepers' namespaces it was made in (see [`KeeperSlot::epoch`]): a keeper in
    /// them can copy it (one in others only on recent kernels).
    epoch: u64,
    last_used: Mutex<Instant>,
    /// Held by the run in progress; holds the live sandboxes.
    pub slots: tokio::sync::Mutex<LiveSlots>,
    /// The session's PII token map (used when PII handling is on).
    pub vault: Arc<crate::pii::Vault>,
    /// When it was first created (kept across pauses), seconds since the Unix epoch.
    created_unix: u64,
    /// Where its ledger in the snapshot store stands, once it was paused and resumed.
    ledger: Mutex<Option<crate::snapshot::store::LedgerPos>>,
    /// Resumed from a pause and not yet reported by a run's result.
    resumed: std::sync::atomic::AtomicBool,
    /// Paused away: a call that waited for its run lock asks for it again.
    gone: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The id is a capability: never printed in full.
        f.debug_struct("Session")
            .field("id", &short(&self.id))
            .finish_non_exhaustive()
    }
}

/// The first characters of an id, for logs.
pub fn short(id: &str) -> &str {
    // After the replica's name, if the id carries one (see crate::replica).
    let id = id.rsplit('.').next().unwrap_or(id);
    &id[..id.len().min(10)]
}

impl Session {
    fn new(
        id: String,
        owner: String,
        mount: OwnedFd,
        epoch: u64,
        vault: Arc<crate::pii::Vault>,
        created_unix: u64,
    ) -> Session {
        Session {
            id,
            owner,
            mount,
            epoch,
            last_used: Mutex::new(Instant::now()),
            slots: tokio::sync::Mutex::new(LiveSlots::default()),
            vault,
            created_unix,
            ledger: Mutex::new(None),
            resumed: Default::default(),
            gone: Default::default(),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether it was paused away (after the caller got it): ask for it again.
    pub fn is_gone(&self) -> bool {
        self.gone.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether it was resumed from a pause and no result said so yet (true once).
    pub fn take_resumed(&self) -> bool {
        self.resumed
            .swap(false, std::sync::atomic::Ordering::SeqCst)
    }

    /// The root of the session's workspace filesystem.
    pub fn workspace(&self) -> BorrowedFd<'_> {
        self.mount.as_fd()
    }

    /// Marks the session used now (its TTL starts again).
    pub fn touch(&self) {
        *self.last_used.lock().expect("session clock") = Instant::now();
    }

    /// How long since the session was last used.
    pub fn idle_for(&self) -> Duration {
        self.last_used.lock().expect("session clock").elapsed()
    }
}

/// The workspace keeper, started with the first session and replaced when it died.
#[derive(Default)]
struct KeeperSlot {
    current: Option<Arc<keeper::Keeper>>,
    /// Counts the namespaces keepers have worked in: a replacement that joined its
    /// predecessor's keeps the epoch (and the sessions their workspaces); one that could
    /// not starts the next.
    epoch: u64,
    status: KeeperStatus,
}

/// What `health` says about the workspace keeper.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct KeeperStatus {
    /// The current keeper's pid (none before the first session).
    pub pid: Option<i32>,
    /// Whether it runs; a dead one is replaced by the next session request.
    pub alive: bool,
    /// How many dead keepers were replaced.
    pub restarts: u64,
    /// When the last one was replaced (seconds since the Unix epoch).
    pub last_restart_unix: Option<u64>,
    /// How the last dead one ended.
    pub last_reason: Option<String>,
    /// Replacements that could not join their predecessor's namespaces: the sessions of
    /// that time keep their workspaces only where the kernel lets a keeper in other
    /// namespaces copy them (recent kernels); elsewhere their runs are refused, naming it.
    pub lost_epochs: u64,
}

/// Every open session of this server.
pub struct Sessions {
    keeper: Mutex<KeeperSlot>,
    limits: SessionLimits,
    /// Host ids of the sandbox user (the workspace's owner).
    owner_ids: (u32, u32),
    /// This replica's name, which every id it makes starts with (`None`: one server).
    replica: Option<crate::replica::ReplicaName>,
    open: Mutex<HashMap<String, Arc<Session>>>,
    /// This run's instance mark (in every id) and the sessions ended here.
    ended: ended::Ended,
    /// The snapshot store, when paused sessions are kept.
    persist: Option<Arc<persist::Persist>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Sessions {
    /// No session yet; removes what earlier versions' dead processes left in `base`
    /// (session directories on disk: workspaces are no longer there).
    pub fn new(base: &Path, limits: SessionLimits, owner_ids: (u32, u32)) -> Result<Sessions> {
        crate::tempdirs::remove_of_dead_processes(base, PREFIX);
        Ok(Sessions {
            keeper: Mutex::new(KeeperSlot::default()),
            limits,
            owner_ids,
            replica: None,
            open: Mutex::new(HashMap::new()),
            ended: ended::Ended::new().map_err(Error::Random)?,
            persist: None,
        })
    }

    /// Names this process a replica: the ids it makes start with `replica.`, and an id
    /// another replica made is answered [`Error::Elsewhere`].
    pub fn with_replica(mut self, replica: Option<crate::replica::ReplicaName>) -> Sessions {
        self.replica = replica;
        self
    }

    /// The running keeper and its epoch, started now if there is none or the last one is
    /// gone. A dead keeper's replacement joins its namespaces when it can, so every open
    /// session keeps its workspace; one WARN line per replacement says which.
    fn keeper(&self) -> Result<(Arc<keeper::Keeper>, u64)> {
        let mut slot = self.keeper.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = slot.current.as_ref().filter(|k| k.alive()) {
            return Ok((k.clone(), slot.epoch));
        }
        let Some(dead) = slot.current.take() else {
            let k = Arc::new(keeper::Keeper::start(self.owner_ids)?);
            slot.epoch = 1;
            slot.status.pid = Some(k.pid().as_raw());
            slot.current = Some(k.clone());
            return Ok((k, slot.epoch));
        };
        let reason = dead
            .ended()
            .unwrap_or_else(|| "it stopped answering".into());
        let joined = match dead.namespaces() {
            Some(ns) => keeper::Keeper::start_in(self.owner_ids, &ns).map_err(|e| {
                tracing::warn!(error = %crate::error_chain::error_chain(&e), "a new workspace keeper cannot join the old one's namespaces");
            }),
            None => Err(()),
        };
        // Reaped (or killed and reaped) now, not in a later health request.
        drop(dead);
        let (k, kept) = match joined {
            Ok(k) => (k, true),
            Err(()) => (keeper::Keeper::start(self.owner_ids)?, false),
        };
        let k = Arc::new(k);
        // `create` holds the sessions' lock while it asks for the keeper: no waiting here.
        let open = self.open.try_lock().map(|o| o.len()).ok();
        if !kept {
            slot.epoch += 1;
            slot.status.lost_epochs += 1;
        }
        slot.current = Some(k.clone());
        let status = &mut slot.status;
        status.pid = Some(k.pid().as_raw());
        status.restarts += 1;
        status.last_restart_unix = unix_now();
        status.last_reason = Some(reason.clone());
        if kept {
            tracing::warn!(reason, new = k.pid().as_raw(), open_sessions = ?open, restarts = status.restarts,
                "the workspace keeper died; a new one took over and the sessions keep their workspaces");
        } else {
            tracing::warn!(reason, new = k.pid().as_raw(), open_sessions = ?open, restarts = status.restarts,
                "the workspace keeper died and its namespaces could not be kept; the open sessions' workspaces may be lost (new sessions work)");
        }
        Ok((k, slot.epoch))
    }

    /// The workspace keeper's state for `health` (a dead one is noticed here, and
    /// replaced by the next request that needs it).
    pub fn keeper_status(&self) -> KeeperStatus {
        let slot = self.keeper.lock().unwrap_or_else(|p| p.into_inner());
        let mut status = slot.status.clone();
        status.alive = slot.current.as_ref().is_some_and(|k| k.alive());
        status
    }

    /// A fresh copy of `session`'s workspace mount, for one sandbox to attach. Only a
    /// keeper in the namespaces the mount was made in can copy it (the kernel allows a
    /// clone only from the mount namespace a detached mount was made in): the current
    /// one, or its replacement if it died.
    pub fn mount_for_run(&self, session: &Session) -> Result<OwnedFd> {
        self.with_keeper(
            |keeper, epoch| match keeper.clone_mount(session.workspace()) {
                Ok(fd) => Ok(fd),
                // A keeper in other namespaces than the one that made the mount, which this
                // kernel does not let copy it.
                Err(keeper::Error::Keeper { .. }) if epoch != session.epoch && keeper.alive() => {
                    let why = self
                        .keeper
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .status
                        .last_reason
                        .clone()
                        .unwrap_or_else(|| "died".into());
                    Err(Error::Lost {
                        why: format!("it {why}"),
                    })
                }
                Err(e) => Err(e.into()),
            },
        )
    }

    /// Runs `ask` with the live keeper; when the keeper died under it (its answer never
    /// came), once more with the replacement: a keeper's death costs no request.
    fn with_keeper<T>(&self, ask: impl Fn(&keeper::Keeper, u64) -> Result<T>) -> Result<T> {
        let (keeper, epoch) = self.keeper()?;
        match ask(&keeper, epoch) {
            Err(Error::Keeper(_)) if !keeper.alive() => {
                drop(keeper);
                let (keeper, epoch) = self.keeper()?;
                ask(&keeper, epoch)
            }
            other => other,
        }
    }

    pub fn limits(&self) -> &SessionLimits {
        &self.limits
    }

    /// A new session id of this run (qualified with the replica's name, if any).
    fn new_id(&self) -> Result<String> {
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).map_err(Error::Random)?;
        let id = self.ended.new_id(&raw);
        Ok(match &self.replica {
            Some(replica) => replica.qualify(&id),
            None => id,
        })
    }

    /// Opens a new session for `owner`.
    pub fn create(&self, owner: &str, vault: Arc<crate::pii::Vault>) -> Result<Arc<Session>> {
        let mut open = self.open.lock().expect("sessions lock");
        if open.len() >= self.limits.max_sessions {
            return Err(Error::TooMany { open: open.len() });
        }
        let id = self.new_id()?;
        let limits = &self.limits;
        let (mount, epoch) = self.with_keeper(|keeper, epoch| {
            // The root and /workspace/out take one inode each beyond the program's own.
            let inodes = limits.max_entries.saturating_add(2);
            Ok((keeper.create(limits.quota_bytes, inodes)?, epoch))
        })?;
        // Every run finds /workspace/out there from the start (the runtimes make it too,
        // if the program removed it).
        disk::make_out_dir(mount.as_fd(), self.owner_ids).map_err(|source| Error::Io {
            doing: "make out/ in",
            path: PathBuf::from("the session's workspace"),
            source,
        })?;
        let session = Arc::new(Session::new(
            id.clone(),
            owner.to_string(),
            mount,
            epoch,
            vault,
            crate::snapshot::store::unix_now(),
        ));
        open.insert(id, session.clone());
        tracing::info!(session = short(&session.id), owner, "session opened");
        Ok(session)
    }

    /// The session `id` if `owner` owns it.
    pub fn get(&self, id: &str, owner: &str) -> Result<Arc<Session>> {
        use crate::replica::{elsewhere_message, placement, Placement};
        if let (Some(here), Placement::Elsewhere { owner: made_by }) =
            (&self.replica, placement(self.replica.as_ref(), id))
        {
            // Made elsewhere and resumed here from a shared store.
            if let Ok(s) = self.open_here(id, owner) {
                return Ok(s);
            }
            tracing::info!(
                session = short(id),
                made_by,
                "a session another replica made"
            );
            return Err(Error::Elsewhere {
                message: elsewhere_message("session", id, made_by, here),
            });
        }
        let open = self.open.lock().expect("sessions lock");
        match open.get(id) {
            Some(s) if constant_time_eq(s.owner.as_bytes(), owner.as_bytes()) => {
                s.touch();
                Ok(s.clone())
            }
            Some(_) => {
                tracing::warn!(
                    session = short(id),
                    owner,
                    "a client asked for another client's session"
                );
                Err(Error::Unknown { id: id.to_string() })
            }
            None => Err(self.fate_of(id, owner)),
        }
    }

    /// `owner`'s session `id` if it is open on this server (whatever replica made it).
    fn open_here(&self, id: &str, owner: &str) -> Result<Arc<Session>> {
        let open = self.open.lock().expect("sessions lock");
        match open.get(id) {
            Some(s) if constant_time_eq(s.owner.as_bytes(), owner.as_bytes()) => {
                s.touch();
                Ok(s.clone())
            }
            _ => Err(Error::Unknown { id: id.to_string() }),
        }
    }

    /// Why `owner` cannot have `id`, which is not open: what became of it, if it is
    /// theirs to know.
    fn fate_of(&self, id: &str, owner: &str) -> Error {
        use ended::{ago_words, Fate, How};
        let id = id.to_string();
        // A replica's id on a server that is no replica was never this server's.
        if self.replica.is_none() && id.contains('.') {
            return Error::Unknown { id };
        }
        match self.ended.fate(&id, owner) {
            Fate::Ended {
                how: How::Closed,
                ago,
            } => Error::Closed {
                id,
                ago: ago_words(ago),
            },
            Fate::Ended {
                how: How::Expired { idle_ttl },
                ago,
            } => Error::Expired {
                id,
                ago: ago_words(ago),
                idle_ttl: ago_words(idle_ttl),
            },
            Fate::EarlierRun { ago } => Error::EarlierRun {
                id,
                ago: ago_words(ago),
            },
            Fate::Unknown => Error::Unknown { id },
        }
    }

    /// The sessions of `owner`.
    pub fn of_owner(&self, owner: &str) -> Vec<Arc<Session>> {
        let open = self.open.lock().expect("sessions lock");
        open.values()
            .filter(|s| s.owner == owner)
            .cloned()
            .collect()
    }

    /// Closes `owner`'s session `id`: waits for its run in progress, kills its live
    /// sandboxes, removes its workspace; says what it could not remove, if anything.
    pub async fn close(&self, id: &str, owner: &str) -> Result<()> {
        let session = match self.get(id, owner) {
            Ok(s) => s,
            Err(e @ (Error::Unknown { .. } | Error::EarlierRun { .. })) => {
                // A paused one: its snapshot is removed.
                if self.close_paused(id, owner).await? {
                    self.ended.record(id, owner, ended::How::Closed);
                    return Ok(());
                }
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        self.open.lock().expect("sessions lock").remove(id);
        self.ended.record(id, owner, ended::How::Closed);
        self.end_kept(&session, "closed").await;
        self.end(session).await.map_err(Error::Leftover)
    }

    /// Kills the session's live sandboxes and empties its workspace now (the filesystem
    /// itself goes with the last descriptor and the last sandbox holding it).
    async fn end(&self, session: Arc<Session>) -> std::result::Result<(), disk::Leftover> {
        let mut slots = session.slots.lock().await;
        // Dropping a live sandbox kills it.
        slots.python = None;
        slots.typescript = None;
        let removed = disk::remove_contents(session.workspace());
        if let Err(e) = &removed {
            tracing::warn!(session = short(&session.id), %e, "cannot empty a session's workspace");
        }
        removed
    }

    /// Removes the sessions idle longer than the TTL (never one that is running).
    pub async fn sweep(&self) -> usize {
        // With on_idle = "pause" they stay open until their snapshot is published: a call
        // meanwhile waits for the pause and then resumes them.
        let pause = self.on_idle() == crate::snapshot::OnIdle::Pause;
        let expired: Vec<Arc<Session>> = {
            let mut open = self.open.lock().expect("sessions lock");
            let ids: Vec<String> = open
                .iter()
                .filter(|(_, s)| s.idle_for() >= self.limits.idle_ttl && s.slots.try_lock().is_ok())
                .map(|(id, _)| id.clone())
                .collect();
            if pause {
                ids.iter().filter_map(|id| open.get(id).cloned()).collect()
            } else {
                ids.iter().filter_map(|id| open.remove(id)).collect()
            }
        };
        let mut n = 0;
        for s in expired {
            if pause {
                if self.pause_idle(&s).await {
                    continue;
                }
                self.open.lock().expect("sessions lock").remove(&s.id);
            }
            n += 1;
            tracing::info!(session = short(&s.id), "session expired");
            let idle_ttl = self.limits.idle_ttl;
            self.ended
                .record(&s.id, &s.owner, ended::How::Expired { idle_ttl });
            self.end_kept(&s, "expired").await;
            let _ = self.end(s).await;
        }
        self.tend_store().await;
        n
    }

    /// Open sessions, and live sandboxes among them (those not running now).
    pub fn counts(&self) -> (usize, usize) {
        let open = self.open.lock().expect("sessions lock");
        let live = open
            .values()
            .filter_map(|s| s.slots.try_lock().ok().map(|l| l.live_count()))
            .sum();
        (open.len(), live)
    }

    /// Ends every session and removes the sessions directory.
    pub async fn shutdown(&self) {
        let all: Vec<Arc<Session>> = self
            .open
            .lock()
            .expect("sessions lock")
            .drain()
            .map(|(_, s)| s)
            .collect();
        let pause = self.on_stop() == crate::snapshot::OnIdle::Pause;
        for s in all {
            self.pause_or_end(s, pause).await;
        }
    }
}

fn unix_now() -> Option<u64> {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests;
