//! A watch: one etcd watch from the revision after `after_revision`, with `prev_kv` and
//! progress notifications, turned into [`WatchBatch`]es.
//!
//! etcd replays its history and follows live changes itself, without gap or duplicate, so
//! this side only converts. What it adds: the embedded store's compaction rule (a watch after
//! a compacted revision fails even where etcd could still replay), progress reported only
//! when it moves, a resumption on the next member from the last revision delivered when the
//! member's stream breaks, and an error item when that fails or etcd ends the watch, so a
//! watch never ends silently.

use std::pin::pin;
use std::sync::Arc;

use etcd_client::{WatchOptions, WatchResponse};
use futures_util::future::{select, Either};
use futures_util::stream;

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
    finished: bool,
}

/// The stream of changes under `prefix` after `after_revision`.
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
