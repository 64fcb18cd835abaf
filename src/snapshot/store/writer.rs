//! Writing a pause ([`SnapshotWriter`]: parts into a temporary directory, checked against
//! the bounds and published under the owner's lock) and reading a claimed snapshot
//! ([`Claimed`], [`SnapshotReader`]).

use super::*;

/// A pause being written: parts into a temporary directory, then [`Self::commit`].
/// Dropped uncommitted, it removes what it wrote.
pub struct SnapshotWriter<'a> {
    pub(super) store: &'a Store,
    pub(super) session: String,
    pub(super) owner: String,
    pub(super) slot: String,
    pub(super) slot_dir: PathBuf,
    pub(super) tmp: PathBuf,
    pub(super) head_seq: u64,
    pub(super) prev_gen: u64,
    pub(super) gen: u64,
    pub(super) parts: Vec<PartEntry>,
    pub(super) committed: bool,
}

/// One part being written (an `io::Write` that encrypts).
pub struct PartSink {
    pub(super) kind: PartKind,
    pub(super) key: PartKey,
    pub(super) path: PathBuf,
    pub(super) w: PartWriter<BufWriter<File>>,
}

impl Write for PartSink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.w.write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }
}

impl SnapshotWriter<'_> {
    /// The generation this pause writes.
    pub fn generation(&self) -> u64 {
        self.gen
    }

    /// A new part of `kind` (one of each kind).
    pub fn part(&mut self, kind: PartKind) -> Result<PartSink> {
        if self.parts.iter().any(|p| p.kind() == Some(kind)) {
            return Err(Error::Format {
                why: format!("two {} parts", kind.as_str()),
            });
        }
        let path = self.tmp.join(kind.as_str());
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(io("create", &path))?;
        let key = PartKey::random()?;
        let w = PartWriter::new(&key, kind.as_str(), BufWriter::with_capacity(256 * 1024, f));
        Ok(PartSink { kind, key, path, w })
    }

    /// Finishes a part: its last chunk written and the file synced.
    pub fn add(&mut self, sink: PartSink) -> Result<()> {
        let PartSink { kind, key, path, w } = sink;
        let (out, plain) = w.finish().map_err(io("write", &path))?;
        let f = out.into_inner().map_err(|e| Error::Io {
            doing: "write",
            path: path.clone(),
            source: e.into_error(),
        })?;
        f.sync_all().map_err(io("sync", &path))?;
        self.parts.push(PartEntry::new(kind, &key, plain));
        Ok(())
    }

    /// Seals the manifest, moves the snapshot into place and publishes it in the ledger;
    /// then removes the previous snapshot. Refused (nothing published) when the owner's
    /// bytes would pass their bound or another server changed the slot meanwhile.
    pub fn commit(mut self, meta: SnapshotMeta) -> Result<PausedInfo> {
        let store = self.store;
        let now = unix_now();
        let manifest = Manifest {
            session: self.session.clone(),
            owner: self.owner.clone(),
            generation: self.gen,
            created_unix: meta.created_unix,
            paused_unix: now,
            paused_by: format!(
                "{}/{}",
                store.me.replica.as_deref().unwrap_or("-"),
                store.me.instance
            ),
            backend: meta.backend,
            state: meta.state,
            languages: meta.languages.clone(),
            keep_alive: meta.keep_alive,
            workspace: meta.workspace,
            quota_bytes: meta.quota_bytes,
            max_entries: meta.max_entries,
            parts: self.parts.clone(),
        };
        let sealed = manifest.seal(&store.key)?;
        let mpath = self.tmp.join("manifest");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&mpath)
            .map_err(io("create", &mpath))?;
        f.write_all(&sealed)
            .and_then(|()| f.sync_all())
            .map_err(io("write", &mpath))?;
        drop(f);
        ledger::sync_dir(&self.tmp)?;
        let bytes = dir_bytes(&self.tmp);
        // The bounds are checked again and the snapshot published under the owner's
        // lock: two pauses or forks of one client at once cannot both pass a bound only
        // one of them fits in (begin_pause's check alone was check-then-act). The lock
        // is a file in the store's directory, so servers sharing it take turns too.
        let _owner_lock = store.owner_lock(&self.owner)?;
        let (count, used) = store.usage_besides(&self.owner, Some(&self.slot));
        if count >= store.bounds.max_per_client as u64 {
            return Err(Error::Limit(format!(
                "this client has {count} paused sessions, the most this server keeps (max_paused_per_client); close or resume one"
            )));
        }
        if used + bytes > store.bounds.max_bytes_per_client {
            return Err(Error::Limit(format!(
                "this snapshot ({bytes} bytes) would take this client's paused sessions to {} bytes, over max_paused_bytes_per_client ({} bytes)",
                used + bytes,
                store.bounds.max_bytes_per_client
            )));
        }
        let snap = self.slot_dir.join(snap_name(self.gen));
        if snap.exists() {
            // A crashed pause of this same generation: never published.
            std::fs::remove_dir_all(&snap).map_err(io("remove", &snap))?;
        }
        std::fs::rename(&self.tmp, &snap).map_err(io("move into place", &snap))?;
        self.committed = true;
        ledger::sync_dir(&self.slot_dir)?;
        let expires = now + store.bounds.keep_for.as_secs();
        let entry = Entry {
            seq: self.head_seq + 1,
            owner: store.key.owner_tag(&self.owner),
            state: State::Paused {
                gen: self.gen,
                bytes,
                paused_unix: now,
                expires_unix: expires,
            },
        };
        match store.publish(&self.slot, &entry) {
            Ok(true) => {}
            Ok(false) => {
                let _ = std::fs::remove_dir_all(&snap);
                return Err(Error::Raced {
                    what: "another server took the session while it was being paused".into(),
                });
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&snap);
                return Err(e);
            }
        }
        if self.prev_gen > 0 && self.prev_gen != self.gen {
            let _ = std::fs::remove_dir_all(self.slot_dir.join(snap_name(self.prev_gen)));
        }
        Ok(PausedInfo {
            id: self.session.clone(),
            generation: self.gen,
            paused_unix: now,
            expires_unix: expires,
            created_unix: meta.created_unix,
            bytes,
            state: meta.state,
            languages: meta.languages,
            workspace: meta.workspace,
        })
    }
}

impl Drop for SnapshotWriter<'_> {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

/// A session claimed for resuming: its manifest, checked, and its parts to read.
pub struct Claimed {
    pub pos: LedgerPos,
    pub manifest: Manifest,
    pub(super) snap_dir: PathBuf,
    /// The entry it was claimed from (given back by [`Store::release`]).
    pub(super) before: State,
    /// The server that held it live and is gone (its last pause is what resumes).
    pub recovered_from: Option<Holder>,
}

impl Claimed {
    /// The reader of its parts.
    pub fn reader(&self) -> SnapshotReader<'_> {
        SnapshotReader {
            dir: &self.snap_dir,
            manifest: &self.manifest,
        }
    }
}

/// Reads a claimed snapshot's parts.
pub struct SnapshotReader<'a> {
    pub(super) dir: &'a Path,
    pub(super) manifest: &'a Manifest,
}

impl SnapshotReader<'_> {
    /// The part of `kind` (`None`: the snapshot has none). Its `finish` confirms it.
    pub fn part(&self, kind: PartKind) -> Result<Option<PartReader<BufReader<File>>>> {
        let Some(p) = self.manifest.part(kind) else {
            return Ok(None);
        };
        let path = self.dir.join(&p.file);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(io("open", &path))?;
        let key = p.part_key().ok_or_else(|| Error::Format {
            why: "a part's key".into(),
        })?;
        Ok(Some(PartReader::new(
            &key,
            kind.as_str(),
            p.plain,
            BufReader::with_capacity(256 * 1024, f),
        )))
    }

    pub fn manifest(&self) -> &Manifest {
        self.manifest
    }
}

/// The named error for a part's stream failing.
pub fn part_error(kind: PartKind, e: std::io::Error) -> Error {
    use crate::snapshot::stream::StreamError;
    let what = format!("{} part", kind.as_str());
    match StreamError::of(&e) {
        Some(StreamError::Truncated) => Error::Truncated { what },
        Some(s) => Error::Forged {
            what,
            why: s.to_string(),
        },
        None => Error::Io {
            doing: "read",
            path: PathBuf::from(what),
            source: e,
        },
    }
}
