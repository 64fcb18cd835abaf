//! PII token maps of stateless clients (2026-07-28 over HTTP).
//!
//! A stateful connection (stdio, or a 2025-11-25 HTTP session) keeps its own token map
//! for as long as it lives. A 2026-07-28 HTTP client has no connection: rmcp builds a
//! server value per request, so a map per value would forget every token between two
//! requests and `[EMAIL_1]` in one answer could not be restored by the next call. Its
//! map is kept here, by client identity (`token:<name>`, or the one unauthenticated
//! loopback client), for the life of the process.
//!
//! Bounded: a stateless identity is a configured token's client or the one loopback
//! client, so the configuration bounds the maps; [`MAX_CLIENTS`] bounds them whatever
//! it says: past it the least recently used map is dropped (its tokens can no longer be
//! restored; logged). Each map bounds its own tokens (`pii::Vault`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::pii::{Detector, Vault};

/// Stateless clients whose token maps are kept at once.
pub const MAX_CLIENTS: usize = 1024;

/// Each client's token map, with when it was last used.
pub struct ClientVaults {
    detector: Arc<Detector>,
    limit: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Advances on each use: the smallest stamp is the least recently used map.
    clock: u64,
    vaults: HashMap<String, (Arc<Vault>, u64)>,
}

impl ClientVaults {
    pub fn new(detector: Arc<Detector>) -> ClientVaults {
        Self::with_limit(detector, MAX_CLIENTS)
    }

    fn with_limit(detector: Arc<Detector>, limit: usize) -> ClientVaults {
        ClientVaults {
            detector,
            limit: limit.max(1),
            inner: Mutex::default(),
        }
    }

    /// `client`'s token map, made on first use.
    pub fn of(&self, client: &str) -> Arc<Vault> {
        let mut inner = self.inner.lock().expect("client vaults lock");
        inner.clock += 1;
        let now = inner.clock;
        if let Some((vault, used)) = inner.vaults.get_mut(client) {
            *used = now;
            return vault.clone();
        }
        if inner.vaults.len() >= self.limit {
            let oldest = inner
                .vaults
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(name, _)| name.clone());
            if let Some(oldest) = oldest {
                inner.vaults.remove(&oldest);
                tracing::warn!(
                    client = %oldest,
                    limit = self.limit,
                    "dropped the PII token map of the least recently seen stateless client"
                );
            }
        }
        let vault = Arc::new(Vault::new(self.detector.clone()));
        inner
            .vaults
            .insert(client.to_string(), (vault.clone(), now));
        vault
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detector() -> Arc<Detector> {
        Arc::new(Detector::new(&[]).expect("built-in detectors"))
    }

    #[test]
    fn one_client_keeps_its_tokens_and_others_do_not_share_them() {
        let vaults = ClientVaults::new(detector());
        let text = vaults.of("token:alice").tokenize("mail bob@example.com");
        assert!(!text.contains("bob@example.com"), "{text}");
        assert_eq!(
            vaults.of("token:alice").restore(&text),
            "mail bob@example.com"
        );
        // Another client's map does not know the token.
        assert_eq!(vaults.of("token:eve").restore(&text), text);
    }

    #[test]
    fn past_the_limit_the_least_recently_used_map_goes() {
        let vaults = ClientVaults::with_limit(detector(), 2);
        let a = vaults.of("a").tokenize("a@example.com");
        let b = vaults.of("b").tokenize("b@example.com");
        // "a" used again: "b" is now the oldest.
        vaults.of("a");
        vaults.of("c");
        assert_eq!(vaults.of("a").restore(&a), "a@example.com");
        assert_eq!(vaults.of("b").restore(&b), b, "b's map was dropped");
    }
}
