//! Periodic compaction, for any [`Store`].
//!
//! Follows kube-apiserver's compactor: every `interval` it compacts to the revision it saw at
//! the previous tick, so the store always keeps between one and two intervals of history. Time
//! rather than a revision count is what matters to clients: a watcher that reconnects within
//! `interval` can always resume without a re-list, however busy the store was meanwhile.

use std::sync::Arc;
use std::time::Duration;

use crate::error::StoreError;
use crate::Store;

/// Compacts a store periodically; run it with `tokio::spawn(compactor.run())` and abort the
/// task to stop it.
pub struct Compactor {
    store: Arc<dyn Store>,
    interval: Duration,
    /// The revision seen at the previous tick: the next compaction target.
    seen: Option<u64>,
}

impl Compactor {
    /// A compactor of `store` keeping at least `interval` of history (kube-apiserver: 5 min).
    pub fn new(store: Arc<dyn Store>, interval: Duration) -> Compactor {
        Compactor {
            store,
            interval,
            seen: None,
        }
    }

    /// Ticks every `interval` forever; failures are logged and retried at the next tick.
    pub async fn run(mut self) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if let Err(error) = self.tick().await {
                tracing::warn!(%error, "store compaction failed; retrying at the next tick");
            }
        }
    }

    /// One tick: compacts to the revision seen at the previous tick, then remembers the current
    /// one. Returns the revision compacted to, if any.
    pub async fn tick(&mut self) -> Result<Option<u64>, StoreError> {
        let current = self.store.current_revision().await?;
        let compacted = match self.seen {
            Some(target) if target > 0 => {
                self.store.compact(target).await?;
                Some(target)
            }
            _ => None,
        };
        self.seen = Some(current);
        Ok(compacted)
    }
}
