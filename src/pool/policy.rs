//! How many sandboxes a language's pool keeps: a target between a floor and a ceiling,
//! from the arrivals it saw and the time a new sandbox took to become ready. Plain data
//! and arithmetic on instants the caller passes in, so every rule is unit-tested.
//!
//! - A call that takes a sandbox needs a replacement, which is ready only `ready` later
//!   (spawn to `codebox/ready`, measured per language: a Deno start, a Python start with
//!   its preload, or a fork of a pre-initialised interpreter — whatever the spawner does).
//!   Every call arriving meanwhile needs a sandbox that is ready already. So the pool keeps
//!   the calls that arrived within the last `ready` plus one: ready + starting then cover
//!   the calls that arrive while the replacements start ([`Demand::wanted`]).
//! - It grows at once: the target rises at the arrival that raises the demand.
//! - It shrinks slowly: a target is held until the demand has not reached it for
//!   `shrink_after`; then it falls to what the demand is now, and the refill kills the
//!   idle sandboxes above it. A client that works in bursts with pauses shorter than
//!   `shrink_after` finds the pool as its last burst left it.
//! - It is bounded: the target never leaves `floor..=ceiling`, whatever arrives. Arrivals
//!   are counted where a call takes a sandbox, after the server's admission and per-client
//!   rate limit, so a flood is counted only as far as the server runs it; the record of
//!   arrivals is bounded too ([`ARRIVALS_KEPT`]).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The largest ceiling accepted: more pooled sandboxes than that per language is more
/// processes (a Deno holds ~10 threads) than any admission limit can use, and most likely
/// a typo.
pub const MAX_CEILING: usize = 256;

/// Arrivals remembered per language: enough to count any demand up to [`MAX_CEILING`]
/// and a rate of 1024 per second; older ones are dropped first.
pub const ARRIVALS_KEPT: usize = 1024;

/// Over what the arrival rate shown by `health` and `/metrics` is counted.
pub const RATE_WINDOW: Duration = Duration::from_secs(1);

/// The time to ready assumed before one was measured (the first fill measures it).
const ASSUMED_READY: Duration = Duration::from_millis(100);

/// A measured time to ready counts at most this much (a start that took longer failed
/// its ready timeout anyway).
const MAX_READY: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error(
        "pool_max ({ceiling}) is below pool_size ({floor}): the ceiling must be at least the floor"
    )]
    CeilingBelowFloor { floor: usize, ceiling: usize },
    #[error("pool_max ({ceiling}) is above {MAX_CEILING}, the most sandboxes one language may keep waiting")]
    CeilingTooHigh { ceiling: usize },
    #[error("pool_size ({floor}) is above {MAX_CEILING}, the most sandboxes one language may keep waiting")]
    FloorTooHigh { floor: usize },
    #[error("pool_shrink_after must be more than 0 (a pool that shrinks at once cannot keep a burst warm)")]
    NoShrinkDelay,
}

/// What the operator set: the pool of a language keeps between `floor` and `ceiling`
/// sandboxes; one above the target for `shrink_after` is killed. A floor of 0 is no pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub floor: usize,
    pub ceiling: usize,
    pub shrink_after: Duration,
}

impl Bounds {
    /// Checked bounds; with `floor` 0 (no pool) the others are not looked at.
    pub fn new(floor: usize, ceiling: usize, shrink_after: Duration) -> Result<Bounds, Error> {
        if floor == 0 {
            return Ok(Bounds::off());
        }
        if floor > MAX_CEILING {
            return Err(Error::FloorTooHigh { floor });
        }
        if ceiling < floor {
            return Err(Error::CeilingBelowFloor { floor, ceiling });
        }
        if ceiling > MAX_CEILING {
            return Err(Error::CeilingTooHigh { ceiling });
        }
        if shrink_after.is_zero() {
            return Err(Error::NoShrinkDelay);
        }
        Ok(Bounds {
            floor,
            ceiling,
            shrink_after,
        })
    }

    /// A pool of exactly `size` per language (floor = ceiling): it never grows or shrinks.
    pub fn fixed(size: usize) -> Bounds {
        Bounds {
            floor: size,
            ceiling: size,
            shrink_after: Duration::from_secs(60),
        }
    }

    /// No warm pool.
    pub fn off() -> Bounds {
        Bounds::fixed(0)
    }

    pub fn is_off(&self) -> bool {
        self.floor == 0
    }

    fn clamp(&self, n: usize) -> usize {
        n.clamp(self.floor, self.ceiling)
    }
}

/// What one language's pool observed, and the target it holds.
#[derive(Debug, Default)]
pub struct Demand {
    /// When calls that fit the pool arrived, oldest first; at most [`ARRIVALS_KEPT`].
    arrivals: VecDeque<Instant>,
    /// Spawn to ready of the pool's own starts, smoothed; `None` before the first.
    ready: Option<Duration>,
    /// The target held, and since when the demand has not reached it.
    held: Option<(usize, Instant)>,
}

impl Demand {
    /// A call that fits the pool arrived (served warm or not): the target rises at once
    /// if the demand now exceeds it.
    pub fn arrived(&mut self, now: Instant, bounds: &Bounds) {
        if self.arrivals.len() == ARRIVALS_KEPT {
            self.arrivals.pop_front();
        }
        self.arrivals.push_back(now);
        let wanted = bounds.clamp(self.wanted(now));
        match self.held {
            Some((held, _)) if held > wanted => {}
            _ => self.held = Some((wanted, now)),
        }
    }

    /// One of the pool's starts became ready `took` after it was asked for: the window
    /// of [`Demand::wanted`] follows it (a quarter of each new measure, so one slow start
    /// on a busy machine moves it, but does not set it).
    pub fn became_ready(&mut self, took: Duration) {
        let took = took.min(MAX_READY);
        self.ready = Some(match self.ready {
            None => took,
            Some(ready) => (ready * 3 + took) / 4,
        });
    }

    /// The measured time from spawn to ready (`None` before the first start).
    pub fn ready(&self) -> Option<Duration> {
        self.ready
    }

    /// How long a replacement takes to be ready: what the pool must bridge.
    pub fn window(&self) -> Duration {
        self.ready.unwrap_or(ASSUMED_READY)
    }

    /// Arrivals in the last `span` (up to `now`).
    fn arrivals_within(&self, now: Instant, span: Duration) -> usize {
        let since = now.checked_sub(span);
        self.arrivals
            .iter()
            .rev()
            .take_while(|t| since.is_none_or(|s| **t > s))
            .count()
    }

    /// Sandboxes (ready + starting) that cover the calls arriving now: those that arrived
    /// within one time-to-ready, each waiting for its replacement, and one for the next.
    pub fn wanted(&self, now: Instant) -> usize {
        self.arrivals_within(now, self.window()) + 1
    }

    /// Calls per second that arrived over the last [`RATE_WINDOW`].
    pub fn rate_per_s(&self, now: Instant) -> f64 {
        self.arrivals_within(now, RATE_WINDOW) as f64 / RATE_WINDOW.as_secs_f64()
    }

    /// Whether another call arrived within one time-to-ready before the latest: a burst,
    /// in which a replacement must start at once (see `REFILL_DELAY`).
    pub fn in_burst(&self, now: Instant) -> bool {
        self.arrivals_within(now, self.window()) >= 2
    }

    /// The sandboxes the pool keeps now. A held target that the demand has not reached
    /// for `shrink_after` falls to the demand of `now`, and is held from then on.
    pub fn target(&mut self, now: Instant, bounds: &Bounds) -> usize {
        let wanted = bounds.clamp(self.wanted(now));
        match self.held {
            Some((held, since))
                if held > wanted && now.saturating_duration_since(since) < bounds.shrink_after =>
            {
                held
            }
            _ => {
                self.held = Some((wanted, now));
                wanted
            }
        }
    }

    /// When the target may fall next without an arrival (the refill looks then), or
    /// `None` when it is at the floor.
    pub fn next_change(&self, bounds: &Bounds) -> Option<Instant> {
        match self.held {
            Some((held, since)) if held > bounds.floor => Some(since + bounds.shrink_after),
            _ => None,
        }
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
