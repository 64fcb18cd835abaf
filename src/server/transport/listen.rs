//! `subscriptions/listen` (2026-07-28, SEP-2575): how a client without a session hears
//! that the resource list changed.
//!
//! codebox advertises `resources.listChanged`: its resources include the `/servers`
//! wrappers, which change with the upstream catalog. A 2025-11-25 connection is told on
//! its own stream ([`crate::server::readiness::Listeners`]); a 2026-07-28 client opens a listen
//! request instead. rmcp acknowledges it (`notifications/subscriptions/acknowledged`
//! with the accepted filter and the subscription id) and then runs [`listen`]: the
//! subscription's sink is kept here until the client cancels the request (or goes
//! away) or the server stops, when the request ends with its final result.
//!
//! Accepted: `resourcesListChanged` only (codebox's tool and prompt lists never change
//! while it runs, and it has no per-resource updates). At most [`MAX_SUBSCRIPTIONS`]
//! at once; another is refused with an error after its acknowledgment.
//!
//! [`listen`]: rmcp::ServerHandler::listen

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rmcp::model::SubscriptionFilter;
use rmcp::service::{SubscriptionContext, SubscriptionSink};
use tokio_util::sync::CancellationToken;

use crate::server::CodeboxServer;

/// Listen requests open at once.
pub const MAX_SUBSCRIPTIONS: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{open} subscriptions are open, the most this server keeps; close one first")]
    TooMany { open: usize },
}

/// The open subscriptions' sinks, and the token that ends them all at shutdown.
#[derive(Debug, Default)]
pub struct Subscriptions {
    next: AtomicU64,
    sinks: Mutex<HashMap<u64, SubscriptionSink>>,
    closing: CancellationToken,
}

impl Subscriptions {
    /// Keeps `sink` until the returned guard drops.
    fn add(&self, sink: SubscriptionSink) -> Result<Registered<'_>, Error> {
        let mut sinks = lock(&self.sinks);
        if sinks.len() >= MAX_SUBSCRIPTIONS {
            return Err(Error::TooMany { open: sinks.len() });
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        sinks.insert(id, sink);
        Ok(Registered { owner: self, id })
    }

    /// Ends every subscription (each gets its final result) and refuses new ones.
    pub fn close(&self) {
        self.closing.cancel();
    }

    /// `notifications/resources/list_changed` to every subscription that accepted it,
    /// each bounded like a connection's.
    pub(in crate::server) fn resources_changed(&self) {
        let sinks: Vec<SubscriptionSink> = lock(&self.sinks).values().cloned().collect();
        for sink in sinks {
            tokio::spawn(async move {
                let bound = crate::server::readiness::NOTIFY_BOUND;
                match tokio::time::timeout(bound, sink.notify_resource_list_changed()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, id = ?sink.id(), "resources/list_changed not sent to a subscription")
                    }
                    Err(_) => tracing::warn!(
                        bound_s = bound.as_secs(),
                        id = ?sink.id(),
                        "a subscription did not take resources/list_changed in time"
                    ),
                }
            });
        }
    }
}

/// A subscription's place in [`Subscriptions`], given up on drop.
struct Registered<'a> {
    owner: &'a Subscriptions,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        lock(&self.owner.sinks).remove(&self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What codebox accepts of `requested`: resource list changes, if asked for.
pub(in crate::server) fn accepted(requested: &SubscriptionFilter) -> SubscriptionFilter {
    let mut accepted = SubscriptionFilter::new();
    if requested.resources_list_changed == Some(true) {
        accepted = SubscriptionFilter::builder()
            .resources_list_changed()
            .build();
    }
    accepted
}

impl CodeboxServer {
    /// Runs one subscription until the client ends it or the server stops.
    pub(in crate::server) async fn listen_until_closed(
        &self,
        subscription: SubscriptionContext,
    ) -> Result<(), rmcp::ErrorData> {
        let subscriptions = &self.state.listeners.subscriptions;
        if subscriptions.closing.is_cancelled() {
            return Ok(());
        }
        let _registered = subscriptions
            .add(subscription.sink().clone())
            .map_err(|e| {
                tracing::warn!(error = %e, "subscriptions/listen refused");
                rmcp::ErrorData::internal_error(e.to_string(), None)
            })?;
        tracing::debug!(id = ?subscription.sink().id(), "subscription open");
        tokio::select! {
            () = subscription.cancelled() => {}
            () = subscriptions.closing.cancelled() => {}
        }
        tracing::debug!(id = ?subscription.sink().id(), "subscription closed");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_resource_list_changes_are_accepted_and_only_when_asked() {
        let everything = SubscriptionFilter::builder()
            .tools_list_changed()
            .prompts_list_changed()
            .resources_list_changed()
            .resource_subscription("codebox://health")
            .build();
        let a = accepted(&everything);
        assert_eq!(a.resources_list_changed, Some(true));
        assert_eq!(a.tools_list_changed, None);
        assert_eq!(a.prompts_list_changed, None);
        assert_eq!(a.resource_subscriptions, None);
        let tools_only = SubscriptionFilter::builder().tools_list_changed().build();
        assert_eq!(accepted(&tools_only), SubscriptionFilter::new());
    }
}
