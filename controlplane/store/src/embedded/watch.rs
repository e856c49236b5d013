//! A watch: replay the log, then follow the hub, with neither gap nor duplicate.
//!
//! The switch works in three phases. (1) Replay the log from `after_revision` up to the current
//! revision, batch by batch, without holding any live feed (a slow client costs nothing).
//! (2) Once caught up, subscribe: the hub returns the last revision it published, and every
//! change above it will arrive on the channel. (3) Replay the log once more up to that revision
//! (it is committed, so readable) to close the window between (1) and (2), then take the
//! channel's changes, dropping any at or below the cursor (a change committed but not yet
//! published during (1) is read from the log and then arrives on the channel too).

use std::sync::Arc;

use futures_util::stream;

use super::history;
use super::hub::Subscription;
use super::Inner;
use crate::error::StoreError;
use crate::types::Event;
use crate::WatchStream;

/// One watch's progress.
struct Watch {
    inner: Arc<Inner>,
    prefix: Arc<str>,
    /// Every change under the prefix up to this revision has been delivered.
    cursor: u64,
    subscription: Option<Subscription>,
    finished: bool,
}

/// The stream of changes under `prefix` after `after_revision`.
pub(crate) fn stream(inner: Arc<Inner>, prefix: &str, after_revision: u64) -> WatchStream {
    let watch = Watch {
        inner,
        prefix: prefix.into(),
        cursor: after_revision,
        subscription: None,
        finished: false,
    };
    Box::pin(stream::unfold(watch, |mut watch| async move {
        if watch.finished {
            return None;
        }
        let item = watch.next_batch().await;
        watch.finished = item.is_err();
        Some((item, watch))
    }))
}

impl Watch {
    /// The next non-empty batch of changes, or the error that ends the watch.
    async fn next_batch(&mut self) -> Result<Vec<Event>, StoreError> {
        loop {
            let replay_until = match &self.subscription {
                None => None,
                Some(subscription) if self.cursor < subscription.registered_at => {
                    Some(subscription.registered_at)
                }
                Some(_) => return self.next_live().await,
            };
            let batch = self.replay(replay_until).await?;
            self.cursor = batch.cursor;
            if !batch.events.is_empty() {
                return Ok(batch.events);
            }
            if batch.reached_end && self.subscription.is_none() {
                let hub = &self.inner.hub;
                self.subscription =
                    Some(hub.subscribe(&self.prefix, self.inner.config.watch_buffer));
            }
        }
    }

    /// Reads the log after the cursor on a blocking thread.
    async fn replay(&self, until: Option<u64>) -> Result<history::Batch, StoreError> {
        let inner = self.inner.clone();
        let prefix = self.prefix.clone();
        let after = self.cursor;
        super::blocking(move || history::read(&inner.db, &prefix, after, until)).await
    }

    /// Waits for live changes and takes every one already queued, up to a batch.
    async fn next_live(&mut self) -> Result<Vec<Event>, StoreError> {
        let cursor = &mut self.cursor;
        let Some(subscription) = self.subscription.as_mut() else {
            return Ok(Vec::new());
        };
        loop {
            let Some(first) = subscription.receiver.recv().await else {
                return Err(if subscription.was_lagged() {
                    StoreError::Lagged {
                        last_revision: *cursor,
                    }
                } else {
                    StoreError::unavailable("the store was closed")
                });
            };
            let mut events = Vec::new();
            let mut next = Some(first);
            while let Some(event) = next {
                if event.revision() > *cursor {
                    *cursor = event.revision();
                    events.push(event);
                }
                next = if events.len() < history::EVENTS_PER_BATCH {
                    subscription.receiver.try_recv().ok()
                } else {
                    None
                };
            }
            if !events.is_empty() {
                return Ok(events);
            }
        }
    }
}
