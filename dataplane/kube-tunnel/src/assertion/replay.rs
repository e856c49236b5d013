//! The assertions an agent has accepted and that are still acceptable: one is accepted once.
//! Bounded: when every remembered assertion is unexpired and the cache is full, a new one is
//! refused (the gateway signs a fresh one per request; a refusal costs one request, a cache that
//! grows costs the agent its memory).

use std::collections::{BTreeSet, HashMap};

use super::AssertionError;

#[derive(Debug)]
pub(super) struct ReplayCache {
    capacity: usize,
    /// jti -> the second after which the assertion is refused as expired anyway.
    seen: HashMap<u128, u64>,
    /// The same entries in the order they may be forgotten.
    by_expiry: BTreeSet<(u64, u128)>,
}

impl ReplayCache {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            seen: HashMap::new(),
            by_expiry: BTreeSet::new(),
        }
    }

    /// Remembers `jti` until `forget_after` (Unix seconds), or refuses it as a replay or
    /// because the cache is full of unexpired entries.
    pub(super) fn insert(
        &mut self,
        jti: u128,
        forget_after: u64,
        now: u64,
    ) -> Result<(), AssertionError> {
        self.forget_expired(now);
        if self.seen.contains_key(&jti) {
            return Err(AssertionError::Replayed);
        }
        if self.seen.len() >= self.capacity {
            return Err(AssertionError::ReplayCacheFull {
                capacity: self.capacity,
            });
        }
        self.seen.insert(jti, forget_after);
        self.by_expiry.insert((forget_after, jti));
        Ok(())
    }

    pub(super) fn len(&self) -> usize {
        self.seen.len()
    }

    fn forget_expired(&mut self, now: u64) {
        while let Some(&(forget_after, jti)) = self.by_expiry.first() {
            if forget_after >= now {
                break;
            }
            self.by_expiry.pop_first();
            self.seen.remove(&jti);
        }
    }
}
