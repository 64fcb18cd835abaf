//! The owner of one idle pooled sandbox: it hands the sandbox out once, or sees it die.

use std::sync::Weak;

use tokio::sync::oneshot;

use super::{Inner, Warm};
use crate::runtime::Language;

/// Holds `warm` until someone asks for it through `take` (it is handed over, once), the
/// pool drops the slot (the sandbox is killed and reaped), or the sandbox ends while
/// waiting (the pool forgets it and refills).
pub(super) async fn hold(
    pool: Weak<Inner>,
    language: Language,
    id: u64,
    mut warm: Warm,
    take: oneshot::Receiver<oneshot::Sender<Warm>>,
) {
    tokio::select! {
        asked = take => {
            let unused = match asked {
                Ok(reply) => reply.send(warm).err(),
                // The pool retired the slot or is shutting down.
                Err(_) => Some(warm),
            };
            if let Some(warm) = unused {
                warm.sandbox.kill_and_wait().await;
            }
        }
        ending = warm.sandbox.ended() => {
            tracing::debug!(%language, sandbox = id, ?ending, "pooled sandbox ended while idle");
            if let Some(pool) = pool.upgrade() {
                pool.died_idle(language, id, ending.is_none());
            }
        }
    }
}
