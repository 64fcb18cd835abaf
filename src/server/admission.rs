//! Admission: at most `concurrency` executions run at once, at most `queue` more wait,
//! and everything beyond that is refused at once with a clear "busy, retry".

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The admission gate, shared by every request.
#[derive(Debug, Clone)]
pub struct Admission {
    slots: Arc<Semaphore>,
    /// One slot only for sandboxes an execution needs while it holds its own (the
    /// syntax check of a skill saved from code): see [`Admission::enter_nested`].
    nested: Arc<Semaphore>,
    waiting: Arc<AtomicUsize>,
    closed: Arc<AtomicBool>,
    concurrency: usize,
    queue: usize,
}

/// The execution may run while this is held.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
}

/// Refused at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Busy {
    #[error(
        "codebox is busy: {running} executions are running and {waiting} are queued; retry shortly"
    )]
    Full { running: usize, waiting: usize },
    #[error(
        "codebox is shutting down and takes no new executions; retry against a running server"
    )]
    ShuttingDown,
    #[error(
        "no sandbox slot came free within {waited_s} s (every slot is in use, and so is the one kept for checks from running code); retry shortly"
    )]
    NoNestedSlot { waited_s: u64 },
}

impl Admission {
    pub fn new(concurrency: usize, queue: usize) -> Admission {
        Admission {
            slots: Arc::new(Semaphore::new(concurrency.max(1))),
            nested: Arc::new(Semaphore::new(1)),
            waiting: Arc::new(AtomicUsize::new(0)),
            closed: Arc::new(AtomicBool::new(false)),
            concurrency: concurrency.max(1),
            queue,
        }
    }

    /// Waits for a slot, unless the queue is already full.
    pub async fn enter(&self) -> Result<Slot, Busy> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Busy::ShuttingDown);
        }
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            return Ok(Slot { _permit: p });
        }
        // Claim a queue place, or refuse.
        let claimed = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w < self.queue).then_some(w + 1)
            });
        if claimed.is_err() {
            return Err(Busy::Full {
                running: self.running(),
                waiting: self.waiting(),
            });
        }
        let permit = self.slots.clone().acquire_owned().await;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        Ok(Slot {
            _permit: permit.expect("the semaphore is never closed"),
        })
    }

    /// A slot for a sandbox that a running execution needs before it can go on (the
    /// syntax check of a skill its code saves): a free slot, else the one kept for such
    /// sandboxes, waiting at most `within`.
    ///
    /// Never the queue: the caller holds a slot itself, so with every slot held by such
    /// callers it would wait for its own end (at `concurrency = 1`, always). The kept
    /// slot is held only by these sandboxes, which wait for nothing and are bounded in
    /// time, so the wait ends; live sandboxes stay within `concurrency + 1`.
    pub async fn enter_nested(&self, within: std::time::Duration) -> Result<Slot, Busy> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Busy::ShuttingDown);
        }
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            return Ok(Slot { _permit: p });
        }
        let (slots, nested) = (self.slots.clone(), self.nested.clone());
        let either = async move {
            tokio::select! {
                p = slots.acquire_owned() => p,
                p = nested.acquire_owned() => p,
            }
        };
        match tokio::time::timeout(within, either).await {
            Ok(p) => Ok(Slot {
                _permit: p.expect("the semaphores are never closed"),
            }),
            Err(_) => Err(Busy::NoNestedSlot {
                waited_s: within.as_secs(),
            }),
        }
    }

    /// Refuses every new execution from now on (shutdown); running ones go on.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Whether [`Admission::close`] was called (the server is draining).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub fn running(&self) -> usize {
        self.concurrency - self.slots.available_permits()
    }

    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }
}

/// The metrics label of a refusal (the metrics room knows labels, not the server).
impl From<&Busy> for crate::metrics::labels::Refusal {
    fn from(busy: &Busy) -> crate::metrics::labels::Refusal {
        use crate::metrics::labels::Refusal;
        match busy {
            Busy::Full { .. } => Refusal::QueueFull,
            Busy::ShuttingDown => Refusal::Draining,
            Busy::NoNestedSlot { .. } => Refusal::NoNestedSlot,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn queue_overflow_is_refused_and_slots_free_up() {
        let a = Admission::new(1, 1);
        let first = a.enter().await.unwrap();
        let a2 = a.clone();
        let queued = tokio::spawn(async move { a2.enter().await.map(|_| ()) });
        tokio::task::yield_now().await;
        while a.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        let busy = a.enter().await.unwrap_err();
        assert_eq!(
            busy,
            Busy::Full {
                running: 1,
                waiting: 1
            }
        );
        assert!(busy.to_string().contains("retry"));
        drop(first);
        queued.await.unwrap().unwrap();
        assert_eq!(a.running(), 0);
        assert_eq!(a.waiting(), 0);
        a.close();
        assert_eq!(a.enter().await.unwrap_err(), Busy::ShuttingDown);
    }

    #[tokio::test]
    async fn a_nested_slot_never_waits_behind_its_own_caller() {
        let wait = std::time::Duration::from_millis(200);
        let a = Admission::new(1, 0);
        let running = a.enter().await.unwrap();
        // The only slot is the caller's own: the kept one serves the check.
        let check = a.enter_nested(wait).await.unwrap();
        // A second check meanwhile waits, boundedly, and says so.
        let e = a.enter_nested(wait).await.unwrap_err();
        assert_eq!(e, Busy::NoNestedSlot { waited_s: 0 });
        assert!(e.to_string().contains("retry"), "{e}");
        drop(check);
        let again = a.enter_nested(wait).await.unwrap();
        drop((again, running));
        // With a free slot, that one is taken.
        let free = a.enter_nested(wait).await.unwrap();
        assert_eq!(a.running(), 1);
        drop(free);
        a.close();
        assert_eq!(a.enter_nested(wait).await.unwrap_err(), Busy::ShuttingDown);
    }
}
