//! The snapshot store: slots in `[sessions] dir`, pausing into them, claiming from them,
//! ending, forking, listing, bounds and clean-up. See the module docs of [`super`] for the
//! layout, what is authenticated and what a crash leaves.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::keys::SnapshotKey;
use super::ledger::{self, Entry, Head, State};
use super::manifest::{Manifest, PartEntry, PartKind, StateKind, WorkspaceFacts};
use super::stream::{cipher_len, PartKey, PartReader, PartWriter};
use super::{Error, Result};

pub use super::ledger::Holder;
pub use writer::{part_error, Claimed, PartSink, SnapshotReader, SnapshotWriter};

mod upkeep;
mod writer;

use upkeep::remove_snapshots;

/// A temporary directory older than this is a crashed pause's and is removed.
const STALE_TEMP: Duration = Duration::from_secs(3600);

/// What bounds paused sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Paused sessions one client may have.
    pub max_per_client: usize,
    /// Bytes of snapshots one client may have.
    pub max_bytes_per_client: u64,
    /// How long a paused session is kept before it is removed.
    pub keep_for: Duration,
}

/// Where a live session's ledger stands (it was resumed, or paused and resumed, here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerPos {
    pub slot: String,
    /// Our `live` entry.
    pub seq: u64,
    /// The snapshot it resumed from.
    pub gen: u64,
}

/// A paused session as listed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PausedInfo {
    pub id: String,
    pub generation: u64,
    pub paused_unix: u64,
    pub expires_unix: u64,
    pub created_unix: u64,
    /// Bytes of the snapshot on disk.
    pub bytes: u64,
    pub state: StateKind,
    pub languages: Vec<String>,
    pub workspace: WorkspaceFacts,
}

/// The store's figures, for `health` and metrics.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Totals {
    pub paused: u64,
    pub bytes: u64,
    /// Sessions a server holds live with a fallback snapshot.
    pub live: u64,
    /// Slots that could not be read (altered, or another key's).
    pub unreadable: u64,
}

/// The non-store fields of a manifest, given by the session code.
#[derive(Debug, Clone)]
pub struct SnapshotMeta {
    pub created_unix: u64,
    pub backend: String,
    pub state: StateKind,
    pub languages: Vec<String>,
    pub keep_alive: Vec<String>,
    pub workspace: WorkspaceFacts,
    pub quota_bytes: u64,
    pub max_entries: u64,
}

/// The snapshot store.
pub struct Store {
    dir: PathBuf,
    key: Arc<SnapshotKey>,
    me: Holder,
    bounds: Bounds,
    /// The highest ledger entry this process saw per slot: a lower head later is a
    /// rollback.
    seen: Mutex<HashMap<String, u64>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.dir)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// This host's boot id (empty when unknown).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The inode of this process's pid namespace (0 when /proc cannot say).
pub fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

fn io(doing: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io {
        doing,
        path,
        source,
    }
}

impl Store {
    /// Opens (making it, mode 0700) the store at `dir`.
    pub fn open(dir: &Path, key: Arc<SnapshotKey>, me: Holder, bounds: Bounds) -> Result<Store> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io("make", dir))?;
        let md = std::fs::symlink_metadata(dir).map_err(io("stat", dir))?;
        if !md.is_dir() {
            return Err(Error::Format {
                why: format!("{} is not a directory", dir.display()),
            });
        }
        // The key the directory's snapshots are sealed with, by its id: a server given
        // another key (a replica configured apart from the others) is refused at start
        // rather than finding no session and sealing new ones nobody else can read.
        let marker = dir.join("key-id");
        let ours = key.id_hex();
        // Written whole under a name of its own, then linked into place: `link` fails if
        // the marker exists, and a marker that exists is never partly written (a crash
        // leaves at most the temporary file).
        let part = dir.join(format!("key-id.{}.part", std::process::id()));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&part)
            .and_then(|mut f| {
                f.write_all(format!("{ours}\n").as_bytes())
                    .and_then(|()| f.sync_all())
            })
            .and_then(|()| std::fs::hard_link(&part, &marker));
        let _ = std::fs::remove_file(&part);
        match written {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let found = ledger::read_small(&marker, 64)?;
                let found = String::from_utf8_lossy(&found).trim().to_string();
                if found.is_empty() {
                    // Left by a crash while it was written in place (as a version before
                    // this one did): it says nothing, so it is not taken for agreement.
                    return Err(Error::EmptyKeyMarker { path: marker });
                }
                if found != ours {
                    return Err(Error::OtherKey { found, ours });
                }
            }
            Err(e) => return Err(io("write", &marker)(e)),
        }
        Ok(Store {
            dir: dir.to_path_buf(),
            key,
            me,
            bounds,
            seen: Mutex::new(HashMap::new()),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn bounds(&self) -> Bounds {
        self.bounds
    }

    pub fn key(&self) -> &SnapshotKey {
        &self.key
    }

    pub fn me(&self) -> &Holder {
        &self.me
    }

    fn slot_dir(&self, slot: &str) -> PathBuf {
        self.dir.join(slot)
    }

    /// The slot's head, checked against what this process saw before.
    fn head(&self, slot: &str) -> Result<Option<Head>> {
        let dir = self.slot_dir(slot);
        if !dir.exists() {
            return Ok(None);
        }
        let head = ledger::head(&self.key, slot, &dir)?;
        let found = head.as_ref().map_or(0, |h| h.entry.seq);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let high = seen.entry(slot.to_string()).or_insert(0);
        if found < *high {
            tracing::error!(
                slot,
                seen = *high,
                found,
                "a paused session's ledger went back"
            );
            return Err(Error::RolledBack { seen: *high, found });
        }
        *high = found;
        Ok(head)
    }

    fn publish(&self, slot: &str, entry: &Entry) -> Result<bool> {
        let won = ledger::publish(&self.key, slot, &self.slot_dir(slot), entry)?;
        if won {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            let high = seen.entry(slot.to_string()).or_insert(0);
            *high = (*high).max(entry.seq);
        }
        Ok(won)
    }

    /// Whether `holder` is gone: an earlier run of this replica (names are unique in a
    /// deployment), a dead process on this host, or a lease not refreshed in time.
    fn stale(&self, holder: &Holder, age: Duration) -> bool {
        if *holder == self.me {
            return true;
        }
        if holder.replica.is_some() && holder.replica == self.me.replica {
            return true;
        }
        // Its pid means something here only on this boot and in this pid namespace.
        if !holder.boot.is_empty()
            && holder.boot == self.me.boot
            && holder.pid_ns != 0
            && holder.pid_ns == self.me.pid_ns
        {
            let pid = nix::unistd::Pid::from_raw(holder.pid as i32);
            if matches!(
                nix::sys::signal::kill(pid, None),
                Err(nix::errno::Errno::ESRCH)
            ) {
                return true;
            }
        }
        age > ledger::LEASE
    }

    // ------------------------------------------------------------- pausing

    /// Starts a pause of session `id` of `owner`, live here at `pos` (`None`: never paused
    /// or resumed, so not in the store). Refused when the store says someone else holds
    /// it, or the owner is at their count limit.
    pub fn begin_pause(
        &self,
        id: &str,
        owner: &str,
        pos: Option<&LedgerPos>,
    ) -> Result<SnapshotWriter<'_>> {
        let slot = self.key.slot_of(id);
        let head = self.head(&slot)?;
        let (head_seq, prev_gen) = match (&head, pos) {
            (None, None) => (0, 0),
            (Some(h), Some(pos)) if h.entry.seq == pos.seq => match &h.entry.state {
                State::Live { gen, holder, .. } if *holder == self.me => (h.entry.seq, *gen),
                _ => return Err(self.taken(h)),
            },
            (Some(h), _) => return Err(self.taken(h)),
            (None, Some(_)) => {
                return Err(Error::Raced {
                    what: "its ledger is gone".into(),
                })
            }
        };
        let (count, _) = self.usage(owner);
        if count >= self.bounds.max_per_client as u64 {
            return Err(Error::Limit(format!(
                "this client has {count} paused sessions, the most this server keeps (max_paused_per_client); close or resume one"
            )));
        }
        let slot_dir = self.slot_dir(&slot);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&slot_dir)
            .or_else(|e| if slot_dir.is_dir() { Ok(()) } else { Err(e) })
            .map_err(io("make", &slot_dir))?;
        let tmp = ledger::temp_name(&slot_dir, "snap")?;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&tmp)
            .map_err(io("make", &tmp))?;
        Ok(SnapshotWriter {
            store: self,
            session: id.to_string(),
            owner: owner.to_string(),
            slot,
            slot_dir,
            tmp,
            head_seq,
            prev_gen,
            gen: prev_gen + 1,
            parts: Vec::new(),
            committed: false,
        })
    }

    /// The error for a slot someone else holds (or that ended).
    fn taken(&self, h: &Head) -> Error {
        match &h.entry.state {
            State::Live {
                holder, since_unix, ..
            } => Error::LiveElsewhere {
                by: holder.describe(),
                since_s: unix_now().saturating_sub(*since_unix),
            },
            State::Ended { how, at_unix } => Error::Ended {
                how: how.clone(),
                ago_s: unix_now().saturating_sub(*at_unix),
            },
            State::Paused { .. } => Error::Raced {
                what: "it was paused by another server".into(),
            },
        }
    }

    // ------------------------------------------------------------- resuming

    /// Claims `owner`'s paused session `id` for this server: the snapshot is checked
    /// (key, authentication, session, owner, generation, part lengths) before the claim,
    /// so a bad one is refused without taking it. Exactly one of racing servers wins.
    pub fn claim(&self, id: &str, owner: &str) -> Result<Claimed> {
        let slot = self.key.slot_of(id);
        let head = self.head(&slot)?.ok_or(Error::NotFound)?;
        if head.entry.owner != self.key.owner_tag(owner) {
            return Err(Error::NotFound);
        }
        let mut recovered_from = None;
        let (gen, before) = match &head.entry.state {
            // Past its lifetime (keep_paused_for): as good as removed (gc removes it).
            State::Paused { expires_unix, .. } if *expires_unix <= unix_now() => {
                return Err(Error::Ended {
                    how: "expired (past keep_paused_for)".into(),
                    ago_s: unix_now().saturating_sub(*expires_unix),
                })
            }
            State::Paused { gen, .. } => (*gen, head.entry.state.clone()),
            // Held by a server that is gone, for longer than a paused session is kept:
            // its fallback is past its lifetime too.
            State::Live { holder, .. }
                if *holder != self.me
                    && self.stale(holder, head.age)
                    && head.age >= self.bounds.keep_for =>
            {
                return Err(Error::Ended {
                    how: "expired (its server stopped holding it more than keep_paused_for ago)"
                        .into(),
                    ago_s: head.age.saturating_sub(self.bounds.keep_for).as_secs(),
                })
            }
            State::Live { gen, holder, .. } if self.stale(holder, head.age) => {
                if *gen == 0 {
                    return Err(Error::NotFound);
                }
                if *holder != self.me {
                    recovered_from = Some(holder.clone());
                }
                (*gen, head.entry.state.clone())
            }
            _ => return Err(self.taken(&head)),
        };
        let snap_dir = self.slot_dir(&slot).join(snap_name(gen));
        let manifest = self.check(id, owner, gen, &snap_dir)?;
        let bytes = match &before {
            State::Paused { bytes, .. } | State::Live { bytes, .. } => *bytes,
            State::Ended { .. } => 0,
        };
        let entry = Entry {
            seq: head.entry.seq + 1,
            owner: head.entry.owner.clone(),
            state: State::Live {
                gen,
                holder: self.me.clone(),
                since_unix: unix_now(),
                bytes,
            },
        };
        if !self.publish(&slot, &entry)? {
            let now = self.head(&slot)?;
            return Err(match now {
                Some(h) => self.taken(&h),
                None => Error::NotFound,
            });
        }
        Ok(Claimed {
            pos: LedgerPos {
                slot,
                seq: entry.seq,
                gen,
            },
            manifest,
            snap_dir,
            before,
            recovered_from,
        })
    }

    /// Reads and checks the manifest of `snap.<gen>` for session `id` of `owner`, and the
    /// lengths of its part files.
    fn check(&self, id: &str, owner: &str, gen: u64, snap_dir: &Path) -> Result<Manifest> {
        let bytes = match ledger::read_small(
            &snap_dir.join("manifest"),
            super::manifest::MAX_BYTES as u64,
        ) {
            Ok(b) => b,
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::Forged {
                    what: "manifest".into(),
                    why: format!("pause {gen}'s snapshot is missing"),
                })
            }
            Err(e) => return Err(e),
        };
        let m = Manifest::open(&self.key, &bytes)?;
        if m.session != id {
            return Err(Error::OtherSession { found: m.session });
        }
        if m.owner != owner {
            return Err(Error::Forged {
                what: "manifest".into(),
                why: "it names another owner".into(),
            });
        }
        if m.generation != gen {
            return Err(Error::Replayed {
                found: m.generation,
                expected: gen,
            });
        }
        for p in &m.parts {
            let path = snap_dir.join(&p.file);
            let len = std::fs::symlink_metadata(&path)
                .ok()
                .filter(|md| md.is_file())
                .map(|md| md.len());
            let want = cipher_len(p.plain);
            match len {
                Some(l) if l == want => {}
                Some(l) if l < want => {
                    return Err(Error::Truncated {
                        what: format!("{} part", p.kind),
                    })
                }
                Some(_) => {
                    return Err(Error::Forged {
                        what: format!("{} part", p.kind),
                        why: "it is longer than its manifest says".into(),
                    })
                }
                None => {
                    return Err(Error::Truncated {
                        what: format!("{} part (missing)", p.kind),
                    })
                }
            }
        }
        Ok(m)
    }

    /// Gives a claim back (the restore failed): the session is paused again as it was.
    pub fn release(&self, claimed: &Claimed) -> Result<()> {
        let state = match &claimed.before {
            State::Paused { .. } => claimed.before.clone(),
            _ => State::Paused {
                gen: claimed.pos.gen,
                bytes: dir_bytes(&claimed.snap_dir),
                paused_unix: claimed.manifest.paused_unix,
                expires_unix: unix_now() + self.bounds.keep_for.as_secs(),
            },
        };
        let entry = Entry {
            seq: claimed.pos.seq + 1,
            owner: self.key.owner_tag(&claimed.manifest.owner),
            state,
        };
        if self.publish(&claimed.pos.slot, &entry)? {
            Ok(())
        } else {
            Err(Error::Raced {
                what: "it was taken while this server gave it back".into(),
            })
        }
    }

    /// Refreshes the lease of a session held live here.
    pub fn renew(&self, pos: &LedgerPos) -> Result<()> {
        ledger::touch(&self.slot_dir(&pos.slot), pos.seq)
    }

    // ------------------------------------------------------------- ending

    /// Ends session `id` of `owner` in the store (closed, expired): its snapshots are
    /// removed. `pos`: where it stands when live here. Nothing to do when the store never
    /// had it.
    pub fn end(&self, id: &str, owner: &str, how: &str, pos: Option<&LedgerPos>) -> Result<()> {
        let slot = self.key.slot_of(id);
        let Some(head) = self.head(&slot)? else {
            return Ok(());
        };
        if head.entry.owner != self.key.owner_tag(owner) {
            return Err(Error::NotFound);
        }
        match (&head.entry.state, pos) {
            (State::Ended { .. }, _) => return Ok(()),
            (_, Some(pos)) if pos.seq == head.entry.seq => {}
            (State::Paused { .. }, None) => {}
            (State::Live { holder, .. }, None) if self.stale(holder, head.age) => {}
            _ => return Err(self.taken(&head)),
        }
        let entry = Entry {
            seq: head.entry.seq + 1,
            owner: head.entry.owner.clone(),
            state: State::Ended {
                how: how.to_string(),
                at_unix: unix_now(),
            },
        };
        if !self.publish(&slot, &entry)? {
            return Err(Error::Raced {
                what: "another server changed it while it was being ended".into(),
            });
        }
        remove_snapshots(&self.slot_dir(&slot), None);
        Ok(())
    }

    /// What the store says of `id` for `owner` (`None`: nothing, or not theirs).
    pub fn state_of(&self, id: &str, owner: &str) -> Result<Option<(State, Duration)>> {
        let slot = self.key.slot_of(id);
        Ok(self
            .head(&slot)?
            .filter(|h| h.entry.owner == self.key.owner_tag(owner))
            .map(|h| (h.entry.state, h.age)))
    }

    // ------------------------------------------------------------- forking

    /// A paused copy of `owner`'s paused session `id` under `new_id`: the part files are
    /// reflinked where the filesystem can (copy-on-write), else copied; a new manifest
    /// names the new session.
    pub fn fork_paused(
        &self,
        id: &str,
        owner: &str,
        new_id: &str,
        created_unix: u64,
    ) -> Result<PausedInfo> {
        let slot = self.key.slot_of(id);
        let head = self.head(&slot)?.ok_or(Error::NotFound)?;
        if head.entry.owner != self.key.owner_tag(owner) {
            return Err(Error::NotFound);
        }
        let State::Paused { gen, .. } = head.entry.state else {
            return Err(self.taken(&head));
        };
        let src = self.slot_dir(&slot).join(snap_name(gen));
        let m = self.check(id, owner, gen, &src)?;
        let mut w = self.begin_pause(new_id, owner, None)?;
        for p in &m.parts {
            let from = src.join(&p.file);
            let to = w.tmp.join(&p.file);
            copy_cow(&from, &to)?;
            w.parts.push(p.clone());
        }
        let meta = SnapshotMeta {
            created_unix,
            backend: m.backend.clone(),
            state: m.state,
            languages: m.languages.clone(),
            keep_alive: m.keep_alive.clone(),
            workspace: m.workspace,
            quota_bytes: m.quota_bytes,
            max_entries: m.max_entries,
        };
        w.commit(meta)
    }
}

fn snap_name(gen: u64) -> String {
    format!("snap.{gen:016x}")
}

/// Bytes of the files in `dir` (not recursive).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Copies `from` to a new file `to`: a reflink (`FICLONE`) where the filesystem shares
/// blocks, else a copy (`copy_file_range`, which some filesystems also share); fsynced.
fn copy_cow(from: &Path, to: &Path) -> Result<()> {
    let src = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(from)
        .map_err(io("open", from))?;
    let dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)
        .map_err(io("create", to))?;
    use std::os::fd::AsRawFd;
    // SAFETY: ioctl(FICLONE) on two descriptors we own; the argument is a descriptor.
    let cloned = unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) } == 0;
    if !cloned {
        let mut s = &src;
        let mut d = &dst;
        std::io::copy(&mut s, &mut d).map_err(io("copy to", to))?;
    }
    dst.sync_all().map_err(io("sync", to))?;
    Ok(())
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
