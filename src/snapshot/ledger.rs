//! A slot's ledger: the state of one session's snapshots, as a sequence of entries
//! `log.<seq>` (16 hex digits) that are published once and never rewritten.
//!
//! - An entry is one line of JSON and one line with the hex HMAC of (slot, seq, JSON):
//!   moved to another slot, renumbered or edited, it no longer authenticates.
//! - The head is the entry with the highest sequence number. If the head does not
//!   authenticate, the slot is refused ([`Error::Ledger`]): falling back to an earlier
//!   entry would be a rollback.
//! - Publishing entry `seq` is a compare-and-swap on the head `seq - 1`: the entry is
//!   written and fsynced under a temporary name, then hard-linked to `log.<seq>`, which
//!   fails with `EEXIST` when another server published that number first. `link(2)` is
//!   atomic on local filesystems and on NFS (where a lost reply is told apart by the
//!   temporary file's link count, the classic lock-file test), unlike `O_EXCL` on old NFS
//!   clients and `rename(2)`, which replaces.
//! - A `live` entry's lease is its file's modification time, refreshed by the server that
//!   holds it ([`touch`]); a holder that stopped refreshing for [`LEASE`] is taken to be
//!   gone.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::keys::{hex, unhex, SnapshotKey};
use super::{Error, Result};

/// A ledger entry file is at most this long.
const MAX_ENTRY: u64 = 4096;
/// How long a `live` entry stays valid without a refresh.
pub const LEASE: Duration = Duration::from_secs(120);
/// Entries below the head kept (older ones are removed).
const KEEP_BELOW_HEAD: u64 = 1;

/// Who holds a session live: enough to tell whether it is still there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Holder {
    /// The replica's name (`None`: a server without one).
    pub replica: Option<String>,
    /// The run's instance mark (see `session::ended`).
    pub instance: String,
    /// The host's boot id, and the server's pid on it.
    pub boot: String,
    pub pid: u32,
    /// The inode of the server's pid namespace (`/proc/self/ns/pid`; 0: unknown). Servers
    /// in containers on one host share its boot id but not their pids: a pid is probed
    /// only by a server in the same pid namespace.
    #[serde(default)]
    pub pid_ns: u64,
}

impl Holder {
    /// `replica r1 (run 0a0b0c0d)` or `another codebox server (pid 7, run …)`.
    pub fn describe(&self) -> String {
        match &self.replica {
            Some(r) => format!("replica {r:?} (run {})", self.instance),
            None => format!(
                "another codebox server (pid {}, run {})",
                self.pid, self.instance
            ),
        }
    }
}

/// What an entry says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum State {
    /// `snap.<gen>` is whole and nobody holds the session.
    Paused {
        gen: u64,
        /// Bytes of the snapshot on disk.
        bytes: u64,
        paused_unix: u64,
        /// When it may be removed (`keep_paused_for` after the pause).
        expires_unix: u64,
    },
    /// A server holds the session live; `gen` is the snapshot it resumed from (0: none),
    /// kept as the fallback should that server die without pausing it again.
    Live {
        gen: u64,
        holder: Holder,
        since_unix: u64,
        /// Bytes of `snap.<gen>` on disk: they count against the owner's bytes bound
        /// while the fallback is kept.
        #[serde(default)]
        bytes: u64,
    },
    /// Closed or expired: its snapshots are gone.
    Ended { how: String, at_unix: u64 },
}

/// One ledger entry (no `deny_unknown_fields`: serde cannot check them with a flattened
/// enum; the MAC makes the text the server's own anyway).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub seq: u64,
    /// The owner's tag ([`SnapshotKey::owner_tag`]).
    pub owner: String,
    #[serde(flatten)]
    pub state: State,
}

/// The head entry and its file's age (the lease of a `live` one).
#[derive(Debug, Clone)]
pub struct Head {
    pub entry: Entry,
    pub age: Duration,
}

fn entry_name(seq: u64) -> String {
    format!("log.{seq:016x}")
}

/// The sequence numbers of the entries in `slot_dir`, unsorted.
fn sequences(slot_dir: &Path) -> Result<Vec<u64>> {
    let rd = std::fs::read_dir(slot_dir).map_err(|source| Error::Io {
        doing: "list",
        path: slot_dir.to_path_buf(),
        source,
    })?;
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(n) = name.to_str().and_then(|n| n.strip_prefix("log.")) else {
            continue;
        };
        if n.len() == 16 {
            if let Ok(seq) = u64::from_str_radix(n, 16) {
                out.push(seq);
            }
        }
    }
    Ok(out)
}

/// Reads a file of at most `max` bytes without following a symlink.
pub(super) fn read_small(path: &Path, max: u64) -> Result<Vec<u8>> {
    let io = |doing| {
        move |source| Error::Io {
            doing,
            path: path.to_path_buf(),
            source,
        }
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(io("open"))?;
    let md = f.metadata().map_err(io("stat"))?;
    if !md.is_file() || md.len() > max {
        return Err(Error::Format {
            why: format!("{} is not a small regular file", path.display()),
        });
    }
    let mut out = Vec::new();
    f.take(max + 1).read_to_end(&mut out).map_err(io("read"))?;
    Ok(out)
}

/// The slot's head entry, authenticated (`None`: no entry).
pub fn head(key: &SnapshotKey, slot: &str, slot_dir: &Path) -> Result<Option<Head>> {
    let Some(seq) = sequences(slot_dir)?.into_iter().max() else {
        return Ok(None);
    };
    let path = slot_dir.join(entry_name(seq));
    let bytes = read_small(&path, MAX_ENTRY).map_err(|e| Error::Ledger {
        seq,
        why: e.to_string(),
    })?;
    let entry = parse(key, slot, seq, &bytes)?;
    let age = std::fs::symlink_metadata(&path)
        .ok()
        .and_then(|m| {
            let mtime = std::time::UNIX_EPOCH
                + Duration::new(
                    m.mtime().max(0) as u64,
                    m.mtime_nsec().clamp(0, 999_999_999) as u32,
                );
            std::time::SystemTime::now().duration_since(mtime).ok()
        })
        .unwrap_or_default();
    Ok(Some(Head { entry, age }))
}

fn parse(key: &SnapshotKey, slot: &str, seq: u64, bytes: &[u8]) -> Result<Entry> {
    let bad = |why: &str| Error::Ledger {
        seq,
        why: why.to_string(),
    };
    let text = std::str::from_utf8(bytes).map_err(|_| bad("not text"))?;
    let mut lines = text.split('\n');
    let (Some(json), Some(tag), Some(""), None) =
        (lines.next(), lines.next(), lines.next(), lines.next())
    else {
        return Err(bad("not an entry"));
    };
    let tag = unhex(tag).ok_or_else(|| bad("no MAC"))?;
    if !key.ledger_mac_ok(slot, seq, json.as_bytes(), &tag) {
        return Err(bad("its MAC does not match (altered, moved from another slot or renumbered, or written with another key)"));
    }
    let entry: Entry =
        serde_json::from_str(json).map_err(|_| bad("authenticates but cannot be read"))?;
    if entry.seq != seq {
        return Err(bad("its number differs from its name"));
    }
    Ok(entry)
}

/// The bytes of `entry` as published in `slot`.
fn render(key: &SnapshotKey, slot: &str, entry: &Entry) -> Vec<u8> {
    let json = serde_json::to_string(entry).expect("an entry serialises");
    let tag = key.ledger_mac(slot, entry.seq, json.as_bytes());
    format!("{json}\n{}\n", hex(&tag)).into_bytes()
}

/// Publishes `entry` as `log.<entry.seq>` unless that number exists: `Ok(false)` when
/// another server published it first.
pub fn publish(key: &SnapshotKey, slot: &str, slot_dir: &Path, entry: &Entry) -> Result<bool> {
    let final_path = slot_dir.join(entry_name(entry.seq));
    let tmp = temp_name(slot_dir, "log")?;
    let io = |doing, path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io {
            doing,
            path,
            source,
        }
    };
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(io("create", &tmp))?;
        let written = f
            .write_all(&render(key, slot, entry))
            .and_then(|()| f.sync_all());
        if let Err(source) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::Io {
                doing: "write",
                path: tmp,
                source,
            });
        }
    }
    let linked = match std::fs::hard_link(&tmp, &final_path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        // NFS: the link may have been made and its reply lost; then the temporary file
        // has two links.
        Err(e) => match std::fs::symlink_metadata(&tmp) {
            Ok(m) if m.nlink() == 2 => Ok(true),
            _ => Err(Error::Io {
                doing: "link",
                path: final_path.clone(),
                source: e,
            }),
        },
    };
    let _ = std::fs::remove_file(&tmp);
    let linked = linked?;
    if linked {
        sync_dir(slot_dir)?;
        prune(slot_dir, entry.seq);
    }
    Ok(linked)
}

/// Removes entries more than [`KEEP_BELOW_HEAD`] below `head` (best effort).
fn prune(slot_dir: &Path, head: u64) {
    if let Ok(seqs) = sequences(slot_dir) {
        for seq in seqs {
            if seq + KEEP_BELOW_HEAD < head {
                let _ = std::fs::remove_file(slot_dir.join(entry_name(seq)));
            }
        }
    }
}

/// Refreshes the lease of the `live` entry `seq` (its modification time, set to now).
pub fn touch(slot_dir: &Path, seq: u64) -> Result<()> {
    let path = slot_dir.join(entry_name(seq));
    nix::sys::stat::utimensat(
        nix::fcntl::AT_FDCWD,
        &path,
        &nix::sys::time::TimeSpec::UTIME_NOW,
        &nix::sys::time::TimeSpec::UTIME_NOW,
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )
    .map_err(|e| Error::Io {
        doing: "refresh",
        path,
        source: e.into(),
    })
}

/// A fresh name `.tmp.<what>.<random>` in `dir`.
pub(super) fn temp_name(dir: &Path, what: &str) -> Result<PathBuf> {
    let mut r = [0u8; 8];
    getrandom::fill(&mut r).map_err(Error::Random)?;
    Ok(dir.join(format!(".tmp.{what}.{}", hex(&r))))
}

/// fsync of a directory (its entries are durable).
pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| Error::Io {
            doing: "sync",
            path: dir.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SnapshotKey {
        let mut raw = [7u8; 32];
        raw[0] = 1;
        SnapshotKey::from_bytes(&raw)
    }

    fn paused(seq: u64, gen: u64) -> Entry {
        Entry {
            seq,
            owner: "tag".into(),
            state: State::Paused {
                gen,
                bytes: 10,
                paused_unix: 1,
                expires_unix: 2,
            },
        }
    }

    #[test]
    fn entries_publish_once_and_the_head_is_the_highest() {
        let k = key();
        let d = tempfile::tempdir().unwrap();
        assert!(head(&k, "s", d.path()).unwrap().is_none());
        assert!(publish(&k, "s", d.path(), &paused(1, 1)).unwrap());
        assert!(!publish(&k, "s", d.path(), &paused(1, 9)).unwrap(), "taken");
        assert!(publish(&k, "s", d.path(), &paused(2, 2)).unwrap());
        assert!(publish(&k, "s", d.path(), &paused(3, 3)).unwrap());
        let h = head(&k, "s", d.path()).unwrap().unwrap();
        assert_eq!(h.entry, paused(3, 3));
        // Old entries pruned; no temporary file left.
        let mut names: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, [entry_name(2), entry_name(3)]);
    }

    #[test]
    fn altered_renumbered_moved_or_foreign_entries_are_refused() {
        let k = key();
        let d = tempfile::tempdir().unwrap();
        publish(&k, "s", d.path(), &paused(1, 1)).unwrap();
        let p1 = d.path().join(entry_name(1));
        let good = std::fs::read(&p1).unwrap();
        // Renumbered: copied to a higher number to look like the head.
        std::fs::write(d.path().join(entry_name(5)), &good).unwrap();
        assert!(matches!(
            head(&k, "s", d.path()),
            Err(Error::Ledger { seq: 5, .. })
        ));
        std::fs::remove_file(d.path().join(entry_name(5))).unwrap();
        // Edited.
        let edited = String::from_utf8(good.clone())
            .unwrap()
            .replace("\"gen\":1", "\"gen\":7");
        std::fs::write(&p1, edited).unwrap();
        assert!(matches!(head(&k, "s", d.path()), Err(Error::Ledger { .. })));
        // Moved from another slot, or made with another key.
        std::fs::write(&p1, &good).unwrap();
        assert!(matches!(
            head(&k, "other", d.path()),
            Err(Error::Ledger { .. })
        ));
        let other = SnapshotKey::from_bytes(&[9u8; 32]);
        assert!(matches!(
            head(&other, "s", d.path()),
            Err(Error::Ledger { .. })
        ));
        // Garbage, a symlink, a huge file.
        std::fs::write(&p1, "nonsense").unwrap();
        assert!(head(&k, "s", d.path()).is_err());
        std::fs::remove_file(&p1).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &p1).unwrap();
        assert!(head(&k, "s", d.path()).is_err());
        std::fs::remove_file(&p1).unwrap();
        std::fs::write(&p1, vec![b'x'; 10_000]).unwrap();
        assert!(head(&k, "s", d.path()).is_err());
    }

    #[test]
    fn racing_publishers_get_one_winner() {
        let k = std::sync::Arc::new(key());
        let d = tempfile::tempdir().unwrap();
        let wins: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let k = k.clone();
                    let dir = d.path().to_path_buf();
                    s.spawn(move || publish(&k, "s", &dir, &paused(1, i)).unwrap() as usize)
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(wins, 1);
    }
}
