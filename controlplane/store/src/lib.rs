//! The control plane's storage: an etcd-like MVCC key-value store behind one trait, [`Store`].
//!
//! Every write gets the next value of one store-wide revision counter; a key's `mod_revision` is
//! the revision of its last write and is what the API server hands out as `resourceVersion`. A
//! list can read the state as of an older revision (so paging with a continue token sees one
//! snapshot), a watch replays every change after a revision and then follows live changes, and
//! compaction drops history older than a revision. These are etcd v3's semantics on purpose: an
//! etcd backend maps them one to one (mod_revision, etcd watches, etcd compaction).
//!
//! [`EmbeddedStore`] is the default backend: a single MVCC log in a redb file, shaped like k3s'
//! kine (see `README.md` for the data model and why redb). [`EtcdStore`] keeps the same data in
//! an etcd v3 cluster, where revisions, watches and compaction are etcd's own.

#![warn(missing_docs)]

mod checks;
mod compactor;
mod embedded;
mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod types;

use std::pin::Pin;

use bytes::Bytes;
use futures_core::Stream;

pub use compactor::Compactor;
/// The log's row encoding, public for the fuzz target only (`fuzz/fuzz_targets/store_row.rs`):
/// a damaged store file must fail the request that reads the row, never the server.
#[doc(hidden)]
pub use embedded::Record as LogRow;
pub use embedded::{
    EmbeddedConfig, EmbeddedStore, DEFAULT_MAX_VALUE_BYTES, DEFAULT_PROGRESS_INTERVAL,
    DEFAULT_QUOTA_BYTES, DEFAULT_WATCH_BUFFER,
};
pub use error::{BoxError, QuotaFull, StoreError};
#[cfg(feature = "etcd")]
pub use etcd::{EtcdClientCert, EtcdConfig, EtcdOp, EtcdStats, EtcdStore, EtcdTls};
pub use types::{Event, KeyValue, ListPage, StoreUsage, WatchBatch};

/// The changes a watch delivers, in revision order, in batches; a batch without changes is a
/// progress notification (the watched keys did not change up to its revision).
///
/// After an `Err` item the stream ends; the error says how to go on ([`StoreError::Lagged`]:
/// watch again from its `last_revision`; [`StoreError::Compacted`]: list again).
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchBatch, StoreError>> + Send>>;

/// An MVCC key-value store with etcd v3 semantics, shared as `Arc<dyn Store>`.
///
/// Keys are opaque strings (the API server uses `/<group>/<resource>/[<namespace>/]<name>`),
/// values opaque bytes. Every write gets the next revision. An empty embedded store is at
/// revision 0 and its first write gets 1; etcd starts at its initial revision 1, and a cluster
/// shared with other users also moves it with their writes, so callers rely on order, never on
/// revisions being dense.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// The key's current value, or `None` when it does not exist.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError>;

    /// Up to `limit` keys under `prefix` in key order (0: no limit), strictly after
    /// `start_after` when given.
    ///
    /// `at_revision: None` reads the latest state and returns the store's current revision;
    /// `Some(r)` reads the state as of revision `r` (and returns `r`), so that the pages of one
    /// list see a single snapshot. [`StoreError::Compacted`] when `r` is older than the
    /// compaction point, [`StoreError::FutureRevision`] when it is newer than the store.
    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
        at_revision: Option<u64>,
    ) -> Result<ListPage, StoreError>;

    /// Creates `key`; [`StoreError::AlreadyExists`] when it exists.
    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue, StoreError>;

    /// Replaces the value of an existing `key`.
    ///
    /// With `expected_mod_revision: Some(r)` the write happens only if the key's mod_revision is
    /// `r`, else [`StoreError::Conflict`] carrying the current value. [`StoreError::NotFound`]
    /// when the key does not exist.
    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected_mod_revision: Option<u64>,
    ) -> Result<KeyValue, StoreError>;

    /// Deletes `key` and returns the value it had; preconditions and errors as for
    /// [`Store::update`].
    async fn delete(
        &self,
        key: &str,
        expected_mod_revision: Option<u64>,
    ) -> Result<KeyValue, StoreError>;

    /// Every change under `prefix` with a revision greater than `after_revision`, in revision
    /// order, without gap or duplicate between the replayed history and the live changes.
    ///
    /// A watch that saw no change for a while reports its progress with an empty batch (etcd's
    /// progress notification). Errors arrive as stream items: [`StoreError::Compacted`] when `after_revision` is older
    /// than the compaction point, [`StoreError::Lagged`] when the watcher fell too far behind.
    fn watch(&self, prefix: &str, after_revision: u64) -> WatchStream;

    /// The revision of the last write (0 for an empty store).
    async fn current_revision(&self) -> Result<u64, StoreError>;

    /// The compaction point: history at or before it is gone (0 when never compacted).
    async fn compact_revision(&self) -> Result<u64, StoreError>;

    /// Drops the history superseded at `revision`: afterwards lists at revisions `>= revision`
    /// and watches after revisions `>= revision` still work, older ones get
    /// [`StoreError::Compacted`]. Current values always stay. Compacting to a revision at or
    /// before the compaction point does nothing; past the current revision is
    /// [`StoreError::FutureRevision`].
    async fn compact(&self, revision: u64) -> Result<(), StoreError>;

    /// How full the store is, when the backend counts it (the embedded store does; etcd
    /// reports its own `etcd_mvcc_db_total_size_in_bytes`). Cheap: no I/O.
    fn usage(&self) -> Option<StoreUsage> {
        None
    }
}
