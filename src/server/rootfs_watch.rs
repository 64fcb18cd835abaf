//! `codebox serve` re-checks its rootfs in the background: at start-up `serve` verifies
//! the tree as `run` does (O(1) for a sealed tree with a stamp, see `rootfs`), so
//! here, off the request path, every entry's metadata is compared with what was verified
//! (`rootfs::recheck`): [`FIRST`] after start-up (its CPU is not taken from the first
//! calls and the pool's fill), then every [`INTERVAL`], one check at a time on the
//! blocking pool. A moved fingerprint costs a full verification there; a
//! tree found changed (an entry that differs from the manifest, a file whose contents do,
//! another manifest) refuses every execution with the check's own words, says so in
//! `health.rootfs` and makes the server not ready, until a later check finds the tree
//! intact again (a new manifest stays refused: that is another tree, for a restart).
//!
//! For tests: `CODEBOX_TEST_ROOTFS_RECHECK_MS=N` checks every N ms (at least 10).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::rootfs::{self, Recheck, Rootfs};

/// When the first check runs (or after the interval, when that is shorter).
pub const FIRST: Duration = Duration::from_secs(5);
/// How often the tree is checked after the first check.
pub const INTERVAL: Duration = Duration::from_secs(600);
/// Overrides [`INTERVAL`] in milliseconds (tests).
pub const INTERVAL_VARIABLE: &str = "CODEBOX_TEST_ROOTFS_RECHECK_MS";

/// What the checks found so far (`health.rootfs`).
#[derive(Debug, Default)]
pub struct RootfsWatch {
    inner: Mutex<WatchState>,
}

#[derive(Debug, Default, Clone, serde::Serialize)]
struct WatchState {
    path: Option<PathBuf>,
    manifest_sha256: Option<String>,
    /// How `serve` verified it at start-up.
    verification: Option<String>,
    /// `true`, or why the tree is not sealed.
    sealed: Option<serde_json::Value>,
    /// Background checks done.
    checks: u64,
    /// Checks that found moved metadata and verified the tree in full again.
    reverified: u64,
    last_check_unix: Option<u64>,
    last_check_ms: Option<u64>,
    /// Why executions are refused: the tree changed.
    changed: Option<String>,
}

impl RootfsWatch {
    /// Why executions are refused, when the tree changed.
    pub fn refusal(&self) -> Option<String> {
        lock(&self.inner).changed.clone()
    }

    pub fn status(&self) -> serde_json::Value {
        let s = lock(&self.inner).clone();
        let mut v = serde_json::to_value(&s).unwrap_or_default();
        v["state"] = match (&s.changed, s.checks) {
            (Some(_), _) => "changed",
            (None, 0) => "verified at start-up",
            (None, _) => "intact",
        }
        .into();
        v
    }

    fn started(&self, r: &Rootfs) {
        let mut s = lock(&self.inner);
        s.path = Some(r.path.clone());
        s.manifest_sha256 = Some(r.manifest_sha256.clone());
        s.verification = Some(r.verification.to_string());
        s.sealed = Some(sealed_value(r));
    }

    fn checked(&self, r: &Rootfs, took: Duration, result: &rootfs::Result<Recheck>) {
        let mut s = lock(&self.inner);
        s.checks += 1;
        s.last_check_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs());
        s.last_check_ms = Some(took.as_millis() as u64);
        s.sealed = Some(sealed_value(r));
        match result {
            Ok(how) => {
                if *how == Recheck::Reverified {
                    s.reverified += 1;
                    tracing::info!(path = %r.path.display(), "the rootfs's metadata moved; a full verification found it intact");
                }
                if s.changed.take().is_some() {
                    tracing::info!(path = %r.path.display(), "the rootfs is intact again; executions run again");
                }
            }
            Err(e) => {
                let why = format!("the rootfs changed since codebox verified it: {e}");
                if s.changed.as_deref() != Some(&why) {
                    tracing::error!(path = %r.path.display(), error = %e, "the rootfs changed since it was verified; executions are refused");
                }
                s.changed = Some(why);
            }
        }
    }
}

fn sealed_value(r: &Rootfs) -> serde_json::Value {
    match &r.sealed {
        Ok(()) => serde_json::Value::Bool(true),
        Err(why) => serde_json::json!({ "not_sealed": why }),
    }
}

/// The interval: [`INTERVAL`], or the test variable's.
pub fn interval() -> Duration {
    std::env::var(INTERVAL_VARIABLE)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(|ms| Duration::from_millis(ms.max(10)))
        .unwrap_or(INTERVAL)
}

/// Starts the checks of `rootfs` (as `serve` verified it) into `watch`; a
/// re-verification leaves its stamp in `stamp_dir`. Ends with the runtime.
pub fn start(
    watch: Arc<RootfsWatch>,
    mut rootfs: Rootfs,
    mut stamp_dir: Option<PathBuf>,
    every: Duration,
) {
    watch.started(&rootfs);
    tokio::spawn(async move {
        tokio::time::sleep(FIRST.min(every)).await;
        loop {
            let started = Instant::now();
            // One check at a time: the next sleep starts when this one is done.
            let done = tokio::task::spawn_blocking(move || {
                let result = rootfs::recheck(&mut rootfs, stamp_dir.as_deref());
                (rootfs, stamp_dir, result)
            })
            .await;
            let Ok((r, dir, result)) = done else {
                tracing::error!("the rootfs check panicked; the rootfs is no longer re-checked");
                return;
            };
            watch.checked(&r, started.elapsed(), &result);
            (rootfs, stamp_dir) = (r, dir);
            tokio::time::sleep(every).await;
        }
    });
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Polls `watch` until `done` holds (at most ~20 s: a bound for a hung check, not a
    /// timing assertion).
    async fn until(watch: &RootfsWatch, what: &str, done: impl Fn(&serde_json::Value) -> bool) {
        for _ in 0..2000 {
            if done(&watch.status()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the rootfs watch never got to {what}: {}", watch.status());
    }

    fn rewrite(path: &std::path::Path, contents: &[u8]) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(path, contents).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o444)).unwrap();
    }

    #[tokio::test]
    async fn a_tree_changed_in_use_refuses_executions_until_it_is_intact_again() {
        let (t, stamps) = crate::rootfs::tests::stamped_sealed_tree();
        let r = rootfs::verify(t.path(), Some(stamps.path())).unwrap();
        assert_eq!(r.verification, rootfs::Verification::Sealed);
        let watch = Arc::new(RootfsWatch::default());
        start(
            watch.clone(),
            r,
            Some(stamps.path().to_path_buf()),
            Duration::from_millis(10),
        );
        until(&watch, "a first intact check", |s| {
            s["checks"].as_u64() >= Some(1)
        })
        .await;
        assert_eq!(watch.status()["state"], "intact");
        assert_eq!(watch.status()["sealed"], true);
        assert!(watch.refusal().is_none());

        // A file rewritten in place (what the per-run sealed check does not look at).
        let tool = t.path().join("usr/bin/tool");
        rewrite(&tool, b"HELLO");
        until(&watch, "changed", |s| s["state"] == "changed").await;
        let why = watch.refusal().unwrap();
        assert!(
            why.contains("the rootfs changed since codebox verified it")
                && why.contains("/usr/bin/tool")
                && why.contains("SHA-256 mismatch"),
            "{why}"
        );
        assert!(
            watch.status()["changed"]
                .as_str()
                .unwrap()
                .contains("/usr/bin/tool"),
            "health says what changed"
        );

        // The same contents back: intact again, by a full verification.
        rewrite(&tool, b"hello");
        until(&watch, "intact again", |s| s["state"] == "intact").await;
        assert!(watch.refusal().is_none());
        assert!(watch.status()["reverified"].as_u64() >= Some(1));
    }

    #[tokio::test]
    async fn another_manifest_stays_refused() {
        // A manifest that no longer lists /usr/lib/data: another tree, for a restart.
        let (t, stamps) = crate::rootfs::tests::stamped_sealed_tree();
        let r = rootfs::verify(t.path(), Some(stamps.path())).unwrap();
        let watch = Arc::new(RootfsWatch::default());
        start(watch.clone(), r, None, Duration::from_millis(10));
        let manifest = t.path().join(rootfs::manifest::FILE_NAME);
        let text = std::fs::read_to_string(&manifest).unwrap();
        rewrite(
            &manifest,
            text.lines()
                .filter(|l| !l.ends_with("/usr/lib/data"))
                .collect::<Vec<_>>()
                .join("\n")
                .as_bytes(),
        );
        until(&watch, "changed", |s| s["state"] == "changed").await;
        let why = watch.refusal().unwrap();
        assert!(why.contains("no longer the one verified"), "{why}");
    }
}
