//! WATCH: the objects' changes after a resourceVersion as newline-delimited JSON events, from
//! the store's gap-free watch. Each watch is its own task with a bounded queue to its client;
//! a slow client slows only its own watch (the store cuts a lagging watcher, which resumes
//! from history here without the client noticing).

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use serde_json::Value;
use sluice_apimachinery::list::{bookmark_event, error_event, watch_event, WatchEventType};
use sluice_apimachinery::meta::set_resource_version;
use sluice_apimachinery::options::ListOptions;
use sluice_apimachinery::table::{self, ResponseFormat, TableOptions};
use sluice_apimachinery::{KindSpec, StatusError, StatusReason};
use sluice_store::{Event, Store, StoreError, WatchBatch};
use tokio::sync::mpsc;

use super::admission::Slot;

use super::keys::{list_prefix, object_key};
use super::metrics::{ResourceLabels, WatchEventCounters};
use super::objects::{decode, matches_selection, Call};
use super::reply::Reply;
use super::visibility::Visibility;
use super::ApiServer;

/// Encoded events queued per watch before the watch waits for its client.
const QUEUE: usize = 64;

/// The events of one store batch go to the client joined in body chunks of up to this many
/// bytes: one HTTP/2 DATA frame and TLS record per chunk instead of per event (issue 36's
/// fan-out); 16 KiB is both HTTP/2's default largest frame and TLS's largest record.
const CHUNK_BYTES: usize = 16 * 1024;

/// A watch whose store connection breaks is opened again this many times in a row, this far
/// apart, before the client is told (with an ERROR event) to watch again itself.
pub(crate) const STORE_RETRIES: u32 = 50;
pub(crate) const STORE_RETRY_PAUSE: Duration = Duration::from_millis(100);

impl ApiServer {
    pub(crate) async fn watch(&self, call: &Call<'_>) -> Result<Reply, StatusError> {
        let options = ListOptions::parse(call.query.pairs())?;
        let (format, table_options) = call.format()?;
        let permit = self.admit(&self.watch_slots, &call.identity)?;
        let from = options.resource_version.filter(|revision| *revision > 0);
        let prefix = match &call.visibility {
            // A VM agent's watch of its own VM follows only that key: following the whole
            // prefix woke every agent's watch at every VM's write (issue 36: 5,000 watches x
            // every heartbeat, the control plane's core spent skipping other VMs' keys).
            Visibility::Own { name } => object_key(call.spec, None, name),
            _ => list_prefix(call.spec, call.request.namespace),
        };
        let watch = Watch {
            spec: call.spec.clone(),
            prefix,
            options,
            visibility: call.visibility.clone(),
            format,
            table_options,
            store: self.store.clone(),
            duration: self.watch_duration(call),
            bookmark_every: self.limits.bookmark_interval,
            events: WatchEventCounters::new(&self.metrics, &call.spec.plural),
            metrics: self.metrics.clone(),
            encoded: self.encoded.clone(),
        };
        let (sender, receiver) = mpsc::channel(QUEUE);
        if let Visibility::Span { vm, .. } = &call.visibility {
            self.span_watch(watch, vm.clone(), from, sender, permit)
                .await?;
            return Ok(Reply::Stream(receiver));
        }
        let (initial, after) = match from {
            // No version, or "0": the current state as ADDED events, then its changes.
            None => self.current_state(call, &watch.options).await?,
            Some(revision) => (Vec::new(), revision),
        };
        tokio::spawn(watch.run(initial, after, sender, permit));
        Ok(Reply::Stream(receiver))
    }

    async fn current_state(
        &self,
        call: &Call<'_>,
        options: &ListOptions,
    ) -> Result<(Vec<Value>, u64), StatusError> {
        let mut paging = options.clone();
        paging.limit = None;
        paging.resource_version = None;
        let mut objects = Vec::new();
        loop {
            let (items, page) = self.list_items(call, &paging).await?;
            objects.extend(items);
            match page.continue_token {
                Some(token) => {
                    paging.continue_token =
                        Some(sluice_apimachinery::list::ContinueToken::decode(&token)?)
                }
                None => return Ok((objects, page.resource_version)),
            }
        }
    }

    /// `timeoutSeconds` if given, else kube's default spread of 30 to 60 minutes (so watches
    /// opened together do not all end together), never more than the server's maximum.
    fn watch_duration(&self, call: &Call<'_>) -> Duration {
        let asked = call
            .query
            .get("timeoutSeconds")
            .and_then(|seconds| seconds.parse::<u64>().ok())
            .map(Duration::from_secs);
        let default = || {
            let mut byte = [0u8; 1];
            let spread = getrandom::getrandom(&mut byte).map_or(0, |()| byte[0] as u64);
            self.limits.watch_timeout + self.limits.watch_timeout * spread as u32 / 255
        };
        asked
            .unwrap_or_else(default)
            .min(self.limits.watch_timeout * 2)
    }
}

/// One open watch.
pub(crate) struct Watch {
    pub(crate) spec: KindSpec,
    /// The store prefix followed: the resource's (or one namespace's), or a VM agent's own
    /// object's key.
    pub(crate) prefix: String,
    pub(crate) options: ListOptions,
    pub(crate) visibility: Visibility,
    pub(crate) format: ResponseFormat,
    pub(crate) table_options: TableOptions,
    pub(crate) store: std::sync::Arc<dyn Store>,
    pub(crate) duration: Duration,
    /// The shortest time between two BOOKMARKs for progress alone.
    pub(crate) bookmark_every: Duration,
    pub(crate) metrics: super::metrics::ApiMetrics,
    /// Counted as each event is sent, so a watch that stays open shows its traffic.
    pub(crate) events: WatchEventCounters,
    pub(crate) encoded: std::sync::Arc<super::encoded::EncodedEvents>,
}

/// A watch's place in the watchers gauge, left however the watch ends.
pub(crate) struct OpenWatch {
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

impl Watch {
    pub(crate) fn open(&self) -> OpenWatch {
        let gauge = self
            .metrics
            .watchers
            .get_or_create(&ResourceLabels {
                resource: self.spec.plural.clone(),
            })
            .clone();
        gauge.inc();
        OpenWatch { gauge }
    }

    async fn run(
        self,
        initial: Vec<Value>,
        after: u64,
        sender: mpsc::Sender<Bytes>,
        _permit: Slot,
    ) {
        let _open = self.open();
        let mut first = true;
        let deadline = tokio::time::sleep(self.duration);
        tokio::pin!(deadline);
        let mut ok = true;
        for object in initial {
            ok = ok
                && self
                    .send(&sender, WatchEventType::Added, &object, &mut first)
                    .await;
        }
        let mut last = after;
        let mut outages = 0;
        let mut next_bookmark = tokio::time::Instant::now() + self.bookmark_every;
        let mut stream = self.store.watch(&self.prefix, after);
        while ok {
            let item = tokio::select! {
                _ = &mut deadline => break,
                _ = sender.closed() => break,
                item = stream.next() => item,
            };
            match item {
                None => break,
                Some(Ok(batch)) => {
                    outages = 0;
                    let revision = batch.revision;
                    let progress_only = batch.events.is_empty();
                    let now = tokio::time::Instant::now();
                    if progress_only && now < next_bookmark {
                        last = revision;
                        continue;
                    }
                    if progress_only {
                        next_bookmark = now + self.bookmark_every;
                    }
                    ok = self.deliver(batch, &sender, &mut first).await;
                    last = revision;
                }
                Some(Err(StoreError::Lagged { last_revision })) => {
                    last = last_revision;
                    stream = self.store.watch(&self.prefix, last);
                }
                // The store's connection broke (an etcd member died): its history is gap-free,
                // so watching again from the last revision loses nothing.
                Some(Err(StoreError::Unavailable { .. })) if outages < STORE_RETRIES => {
                    outages += 1;
                    tokio::time::sleep(STORE_RETRY_PAUSE).await;
                    stream = self.store.watch(&self.prefix, last);
                }
                Some(Err(error)) => {
                    let status = match error {
                        StoreError::Compacted { compact_revision } => {
                            StatusError::gone(last, compact_revision)
                        }
                        other => StatusError::new(
                            StatusReason::ServiceUnavailable,
                            format!("the store ended the watch: {other}"),
                        ),
                    };
                    let _ = sender.send(line(&error_event(&status))).await;
                    break;
                }
            }
        }
    }

    /// Sends a batch's events; an empty batch is a bookmark when the client allows them.
    async fn deliver(
        &self,
        batch: WatchBatch,
        sender: &mpsc::Sender<Bytes>,
        first: &mut bool,
    ) -> bool {
        if batch.events.is_empty() {
            if !self.options.allow_watch_bookmarks {
                return true;
            }
            let bookmark = line(&bookmark_event(&self.spec, batch.revision));
            return sender.send(bookmark).await.is_ok();
        }
        let shared = self.sends_every_change_unchanged();
        // A VM agent's watch of its own VM follows its key as a prefix (see `watch`): VMs
        // whose names extend this one's are skipped by key, before any decode.
        let own = matches!(self.visibility, Visibility::Own { .. });
        let mut chunks = Chunks::new(CHUNK_BYTES);
        for event in batch.events {
            if own && event.key() != self.prefix {
                continue;
            }
            let encoded = if shared {
                self.shared_line(&event)
            } else {
                self.translate(event).map(|(event_type, object)| {
                    (event_type, self.encode(event_type, &object, *first))
                })
            };
            let Some((event_type, line)) = encoded else {
                continue;
            };
            *first = false;
            if let Some(full) = chunks.push(line, event_type) {
                if !self.send_chunk(sender, full).await {
                    return false;
                }
            }
        }
        match chunks.take() {
            Some(last) => self.send_chunk(sender, last).await,
            None => true,
        }
    }

    /// Sends joined lines, counting their events once they are queued for the client.
    async fn send_chunk(&self, sender: &mpsc::Sender<Bytes>, chunk: Chunk) -> bool {
        let (bytes, event_types) = chunk;
        if sender.send(bytes).await.is_err() {
            return false;
        }
        event_types
            .into_iter()
            .for_each(|event_type| self.events.sent(event_type));
        true
    }

    /// Whether every change reaches this watcher as stored: no selectors, every object
    /// visible, the object format (Tables carry per-watch state).
    fn sends_every_change_unchanged(&self) -> bool {
        self.options.label_selector.requirements.is_empty()
            && self.options.field_selector.requirements.is_empty()
            && matches!(self.visibility, Visibility::All)
            && self.format == ResponseFormat::Object
    }

    /// The line of a change for a watcher that sees every change unchanged, encoded once for
    /// all of them. The same event [`Self::translate`] gives when every object passes.
    fn shared_line(&self, event: &Event) -> Option<(WatchEventType, Bytes)> {
        let (revision, key, event_type) = match event {
            Event::Put { kv, prev } => {
                let event_type = if prev.is_some() {
                    WatchEventType::Modified
                } else {
                    WatchEventType::Added
                };
                (kv.mod_revision, &kv.key, event_type)
            }
            Event::Delete { prev, revision } => (*revision, &prev.key, WatchEventType::Deleted),
        };
        let line = self
            .encoded
            .line((revision, key.clone(), event_type.as_str()), || {
                let mut object = match event {
                    Event::Put { kv, .. } => decode(kv).ok()?,
                    Event::Delete { prev, .. } => decode(prev).ok()?,
                };
                set_resource_version(&mut object, revision);
                Some(line(&watch_event(event_type, object)))
            })?;
        Some((event_type, line))
    }

    /// A store event as the client sees it through its selectors: an object that starts
    /// matching is ADDED, one that stops matching is DELETED.
    fn translate(&self, event: Event) -> Option<(WatchEventType, Value)> {
        let passes =
            |object: &Value| matches_selection(&self.spec, &self.visibility, &self.options, object);
        match event {
            Event::Put { kv, prev } => {
                let new = decode(&kv).ok()?;
                let old = prev.and_then(|prev| decode(&prev).ok());
                let was = old.as_ref().is_some_and(&passes);
                match (was, passes(&new)) {
                    (false, true) => Some((WatchEventType::Added, new)),
                    (true, true) => Some((WatchEventType::Modified, new)),
                    (true, false) => {
                        let mut old = old?;
                        set_resource_version(&mut old, kv.mod_revision);
                        Some((WatchEventType::Deleted, old))
                    }
                    (false, false) => None,
                }
            }
            Event::Delete { prev, revision } => {
                let mut old = decode(&prev).ok()?;
                set_resource_version(&mut old, revision);
                passes(&old).then_some((WatchEventType::Deleted, old))
            }
        }
    }

    pub(crate) async fn send(
        &self,
        sender: &mpsc::Sender<Bytes>,
        event_type: WatchEventType,
        object: &Value,
        first: &mut bool,
    ) -> bool {
        let encoded = self.encode(event_type, object, *first);
        *first = false;
        let sent = sender.send(encoded).await.is_ok();
        if sent {
            self.events.sent(event_type);
        }
        sent
    }

    /// The line of an event in the watch's format (a Table's first event carries its columns).
    fn encode(&self, event_type: WatchEventType, object: &Value, first: bool) -> Bytes {
        let event = match self.format {
            ResponseFormat::Object => watch_event(event_type, object.clone()),
            ResponseFormat::Table(_) => {
                table::table_watch_event(&self.spec, event_type, object, &self.table_options, first)
            }
        };
        line(&event)
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

pub(crate) fn line(event: &Value) -> Bytes {
    let mut bytes = serde_json::to_vec(event).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(chunk: &Chunk) -> Vec<&[u8]> {
        chunk.0.split_inclusive(|byte| *byte == b'\n').collect()
    }

    #[test]
    fn lines_are_joined_in_order_up_to_the_limit() {
        let mut chunks = Chunks::new(10);
        assert!(chunks
            .push(Bytes::from_static(b"abc\n"), WatchEventType::Added)
            .is_none());
        assert!(chunks
            .push(Bytes::from_static(b"de\n"), WatchEventType::Modified)
            .is_none());
        let full = chunks.push(Bytes::from_static(b"fghi\n"), WatchEventType::Deleted);
        let full = full.expect("the third line does not fit");
        assert_eq!(lines(&full), vec![&b"abc\n"[..], b"de\n"]);
        assert_eq!(
            full.1,
            vec![WatchEventType::Added, WatchEventType::Modified]
        );
        let last = chunks.take().expect("the third line is kept");
        assert_eq!(last.0, Bytes::from_static(b"fghi\n"));
        assert_eq!(last.1, vec![WatchEventType::Deleted]);
        assert!(chunks.take().is_none());
    }

    #[test]
    fn a_line_over_the_limit_is_a_chunk_of_its_own_and_a_lone_line_is_not_copied() {
        let mut chunks = Chunks::new(4);
        let long = Bytes::from(b"0123456789\n".to_vec());
        assert!(chunks.push(long.clone(), WatchEventType::Added).is_none());
        let full = chunks.push(Bytes::from_static(b"x\n"), WatchEventType::Added);
        let full = full.expect("the long line goes alone");
        assert_eq!(full.0.as_ptr(), long.as_ptr(), "passed on without a copy");
        let (rest, event_types) = chunks.take().expect("the short line is kept");
        assert_eq!((rest, event_types.len()), (Bytes::from_static(b"x\n"), 1));
    }

    #[test]
    fn a_chunk_never_exceeds_the_limit_unless_one_line_does() {
        let mut chunks = Chunks::new(CHUNK_BYTES);
        let mut sent = Vec::new();
        for n in 0..2_000usize {
            let line = Bytes::from(format!("{}\n", "x".repeat(n % 300)));
            sent.extend(chunks.push(line, WatchEventType::Modified));
        }
        sent.extend(chunks.take());
        assert!(sent.len() > 1);
        assert!(sent.iter().all(|(bytes, _)| bytes.len() <= CHUNK_BYTES));
        let events: usize = sent.iter().map(|(_, types)| types.len()).sum();
        let lines_sent: usize = sent.iter().map(|chunk| lines(chunk).len()).sum();
        assert_eq!((events, lines_sent), (2_000, 2_000));
    }
}
