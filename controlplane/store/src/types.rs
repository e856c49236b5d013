//! The values a store hands out: a key's state, a list page, a change.

use bytes::Bytes;

/// A key's state at some revision, as etcd's `mvccpb.KeyValue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key, as given to the store.
    pub key: String,
    /// The value, opaque to the store.
    pub value: Bytes,
    /// The revision that created the key (since its last deletion).
    pub create_revision: u64,
    /// The revision of the key's last write: the object's `resourceVersion`.
    pub mod_revision: u64,
    /// How many writes the key has had since its creation (1 after create).
    pub version: u64,
}

/// One page of a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPage {
    /// The keys, in key order.
    pub items: Vec<KeyValue>,
    /// The revision the page was read at: pass it as `at_revision` for the next page, and
    /// as `after_revision` to a watch that follows this list.
    pub revision: u64,
    /// Whether more keys under the prefix follow the last item.
    pub more: bool,
}

/// What a watch delivers at once: changes, or only progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchBatch {
    /// The changes, in revision order; empty for a progress notification.
    pub events: Vec<Event>,
    /// Every change under the watched prefix up to this revision has now been delivered (etcd's
    /// response header revision): the revision to resume from, and what the API server puts in
    /// a BOOKMARK when `events` is empty.
    pub revision: u64,
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The key was created (`prev: None`) or updated (`prev`: the value it replaced).
    Put {
        /// The key's new state; its `mod_revision` is the change's revision.
        kv: KeyValue,
        /// The state it replaced, `None` for a creation.
        prev: Option<KeyValue>,
    },
    /// The key was deleted.
    Delete {
        /// The state the key had before the deletion.
        prev: KeyValue,
        /// The revision of the deletion.
        revision: u64,
    },
}

impl Event {
    /// The revision of the change.
    pub fn revision(&self) -> u64 {
        match self {
            Event::Put { kv, .. } => kv.mod_revision,
            Event::Delete { revision, .. } => *revision,
        }
    }

    /// The key that changed.
    pub fn key(&self) -> &str {
        match self {
            Event::Put { kv, .. } => &kv.key,
            Event::Delete { prev, .. } => &prev.key,
        }
    }
}

/// How full a store is, for its size and quota gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreUsage {
    /// Bytes stored: live values and the history kept until compaction, with their keys.
    pub used_bytes: u64,
    /// Past this, creates and updates are refused with [`crate::StoreError::QuotaExceeded`].
    pub quota_bytes: u64,
}
