//! The events one replica records, as plain data: repeats of one occurrence aggregate into one
//! Event (count, first and last timestamps), the book holds at most `per_namespace` and
//! `total` of them (the oldest evicted first) and drops those older than the TTL, and a token
//! bucket bounds how many store writes the events cost. No I/O and no clock: `now` is an
//! argument, so the tests are tables.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use sluice_apimachinery::timestamp::format_rfc3339;

use crate::kinds::{MAX_MESSAGE, MAX_REASON};

/// The namespace of the events about cluster-scoped objects (kube's choice too).
pub const CLUSTER_EVENTS_NAMESPACE: &str = "default";

/// How many events, for how long, at what write rate.
#[derive(Debug, Clone, PartialEq)]
pub struct EventLimits {
    /// Events kept per namespace; past it the oldest is evicted.
    pub per_namespace: usize,
    /// Events kept in all; past it the oldest is evicted.
    pub total: usize,
    /// An event not repeated for this long is deleted (kube-apiserver's `--event-ttl`: 1 h).
    pub ttl: Duration,
    /// Occurrences waiting for the writer; past it they are dropped and counted.
    pub queue: usize,
    /// Store writes per second the events may cost, and the burst.
    pub writes_per_second: u32,
    pub write_burst: u32,
}

impl Default for EventLimits {
    fn default() -> Self {
        Self {
            per_namespace: 1000,
            total: 5000,
            ttl: Duration::from_secs(3600),
            queue: 1024,
            writes_per_second: 20,
            write_burst: 100,
        }
    }
}

/// `Normal` or `Warning`, as kube's event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// The object an event is about (`involvedObject`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Involved {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    /// `None` for a cluster-scoped object (its events live in [`CLUSTER_EVENTS_NAMESPACE`]).
    pub namespace: Option<String>,
    /// Empty when not known (a refused create).
    pub uid: String,
}

/// One thing that happened, before aggregation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Occurrence {
    pub involved: Involved,
    pub event_type: EventType,
    pub reason: String,
    pub message: String,
    /// The component that saw it (`source.component`, `reportingComponent`).
    pub component: &'static str,
}

impl Occurrence {
    /// Bounded as kube bounds them: reason 128 bytes, message 1 KiB, names 253.
    pub fn new(
        involved: Involved,
        event_type: EventType,
        reason: &str,
        message: &str,
        component: &'static str,
    ) -> Self {
        let mut involved = involved;
        involved.name = truncated(&involved.name, 253);
        involved.kind = truncated(&involved.kind, 253);
        Self {
            involved,
            event_type,
            reason: truncated(reason, MAX_REASON),
            message: truncated(message, MAX_MESSAGE),
            component,
        }
    }

    fn namespace(&self) -> &str {
        self.involved
            .namespace
            .as_deref()
            .unwrap_or(CLUSTER_EVENTS_NAMESPACE)
    }
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn truncated(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// One aggregated event.
#[derive(Debug, Clone)]
struct Entry {
    name: String,
    uid: String,
    occurrence: Occurrence,
    count: u32,
    first: SystemTime,
    last: SystemTime,
    /// The store revision of the last write of it (`None`: not written yet).
    revision: Option<u64>,
    /// Changed since it was last written.
    dirty: bool,
}

/// A store write the book asks for: the event as it should be stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub namespace: String,
    pub name: String,
    /// `None`: create it; `Some(r)`: replace the one stored at revision `r`.
    pub revision: Option<u64>,
    pub object: Value,
}

/// An event to delete, and why (a metric label).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    pub namespace: String,
    pub name: String,
    /// `None` when it was never written (nothing to delete in the store).
    pub revision: Option<u64>,
    pub reason: &'static str,
}

/// The events of one replica.
#[derive(Debug)]
pub struct EventBook {
    limits: EventLimits,
    /// Who writes them (`source.host`, `reportingInstance`).
    instance: String,
    entries: HashMap<Occurrence, Entry>,
    /// Names made so far, to keep two events of one object in one nanosecond apart.
    sequence: u64,
    tokens: f64,
    refilled: Option<SystemTime>,
}

impl EventBook {
    pub fn new(limits: EventLimits, instance: &str) -> Self {
        let tokens = f64::from(limits.write_burst);
        Self {
            limits,
            instance: instance.to_string(),
            entries: HashMap::new(),
            sequence: 0,
            tokens,
            refilled: None,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds one occurrence: a repeat counts up its event, a new one may evict the oldest of
    /// its namespace or of all (returned, to delete). `uid` names a new event.
    pub fn record(
        &mut self,
        occurrence: Occurrence,
        now: SystemTime,
        uid: impl FnOnce() -> String,
    ) -> Vec<Eviction> {
        if let Some(entry) = self.entries.get_mut(&occurrence) {
            entry.count = entry.count.saturating_add(1);
            entry.last = now.max(entry.last);
            entry.dirty = true;
            return Vec::new();
        }
        let mut evicted = Vec::new();
        let namespace = occurrence.namespace().to_string();
        while self.count_in(&namespace) >= self.limits.per_namespace.max(1) {
            evicted.extend(self.evict_oldest(Some(&namespace), "cap"));
        }
        while self.entries.len() >= self.limits.total.max(1) {
            evicted.extend(self.evict_oldest(None, "cap"));
        }
        self.sequence += 1;
        let name = event_name(&occurrence.involved.name, now, self.sequence);
        let entry = Entry {
            name,
            uid: uid(),
            occurrence: occurrence.clone(),
            count: 1,
            first: now,
            last: now,
            revision: None,
            dirty: true,
        };
        self.entries.insert(occurrence, entry);
        evicted
    }

    fn count_in(&self, namespace: &str) -> usize {
        self.entries
            .keys()
            .filter(|occurrence| occurrence.namespace() == namespace)
            .count()
    }

    fn evict_oldest(&mut self, namespace: Option<&str>, reason: &'static str) -> Option<Eviction> {
        let oldest = self
            .entries
            .iter()
            .filter(|(occurrence, _)| namespace.is_none_or(|ns| occurrence.namespace() == ns))
            .min_by_key(|(_, entry)| (entry.last, entry.name.clone()))
            .map(|(occurrence, _)| occurrence.clone())?;
        let entry = self.entries.remove(&oldest)?;
        Some(eviction(&entry, reason))
    }

    /// The events not repeated within the TTL, removed from the book.
    pub fn expire(&mut self, now: SystemTime) -> Vec<Eviction> {
        let ttl = self.limits.ttl;
        let expired: Vec<Occurrence> = self
            .entries
            .iter()
            .filter(|(_, entry)| now.duration_since(entry.last).is_ok_and(|age| age >= ttl))
            .map(|(occurrence, _)| occurrence.clone())
            .collect();
        expired
            .into_iter()
            .filter_map(|occurrence| self.entries.remove(&occurrence))
            .map(|entry| eviction(&entry, "ttl"))
            .collect()
    }

    /// The changed events to write now, as many as the write budget allows (the oldest
    /// changes first); the rest stay changed for a later call. Each is marked written: the
    /// caller reports the outcome with [`EventBook::written`] or [`EventBook::failed`].
    pub fn writes(&mut self, now: SystemTime) -> Vec<Write> {
        self.refill(now);
        let mut dirty: Vec<&mut Entry> = self.entries.values_mut().filter(|e| e.dirty).collect();
        dirty.sort_by_key(|entry| (entry.last, entry.name.clone()));
        let allowed = self.tokens.floor().max(0.0) as usize;
        let mut writes = Vec::new();
        for entry in dirty.into_iter().take(allowed) {
            entry.dirty = false;
            writes.push(Write {
                namespace: entry.occurrence.namespace().to_string(),
                name: entry.name.clone(),
                revision: entry.revision,
                object: event_object(entry, &self.instance),
            });
        }
        self.tokens -= writes.len() as f64;
        writes
    }

    fn refill(&mut self, now: SystemTime) {
        let elapsed = self
            .refilled
            .and_then(|then| now.duration_since(then).ok())
            .unwrap_or_default();
        self.refilled = Some(now);
        let burst = f64::from(self.limits.write_burst);
        let rate = f64::from(self.limits.writes_per_second);
        self.tokens = (self.tokens + elapsed.as_secs_f64() * rate).min(burst);
    }

    /// A write of the event `name` landed at `revision`.
    pub fn written(&mut self, name: &str, revision: u64) {
        if let Some(entry) = self.entries.values_mut().find(|e| e.name == name) {
            entry.revision = Some(revision);
        }
    }

    /// A write of `name` failed; what is stored now decides the next try.
    pub fn failed(&mut self, name: &str, stored: Stored) {
        let Some(entry) = self.entries.values_mut().find(|e| e.name == name) else {
            return;
        };
        match stored {
            // Deleted (by an admin, or by the sweep): the next write creates it again.
            Stored::Gone => {
                entry.revision = None;
                entry.dirty = true;
            }
            // Changed by another writer: the next write replaces that version.
            Stored::At(revision) => {
                entry.revision = Some(revision);
                entry.dirty = true;
            }
            // The store failed: this change is dropped (counted), the next repeat retries.
            Stored::Unknown => {}
        }
    }
}

/// What the store holds of an event whose write failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    Gone,
    At(u64),
    Unknown,
}

fn eviction(entry: &Entry, reason: &'static str) -> Eviction {
    Eviction {
        namespace: entry.occurrence.namespace().to_string(),
        name: entry.name.clone(),
        revision: entry.revision,
        reason,
    }
}

/// kube's event name: the object's name, a dot, a hex stamp; the object part made a DNS
/// subdomain whatever the refused request named (the events of a hostile name stay readable).
fn event_name(object: &str, now: SystemTime, sequence: u64) -> String {
    let mut base: String = object
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .take(200)
        .collect();
    base = base.trim_matches(|c| c == '-' || c == '.').to_string();
    if base.is_empty() {
        base = "object".into();
    }
    let nanos = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64);
    format!("{base}.{:x}", nanos.wrapping_add(sequence))
}

/// The stored form: core v1 Event, as kube's recorder writes it.
fn event_object(entry: &Entry, instance: &str) -> Value {
    let occurrence = &entry.occurrence;
    let involved = &occurrence.involved;
    let mut involved_object = json!({
        "apiVersion": involved.api_version, "kind": involved.kind, "name": involved.name,
    });
    if let Some(namespace) = &involved.namespace {
        involved_object["namespace"] = json!(namespace);
    }
    if !involved.uid.is_empty() {
        involved_object["uid"] = json!(involved.uid);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": entry.name,
            "namespace": occurrence.namespace(),
            "uid": entry.uid,
            "creationTimestamp": format_rfc3339(entry.first),
        },
        "involvedObject": involved_object,
        "reason": occurrence.reason,
        "message": occurrence.message,
        "type": occurrence.event_type.as_str(),
        "source": {"component": occurrence.component, "host": instance},
        "firstTimestamp": format_rfc3339(entry.first),
        "lastTimestamp": format_rfc3339(entry.last),
        "count": entry.count,
        "reportingComponent": occurrence.component,
        "reportingInstance": instance,
    })
}

/// A stored event as the sweep sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    pub key: String,
    pub namespace: String,
    /// `lastTimestamp`, else `creationTimestamp`; `None` when neither parses.
    pub last: Option<SystemTime>,
}

/// The stored events to delete: older than the TTL (or without a time), then the oldest past
/// each namespace's cap and past the total cap. Covers what the book cannot see: events of an
/// earlier run, of other replicas, or written by an admin.
pub fn sweep(events: &[StoredEvent], limits: &EventLimits, now: SystemTime) -> Vec<String> {
    let fresh = |event: &&StoredEvent| {
        event.last.is_some_and(|last| {
            now.duration_since(last)
                .map_or(true, |age| age < limits.ttl)
        })
    };
    let mut doomed: Vec<String> = events
        .iter()
        .filter(|event| !fresh(event))
        .map(|event| event.key.clone())
        .collect();
    let mut kept: Vec<&StoredEvent> = events.iter().filter(fresh).collect();
    // Newest first, so what is past a cap is the oldest.
    kept.sort_by(|a, b| b.last.cmp(&a.last).then_with(|| a.key.cmp(&b.key)));
    let mut per_namespace: BTreeMap<&str, usize> = BTreeMap::new();
    let mut total = 0;
    for event in kept {
        let in_namespace = per_namespace.entry(&event.namespace).or_default();
        if *in_namespace >= limits.per_namespace || total >= limits.total {
            doomed.push(event.key.clone());
            continue;
        }
        *in_namespace += 1;
        total += 1;
    }
    doomed
}

#[cfg(test)]
#[path = "book_tests.rs"]
mod tests;
