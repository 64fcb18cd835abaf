//! Rate limits per client: executions started per minute, and executions running at once.
//!
//! A client is whoever the server can tell apart: one bearer token over HTTP, the one
//! process on the other end of stdio. The per-minute limit is a GCRA (governor's keyed
//! limiter): a client may start `per_minute` executions in a burst, then one every
//! `60 s / per_minute`; a refusal says how long to wait. The concurrency limit counts the
//! client's executions from admission until their [`ClientPermit`] is dropped.
//!
//! These limits sit in front of the server-wide admission (slots and queue), so one busy
//! client cannot take every slot.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

/// The configured limits; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateLimits {
    pub per_minute: Option<NonZeroU32>,
    pub concurrent: Option<usize>,
}

/// A client was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Limited {
    #[error(
        "rate limit: this client may start {per_minute} executions per minute; retry after {} ms",
        retry_after.as_millis().max(1)
    )]
    Rate {
        per_minute: u32,
        retry_after: Duration,
    },
    #[error(
        "rate limit: this client already runs {running} executions at once, the most it may; \
         retry when one has finished"
    )]
    Concurrent { running: usize },
}

impl Limited {
    /// How long the client should wait, when it is known.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Limited::Rate { retry_after, .. } => Some(*retry_after),
            Limited::Concurrent { .. } => None,
        }
    }
}

/// Forget idle clients once the per-minute table holds this many.
const PRUNE_AT: usize = 10_000;

/// The limiter every request of every client goes through.
pub struct RateLimiter {
    limits: RateLimits,
    rate: Option<DefaultKeyedRateLimiter<String>>,
    clock: DefaultClock,
    running: Mutex<HashMap<String, usize>>,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// One admitted execution of a client; the client's running count drops with it.
#[derive(Debug)]
pub struct ClientPermit {
    limiter: Arc<RateLimiter>,
    client: String,
}

impl RateLimiter {
    pub fn new(limits: RateLimits) -> Arc<RateLimiter> {
        Arc::new(RateLimiter {
            limits,
            rate: limits
                .per_minute
                .map(|n| DefaultKeyedRateLimiter::keyed(Quota::per_minute(n))),
            clock: DefaultClock::default(),
            running: Mutex::new(HashMap::new()),
        })
    }

    pub fn limits(&self) -> RateLimits {
        self.limits
    }

    /// Admits one execution of `client`, or says why not and when to retry. A refusal
    /// by the concurrency limit does not use up the client's per-minute allowance.
    pub fn admit(self: &Arc<Self>, client: &str) -> Result<ClientPermit, Limited> {
        {
            let mut running = self.running.lock().expect("rate limiter lock");
            let count = running.entry(client.to_string()).or_insert(0);
            if let Some(max) = self.limits.concurrent {
                if *count >= max {
                    tracing::info!(client, running = *count, "refused: concurrency limit");
                    return Err(Limited::Concurrent { running: *count });
                }
            }
            *count += 1;
        }
        let permit = ClientPermit {
            limiter: self.clone(),
            client: client.to_string(),
        };
        if let (Some(rate), Some(n)) = (&self.rate, self.limits.per_minute) {
            if rate.len() >= PRUNE_AT {
                rate.retain_recent();
            }
            if let Err(not_until) = rate.check_key(&client.to_string()) {
                let retry_after = not_until.wait_time_from(self.clock.now());
                tracing::info!(
                    client,
                    retry_after_ms = retry_after.as_millis() as u64,
                    "refused: rate limit"
                );
                // `permit` drops here and gives the concurrency place back.
                return Err(Limited::Rate {
                    per_minute: n.get(),
                    retry_after,
                });
            }
        }
        Ok(permit)
    }

    /// Executions of `client` admitted and not yet finished.
    pub fn running(&self, client: &str) -> usize {
        let running = self.running.lock().expect("rate limiter lock");
        running.get(client).copied().unwrap_or(0)
    }
}

impl Drop for ClientPermit {
    fn drop(&mut self) {
        let mut running = self.limiter.running.lock().expect("rate limiter lock");
        if let Some(count) = running.get_mut(&self.client) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                running.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(per_minute: Option<u32>, concurrent: Option<usize>) -> Arc<RateLimiter> {
        RateLimiter::new(RateLimits {
            per_minute: per_minute.and_then(NonZeroU32::new),
            concurrent,
        })
    }

    #[test]
    fn the_call_after_the_burst_is_refused_with_a_retry_time() {
        let l = limiter(Some(3), None);
        for _ in 0..3 {
            drop(l.admit("a").expect("within the limit"));
        }
        let refused = l.admit("a").unwrap_err();
        let wait = refused.retry_after().expect("a retry time");
        // One execution every 20 s: the wait is at most that, and not zero.
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(20),
            "{wait:?}"
        );
        assert!(refused.to_string().contains("retry after"), "{refused}");
        // Another client has its own allowance.
        l.admit("b").expect("client b is not limited by a");
    }

    #[test]
    fn concurrency_is_counted_per_client_until_the_permit_drops() {
        let l = limiter(None, Some(2));
        let p1 = l.admit("a").unwrap();
        let _p2 = l.admit("a").unwrap();
        assert_eq!(
            l.admit("a").unwrap_err(),
            Limited::Concurrent { running: 2 }
        );
        assert_eq!(l.running("a"), 2);
        let _other = l.admit("b").expect("b has its own count");
        drop(p1);
        assert_eq!(l.running("a"), 1);
        l.admit("a").expect("a place is free again");
    }

    #[test]
    fn a_concurrency_refusal_does_not_use_the_rate_allowance() {
        let l = limiter(Some(2), Some(1));
        let held = l.admit("a").unwrap();
        for _ in 0..5 {
            assert!(matches!(
                l.admit("a").unwrap_err(),
                Limited::Concurrent { .. }
            ));
        }
        drop(held);
        // One of the two per-minute starts is left.
        drop(l.admit("a").expect("the second start of the minute"));
        assert!(matches!(l.admit("a").unwrap_err(), Limited::Rate { .. }));
        assert_eq!(l.running("a"), 0, "refused admissions hold nothing");
    }

    #[test]
    fn no_limits_admit_everything() {
        let l = limiter(None, None);
        let permits: Vec<_> = (0..100).map(|_| l.admit("a").unwrap()).collect();
        assert_eq!(l.running("a"), 100);
        drop(permits);
        assert_eq!(l.running("a"), 0);
    }
}
