//! Following the sandbox checks: a finished checker's report becomes the verdict on the
//! host ([`Layers::add`]); a checker that did not finish is retried, and says nothing
//! about the host.
//!
//! A checker "did not finish" when it ended without a complete report (killed by a
//! signal, crashed, or its report is garbled) or took longer than
//! [`deferred::REPORT_BOUND`] (it is killed then). Each such end is one WARN line and is
//! counted in `health.sandbox_checker`; the next checker starts after a back-off that
//! doubles from half a second ([`retry_after`]). After [`QUICK_ATTEMPTS`] unfinished
//! checkers in a row — something keeps killing them — one ERROR line says so and the
//! checks are retried every [`SLOW_RETRY`] for as long as the server runs, so a passing
//! condition heals itself and a lasting one costs a sandbox run every few minutes.
//!
//! Executions are never held for the checks, as while the first checker runs: every
//! sandbox enforces its layers when it is made, and a layer that fails makes that
//! sandbox's spawn fail with its own error. Only a finished checker's verdict that a
//! required layer is missing refuses executions (with the doctor's words). Until a
//! checker finishes, `health.ready.sandbox_checks` says `unfinished` with the reason and
//! what happens next, and the server is not ready (`/readyz`).
//!
//! Checkers are forked by the spawner factory ([`CheckerSource`] for [`Factory`]); when
//! the factory is gone no checker can be started any more, which is reported the same
//! way, with what to do.

use std::sync::Arc;
use std::time::Duration;

use nix::unistd::Pid;

use super::readiness::Layers;
use crate::doctor::deferred::{self, PendingChecks, Report};
use crate::spawner::factory::Factory;

/// Unfinished checkers in a row retried with a short back-off.
pub const QUICK_ATTEMPTS: u32 = 5;
/// The back-off after that.
pub const SLOW_RETRY: Duration = Duration::from_secs(300);

/// How long to wait before the next checker, after `unfinished` unfinished ones in a row
/// (at least 1): 0.5 s doubling while below [`QUICK_ATTEMPTS`], then [`SLOW_RETRY`].
pub fn retry_after(unfinished: u32) -> Duration {
    if unfinished < QUICK_ATTEMPTS {
        Duration::from_millis(500 << unfinished.saturating_sub(1).min(16))
    } else {
        SLOW_RETRY
    }
}

/// Where checkers come from. Both calls block: they run on the blocking pool.
pub trait CheckerSource: Send + Sync + 'static {
    /// Starts a checker.
    fn start(&self) -> Result<PendingChecks, String>;
    /// Reaps checker `pid` (killing it first when `kill`); how it ended, in words.
    fn reap(&self, pid: Pid, kill: bool) -> String;
    /// Why no checker can be started any more, if so.
    fn gone(&self) -> Option<String>;
}

impl CheckerSource for Factory {
    fn start(&self) -> Result<PendingChecks, String> {
        self.start_checks()
            .map_err(|e| crate::error_chain::error_chain(&e))
    }

    fn reap(&self, pid: Pid, kill: bool) -> String {
        match self.reap_checker(pid, kill) {
            Ok(how) => how,
            Err(crate::spawner::Error::Gone) => {
                "ended (the spawner factory that forked it is gone)".into()
            }
            Err(e) => format!(
                "ended (not reaped: {})",
                crate::error_chain::error_chain(&e)
            ),
        }
    }

    fn gone(&self) -> Option<String> {
        self.died()
            .map(|d| format!("the spawner factory that forks them died ({})", d.how))
    }
}

/// Follows `first` (a checker started before the runtime existed) and its successors
/// until one finishes; the verdict goes to `layers`.
pub fn follow(
    layers: Arc<Layers>,
    first: PendingChecks,
    source: Arc<dyn CheckerSource>,
    profile: String,
) {
    tokio::spawn(run(layers, first, source, profile, deferred::REPORT_BOUND));
}

async fn run(
    layers: Arc<Layers>,
    first: PendingChecks,
    source: Arc<dyn CheckerSource>,
    profile: String,
    bound: Duration,
) {
    let blocking = |f: Box<dyn FnOnce() -> Outcome + Send>| async move {
        tokio::task::spawn_blocking(f)
            .await
            .unwrap_or_else(|e| Outcome::Unfinished(format!("following it failed: {e}")))
    };
    let mut next = Some(first);
    let mut unfinished = 0u32;
    loop {
        let checker = match next.take() {
            Some(c) => Ok(c),
            None => {
                let source = source.clone();
                tokio::task::spawn_blocking(move || source.start())
                    .await
                    .unwrap_or_else(|e| Err(e.to_string()))
            }
        };
        let outcome = match checker {
            Ok(checker) => {
                let pid = checker.pid();
                layers.checker_started(pid.as_raw());
                // Weak: a server shutting down drops the factory's last handle, which
                // makes the factory end the checker, which ends this read.
                let source = Arc::downgrade(&source);
                blocking(Box::new(move || attempt(checker, &source, bound))).await
            }
            Err(why) => Outcome::Unfinished(format!("no checker could be started: {why}")),
        };
        match outcome {
            Outcome::Checks(checks) => {
                layers.add(checks, &profile);
                return;
            }
            Outcome::Unfinished(reason) => {
                unfinished += 1;
                let delay = retry_after(unfinished);
                let gone = source.gone();
                let stop = gone.is_some();
                layers.checker_unfinished(reason, delay, unfinished == QUICK_ATTEMPTS, gone);
                if stop {
                    return;
                }
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// What one checker gave.
enum Outcome {
    Checks(Vec<crate::doctor::Check>),
    Unfinished(String),
}

/// Reads one checker's report and has it reaped; blocking.
fn attempt(
    checker: PendingChecks,
    source: &std::sync::Weak<dyn CheckerSource>,
    bound: Duration,
) -> Outcome {
    let pid = checker.pid();
    let report = checker.read(bound);
    let Some(source) = source.upgrade() else {
        return Outcome::Unfinished("the server is stopping".into());
    };
    match report {
        Report::Checks(checks) => {
            let how = source.reap(pid, false);
            tracing::debug!(checker = pid.as_raw(), how, "the sandbox checker finished");
            Outcome::Checks(checks)
        }
        Report::Unfinished(why) => {
            let how = source.reap(pid, false);
            Outcome::Unfinished(format!("the checker {how} before it finished: {why}"))
        }
        Report::TimedOut => {
            let how = source.reap(pid, true);
            Outcome::Unfinished(format!(
                "the checker did not finish within {} s and was ended ({how})",
                bound.as_secs()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::{Check, Status};
    use std::io::Write;
    use std::sync::Mutex;

    #[test]
    fn the_back_off_doubles_then_slows_down() {
        let delays: Vec<u64> = (1..=7).map(|n| retry_after(n).as_millis() as u64).collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 300_000, 300_000, 300_000]);
    }

    /// A scripted source: each start hands out a pipe with the next script's bytes
    /// (`None`: never closes, so the read times out); reaps answer as scripted.
    struct Script {
        reports: Mutex<Vec<Option<Vec<u8>>>>,
        /// Write ends kept open for the reports that never close.
        open: Mutex<Vec<std::os::fd::OwnedFd>>,
        reaps: Mutex<Vec<(i32, bool)>>,
        started: Mutex<i32>,
        gone_after: Option<i32>,
    }

    impl Script {
        fn new(reports: Vec<Option<&[u8]>>, gone_after: Option<i32>) -> Arc<Script> {
            Arc::new(Script {
                reports: Mutex::new(
                    reports
                        .into_iter()
                        .rev()
                        .map(|r| r.map(<[u8]>::to_vec))
                        .collect(),
                ),
                open: Mutex::new(Vec::new()),
                reaps: Mutex::new(Vec::new()),
                started: Mutex::new(0),
                gone_after,
            })
        }

        fn pending(&self) -> PendingChecks {
            let report = self
                .reports
                .lock()
                .unwrap()
                .pop()
                .expect("a script per attempt");
            let mut n = self.started.lock().unwrap();
            *n += 1;
            let (read, write) = nix::unistd::pipe().unwrap();
            match report {
                Some(bytes) => std::fs::File::from(write).write_all(&bytes).unwrap(),
                None => self.open.lock().unwrap().push(write),
            }
            PendingChecks::new(Pid::from_raw(1000 + *n), read)
        }
    }

    impl CheckerSource for Script {
        fn start(&self) -> Result<PendingChecks, String> {
            Ok(self.pending())
        }
        fn reap(&self, pid: Pid, kill: bool) -> String {
            self.reaps.lock().unwrap().push((pid.as_raw(), kill));
            "was killed by SIGKILL".into()
        }
        fn gone(&self) -> Option<String> {
            let started = *self.started.lock().unwrap();
            self.gone_after
                .filter(|&n| started >= n)
                .map(|_| "the factory died".into())
        }
    }

    fn passing() -> Vec<u8> {
        serde_json::to_vec(&vec![Check::new(
            "python in sandbox",
            Status::Ok,
            "Python 3",
            true,
        )])
        .unwrap()
    }

    fn missing() -> Vec<u8> {
        serde_json::to_vec(&vec![Check::new(
            "python in sandbox",
            Status::Missing,
            "no",
            true,
        )])
        .unwrap()
    }

    async fn follow_script(script: Arc<Script>) -> Arc<Layers> {
        let layers = Arc::new(Layers::new(vec![], true));
        let first = script.pending();
        run(
            layers.clone(),
            first,
            script,
            "default".into(),
            Duration::from_millis(300),
        )
        .await;
        layers
    }

    /// Killed, garbled and timed-out checkers are retried and refuse nothing; the first
    /// finished one decides.
    #[tokio::test(start_paused = true)]
    async fn unfinished_checkers_are_retried_until_one_finishes() {
        let pass = passing();
        let half = &pass[..pass.len() / 2];
        let script = Script::new(vec![Some(b""), Some(half), None, Some(&pass)], None);
        let layers = follow_script(script.clone()).await;
        assert_eq!(layers.refusal(), None);
        let status = layers.checker_status();
        assert_eq!((status.attempts, status.unfinished), (4, 3), "{status:?}");
        assert!(
            !status.running && status.next_attempt_unix.is_none(),
            "{status:?}"
        );
        assert!(
            status
                .last_reason
                .as_deref()
                .is_some_and(|r| r.contains("did not finish within")),
            "{status:?}"
        );
        // Each was reaped; the one that hung was killed.
        let reaps = script.reaps.lock().unwrap().clone();
        assert_eq!(
            reaps,
            [(1001, false), (1002, false), (1003, true), (1004, false)]
        );
        let (ready, v) =
            super::super::readiness::value(&layers, None, &crate::upstream::Upstreams::empty());
        assert!(ready, "{v}");
    }

    /// While no checker finished, the state says why and what comes next, and nothing is
    /// refused; a finished checker's missing layer does refuse.
    #[tokio::test(start_paused = true)]
    async fn only_a_finished_checker_can_refuse() {
        let layers = Arc::new(Layers::new(vec![], true));
        let script = Script::new(vec![Some(b"[{\"lay"), Some(&missing())], None);
        let first = script.pending();
        let task = tokio::spawn(run(
            layers.clone(),
            first,
            script.clone(),
            "default".into(),
            Duration::from_secs(60),
        ));
        // Until the retry (0.5 s of paused time) the state is unfinished.
        tokio::time::sleep(Duration::from_millis(100)).await;
        for _ in 0..100 {
            if layers.checker_status().unfinished == 1 {
                break;
            }
            tokio::task::yield_now().await;
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(layers.refusal(), None);
        let (ready, v) =
            super::super::readiness::value(&layers, None, &crate::upstream::Upstreams::empty());
        assert!(!ready, "{v}");
        let text = v["sandbox_checks"]["unfinished"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            text.contains("was killed by SIGKILL before it finished")
                && text.contains("next attempt in")
                && text.contains("not refused"),
            "{v}"
        );
        task.await.unwrap();
        let why = layers
            .refusal()
            .expect("a finished checker's verdict refuses");
        assert!(why.contains("python in sandbox"), "{why}");
    }

    /// Killed again and again: quick attempts, then the slow back-off, still retrying.
    #[tokio::test(start_paused = true)]
    async fn a_checker_killed_again_and_again_slows_down_and_keeps_trying() {
        let mut script: Vec<Option<&[u8]>> = vec![Some(b""); 7];
        let pass = passing();
        script.push(Some(&pass));
        let started = tokio::time::Instant::now();
        let layers = follow_script(Script::new(script, None)).await;
        let status = layers.checker_status();
        assert_eq!((status.attempts, status.unfinished), (8, 7), "{status:?}");
        assert_eq!(layers.refusal(), None);
        // 0.5 + 1 + 2 + 4, then 300 s three times.
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(7_500) + 3 * SLOW_RETRY,
            "{waited:?}"
        );
        assert!(
            waited < Duration::from_millis(7_500) + 4 * SLOW_RETRY,
            "{waited:?}"
        );
    }

    /// Without a factory no checker can be started: reported, not refused, not retried.
    #[tokio::test(start_paused = true)]
    async fn a_source_that_is_gone_is_reported() {
        let layers = follow_script(Script::new(vec![Some(b"")], Some(1))).await;
        let status = layers.checker_status();
        assert_eq!(status.cannot_retry.as_deref(), Some("the factory died"));
        assert_eq!(layers.refusal(), None);
        let (_, v) =
            super::super::readiness::value(&layers, None, &crate::upstream::Upstreams::empty());
        let text = v["sandbox_checks"]["unfinished"]
            .as_str()
            .unwrap_or_default();
        assert!(
            text.contains("cannot be re-run") && text.contains("restart codebox"),
            "{v}"
        );
    }
}
