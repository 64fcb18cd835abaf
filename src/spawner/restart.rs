//! Replacing a dead spawner: the task that waits for the current spawner's end, has the
//! [`Factory`] reap it, clean up after it and fork a new one, installs that one in the
//! client, and records the event for `health`. Gives up (exit status 70) when no
//! replacement can be made or the spawner keeps dying.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use nix::unistd::Pid;
use serde::Serialize;

use super::client::{Inner, Shared};
use super::factory::Factory;
use super::Error;

/// What `health` says about the spawner.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SpawnerStatus {
    /// The current spawner's pid, when known.
    pub pid: Option<i32>,
    /// Whether it is being replaced right now.
    pub replacing: bool,
    /// How many times a dead spawner was replaced.
    pub restarts: u64,
    /// When the last one was replaced (seconds since the Unix epoch).
    pub last_restart_unix: Option<u64>,
    /// Why: how the dead spawner ended.
    pub last_reason: Option<String>,
    /// The factory that forks spawners and sandbox checkers (`None` without one).
    pub factory: Option<super::factory::FactoryStatus>,
    /// The current spawner's Python zygotes.
    pub zygotes: ZygoteStatus,
}

/// What `health` says about the zygotes (`spawner.zygotes`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ZygoteStatus {
    /// Init pids of the current spawner's zygotes.
    pub live: Vec<i32>,
    /// Zygotes launched (by every spawner of this server).
    pub launched: u64,
    /// Zygotes that died on their own (killed, crashed, never got ready); each kind
    /// starts cold for a minute after, then gets a new one.
    pub died: u64,
    /// How the last one that died ended.
    pub last_death_reason: Option<String>,
    /// When (seconds since the Unix epoch).
    pub last_death_unix: Option<u64>,
}

impl ZygoteStatus {
    /// Counts one event from the spawner.
    pub(super) fn record(&mut self, event: super::wire::ZygoteEvent) {
        use super::wire::ZygoteEvent;
        match event {
            ZygoteEvent::Launched { pid } => {
                self.launched += 1;
                self.live.push(pid);
            }
            ZygoteEvent::Ended {
                pid,
                unexpected,
                how,
            } => {
                self.live.retain(|p| *p != pid);
                if unexpected {
                    self.died += 1;
                    self.last_death_reason = Some(how);
                    self.last_death_unix = unix_now();
                }
            }
        }
    }
}

fn unix_now() -> Option<u64> {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

/// How long a spawn waits for a dead spawner's replacement.
pub(super) const REPLACEMENT_WAIT: Duration = Duration::from_secs(15);
/// Attempts at forking a replacement before the supervisor gives up and exits.
const REPLACEMENT_ATTEMPTS: u32 = 3;
/// More replacements than this within [`RESTART_WINDOW`] is a crash loop: exit instead.
const MAX_RESTARTS_IN_WINDOW: usize = 5;
const RESTART_WINDOW: Duration = Duration::from_secs(60);

/// Waits for the current spawner's end and has the factory replace it, again and again.
pub(super) async fn replace_when_dead(shared: Weak<Shared>, factory: Arc<Factory>) {
    let mut recent: std::collections::VecDeque<Instant> = Default::default();
    loop {
        let Some(inner) = shared
            .upgrade()
            .map(|s| s.current.read().expect("lock").clone())
        else {
            return;
        };
        inner.gone.notified().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        if let Some(died) = factory.died() {
            give_up(&format!(
                "the spawner factory, which forks spawners, died earlier ({})",
                died.how
            ));
        }
        {
            let mut st = shared.status.lock().expect("status lock");
            st.replacing = true;
            // Its zygotes died with it.
            st.zygotes.live.clear();
        }
        recent.retain(|t| t.elapsed() < RESTART_WINDOW);
        if recent.len() >= MAX_RESTARTS_IN_WINDOW {
            give_up(&format!(
                "it died {} times within {}s",
                recent.len() + 1,
                RESTART_WINDOW.as_secs()
            ));
        }
        recent.push_back(Instant::now());
        let mut dead = inner.pid;
        let mut attempt = 0;
        let forked = loop {
            attempt += 1;
            let f = factory.clone();
            let r = tokio::task::spawn_blocking(move || f.fork_spawner(dead))
                .await
                .unwrap_or_else(|_| Err(Error::Protocol("the factory request panicked")));
            match r {
                Ok(forked) => break Ok(forked),
                Err(e) if attempt < REPLACEMENT_ATTEMPTS => {
                    tracing::warn!(error = %e, attempt, "forking a new spawner failed; retrying");
                    // The dead one is reaped by the first request that reached the factory.
                    dead = None;
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                }
                Err(e) => break Err(e),
            }
        };
        let installed = forked.and_then(|f| {
            let new = Inner::new(
                f.sock,
                Some(f.pid),
                shared.stopping.clone(),
                shared.status.clone(),
            )?;
            Ok((f.pid, f.dead, f.cleaned, new))
        });
        match installed {
            Ok((pid, reason, cleaned, new)) => {
                *shared.current.write().expect("spawner lock") = new;
                let restarts = {
                    let mut st = shared.status.lock().expect("status lock");
                    st.pid = Some(pid.as_raw());
                    st.replacing = false;
                    st.restarts += 1;
                    st.last_restart_unix = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .ok()
                        .map(|d| d.as_secs());
                    st.last_reason = reason.clone().or(Some("its socket closed".into()));
                    st.restarts
                };
                shared.replaced.send_modify(|n| *n += 1);
                tracing::warn!(
                    dead = inner.pid.map(Pid::as_raw),
                    reason = reason.as_deref().unwrap_or("its socket closed"),
                    new = pid.as_raw(),
                    cgroups_removed = cleaned,
                    restarts,
                    "the spawner process died; its sandboxes were killed and a new spawner started"
                );
            }
            Err(e) => match factory.died() {
                Some(died) => give_up(&format!(
                    "the spawner factory, which forks spawners, died ({})",
                    died.how
                )),
                None => give_up(&e.to_string()),
            },
        }
    }
}

/// Ends the process: without a spawner no sandbox can be created, and a server that
/// looks alive but cannot run code is worse than one a service manager restarts. The
/// sandboxes are already dead (their lifeline); their empty cgroups go at the next start.
fn give_up(why: &str) -> ! {
    tracing::error!(
        why,
        "the spawner process died and cannot be replaced; exiting"
    );
    eprintln!("codebox: the spawner process died and cannot be replaced ({why}); exiting (restart codebox)");
    std::process::exit(70)
}
