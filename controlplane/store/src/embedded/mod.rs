//! The embedded backend: an MVCC log in one redb file, shaped like k3s' kine.
//!
//! Why redb: it is pure Rust (no C toolchain, unlike SQLite or RocksDB bindings), ACID with
//! crash-safe copy-on-write B-trees and durable commits (fsync on commit), lets readers run
//! on snapshots concurrently with the single writer, has a stable file format, and is actively
//! maintained. Its single-writer model matches the log exactly: one write = one revision.
//!
//! Blocking redb calls run on tokio's blocking pool. Writes are serialized by a lock held from
//! the start of the transaction until the change is handed to the watchers, so watchers see
//! changes in revision order.
//!
//! Writes that arrive while another commits are committed together (group commit): the writer
//! that next takes the lock applies every queued write in one transaction, one revision each,
//! and pays one fsync for all of them; each caller still gets its answer only once its write
//! is durable. One fsync per write capped the store at a few hundred writes per second on this
//! machine's disk (issue 36: thousands of VM agents heartbeating, 10,000 watchers of writes
//! taking seconds to commit).

mod compact;
mod history;
mod hub;
mod record;

#[doc(hidden)]
pub use record::Record;
mod tables;
mod watch;
mod write;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use redb::{Database, ReadableDatabase};

use self::hub::Hub;
use self::tables::{backend, ListQuery, INDEX, LOG, LOG_BYTES, META};
use self::write::WriteOp;
use crate::error::StoreError;
use crate::types::{KeyValue, ListPage, StoreUsage};
use crate::{Store, WatchStream};

/// etcd's default request size limit (`--max-request-bytes`), so objects that fit one fit both.
pub const DEFAULT_MAX_VALUE_BYTES: usize = 1536 * 1024;
/// Changes a watcher may have queued before it is cut with [`StoreError::Lagged`].
pub const DEFAULT_WATCH_BUFFER: usize = 1024;
/// How long a live watch waits without a change before it reports its progress.
pub const DEFAULT_PROGRESS_INTERVAL: Duration = Duration::from_secs(10);
/// etcd's default `--quota-backend-bytes` (2 GiB): a disk that holds etcd's default holds
/// this store.
pub const DEFAULT_QUOTA_BYTES: u64 = 2 * 1024 * 1024 * 1024;

/// Limits of an [`EmbeddedStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedConfig {
    /// Larger values are refused with [`StoreError::ValueTooLarge`].
    pub max_value_bytes: usize,
    /// Live changes queued per watcher before it is cut with [`StoreError::Lagged`].
    pub watch_buffer: usize,
    /// A live watch without changes for this long sends an empty batch with its revision, if
    /// the store moved on (at least 1 ms).
    pub progress_interval: Duration,
    /// Bytes of log rows (live values and the history kept until compaction, with their keys)
    /// past which creates and updates are refused with [`StoreError::QuotaExceeded`], as
    /// etcd's `--quota-backend-bytes`; deletes still pass.
    pub quota_bytes: u64,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        EmbeddedConfig {
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            watch_buffer: DEFAULT_WATCH_BUFFER,
            progress_interval: DEFAULT_PROGRESS_INTERVAL,
            quota_bytes: DEFAULT_QUOTA_BYTES,
        }
    }
}

/// What the store's handle and its watch streams share.
#[derive(Debug)]
pub(crate) struct Inner {
    db: Database,
    hub: Hub,
    /// Held from a write's transaction to its publication (see the module comment).
    write_lock: Mutex<()>,
    /// Writes waiting for the next group commit.
    queued: Mutex<Vec<write::Queued>>,
    config: EmbeddedConfig,
    /// The log's bytes as last committed (the quota gauge reads it without I/O).
    log_bytes: AtomicU64,
}

/// The embedded [`Store`]: a redb file holding the MVCC log (see the crate's `README.md`).
///
/// Dropping it ends every watch's live feed; the file closes when the last watch stream is
/// dropped too.
#[derive(Debug)]
pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

impl EmbeddedStore {
    /// Opens (or creates) the store at `path` with the default limits. Blocks on file I/O:
    /// call it at start-up or from a blocking task.
    pub fn open(path: impl AsRef<Path>) -> Result<EmbeddedStore, StoreError> {
        EmbeddedStore::open_with(path, EmbeddedConfig::default())
    }

    /// Opens (or creates) the store at `path` with `config`.
    pub fn open_with(
        path: impl AsRef<Path>,
        config: EmbeddedConfig,
    ) -> Result<EmbeddedStore, StoreError> {
        let db = Database::create(path).map_err(backend)?;
        // Creating the tables up front lets every read transaction open them.
        let txn = db.begin_write().map_err(backend)?;
        let log = txn.open_table(LOG).map_err(backend)?;
        txn.open_table(INDEX).map_err(backend)?;
        let mut meta = txn.open_table(META).map_err(backend)?;
        let revisions = tables::revisions(&meta)?;
        let log_bytes = match tables::log_bytes(&meta)? {
            Some(bytes) => bytes,
            None => {
                let counted = tables::count_log_bytes(&log)?;
                meta.insert(LOG_BYTES, counted).map_err(backend)?;
                counted
            }
        };
        drop((log, meta));
        txn.commit().map_err(backend)?;
        let inner = Inner {
            db,
            hub: Hub::new(revisions.current),
            write_lock: Mutex::new(()),
            queued: Mutex::new(Vec::new()),
            config,
            log_bytes: AtomicU64::new(log_bytes),
        };
        Ok(EmbeddedStore {
            inner: Arc::new(inner),
        })
    }

    /// How many watchers currently follow live changes.
    pub fn live_watchers(&self) -> usize {
        self.inner.hub.watcher_count()
    }

    async fn write(&self, key: &str, op: WriteOp) -> Result<KeyValue, StoreError> {
        let value = match &op {
            WriteOp::Create { value } | WriteOp::Update { value, .. } => Some(value),
            WriteOp::Delete { .. } => None,
        };
        crate::checks::check_write(key, value, self.inner.config.max_value_bytes)?;
        let inner = self.inner.clone();
        let key = key.to_owned();
        blocking(move || inner.write(&key, op)).await
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        self.inner.hub.close();
    }
}

impl Inner {
    /// Commits one write (with whatever others are queued) and hands its change to the
    /// watchers; returns the key's new state (the deleted state for a deletion).
    fn write(&self, key: &str, op: WriteOp) -> Result<KeyValue, StoreError> {
        let (queued, answer) = write::Queued::new(key, op);
        self.queued
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(queued);
        let _serialized = self
            .write_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Queued writes are taken only under the lock: either an earlier holder committed this
        // one (its answer is waiting), or it is still in the queue for this holder.
        if let Ok(answered) = answer.try_recv() {
            return answered;
        }
        let batch =
            std::mem::take(&mut *self.queued.lock().unwrap_or_else(PoisonError::into_inner));
        self.commit_group(batch);
        answer.try_recv().unwrap_or_else(|_| {
            Err(StoreError::unavailable(
                "the write was lost from its group commit",
            ))
        })
    }

    /// Applies `batch` in one transaction, in order (a refused write writes nothing and does
    /// not stop the others), commits once, then publishes the changes and answers each caller.
    fn commit_group(&self, batch: Vec<write::Queued>) {
        let txn = match self.db.begin_write() {
            Ok(txn) => txn,
            Err(error) => return write::Queued::fail_all(batch, &backend(error)),
        };
        let mut outcomes = Vec::with_capacity(batch.len());
        for queued in batch {
            let outcome = write::apply(
                &txn,
                &queued.key,
                queued.op.clone(),
                self.config.quota_bytes,
            );
            if let Err(error @ (StoreError::Unavailable { .. } | StoreError::Corrupt { .. })) =
                &outcome
            {
                // The transaction itself failed: nothing of the group is committed.
                let error = write::Queued::copy_of(error);
                drop(txn);
                outcomes.push((queued, outcome));
                let (batch, _): (Vec<_>, Vec<_>) = outcomes.into_iter().unzip();
                return write::Queued::fail_all(batch, &error);
            }
            outcomes.push((queued, outcome));
        }
        if let Err(error) = txn.commit() {
            let (batch, _): (Vec<_>, Vec<_>) = outcomes.into_iter().unzip();
            return write::Queued::fail_all(batch, &backend(error));
        }
        for (queued, outcome) in outcomes {
            let answer = outcome.map(|applied| {
                self.log_bytes.store(applied.log_bytes, Ordering::Relaxed);
                self.hub.publish(&applied.event);
                match applied.event {
                    crate::Event::Put { kv, .. } => kv,
                    crate::Event::Delete { prev, .. } => prev,
                }
            });
            queued.answer(answer);
        }
    }

    fn read_txn(&self) -> Result<redb::ReadTransaction, StoreError> {
        self.db.begin_read().map_err(backend)
    }

    fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let txn = self.read_txn()?;
        let index = txn.open_table(INDEX).map_err(backend)?;
        let log = txn.open_table(LOG).map_err(backend)?;
        tables::latest_live(&index, &log, key)
    }

    fn list(&self, query: ListRequest) -> Result<ListPage, StoreError> {
        let txn = self.read_txn()?;
        let revisions = tables::revisions(&txn.open_table(META).map_err(backend)?)?;
        let at = query.at_revision.unwrap_or(revisions.current);
        revisions.check_readable(at)?;
        let index = txn.open_table(INDEX).map_err(backend)?;
        let log = txn.open_table(LOG).map_err(backend)?;
        let resolved = ListQuery {
            prefix: &query.prefix,
            start_after: query.start_after.as_deref(),
            limit: query.limit,
            at,
        };
        let (items, more) = tables::list_keys(&index, &log, revisions, &resolved)?;
        Ok(ListPage {
            items,
            revision: at,
            more,
        })
    }

    fn revisions(&self) -> Result<tables::Revisions, StoreError> {
        let txn = self.read_txn()?;
        tables::revisions(&txn.open_table(META).map_err(backend)?)
    }

    /// Compacts step by step, each step its own transaction so writes interleave.
    fn compact(&self, target: u64) -> Result<(), StoreError> {
        loop {
            let txn = self.db.begin_write().map_err(backend)?;
            match compact::step(&txn, target)? {
                compact::Step::Done => return Ok(()),
                compact::Step::Advanced(_) => {
                    let meta = txn.open_table(META).map_err(backend)?;
                    let log_bytes = tables::log_bytes(&meta)?;
                    drop(meta);
                    txn.commit().map_err(backend)?;
                    if let Some(bytes) = log_bytes {
                        self.log_bytes.store(bytes, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

/// A list's arguments, owned so they can move to a blocking thread.
struct ListRequest {
    prefix: String,
    start_after: Option<String>,
    limit: usize,
    at_revision: Option<u64>,
}

/// Runs blocking redb work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(StoreError::unavailable)?
}

#[async_trait::async_trait]
impl Store for EmbeddedStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let inner = self.inner.clone();
        let key = key.to_owned();
        blocking(move || inner.get(&key)).await
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
        at_revision: Option<u64>,
    ) -> Result<ListPage, StoreError> {
        let inner = self.inner.clone();
        let request = ListRequest {
            prefix: prefix.to_owned(),
            start_after: start_after.map(str::to_owned),
            limit,
            at_revision,
        };
        blocking(move || inner.list(request)).await
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue, StoreError> {
        self.write(key, WriteOp::Create { value }).await
    }

    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected_mod_revision: Option<u64>,
    ) -> Result<KeyValue, StoreError> {
        let expected = expected_mod_revision;
        self.write(key, WriteOp::Update { value, expected }).await
    }

    async fn delete(
        &self,
        key: &str,
        expected_mod_revision: Option<u64>,
    ) -> Result<KeyValue, StoreError> {
        let expected = expected_mod_revision;
        self.write(key, WriteOp::Delete { expected }).await
    }

    fn watch(&self, prefix: &str, after_revision: u64) -> WatchStream {
        watch::stream(self.inner.clone(), prefix, after_revision)
    }

    async fn current_revision(&self) -> Result<u64, StoreError> {
        let inner = self.inner.clone();
        blocking(move || Ok(inner.revisions()?.current)).await
    }

    async fn compact_revision(&self) -> Result<u64, StoreError> {
        let inner = self.inner.clone();
        blocking(move || Ok(inner.revisions()?.compacted)).await
    }

    async fn compact(&self, revision: u64) -> Result<(), StoreError> {
        let inner = self.inner.clone();
        blocking(move || inner.compact(revision)).await
    }

    fn usage(&self) -> Option<StoreUsage> {
        Some(StoreUsage {
            used_bytes: self.inner.log_bytes.load(Ordering::Relaxed),
            quota_bytes: self.inner.config.quota_bytes,
        })
    }
}
