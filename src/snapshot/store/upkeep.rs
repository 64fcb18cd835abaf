//! The store's listing, bounds and clean-up: every slot's head, a client's usage and its
//! lock, what `health` and `codebox://sessions` show, and `gc` (expired sessions, stale
//! temporary entries, old snapshots).

use super::*;

impl Store {
    /// Every slot with a readable head, and the number of unreadable ones.
    pub(super) fn heads(&self) -> (Vec<(String, Head)>, u64) {
        let mut out = Vec::new();
        let mut unreadable = 0;
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return (out, 0);
        };
        for e in rd.flatten() {
            let Ok(name) = e.file_name().into_string() else {
                continue;
            };
            if name.len() != 32 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
                continue;
            }
            match self.head(&name) {
                Ok(Some(h)) => out.push((name, h)),
                Ok(None) => {}
                Err(e) => {
                    unreadable += 1;
                    tracing::debug!(slot = name, error = %e, "an unreadable slot");
                }
            }
        }
        (out, unreadable)
    }

    /// `owner`'s paused sessions: how many, and their bytes.
    pub fn usage(&self, owner: &str) -> (u64, u64) {
        self.usage_besides(owner, None)
    }

    /// [`Store::usage`] without slot `besides` (a session being paused again: its
    /// fallback goes once the new snapshot is in). A live session's fallback snapshot
    /// counts in the bytes, not in the count.
    pub(super) fn usage_besides(&self, owner: &str, besides: Option<&str>) -> (u64, u64) {
        let tag = self.key.owner_tag(owner);
        let (heads, _) = self.heads();
        heads
            .iter()
            .filter(|(slot, h)| h.entry.owner == tag && Some(slot.as_str()) != besides)
            .fold((0, 0), |(n, b), (_, h)| match h.entry.state {
                State::Paused { bytes, .. } => (n + 1, b + bytes),
                State::Live { bytes, .. } => (n, b + bytes),
                State::Ended { .. } => (n, b),
            })
    }

    /// An exclusive `flock` on `owner`'s lock file in the store's directory, held until
    /// dropped (blocks while another pause of the same client commits).
    pub(super) fn owner_lock(&self, owner: &str) -> Result<nix::fcntl::Flock<File>> {
        let path = self.dir.join(format!("lock.{}", self.key.owner_tag(owner)));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io("open", &path))?;
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, errno)| io("lock", &path)(errno.into()))
    }

    /// `owner`'s paused sessions, newest first.
    pub fn list(&self, owner: &str) -> Vec<PausedInfo> {
        let tag = self.key.owner_tag(owner);
        let (heads, _) = self.heads();
        let mut out: Vec<PausedInfo> = heads
            .into_iter()
            .filter(|(_, h)| h.entry.owner == tag)
            .filter_map(|(slot, h)| {
                let State::Paused {
                    gen,
                    bytes,
                    paused_unix,
                    expires_unix,
                } = h.entry.state
                else {
                    return None;
                };
                let dir = self.slot_dir(&slot).join(snap_name(gen));
                let bytes_read = ledger::read_small(
                    &dir.join("manifest"),
                    crate::snapshot::manifest::MAX_BYTES as u64,
                )
                .ok()?;
                let m = Manifest::open(&self.key, &bytes_read).ok()?;
                (m.owner == owner && m.generation == gen).then_some(PausedInfo {
                    id: m.session,
                    generation: gen,
                    paused_unix,
                    expires_unix,
                    created_unix: m.created_unix,
                    bytes,
                    state: m.state,
                    languages: m.languages,
                    workspace: m.workspace,
                })
            })
            .collect();
        out.sort_by_key(|p| std::cmp::Reverse(p.paused_unix));
        out
    }

    /// Every client's paused sessions together.
    pub fn totals(&self) -> Totals {
        let (heads, unreadable) = self.heads();
        let mut t = Totals {
            unreadable,
            ..Totals::default()
        };
        for (_, h) in heads {
            match h.entry.state {
                State::Paused { bytes, .. } => {
                    t.paused += 1;
                    t.bytes += bytes;
                }
                State::Live { .. } => t.live += 1,
                State::Ended { .. } => {}
            }
        }
        t
    }

    /// Expires paused sessions past their lifetime, removes what crashed pauses left and
    /// the records of sessions ended longer than the lifetime ago. Returns how many
    /// paused sessions expired.
    pub fn gc(&self) -> u64 {
        let now = unix_now();
        // Slots without a ledger: a first pause that failed or crashed (once old; one in
        // flight is recent).
        if let Ok(rd) = std::fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let is_slot = name.len() == 32 && name.bytes().all(|b| b.is_ascii_hexdigit());
                if !is_slot
                    || ledger::head(&self.key, &name, &e.path())
                        .ok()
                        .flatten()
                        .is_some()
                {
                    continue;
                }
                let has_ledger = std::fs::read_dir(e.path()).is_ok_and(|mut rd| {
                    rd.any(|x| x.is_ok_and(|x| x.file_name().to_string_lossy().starts_with("log.")))
                });
                let old = e
                    .metadata()
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > STALE_TEMP);
                if !has_ledger && old {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let (heads, _) = self.heads();
        let mut expired = 0;
        for (slot, h) in heads {
            let dir = self.slot_dir(&slot);
            // A paused session past keep_paused_for, or the fallback of a session whose
            // server is gone and stopped holding it that long ago.
            let expired_now = match &h.entry.state {
                State::Paused { expires_unix, .. } => *expires_unix <= now,
                State::Live { holder, .. } => {
                    *holder != self.me && self.stale(holder, h.age) && h.age >= self.bounds.keep_for
                }
                State::Ended { .. } => false,
            };
            match &h.entry.state {
                _ if expired_now => {
                    let entry = Entry {
                        seq: h.entry.seq + 1,
                        owner: h.entry.owner.clone(),
                        state: State::Ended {
                            how: "expired".into(),
                            at_unix: now,
                        },
                    };
                    if matches!(self.publish(&slot, &entry), Ok(true)) {
                        expired += 1;
                        remove_snapshots(&dir, None);
                        tracing::info!(slot, "a paused session expired (keep_paused_for)");
                    }
                }
                State::Paused { gen, .. } | State::Live { gen, .. } => {
                    remove_snapshots(&dir, Some(*gen));
                }
                State::Ended { at_unix, .. } => {
                    if at_unix + self.bounds.keep_for.as_secs() <= now {
                        let _ = std::fs::remove_dir_all(&dir);
                        self.seen
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&slot);
                    } else {
                        remove_snapshots(&dir, None);
                    }
                }
            }
        }
        expired
    }
}

/// Removes snapshots of `slot_dir` but `keep` — only those older than it, or left by a
/// pause that crashed more than [`STALE_TEMP`] ago (a pause in flight writes a newer one)
/// — and stale temporary entries.
pub(super) fn remove_snapshots(slot_dir: &Path, keep: Option<u64>) {
    let Ok(rd) = std::fs::read_dir(slot_dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let old = e
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE_TEMP);
        let remove = if let Some(gen) = name
            .strip_prefix("snap.")
            .and_then(|g| u64::from_str_radix(g, 16).ok())
        {
            match keep {
                None => true,
                Some(k) => gen < k || (gen > k && old),
            }
        } else {
            name.starts_with(".tmp.") && old
        };
        if remove {
            let path = e.path();
            let r = if e.file_type().is_ok_and(|t| t.is_dir()) {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            if let Err(err) = r {
                tracing::warn!(path = %path.display(), %err, "cannot remove an old snapshot");
            }
        }
    }
}
