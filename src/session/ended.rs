//! What the server can still say of a session id it no longer holds: closed or expired
//! here (a bounded record, told only to the session's owner), or made by an earlier run of
//! the server (every id carries the run's instance mark), so a client whose session was
//! lost to a restart reads that, not "no such session".
//!
//! An id is `cbx_<instance>_<secret>`: `instance` is 8 hex digits drawn when the server
//! starts, `secret` 32 hex digits drawn for the session. The instance mark is no secret
//! (it is the same in every id of one run); the session's unguessability is all in the
//! second part. Ids of the form `cbx_<secret>` came from versions before the mark: also an
//! earlier run.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Ended sessions remembered, oldest forgotten first.
const REMEMBERED: usize = 1024;

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// `close_session`.
    Closed,
    /// Idle past the TTL, which was this long.
    Expired { idle_ttl: Duration },
}

struct Entry {
    id: String,
    owner: String,
    how: How,
    at: Instant,
}

/// What became of an id this server does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// It ended here, `ago`.
    Ended { how: How, ago: Duration },
    /// An earlier run of the server made it; this run started `ago`.
    EarlierRun { ago: Duration },
    /// Nothing is known (never made, or another client's).
    Unknown,
}

/// The instance mark of this run and the ended sessions it remembers.
pub struct Ended {
    instance: String,
    started: Instant,
    entries: Mutex<VecDeque<Entry>>,
}

impl Ended {
    /// A new run, with a random instance mark.
    pub fn new() -> Result<Ended, getrandom::Error> {
        let mut raw = [0u8; 4];
        getrandom::fill(&mut raw)?;
        Ok(Ended::with_instance(super::hex(&raw)))
    }

    fn with_instance(instance: String) -> Ended {
        Ended {
            instance,
            started: Instant::now(),
            entries: Mutex::new(VecDeque::new()),
        }
    }

    /// This run's instance mark.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// A new id of this run from 16 random bytes (before any replica qualification).
    pub fn new_id(&self, secret: &[u8; 16]) -> String {
        format!("cbx_{}_{}", self.instance, super::hex(secret))
    }

    /// Remembers that `owner`'s session `id` ended.
    pub fn record(&self, id: &str, owner: &str, how: How) {
        let mut entries = self.entries.lock().expect("ended sessions lock");
        if entries.len() >= REMEMBERED {
            entries.pop_front();
        }
        entries.push_back(Entry {
            id: id.to_string(),
            owner: owner.to_string(),
            how,
            at: Instant::now(),
        });
    }

    /// What became of `id`, as far as `owner` may know: an ended session only to its
    /// owner; an earlier run's id to anyone (it says nothing about whose it was).
    pub fn fate(&self, id: &str, owner: &str) -> Fate {
        {
            let entries = self.entries.lock().expect("ended sessions lock");
            if let Some(e) = entries.iter().rev().find(|e| e.id == id) {
                if super::constant_time_eq(e.owner.as_bytes(), owner.as_bytes()) {
                    return Fate::Ended {
                        how: e.how,
                        ago: e.at.elapsed(),
                    };
                }
                return Fate::Unknown;
            }
        }
        match instance_of(id) {
            Some(Mark::Of(instance)) if instance != self.instance => Fate::EarlierRun {
                ago: self.started.elapsed(),
            },
            Some(Mark::Unmarked) => Fate::EarlierRun {
                ago: self.started.elapsed(),
            },
            _ => Fate::Unknown,
        }
    }
}

enum Mark<'a> {
    Of(&'a str),
    /// `cbx_<32 hex>`: made before ids carried a mark.
    Unmarked,
}

/// The instance mark of a well-formed id (after any `<replica>.` prefix).
fn instance_of(id: &str) -> Option<Mark<'_>> {
    let id = id.rsplit('.').next().unwrap_or(id);
    let rest = id.strip_prefix("cbx_")?;
    let is_hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    match rest.split_once('_') {
        Some((instance, secret)) if is_hex(instance, 8) && is_hex(secret, 32) => {
            Some(Mark::Of(instance))
        }
        None if is_hex(rest, 32) => Some(Mark::Unmarked),
        _ => None,
    }
}

/// `ago` in words: "12 s", "3 min", "2 h".
pub fn ago_words(ago: Duration) -> String {
    let s = ago.as_secs();
    if s < 120 {
        format!("{s} s")
    } else if s < 2 * 3600 {
        format!("{} min", s / 60)
    } else {
        format!("{} h", s / 3600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_session_is_told_only_to_its_owner() {
        let ended = Ended::with_instance("0a0b0c0d".into());
        let id = ended.new_id(&[7; 16]);
        assert_eq!(id, format!("cbx_0a0b0c0d_{}", "07".repeat(16)));
        assert_eq!(ended.fate(&id, "alice"), Fate::Unknown);
        ended.record(&id, "alice", How::Closed);
        assert!(matches!(
            ended.fate(&id, "alice"),
            Fate::Ended {
                how: How::Closed,
                ..
            }
        ));
        assert_eq!(ended.fate(&id, "bob"), Fate::Unknown);
    }

    #[test]
    fn an_earlier_runs_id_is_told_apart_from_a_made_up_one() {
        let ended = Ended::with_instance("0a0b0c0d".into());
        let earlier = format!("cbx_deadbeef_{}", "ab".repeat(16));
        assert!(matches!(
            ended.fate(&earlier, "anyone"),
            Fate::EarlierRun { .. }
        ));
        assert!(matches!(
            ended.fate(&format!("r1.{earlier}"), "anyone"),
            Fate::EarlierRun { .. }
        ));
        let unmarked = format!("cbx_{}", "ab".repeat(16));
        assert!(matches!(
            ended.fate(&unmarked, "anyone"),
            Fate::EarlierRun { .. }
        ));
        // This run's own mark, never made or ended: unknown. So is anything malformed.
        let ours = format!("cbx_0a0b0c0d_{}", "ab".repeat(16));
        for id in [
            ours.as_str(),
            "cbx_deadbeef_short",
            "cbx_xyz",
            "abcdef0123456789abcdef0123456789",
            "cbx_deadbeef_zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz",
            "",
        ] {
            assert_eq!(ended.fate(id, "anyone"), Fate::Unknown, "{id}");
        }
    }

    #[test]
    fn the_record_is_bounded() {
        let ended = Ended::with_instance("0a0b0c0d".into());
        let first = ended.new_id(&[0; 16]);
        ended.record(&first, "alice", How::Closed);
        for i in 0..REMEMBERED {
            ended.record(&format!("id{i}"), "alice", How::Closed);
        }
        assert_eq!(ended.entries.lock().unwrap().len(), REMEMBERED);
        assert_eq!(ended.fate(&first, "alice"), Fate::Unknown);
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(ago_words(Duration::from_secs(5)), "5 s");
        assert_eq!(ago_words(Duration::from_secs(600)), "10 min");
        assert_eq!(ago_words(Duration::from_secs(3 * 3600)), "3 h");
    }
}
