//! A watch served as its own response body. The connection's stream task polls the store's
//! watch through it directly, so an event crosses no task or channel of its own on its way to
//! the client: at 10,000 watchers the watch task and its channel were about a tenth of the
//! control plane's core (issue 36, docs/PERFORMANCE.md). A slow client still slows only its own
//! watch: it is not polled, the store cuts it as lagging, and it resumes from history here.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use serde_json::Value;
use sluice_apimachinery::list::{bookmark_event, error_event, WatchEventType};
use sluice_apimachinery::{StatusError, StatusReason};
use sluice_store::{Event, StoreError, WatchBatch, WatchStream};
use tokio::time::{Instant, Sleep};

use super::admission::Slot;
use super::visibility::Visibility;
use super::watch::{line, OpenWatch, Watch, STORE_RETRIES, STORE_RETRY_PAUSE};

/// The events of a watch are joined in body chunks of up to this many bytes: one HTTP/2 DATA
/// frame and TLS record per chunk instead of per event (issue 36's fan-out); 16 KiB is both
/// HTTP/2's default largest frame and TLS's largest record.
const CHUNK_BYTES: usize = 16 * 1024;

/// What is left to encode before the watch waits on the store again.
enum Pending {
    Nothing,
    /// The current state as ADDED events (a watch without a resourceVersion).
    Initial(std::vec::IntoIter<Value>),
    /// The rest of one store batch.
    Batch(std::vec::IntoIter<Event>),
}

/// One open watch as a stream of body chunks.
pub(crate) struct Following {
    watch: Watch,
    _open: OpenWatch,
    _permit: Slot,
    stream: WatchStream,
    deadline: Pin<Box<Sleep>>,
    /// A pause before watching the store again after its connection broke.
    retry: Option<Pin<Box<Sleep>>>,
    pending: Pending,
    chunks: Chunks,
    /// Lines that go out on their own (BOOKMARK, ERROR), before anything else is encoded.
    ready: VecDeque<Bytes>,
    /// The last revision the client has been sent (or skipped as unseen), to resume from.
    last: u64,
    outages: u32,
    next_bookmark: Instant,
    /// No event sent yet: a Table's first event carries its columns.
    first: bool,
    /// Whether every change reaches this watch as stored, encoded once for all such watches.
    shared: bool,
    /// A VM agent's watch of its own VM: keys that merely extend its name are skipped.
    own: bool,
    done: bool,
}

impl Following {
    /// Follows the store from `after`, sending `initial` first.
    pub(crate) fn new(watch: Watch, initial: Vec<Value>, after: u64, permit: Slot) -> Self {
        let open = watch.open();
        let stream = watch.store.watch(&watch.prefix, after);
        let deadline = Box::pin(tokio::time::sleep(watch.duration));
        let next_bookmark = Instant::now() + watch.bookmark_every;
        let shared = watch.sends_every_change_unchanged();
        let own = matches!(watch.visibility, Visibility::Own { .. });
        Following {
            watch,
            _open: open,
            _permit: permit,
            stream,
            deadline,
            retry: None,
            pending: Pending::Initial(initial.into_iter()),
            chunks: Chunks::new(CHUNK_BYTES),
            ready: VecDeque::new(),
            last: after,
            outages: 0,
            next_bookmark,
            first: true,
            shared,
            own,
            done: false,
        }
    }

    /// The next chunk ready to send without waiting: a lone line, or encoded events up to a
    /// chunk's size (what is left of the pending events when they run out).
    fn next_chunk(&mut self) -> Option<Bytes> {
        if let Some(line) = self.ready.pop_front() {
            return Some(line);
        }
        loop {
            let Some((event_type, line)) = self.next_line() else {
                return self.take_chunk();
            };
            if let Some((bytes, event_types)) = self.chunks.push(line, event_type) {
                self.count(&event_types);
                return Some(bytes);
            }
        }
    }

    fn take_chunk(&mut self) -> Option<Bytes> {
        let (bytes, event_types) = self.chunks.take()?;
        self.count(&event_types);
        Some(bytes)
    }

    /// Events are counted as they are handed to the connection, so a watch that stays open
    /// shows its traffic.
    fn count(&self, event_types: &[WatchEventType]) {
        for event_type in event_types {
            self.watch.events.sent(*event_type);
        }
    }

    /// The next pending event this watch sends, encoded; `None` once none is left.
    fn next_line(&mut self) -> Option<(WatchEventType, Bytes)> {
        loop {
            let line = match &mut self.pending {
                Pending::Nothing => return None,
                Pending::Initial(objects) => objects.next().map(|object| {
                    let event_type = WatchEventType::Added;
                    (
                        event_type,
                        self.watch.encode(event_type, &object, self.first),
                    )
                }),
                Pending::Batch(events) => match events.next() {
                    None => None,
                    Some(event) => match self.line_of(event) {
                        Some(line) => Some(line),
                        None => continue,
                    },
                },
            };
            let Some(line) = line else {
                self.pending = Pending::Nothing;
                return None;
            };
            self.first = false;
            return Some(line);
        }
    }

    /// A store event as this watch sends it, `None` when it does not see it.
    fn line_of(&self, event: Event) -> Option<(WatchEventType, Bytes)> {
        if self.own && event.key() != self.watch.prefix {
            return None;
        }
        if self.shared {
            return self.watch.shared_line(&event);
        }
        let (event_type, object) = self.watch.translate(event)?;
        Some((
            event_type,
            self.watch.encode(event_type, &object, self.first),
        ))
    }

    /// Takes in what the store's watch yielded.
    fn receive(&mut self, item: Option<Result<WatchBatch, StoreError>>) {
        match item {
            None => self.done = true,
            Some(Ok(batch)) => {
                self.outages = 0;
                self.last = batch.revision;
                if !batch.events.is_empty() {
                    self.pending = Pending::Batch(batch.events.into_iter());
                    return;
                }
                // Progress alone: a BOOKMARK at most every `bookmark_every`, when allowed.
                let now = Instant::now();
                if now >= self.next_bookmark {
                    self.next_bookmark = now + self.watch.bookmark_every;
                    if self.watch.options.allow_watch_bookmarks {
                        let bookmark = bookmark_event(&self.watch.spec, batch.revision);
                        self.ready.push_back(line(&bookmark));
                    }
                }
            }
            Some(Err(StoreError::Lagged { last_revision })) => {
                self.last = last_revision;
                self.stream = self.watch.store.watch(&self.watch.prefix, last_revision);
            }
            // The store's connection broke (an etcd member died): its history is gap-free, so
            // watching again from the last revision loses nothing.
            Some(Err(StoreError::Unavailable { .. })) if self.outages < STORE_RETRIES => {
                self.outages += 1;
                self.retry = Some(Box::pin(tokio::time::sleep(STORE_RETRY_PAUSE)));
            }
            Some(Err(error)) => {
                let status = match error {
                    StoreError::Compacted { compact_revision } => {
                        StatusError::gone(self.last, compact_revision)
                    }
                    other => StatusError::new(
                        StatusReason::ServiceUnavailable,
                        format!("the store ended the watch: {other}"),
                    ),
                };
                self.ready.push_back(line(&error_event(&status)));
                self.done = true;
            }
        }
    }
}

impl Stream for Following {
    type Item = Bytes;

    fn poll_next(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let this = self.get_mut();
        loop {
            if let Some(chunk) = this.next_chunk() {
                return Poll::Ready(Some(chunk));
            }
            if this.done || this.deadline.as_mut().poll(context).is_ready() {
                return Poll::Ready(None);
            }
            if let Some(pause) = this.retry.as_mut() {
                ready!(pause.as_mut().poll(context));
                this.retry = None;
                this.stream = this.watch.store.watch(&this.watch.prefix, this.last);
            }
            let item = ready!(this.stream.as_mut().poll_next(context));
            this.receive(item);
        }
    }
}

/// Joined lines and the types of the events they carry.
type Chunk = (Bytes, Vec<WatchEventType>);

/// Event lines joined into body chunks of at most `limit` bytes; a longer line is a chunk of
/// its own, and a lone line is passed on without a copy.
struct Chunks {
    limit: usize,
    lines: Vec<Bytes>,
    event_types: Vec<WatchEventType>,
    len: usize,
}

impl Chunks {
    fn new(limit: usize) -> Self {
        Chunks {
            limit,
            lines: Vec::new(),
            event_types: Vec::new(),
            len: 0,
        }
    }

    /// Adds a line; returns the chunk to send first when the line would not fit in it.
    fn push(&mut self, line: Bytes, event_type: WatchEventType) -> Option<Chunk> {
        let full = (self.len > 0 && self.len + line.len() > self.limit)
            .then(|| self.take())
            .flatten();
        self.len += line.len();
        self.lines.push(line);
        self.event_types.push(event_type);
        full
    }

    /// The lines gathered so far as one chunk, `None` if there are none.
    fn take(&mut self) -> Option<Chunk> {
        let event_types = std::mem::take(&mut self.event_types);
        let len = std::mem::replace(&mut self.len, 0);
        let mut lines = std::mem::take(&mut self.lines);
        let bytes = match lines.len() {
            0 => return None,
            1 => lines.pop()?,
            _ => {
                let mut joined = BytesMut::with_capacity(len);
                lines.iter().for_each(|line| joined.extend_from_slice(line));
                joined.freeze()
            }
        };
        Some((bytes, event_types))
    }
}

#[cfg(test)]
#[path = "watch_body_tests.rs"]
mod tests;
