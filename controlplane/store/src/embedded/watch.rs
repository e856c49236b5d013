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
use std::time::Duration;

use futures_util::stream;

use super::history;
use super::hub::{Hub, Subscription};
use super::Inner;
use crate::error::StoreError;
use crate::types::{Event, WatchBatch};
use crate::WatchStream;

/// The shortest progress interval honoured.
const MIN_PROGRESS_INTERVAL: Duration = Duration::from_millis(1);

/// One watch's progress.
struct Watch {
    inner: Arc<Inner>,
    prefix: Arc<str>,
    /// Every change under the prefix up to this revision has been delivered.
    cursor: u64,
    /// The revision of the last batch returned: progress is reported only beyond it.
    reported: u64,
    subscription: Option<Subscription>,
    finished: bool,
}

/// The stream of changes under `prefix` after `after_revision`.
pub(crate) fn stream(inner: Arc<Inner>, prefix: &str, after_revision: u64) -> WatchStream {
    let watch = Watch {
        inner,
        prefix: prefix.into(),
        cursor: after_revision,
        reported: after_revision,
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
    /// The next batch of changes or progress, or the error that ends the watch.
    async fn next_batch(&mut self) -> Result<WatchBatch, StoreError> {
        loop {
            let replay_until = match self.subscription.as_mut() {
                None => None,
                Some(subscription) if self.cursor < subscription.registered_at => {
                    Some(subscription.registered_at)
                }
                Some(subscription) => {
                    let hub = &self.inner.hub;
                    // A zero interval would make an idle watch spin.
                    let interval = self
                        .inner
                        .config
                        .progress_interval
                        .max(MIN_PROGRESS_INTERVAL);
                    let position = Position {
                        cursor: &mut self.cursor,
                        reported: &mut self.reported,
                    };
                    return next_live(hub, interval, subscription, position).await;
                }
            };
            let batch = self.replay(replay_until).await?;
            self.cursor = batch.cursor;
            if !batch.events.is_empty() {
                self.reported = self.cursor;
                return Ok(WatchBatch {
                    events: batch.events,
                    revision: self.cursor,
                });
            }
            if batch.reached_end && self.subscription.is_none() {
                let capacity = self.inner.config.watch_buffer;
                self.subscription = Some(self.inner.hub.subscribe(&self.prefix, capacity));
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
}

/// A live watch's revisions, borrowed from its [`Watch`].
struct Position<'a> {
    cursor: &'a mut u64,
    reported: &'a mut u64,
}

impl Position<'_> {
    /// The batch of `events` up to the cursor (none: a progress report).
    fn report(&mut self, events: Vec<Event>) -> WatchBatch {
        *self.reported = *self.cursor;
        WatchBatch {
            events,
            revision: *self.cursor,
        }
    }
}

/// Waits for live changes and takes every one already queued, up to a batch; reports progress
/// instead when no change came for `interval` but the store moved on.
async fn next_live(
    hub: &Hub,
    interval: Duration,
    subscription: &mut Subscription,
    mut position: Position<'_>,
) -> Result<WatchBatch, StoreError> {
    loop {
        let Ok(received) = tokio::time::timeout(interval, subscription.receiver.recv()).await
        else {
            let published = hub.progress(subscription).unwrap_or(0);
            *position.cursor = (*position.cursor).max(published);
            if *position.cursor > *position.reported {
                return Ok(position.report(Vec::new()));
            }
            continue;
        };
        let Some(first) = received else {
            return Err(if subscription.was_lagged() {
                StoreError::Lagged {
                    last_revision: *position.cursor,
                }
            } else {
                StoreError::unavailable("the store was closed")
            });
        };
        let mut events = Vec::new();
        let mut next = Some(first);
        while let Some(event) = next {
            if event.revision() > *position.cursor {
                *position.cursor = event.revision();
                // The hub shares one copy among the watchers; the batch owns its events.
                events.push(Arc::unwrap_or_clone(event));
            }
            next = if events.len() < history::EVENTS_PER_BATCH {
                subscription.receiver.try_recv().ok()
            } else {
                None
            };
        }
        if !events.is_empty() {
            return Ok(position.report(events));
        }
    }
}
