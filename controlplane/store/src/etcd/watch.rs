//! A watch: one etcd watch from the revision after `after_revision`, with `prev_kv` and
//! progress notifications, turned into [`WatchBatch`]es.
//!
//! etcd replays its history and follows live changes itself, without gap or duplicate, so
//! this side only converts. What it adds: the embedded store's compaction rule (a watch after
//! a compacted revision fails even where etcd could still replay), progress reported only
//! when it moves, a resumption on the next member from the last revision delivered when the
//! member's stream breaks, and an error item when that fails or etcd ends the watch, so a
//! watch never ends silently.
//!
//! A reader task drains each etcd watch into a bounded queue, whatever its consumer does. An
//! etcd stream left unread keeps its data in the HTTP/2 connection's flow-control window,
//! which every watch and request to that member shares: a few API clients that stop reading
//! their watches left every later answer unsent ("etcd did not answer", issue 36). A consumer
//! that falls [`WATCH_BUFFER_EVENTS`] changes or [`WATCH_BUFFER_BYTES`] behind has its etcd
//! watch cancelled and gets [`StoreError::Lagged`] after what was queued, as the embedded
//! store's hub cuts a slow watcher; it watches again from there and etcd replays the rest.

use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use etcd_client::{WatchOptions, WatchResponse};
use futures_util::future::{select, Either};
use futures_util::{stream, FutureExt};
use tokio::sync::mpsc;

use super::convert::{self, etcd_revision, revision, EventError, Failure};
use super::{EtcdOp, Shared};
use crate::error::StoreError;
use crate::types::{Event, WatchBatch};
use crate::WatchStream;

/// One watch's progress.
struct Watch {
    shared: Arc<Shared>,
    /// Closes when the store is dropped.
    open: tokio::sync::watch::Receiver<()>,
    prefix: String,
    /// Every change under the prefix up to this revision has been delivered.
    cursor: u64,
    /// The revision of the last batch returned: progress is reported only beyond it.
    reported: u64,
    etcd: Option<etcd_client::WatchStream>,
    /// The member the etcd watch is on.
    member: usize,
}

/// Changes queued for one consumer before its watch is cut (the embedded store's default).
pub(crate) const WATCH_BUFFER_EVENTS: usize = crate::embedded::DEFAULT_WATCH_BUFFER;
/// Bytes of keys and values queued for one consumer before its watch is cut: about what one
/// HTTP/2 stream's window would have held, now in this process instead of the connection.
pub(crate) const WATCH_BUFFER_BYTES: usize = 8 << 20;

/// What a reader has queued for its consumer and not yet been taken.
#[derive(Default)]
struct Queued {
    events: AtomicUsize,
    bytes: AtomicUsize,
    /// The reader stopped because the consumer fell behind.
    lagged: AtomicBool,
}

impl Queued {
    /// Counts `item` in, unless the queue is not empty and it would pass a bound (a single
    /// batch larger than the bounds still passes an empty queue, or the watch could never
    /// move). Errors always pass: they end the stream.
    fn admit(&self, item: &Result<WatchBatch, StoreError>) -> bool {
        let (events, bytes) = weight(item);
        let queued = self.events.load(Ordering::Acquire);
        if queued > 0
            && (queued + events > WATCH_BUFFER_EVENTS
                || self.bytes.load(Ordering::Acquire) + bytes > WATCH_BUFFER_BYTES)
        {
            return false;
        }
        self.events.fetch_add(events, Ordering::AcqRel);
        self.bytes.fetch_add(bytes, Ordering::AcqRel);
        true
    }

    fn taken(&self, item: &Result<WatchBatch, StoreError>) {
        let (events, bytes) = weight(item);
        self.events.fetch_sub(events, Ordering::AcqRel);
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// An item's share of the bounds: a progress report counts as one change (so that reports
/// cannot pile up either), an error as nothing.
fn weight(item: &Result<WatchBatch, StoreError>) -> (usize, usize) {
    let Ok(batch) = item else {
        return (0, 0);
    };
    let bytes = batch
        .events
        .iter()
        .map(|event| match event {
            Event::Put { kv, prev } => {
                kv.key.len() + kv.value.len() + prev.as_ref().map_or(0, |prev| prev.value.len())
            }
            Event::Delete { prev, .. } => prev.key.len() + prev.value.len(),
        })
        .sum();
    (batch.events.len().max(1), bytes)
}

/// The stream of changes under `prefix` after `after_revision`: a reader task follows etcd,
/// the stream takes from its queue.
pub(crate) fn stream(
    shared: Arc<Shared>,
    open: tokio::sync::watch::Receiver<()>,
    prefix: &str,
    after_revision: u64,
) -> WatchStream {
    let watch = Watch {
        shared,
        open,
        prefix: prefix.to_owned(),
        cursor: after_revision,
        reported: after_revision,
        etcd: None,
        member: 0,
    };
    let queued = Arc::new(Queued::default());
    let (sender, receiver) = mpsc::unbounded_channel();
    tokio::spawn(read(watch, queued.clone(), sender));
    let taker = Taker {
        receiver,
        queued,
        delivered: after_revision,
        finished: false,
    };
    Box::pin(stream::unfold(taker, |mut taker| async move {
        let item = taker.next().await?;
        Some((item, taker))
    }))
}

/// The consumer's side of a reader's queue.
struct Taker {
    receiver: mpsc::UnboundedReceiver<Result<WatchBatch, StoreError>>,
    queued: Arc<Queued>,
    /// The revision of the last batch taken: where a lagged consumer watches again.
    delivered: u64,
    finished: bool,
}

impl Taker {
    async fn next(&mut self) -> Option<Result<WatchBatch, StoreError>> {
        if self.finished {
            return None;
        }
        let item = match self.receiver.recv().await {
            Some(item) => item,
            None => {
                // The reader stopped without an error item: cut for lagging, or it panicked.
                self.finished = true;
                let last_revision = self.delivered;
                if self.queued.lagged.load(Ordering::Acquire) {
                    return Some(Err(StoreError::Lagged { last_revision }));
                }
                return Some(Err(ended("the etcd watch's reader stopped", last_revision)));
            }
        };
        self.queued.taken(&item);
        match &item {
            Ok(batch) => self.delivered = batch.revision,
            Err(_) => self.finished = true,
        }
        Some(item)
    }
}

/// The reader: etcd's batches into the queue until an error, the consumer's drop, or its lag.
/// A panic ends it like a lag without the flag, which the taker reports as a resumable end.
async fn read(
    mut watch: Watch,
    queued: Arc<Queued>,
    sender: mpsc::UnboundedSender<Result<WatchBatch, StoreError>>,
) {
    let follow = async {
        loop {
            let item = tokio::select! {
                _ = sender.closed() => return,
                item = watch.next_batch() => item,
            };
            let last = item.is_err();
            if !queued.admit(&item) {
                queued.lagged.store(true, Ordering::Release);
                return;
            }
            if sender.send(item).is_err() || last {
                return;
            }
        }
    };
    if std::panic::AssertUnwindSafe(follow)
        .catch_unwind()
        .await
        .is_err()
    {
        tracing::error!("an etcd watch's reader panicked; its consumer watches again");
    }
}

impl Watch {
    /// The next batch of changes or progress, or the error that ends the watch.
    async fn next_batch(&mut self) -> Result<WatchBatch, StoreError> {
        // Taken out while in use and put back after a batch: an error drops it, which cancels
        // the watch at etcd.
        let mut etcd = match self.etcd.take() {
            Some(etcd) => etcd,
            None => self.start().await?,
        };
        // Resumptions since the last batch: a member whose new stream breaks again at once
        // moves on to the next, around the ring at most once.
        let mut resumed = 0;
        loop {
            let received = {
                let message = pin!(etcd.message());
                let closed = pin!(self.open.changed());
                match select(message, closed).await {
                    Either::Left((received, _)) => received,
                    Either::Right(_) => {
                        return Err(StoreError::unavailable("the store was closed"));
                    }
                }
            };
            let response = match received {
                Ok(Some(response)) => response,
                broken => {
                    let what = match broken {
                        Err(error) => format!("the etcd watch failed: {error}"),
                        Ok(_) => "etcd ended the watch".to_owned(),
                    };
                    if resumed >= self.shared.members.len() {
                        return Err(ended(&what, self.cursor));
                    }
                    resumed += 1;
                    etcd = self.resume(&what).await?;
                    continue;
                }
            };
            if let Some(batch) = self.batch(response).await? {
                self.etcd = Some(etcd);
                return Ok(batch);
            }
        }
    }

    /// Opens the watch again on the next member from `cursor` after its stream broke (`what`);
    /// its history is etcd's, so nothing is missed or repeated.
    async fn resume(&mut self, what: &str) -> Result<etcd_client::WatchStream, StoreError> {
        self.shared.members.failed(self.member);
        self.shared.members.stats.retried(EtcdOp::Watch);
        tracing::debug!(cursor = self.cursor, "{what}; resuming the watch");
        match self.start().await {
            Ok(etcd) => Ok(etcd),
            Err(StoreError::Unavailable { source }) => Err(ended(
                &format!("{what}; resuming failed: {source}"),
                self.cursor,
            )),
            Err(other) => Err(other),
        }
    }

    /// Opens the etcd watch, after checking that `cursor` is not compacted.
    async fn start(&mut self) -> Result<etcd_client::WatchStream, StoreError> {
        // etcd would replay from a compacted revision's successor as long as that one is kept,
        // but without the states its changes replaced; the embedded store refuses such a
        // watch, and so does this one. Revision 0 is etcd's empty revision 1.
        match self.shared.probe(self.cursor.max(1)).await {
            Ok(_) | Err(Failure::FutureRevision) => {}
            Err(failure) => return Err(self.shared.explain(failure, self.cursor).await),
        }
        let (start, end) = self.shared.namespace.prefix_range(&self.prefix);
        let options = WatchOptions::new()
            .with_range(end)
            .with_start_revision(etcd_revision(self.cursor + 1))
            .with_prev_key()
            .with_progress_notify();
        let opened = self.shared.run(EtcdOp::Watch, |member| {
            let (mut client, start, options) =
                (member.watch.clone(), start.clone(), options.clone());
            async move { client.watch(start, Some(options)).await }
        });
        match opened.await {
            Ok(answer) => {
                self.member = answer.member;
                Ok(answer.value)
            }
            Err(failure) => Err(self.shared.explain(failure, self.cursor).await),
        }
    }

    /// What one etcd response means: a batch, nothing to report (`None`), or the end.
    async fn batch(&mut self, response: WatchResponse) -> Result<Option<WatchBatch>, StoreError> {
        if response.compact_revision() > 0 {
            let compact_revision = revision(response.compact_revision());
            self.shared.note_compaction(compact_revision);
            return Err(StoreError::Compacted { compact_revision });
        }
        if response.canceled() {
            let reason = format!("etcd cancelled the watch ({})", response.cancel_reason());
            return Err(ended(&reason, self.cursor));
        }
        if response.events().is_empty() {
            // The creation's answer carries the current revision, not progress: the replay
            // of older changes may still follow.
            if response.created() {
                return Ok(None);
            }
            let now = response
                .header()
                .map_or(0, |header| revision(header.revision()));
            if now <= self.reported {
                return Ok(None);
            }
            self.cursor = self.cursor.max(now);
            return Ok(Some(self.report(Vec::new())));
        }
        let mut events = Vec::with_capacity(response.events().len());
        for event in response.events() {
            let event = match convert::event(&self.shared.namespace, event) {
                Ok(event) => event,
                Err(EventError::PreviousCompacted) => {
                    return Err(self.shared.explain(Failure::Compacted, 0).await)
                }
                Err(EventError::Store(error)) => return Err(error),
            };
            // etcd never repeats a change; the check keeps the cursor honest regardless.
            if event.revision() > self.cursor {
                self.cursor = event.revision();
                events.push(event);
            }
        }
        Ok((!events.is_empty()).then(|| self.report(events)))
    }

    /// The batch of `events` up to the cursor (none: a progress report).
    fn report(&mut self, events: Vec<Event>) -> WatchBatch {
        self.reported = self.cursor;
        WatchBatch {
            events,
            revision: self.cursor,
        }
    }
}

/// The error ending a watch that can be resumed: watch again after `cursor`.
fn ended(what: &str, cursor: u64) -> StoreError {
    StoreError::unavailable(format!("{what}; watch again after revision {cursor}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::KeyValue;
    use bytes::Bytes;

    fn batch(changes: usize, value_bytes: usize) -> Result<WatchBatch, StoreError> {
        let put = |revision| Event::Put {
            kv: KeyValue {
                key: "k".into(),
                value: Bytes::from(vec![0; value_bytes]),
                create_revision: revision,
                mod_revision: revision,
                version: 1,
            },
            prev: None,
        };
        Ok(WatchBatch {
            events: (1..=changes as u64).map(put).collect(),
            revision: changes as u64,
        })
    }

    #[test]
    fn a_queue_admits_up_to_its_bounds_and_always_when_empty() {
        let queued = Queued::default();
        // Larger than both bounds, into an empty queue: the watch must be able to move.
        let huge = batch(WATCH_BUFFER_EVENTS + 1, WATCH_BUFFER_BYTES);
        assert!(queued.admit(&huge));
        assert!(!queued.admit(&batch(1, 0)));
        queued.taken(&huge);
        // Progress reports count as one change each.
        for _ in 0..WATCH_BUFFER_EVENTS {
            assert!(queued.admit(&batch(0, 0)));
        }
        assert!(!queued.admit(&batch(0, 0)));
        // Errors always pass: they end the stream.
        assert!(queued.admit(&Err(StoreError::unavailable("gone"))));
        let queued = Queued::default();
        // Bytes are keys and values: a one-byte key each here.
        assert!(queued.admit(&batch(1, WATCH_BUFFER_BYTES - 2)));
        assert!(!queued.admit(&batch(1, 1)));
        assert!(queued.admit(&batch(1, 0)));
    }
}
