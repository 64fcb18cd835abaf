//! Sandbox cgroup names, and telling a crashed supervisor's cgroups from a live one's.
//!
//! A sandbox cgroup is named `codebox-<pid>-<start>-<seq>[-<hint>]`: the supervisor's pid
//! and start time (field 22 of `/proc/<pid>/stat`, clock ticks after boot), a per-process
//! sequence number, and an optional short hint (`python`, `deno`) for people reading
//! `/sys/fs/cgroup`. The start time makes the owner check immune to pid reuse: a cgroup is
//! stale when `/proc/<pid>` is gone or belongs to a process that started at another time.
//! Names that do not parse (`codebox-supervisor`, `codebox-delegated-*`, anything else)
//! are never touched.

use std::io;
use std::path::Path;

use super::discover::parse_stat;
use super::error::{Error, Result};

pub(super) const PREFIX: &str = "codebox-";
const MAX_HINT: usize = 24;

/// The supervisor process that owns a cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Owner {
    pub pid: i32,
    pub start: u64,
}

/// `codebox-<pid>-<start>-<seq>[-<hint>]`.
pub(super) fn sandbox_name(owner: Owner, seq: u64, hint: &str) -> String {
    let Owner { pid, start } = owner;
    if hint.is_empty() {
        format!("{PREFIX}{pid}-{start}-{seq}")
    } else {
        format!("{PREFIX}{pid}-{start}-{seq}-{hint}")
    }
}

/// The owner encoded in a sandbox cgroup name, if it is one.
pub(super) fn parse_name(name: &str) -> Option<Owner> {
    let mut parts = name.strip_prefix(PREFIX)?.splitn(4, '-');
    let number = |s: Option<&str>| -> Option<u64> {
        let s = s?;
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    let pid = i32::try_from(number(parts.next())?).ok()?;
    let start = number(parts.next())?;
    let _seq = number(parts.next())?;
    match parts.next() {
        Some(hint) if !valid_hint(hint) => None,
        _ => Some(Owner { pid, start }),
    }
}

/// The sequence number in a sandbox cgroup name, if it is one.
pub(super) fn parse_seq(name: &str) -> Option<u64> {
    parse_name(name)?;
    let seq = name.strip_prefix(PREFIX)?.split('-').nth(2)?;
    seq.parse().ok()
}

/// Checks a name hint: at most 24 of `[A-Za-z0-9_]`, possibly empty.
pub(super) fn check_hint(hint: &str) -> Result<&str> {
    if hint.len() <= MAX_HINT && valid_hint(hint) {
        Ok(hint)
    } else {
        Err(Error::InvalidName(hint.to_string()))
    }
}

fn valid_hint(hint: &str) -> bool {
    hint.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Whether `owner` still runs, judged from `<proc_root>/<pid>/stat`. Anything other than
/// "gone" or "another process now" counts as alive: a live supervisor's sandboxes must
/// never be killed on a guess.
pub(super) fn owner_alive(proc_root: &Path, owner: Owner) -> bool {
    let path = proc_root.join(owner.pid.to_string()).join("stat");
    match std::fs::read_to_string(&path) {
        Ok(text) => match parse_stat(&path, &text) {
            Ok(stat) => stat.start == owner.start,
            Err(e) => {
                tracing::warn!(?e, path = %path.display(), "unreadable stat; assuming the owner lives");
                true
            }
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => {
            false
        }
        Err(e) => {
            tracing::warn!(?e, path = %path.display(), "cannot read stat; assuming the owner lives");
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: Owner = Owner {
        pid: 4242,
        start: 987_654,
    };

    #[test]
    fn names_round_trip() {
        assert_eq!(sandbox_name(ME, 7, ""), "codebox-4242-987654-7");
        assert_eq!(
            sandbox_name(ME, 7, "python"),
            "codebox-4242-987654-7-python"
        );
        assert_eq!(parse_name("codebox-4242-987654-7"), Some(ME));
        assert_eq!(parse_name("codebox-4242-987654-7-python"), Some(ME));
        assert_eq!(parse_name("codebox-4242-987654-7-deno_2"), Some(ME));
        assert_eq!(parse_seq("codebox-4242-987654-7-deno_2"), Some(7));
        assert_eq!(parse_seq(&sandbox_name(ME, 1 << 40, "")), Some(1 << 40));
        assert_eq!(parse_seq("codebox-supervisor"), None);
    }

    #[test]
    fn foreign_names_are_not_ours() {
        for name in [
            "codebox-supervisor",
            "codebox-delegated-codebox-test",
            "codebox-4242-987654",
            "codebox-4242-987654-x",
            "codebox--987654-1",
            "codebox-+1-2-3",
            "codebox-1-2-3-a-b",
            "codebox-99999999999-1-1",
            "sandbox-1-2-3",
            "user.slice",
        ] {
            assert_eq!(parse_name(name), None, "{name}");
        }
    }

    #[test]
    fn hints_are_checked() {
        assert_eq!(check_hint("python").unwrap(), "python");
        assert_eq!(check_hint("").unwrap(), "");
        assert!(check_hint("a-b").is_err());
        assert!(check_hint("../x").is_err());
        assert!(check_hint(&"x".repeat(25)).is_err());
    }

    #[test]
    fn owner_liveness_follows_proc() {
        let proc = tempfile::tempdir().unwrap();
        let stat = |pid: i32, start: u64| {
            let dir = proc.path().join(pid.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            let line =
                format!("{pid} (codebox) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0\n");
            std::fs::write(dir.join("stat"), line).unwrap();
        };
        stat(4242, 987_654);
        stat(777, 5);
        assert!(owner_alive(proc.path(), ME));
        // Same pid, other start time: the pid was reused, the owner is gone.
        assert!(!owner_alive(proc.path(), Owner { pid: 777, start: 6 }));
        assert!(!owner_alive(
            proc.path(),
            Owner {
                pid: 31337,
                start: 1
            }
        ));
        // Garbage in stat: assume alive.
        std::fs::write(proc.path().join("777/stat"), "junk").unwrap();
        assert!(owner_alive(proc.path(), Owner { pid: 777, start: 6 }));
    }
}
