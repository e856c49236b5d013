//! WATCH: the objects' changes after a resourceVersion as newline-delimited JSON events, from
//! the store's gap-free watch. Each watch is its response body ([`Following`]); a slow client
//! slows only its own watch (the store cuts a lagging watcher, which resumes from history
//! without the client noticing). A VM agent's watch follows the span view instead
//! (`span_watch.rs`), as a task with a bounded queue to its client.

use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use sluice_apimachinery::list::{watch_event, WatchEventType};
use sluice_apimachinery::meta::set_resource_version;
use sluice_apimachinery::options::ListOptions;
use sluice_apimachinery::table::{self, ResponseFormat, TableOptions};
use sluice_apimachinery::{KindSpec, StatusError};
use sluice_store::{Event, Store};
use tokio::sync::mpsc;

use super::keys::{list_prefix, object_key};
use super::metrics::{ResourceLabels, WatchEventCounters};
use super::objects::{decode, matches_selection, Call};
use super::reply::Reply;
use super::visibility::Visibility;
use super::watch_body::Following;
use super::ApiServer;

/// Encoded events queued per VM agent's watch before the watch waits for its client.
const QUEUE: usize = 64;

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
        if let Visibility::Span { vm, .. } = &call.visibility {
            let (sender, receiver) = mpsc::channel(QUEUE);
            self.span_watch(watch, vm.clone(), from, sender, permit)
                .await?;
            return Ok(Reply::Stream(super::reply::received(receiver)));
        }
        let (initial, after) = match from {
            // No version, or "0": the current state as ADDED events, then its changes.
            None => self.current_state(call, &watch.options).await?,
            Some(revision) => (Vec::new(), revision),
        };
        let following = Following::new(watch, initial, after, permit);
        Ok(Reply::Stream(Box::pin(following)))
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

    /// Whether every change reaches this watcher as stored: no selectors, every object
    /// visible, the object format (Tables carry per-watch state).
    pub(super) fn sends_every_change_unchanged(&self) -> bool {
        self.options.label_selector.requirements.is_empty()
            && self.options.field_selector.requirements.is_empty()
            && matches!(self.visibility, Visibility::All)
            && self.format == ResponseFormat::Object
    }

    /// The line of a change for a watcher that sees every change unchanged, encoded once for
    /// all of them. The same event [`Self::translate`] gives when every object passes.
    pub(super) fn shared_line(&self, event: &Event) -> Option<(WatchEventType, Bytes)> {
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
    pub(super) fn translate(&self, event: Event) -> Option<(WatchEventType, Value)> {
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
    pub(super) fn encode(&self, event_type: WatchEventType, object: &Value, first: bool) -> Bytes {
        let event = match self.format {
            ResponseFormat::Object => watch_event(event_type, object.clone()),
            ResponseFormat::Table(_) => {
                table::table_watch_event(&self.spec, event_type, object, &self.table_options, first)
            }
        };
        line(&event)
    }
}

pub(crate) fn line(event: &Value) -> Bytes {
    let mut bytes = serde_json::to_vec(event).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}
