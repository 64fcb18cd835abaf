//! `[sessions]` in `codebox.toml`: sessions that outlive the server.
//!
//! ```toml
//! [sessions]
//! snapshot_key = "env:CODEBOX_SNAPSHOT_KEY"   # 32 bytes: 64 hex digits or base64; required
//! dir = "/var/lib/codebox/sessions"           # default <state_dir>/sessions; shared by replicas
//! on_idle = "pause"                           # or "close" (after session_ttl unused)
//! on_stop = "pause"                           # or "close" (SIGTERM, SIGINT, end of stdin)
//! keep_paused_for = "7d"                      # a paused session's lifetime
//! max_paused_per_client = 16
//! max_paused_bytes_per_client = "4G"
//! ```
//!
//! Without `snapshot_key` nothing is written to disk: sessions end with the process (and
//! `pause_session` says why it cannot). The key is read from the environment only: a key
//! in a config file ends up in backups and repositories.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::keys::SnapshotKey;
use super::store::Bounds;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("sessions.{key}: {why}")]
    Invalid { key: &'static str, why: String },
}

/// What becomes of a session when it is idle past `session_ttl`, or when the server
/// stops.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum OnIdle {
    /// Saved to `dir` and freed; its next call resumes it.
    Pause,
    /// Ended: its interpreters and workspace are gone.
    Close,
}

impl std::str::FromStr for OnIdle {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "pause" => Ok(OnIdle::Pause),
            "close" => Ok(OnIdle::Close),
            other => Err(format!("{other:?} is neither \"pause\" nor \"close\"")),
        }
    }
}

/// The section as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionsSection {
    /// `env:VAR`: the environment variable holding the snapshot key (32 bytes as 64 hex
    /// digits or base64). Without it nothing is written to disk: sessions end with the
    /// process and `pause_session` says why it cannot pause. A key written in the file
    /// itself is refused (it would end up in backups and repositories).
    pub snapshot_key: Option<String>,
    /// Where paused sessions are kept, encrypted (default `<state_dir>/sessions`). Servers
    /// and replicas sharing it and the key resume each other's paused sessions.
    pub dir: Option<PathBuf>,
    /// What becomes of a session idle past `session_ttl`: `"pause"` (saved to `dir`, freed;
    /// its next call resumes it; the default with a key) or `"close"` (ended).
    pub on_idle: Option<OnIdle>,
    /// What becomes of the open sessions when the server stops (SIGTERM, SIGINT, end of
    /// stdin): `"pause"` (the default with a key) or `"close"`.
    pub on_stop: Option<OnIdle>,
    /// How long a paused session is kept before it is removed, as `12h` or `7d` (default
    /// 7d; at most 365d).
    pub keep_paused_for: Option<String>,
    /// Paused sessions one client holds; a further pause is refused (default 16).
    pub max_paused_per_client: Option<usize>,
    /// Bytes of snapshots one client holds, as `4G` (default 4G; at least 1M); a pause
    /// that would pass it is refused and the session stays live.
    pub max_paused_bytes_per_client: Option<String>,
}

/// What the section sets, once checked (only when a key is given).
#[derive(Clone)]
pub struct PersistSettings {
    pub key: Arc<SnapshotKey>,
    pub dir: PathBuf,
    pub on_idle: OnIdle,
    pub on_stop: OnIdle,
    pub bounds: Bounds,
}

impl std::fmt::Debug for PersistSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PersistSettings")
            .field("key", &self.key)
            .field("dir", &self.dir)
            .field("on_idle", &self.on_idle)
            .field("on_stop", &self.on_stop)
            .field("bounds", &self.bounds)
            .finish()
    }
}

/// The longest `keep_paused_for`.
const MAX_KEEP: Duration = Duration::from_secs(365 * 24 * 3600);

/// A duration that may be given in days (`7d`), else as [`crate::units::parse_duration`].
fn parse_long_duration(v: &str) -> Result<Duration, String> {
    let t = v.trim();
    if let Some(days) = t.strip_suffix('d') {
        let n: u64 = days
            .trim()
            .parse()
            .map_err(|_| format!("{t:?} is not a duration such as 12h or 7d"))?;
        if n == 0 {
            return Err(format!("{t:?} must be more than 0"));
        }
        return Ok(Duration::from_secs(n.saturating_mul(24 * 3600)));
    }
    crate::units::parse_duration(t)
}

impl SessionsSection {
    /// `CODEBOX_SESSIONS_<KEY>` overrides.
    pub fn apply_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), Error> {
        if let Some(v) = env("CODEBOX_SESSIONS_SNAPSHOT_KEY") {
            self.snapshot_key = Some(v);
        }
        if let Some(v) = env("CODEBOX_SESSIONS_DIR") {
            self.dir = Some(v.into());
        }
        for (var, key, slot) in [
            ("CODEBOX_SESSIONS_ON_IDLE", "on_idle", &mut self.on_idle),
            ("CODEBOX_SESSIONS_ON_STOP", "on_stop", &mut self.on_stop),
        ] {
            if let Some(v) = env(var) {
                *slot = Some(v.parse().map_err(|why| Error::Invalid { key, why })?);
            }
        }
        if let Some(v) = env("CODEBOX_SESSIONS_KEEP_PAUSED_FOR") {
            self.keep_paused_for = Some(v);
        }
        Ok(())
    }

    /// The settings, `None` when no key is given (sessions end with the process);
    /// `state_dir` is the default's parent.
    pub fn settings(
        &self,
        state_dir: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<PersistSettings>, Error> {
        let invalid = |key, why: String| Error::Invalid { key, why };
        let Some(named) = &self.snapshot_key else {
            for (key, v) in [("on_idle", self.on_idle), ("on_stop", self.on_stop)] {
                if v == Some(OnIdle::Pause) {
                    return Err(invalid(
                        key,
                        "\"pause\" keeps sessions on disk, encrypted: set sessions.snapshot_key = \"env:VAR\" too".into(),
                    ));
                }
            }
            return Ok(None);
        };
        let Some(var) = named.strip_prefix("env:").filter(|v| !v.is_empty()) else {
            return Err(invalid(
                "snapshot_key",
                "name the environment variable holding the key, as \"env:CODEBOX_SNAPSHOT_KEY\" (a key written in a config file ends up in backups and repositories)".into(),
            ));
        };
        crate::config::note_secret_var(var);
        let text = env(var).ok_or_else(|| {
            invalid(
                "snapshot_key",
                format!("environment variable {var} (named by env:{var}) is not set"),
            )
        })?;
        let key = SnapshotKey::parse(&text)
            .map_err(|e| invalid("snapshot_key", format!("{var}: {e}")))?;
        let dir = match (&self.dir, state_dir) {
            (Some(d), _) => d.clone(),
            (None, Some(s)) => s.join("sessions"),
            (None, None) => {
                return Err(invalid(
                    "dir",
                    "no state_dir to put paused sessions under: set sessions.dir".into(),
                ))
            }
        };
        let mut bounds = Bounds {
            max_per_client: 16,
            max_bytes_per_client: 4 << 30,
            keep_for: Duration::from_secs(7 * 24 * 3600),
        };
        if let Some(v) = &self.keep_paused_for {
            let d = parse_long_duration(v).map_err(|why| invalid("keep_paused_for", why))?;
            if d > MAX_KEEP {
                return Err(invalid(
                    "keep_paused_for",
                    format!("{v} is more than 365 days"),
                ));
            }
            bounds.keep_for = d;
        }
        if let Some(n) = self.max_paused_per_client {
            if n == 0 || n > 100_000 {
                return Err(invalid(
                    "max_paused_per_client",
                    format!("{n} is not between 1 and 100000"),
                ));
            }
            bounds.max_per_client = n;
        }
        if let Some(v) = &self.max_paused_bytes_per_client {
            let b = crate::units::parse_size(v)
                .map_err(|why| invalid("max_paused_bytes_per_client", why))?;
            if b < 1 << 20 {
                return Err(invalid(
                    "max_paused_bytes_per_client",
                    format!("{v} is less than 1M"),
                ));
            }
            bounds.max_bytes_per_client = b;
        }
        Ok(Some(PersistSettings {
            key: Arc::new(key),
            dir,
            on_idle: self.on_idle.unwrap_or(OnIdle::Pause),
            on_stop: self.on_stop.unwrap_or(OnIdle::Pause),
            bounds,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn without_a_key_nothing_is_kept_and_pause_is_refused() {
        let s = SessionsSection::default();
        assert!(s
            .settings(Some(Path::new("/s")), &env(&[]))
            .unwrap()
            .is_none());
        let s = SessionsSection {
            on_idle: Some(OnIdle::Pause),
            ..Default::default()
        };
        let e = s
            .settings(Some(Path::new("/s")), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sessions.on_idle") && e.contains("snapshot_key"),
            "{e}"
        );
    }

    #[test]
    fn a_key_comes_from_the_environment_only_and_the_rest_has_defaults() {
        let s = SessionsSection {
            snapshot_key: Some("env:K".into()),
            ..Default::default()
        };
        let p = s
            .settings(Some(Path::new("/state")), &env(&[("K", KEY)]))
            .unwrap()
            .unwrap();
        assert_eq!(p.dir, Path::new("/state/sessions"));
        assert_eq!((p.on_idle, p.on_stop), (OnIdle::Pause, OnIdle::Pause));
        assert_eq!(p.bounds.keep_for, Duration::from_secs(7 * 86400));
        let e = s.settings(None, &env(&[])).unwrap_err().to_string();
        assert!(e.contains("K") && e.contains("not set"), "{e}");
        let literal = SessionsSection {
            snapshot_key: Some(KEY.into()),
            ..Default::default()
        };
        let e = literal.settings(None, &env(&[])).unwrap_err().to_string();
        assert!(e.contains("env:") && !e.contains(KEY), "{e}");
        let e = s
            .settings(Some(Path::new("/s")), &env(&[("K", "too short")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("snapshot key") && !e.contains("too short"),
            "{e}"
        );
    }

    #[test]
    fn bounds_are_checked() {
        let base = SessionsSection {
            snapshot_key: Some("env:K".into()),
            ..Default::default()
        };
        let k = env(&[("K", KEY)]);
        let with = |f: &dyn Fn(&mut SessionsSection)| {
            let mut s = base.clone();
            f(&mut s);
            s.settings(Some(Path::new("/s")), &k)
        };
        let p = with(&|s| {
            s.keep_paused_for = Some("30d".into());
            s.max_paused_per_client = Some(3);
            s.max_paused_bytes_per_client = Some("1G".into());
            s.on_idle = Some(OnIdle::Close);
        })
        .unwrap()
        .unwrap();
        assert_eq!(p.bounds.keep_for, Duration::from_secs(30 * 86400));
        assert_eq!(
            (p.bounds.max_per_client, p.bounds.max_bytes_per_client),
            (3, 1 << 30)
        );
        assert_eq!(p.on_idle, OnIdle::Close);
        assert_eq!(
            with(&|s| s.keep_paused_for = Some("2h".into()))
                .unwrap()
                .unwrap()
                .bounds
                .keep_for,
            Duration::from_secs(7200)
        );
        for (f, key) in [
            (
                &(|s: &mut SessionsSection| s.keep_paused_for = Some("400d".into()))
                    as &dyn Fn(&mut SessionsSection),
                "keep_paused_for",
            ),
            (
                &|s: &mut SessionsSection| s.keep_paused_for = Some("0d".into()),
                "keep_paused_for",
            ),
            (
                &|s: &mut SessionsSection| s.max_paused_per_client = Some(0),
                "max_paused_per_client",
            ),
            (
                &|s: &mut SessionsSection| s.max_paused_bytes_per_client = Some("10K".into()),
                "max_paused_bytes_per_client",
            ),
        ] {
            let e = with(f).unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
        }
        let mut s = base.clone();
        let e = s
            .apply_env(&env(&[("CODEBOX_SESSIONS_ON_IDLE", "sleep")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("on_idle"), "{e}");
    }
}
