//! The refill task: keeps each language's shelf at its target, off the request path.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio::task::JoinSet;

use super::{holder, Inner, Slot, Template, Warm, READY_TIMEOUT};
use crate::runtime::Language;
use crate::spawner::RemoteSandbox;

/// The longest pause after failed spawns before the refill tries again.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Per language, starts sandboxes while ready + starting are below the target (several
/// at once when several are missing, up to `max_starting`) and kills idle ones above it; looks again when woken,
/// when a start ends, and when a held target may fall. Returns at shutdown, after killing
/// what it was still starting.
pub(super) async fn run(pool: Arc<Inner>) {
    let mut starting: JoinSet<()> = JoinSet::new();
    let mut backoff = Duration::ZERO;
    loop {
        // Registered before the state is read, so a wake-up in between is not lost.
        let woken = pool.wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let now = Instant::now();
        let (jobs, next_change) = {
            let mut st = pool.lock();
            if st.closed {
                break;
            }
            let mut jobs = Vec::new();
            let mut excess = Vec::new();
            let mut next_change: Option<Instant> = None;
            let languages: Vec<Language> = st.templates.keys().copied().collect();
            for language in languages {
                let template = st.templates[&language].clone();
                let shelf = st.shelves.entry(language).or_default();
                let generation = shelf.generation;
                let target = shelf.demand.target(now, &pool.bounds);
                while shelf.idle.len() + shelf.starting < target
                    && shelf.starting < pool.max_starting
                {
                    shelf.starting += 1;
                    jobs.push((language, template.clone(), generation));
                }
                // Shrinking: the newest idle ones go (the oldest are handed out first);
                // one still starting is dropped when it is ready (see `start_one`).
                while shelf.idle.len() > target {
                    let Some(slot) = shelf.idle.pop_back() else {
                        break;
                    };
                    shelf.counters.shrunk.fetch_add(1, Ordering::Relaxed);
                    excess.push(slot);
                }
                if let Some(at) = shelf.demand.next_change(&pool.bounds) {
                    next_change = Some(next_change.map_or(at, |n| n.min(at)));
                }
            }
            if !excess.is_empty() {
                tracing::debug!(killed = excess.len(), "the pool shrinks");
                // Dropping a slot's `take` makes its holder kill the sandbox; the holder
                // is awaited at shutdown like a retired one (under this same lock, so a
                // shutdown cannot miss it).
                st.retiring.retain(|h| !h.is_finished());
                st.retiring.extend(excess.into_iter().map(|s| s.holder));
            }
            (jobs, next_change)
        };
        for (language, template, generation) in jobs {
            starting.spawn(start_one(pool.clone(), language, template, generation));
        }
        // A held target falls without an arrival: look again then (at the latest).
        let shrink = async {
            match next_change {
                Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut woken => {}
            Some(_) = starting.join_next(), if !starting.is_empty() => {}
            _ = shrink => {}
        }
        // After failures, pause before trying again (a broken host must not spin).
        let failures = failures(&pool);
        if failures > 0 {
            backoff = (backoff * 2).clamp(Duration::from_millis(100), MAX_BACKOFF);
            tokio::time::sleep(backoff).await;
        } else {
            backoff = Duration::ZERO;
        }
    }
    // Shutdown: what is still starting is killed and reaped by its own task.
    while starting.join_next().await.is_some() {}
}

/// Spawn failures since the last call (reset on read).
fn failures(pool: &Inner) -> u64 {
    pool.failed_since_wake.swap(0, Ordering::Relaxed)
}

/// Starts one sandbox from `template`, waits for its runtime to be ready, and shelves it
/// if the pool still wants it (open, same template); otherwise kills it.
async fn start_one(pool: Arc<Inner>, language: Language, template: Template, generation: u64) {
    let started = std::time::Instant::now();
    let mut own = None;
    let made = async {
        let mut spec = template.spec.clone();
        spec.pooled = true;
        if let Some(per_sandbox) = template.per_sandbox.clone() {
            let (prepared, made) = tokio::task::spawn_blocking(move || {
                let made = per_sandbox.prepare(&mut spec);
                (spec, made)
            })
            .await
            .map_err(|_| crate::spawner::Error::Protocol("preparing a pooled sandbox panicked"))?;
            spec = prepared;
            own = Some(made.map_err(|why| {
                tracing::error!(%language, %why, "preparing a pooled sandbox failed");
                crate::spawner::Error::Protocol("preparing a pooled sandbox failed")
            })?);
        }
        let mut sandbox = pool.spawner.spawn(spec).await?;
        match tokio::time::timeout(READY_TIMEOUT, sandbox.wait_ready()).await {
            Ok(Ok(())) => Ok(sandbox),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(crate::spawner::Error::Protocol(
                "the runtime did not announce it was ready in time",
            )),
        }
    }
    .await;
    let took = started.elapsed();
    // Decided under the lock, acted on after it (a kill waits).
    let unwanted = {
        let mut st = pool.lock();
        let closed = st.closed;
        let shelf = st.shelves.entry(language).or_default();
        shelf.starting -= 1;
        if made.is_ok() {
            shelf.demand.became_ready(took);
        }
        let sandbox: RemoteSandbox = match made {
            Ok(sandbox) => sandbox,
            Err(e) => {
                shelf
                    .counters
                    .spawn_failures
                    .fetch_add(1, Ordering::Relaxed);
                pool.failed_since_wake.fetch_add(1, Ordering::Relaxed);
                if closed || matches!(e, crate::spawner::Error::Lost) {
                    // Shutting down (the spawner may already be going), or the spawner
                    // died: its replacement logs that once.
                    tracing::debug!(%language, error = %e, "a pooled sandbox was not started");
                } else {
                    tracing::error!(%language, error = %e, "starting a pooled sandbox failed");
                }
                return;
            }
        };
        // The target may have fallen while it started: then it is not kept.
        let target = shelf.demand.target(Instant::now(), &pool.bounds);
        let current = !closed && shelf.generation == generation;
        let surplus = current && shelf.idle.len() + shelf.starting >= target;
        if surplus {
            shelf.counters.shrunk.fetch_add(1, Ordering::Relaxed);
        }
        if !current || surplus {
            Some(sandbox)
        } else {
            let id = sandbox.id();
            let cgroups = sandbox.cgroup_paths().to_vec();
            let (take, asked) = oneshot::channel();
            let warm = Warm {
                sandbox,
                hold: template.hold,
                own,
                refill: None,
            };
            let holder = tokio::spawn(holder::hold(
                Arc::downgrade(&pool),
                language,
                id,
                warm,
                asked,
            ));
            shelf.idle.push_back(Slot {
                id,
                generation,
                take,
                cgroups,
                holder,
            });
            tracing::debug!(%language, sandbox = id, ready_us = took.as_micros() as u64, "pooled sandbox ready");
            None
        }
    };
    if let Some(sandbox) = unwanted {
        sandbox.kill_and_wait().await;
    }
}
