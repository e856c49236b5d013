//! Events the control plane records about its objects (core `v1 Event`s, read with `kubectl
//! get events` and `kubectl describe`): the VMManager's state changes, writes refused as
//! invalid, too large, over a write budget or over the store's quota.
//!
//! Recording never waits and never fails the operation it describes: [`Recorder::record`] puts
//! the occurrence on a bounded queue (full: dropped and counted), and one writer task per
//! replica aggregates repeats ([`book`]), writes at a bounded rate straight to the store (no
//! request, no write budget), deletes what is past the caps or the TTL, and sweeps the stored
//! events every minute for those it does not know (earlier runs, other replicas).

pub mod book;
mod refusals;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use sluice_store::{Store, StoreError};
use tokio::sync::{mpsc, watch};

use crate::auth::Role;
use crate::server::write_budget::reserve_refusal;

pub use book::{
    EventBook, EventLimits, EventType, Eviction, Involved, Occurrence, Stored, StoredEvent,
    CLUSTER_EVENTS_NAMESPACE,
};
pub use refusals::refusal;

/// How often changed events are written (repeats within it cost one write).
const FLUSH_INTERVAL: Duration = Duration::from_millis(250);
/// How often the stored events are swept for those past the TTL or the caps.
const SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// The prefix of every stored event (the core group's key layout).
const EVENTS_PREFIX: &str = "/registry/events/";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

/// `sluice_controlplane_events_*`.
#[derive(Debug, Clone, Default)]
pub struct EventMetrics {
    pub recorded: Counter,
    pub dropped: Family<ReasonLabels, Counter>,
    pub evicted: Family<ReasonLabels, Counter>,
    pub held: Gauge,
}

impl EventMetrics {
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
        let metrics = Self::default();
        // Every reason is present from the start, so a rate() sees 0 rather than nothing.
        for reason in ["queue_full", "store_full", "store_error", "stopped"] {
            let _ = metrics.dropped.get_or_create(&ReasonLabels { reason });
        }
        for reason in ["cap", "ttl", "sweep"] {
            let _ = metrics.evicted.get_or_create(&ReasonLabels { reason });
        }
        registry.register(
            "sluice_controlplane_events_recorded",
            "Occurrences queued for an Event (repeats included)",
            metrics.recorded.clone(),
        );
        registry.register(
            "sluice_controlplane_events_dropped",
            "Occurrences or Event writes lost, by reason (queue_full, store_full, store_error, stopped)",
            metrics.dropped.clone(),
        );
        registry.register(
            "sluice_controlplane_events_evicted",
            "Events deleted, by reason (cap, ttl: this replica's own; sweep: any stored event past the TTL or a cap)",
            metrics.evicted.clone(),
        );
        registry.register(
            "sluice_controlplane_events",
            "Events this replica holds (aggregated, within the caps)",
            metrics.held.clone(),
        );
        metrics
    }

    fn drop(&self, reason: &'static str) {
        self.dropped.get_or_create(&ReasonLabels { reason }).inc();
    }
}

/// Where occurrences go; cheap to clone, never blocks.
#[derive(Debug, Clone)]
pub struct Recorder {
    sender: mpsc::Sender<Occurrence>,
    metrics: EventMetrics,
}

impl Recorder {
    /// A recorder and the queue its writer reads.
    pub fn new(limits: &EventLimits, metrics: EventMetrics) -> (Self, mpsc::Receiver<Occurrence>) {
        let (sender, receiver) = mpsc::channel(limits.queue.max(1));
        (Self { sender, metrics }, receiver)
    }

    /// Queues one occurrence; a full queue drops it (counted).
    pub fn record(&self, occurrence: Occurrence) {
        match self.sender.try_send(occurrence) {
            Ok(()) => {
                self.metrics.recorded.inc();
            }
            Err(mpsc::error::TrySendError::Full(_)) => self.metrics.drop("queue_full"),
            Err(mpsc::error::TrySendError::Closed(_)) => self.metrics.drop("stopped"),
        }
    }
}

/// The writer of one replica: runs until `stop` turns true.
pub async fn write_events(
    store: Arc<dyn Store>,
    limits: EventLimits,
    metrics: EventMetrics,
    instance: String,
    mut queue: mpsc::Receiver<Occurrence>,
    mut stop: watch::Receiver<bool>,
) {
    let mut book = EventBook::new(limits.clone(), &instance);
    let mut flush = tokio::time::interval(FLUSH_INTERVAL);
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sweeping = tokio::time::interval(SWEEP_INTERVAL);
    sweeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // The select only picks; the awaits run after it (a watch::Ref is not Send).
        let step = tokio::select! {
            _ = stop.wait_for(|stopped| *stopped) => Step::Stop,
            received = queue.recv() => received.map_or(Step::Stop, Step::Record),
            _ = flush.tick() => Step::Flush,
            _ = sweeping.tick() => Step::Sweep,
        };
        match step {
            Step::Stop => return,
            Step::Record(occurrence) => {
                let now = SystemTime::now();
                let mut evicted = book.record(occurrence, now, new_uid);
                // Whatever else is queued joins this write.
                while let Ok(more) = queue.try_recv() {
                    evicted.extend(book.record(more, now, new_uid));
                }
                delete(store.as_ref(), &metrics, evicted).await;
            }
            Step::Flush => {
                let expired = book.expire(SystemTime::now());
                delete(store.as_ref(), &metrics, expired).await;
            }
            Step::Sweep => sweep(store.as_ref(), &limits, &metrics).await,
        }
        write(store.as_ref(), &mut book, &metrics).await;
        metrics.held.set(book.len() as i64);
    }
}

enum Step {
    Stop,
    Record(Occurrence),
    Flush,
    Sweep,
}

async fn write(store: &dyn Store, book: &mut EventBook, metrics: &EventMetrics) {
    for write in book.writes(SystemTime::now()) {
        let key = format!("{EVENTS_PREFIX}{}/{}", write.namespace, write.name);
        let bytes = bytes::Bytes::from(serde_json::to_vec(&write.object).unwrap_or_default());
        // Events never write into the store's system reserve: past the share vm-agents may
        // fill, they are dropped (the admin, nodes and gateways keep the room they need).
        if reserve_refusal(Role::VmAgent, store.usage(), bytes.len()).is_some() {
            metrics.drop("store_full");
            book.failed(&write.name, Stored::Unknown);
            continue;
        }
        let outcome = match write.revision {
            None => store.create(&key, bytes).await,
            Some(revision) => store.update(&key, bytes, Some(revision)).await,
        };
        match outcome {
            Ok(stored) => book.written(&write.name, stored.mod_revision),
            Err(error) => {
                let stored = match error {
                    StoreError::NotFound { .. } => Stored::Gone,
                    StoreError::Conflict { current } => Stored::At(current.mod_revision),
                    other => {
                        tracing::debug!(%other, key, "an event was not written");
                        metrics.drop("store_error");
                        Stored::Unknown
                    }
                };
                book.failed(&write.name, stored);
            }
        }
    }
}

async fn delete(store: &dyn Store, metrics: &EventMetrics, evictions: Vec<Eviction>) {
    for eviction in evictions {
        metrics
            .evicted
            .get_or_create(&ReasonLabels {
                reason: eviction.reason,
            })
            .inc();
        if let Some(revision) = eviction.revision {
            let key = format!("{EVENTS_PREFIX}{}/{}", eviction.namespace, eviction.name);
            // Changed since (another writer) or gone: the sweep judges it later.
            let _ = store.delete(&key, Some(revision)).await;
        }
    }
}

/// Deletes the stored events [`book::sweep`] picks; a store error leaves them to the next.
async fn sweep(store: &dyn Store, limits: &EventLimits, metrics: &EventMetrics) {
    let mut events = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let Ok(page) = store
            .list(EVENTS_PREFIX, after.as_deref(), 1000, None)
            .await
        else {
            return;
        };
        for row in &page.items {
            events.push(stored_event(row));
        }
        after = page.items.last().map(|row| row.key.clone());
        if !page.more || after.is_none() {
            break;
        }
    }
    let now = SystemTime::now();
    for key in book::sweep(&events, limits, now) {
        if store.delete(&key, None).await.is_ok() {
            metrics
                .evicted
                .get_or_create(&ReasonLabels { reason: "sweep" })
                .inc();
        }
    }
}

fn stored_event(row: &sluice_store::KeyValue) -> StoredEvent {
    let object: serde_json::Value = serde_json::from_slice(&row.value).unwrap_or_default();
    let namespace = row
        .key
        .strip_prefix(EVENTS_PREFIX)
        .and_then(|rest| rest.split_once('/'))
        .map_or("", |(namespace, _)| namespace)
        .to_string();
    let time = |field: &str| {
        object
            .pointer(field)
            .and_then(serde_json::Value::as_str)
            .and_then(sluice_apimachinery::timestamp::parse_rfc3339)
    };
    StoredEvent {
        key: row.key.clone(),
        namespace,
        last: time("/lastTimestamp").or_else(|| time("/metadata/creationTimestamp")),
    }
}

/// A random (version 4) UUID for a new event.
fn new_uid() -> String {
    let mut bytes = [0u8; 16];
    let _ = getrandom::getrandom(&mut bytes);
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}
