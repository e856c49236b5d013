//! The one error type of every store operation.

use crate::types::KeyValue;

/// A boxed error from a backend (redb, the etcd client).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a store operation failed.
///
/// Callers decide on the variant, never on the message: [`StoreError::retryable`] says whether
/// repeating the same request may succeed, [`StoreError::http_status`] is the Kubernetes
/// `Status` code the API server answers with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The key does not exist.
    #[error("key {key} not found")]
    NotFound {
        /// The key asked for.
        key: String,
    },
    /// A create found the key already there.
    #[error("key {key} already exists")]
    AlreadyExists {
        /// The key asked for.
        key: String,
    },
    /// A conditional write found another mod_revision than expected.
    #[error("conflict on key {}: its mod_revision is {}", current.key, current.mod_revision)]
    Conflict {
        /// The key's state now, so the caller can retry on top of it.
        current: Box<KeyValue>,
    },
    /// The revision asked for is older than the compaction point: list again.
    #[error("revision has been compacted (compaction point {compact_revision})")]
    Compacted {
        /// The oldest revision still readable.
        compact_revision: u64,
    },
    /// The revision asked for is newer than the store's current revision.
    #[error("revision {requested} is in the future (current revision {current})")]
    FutureRevision {
        /// The revision asked for.
        requested: u64,
        /// The store's current revision.
        current: u64,
    },
    /// A watcher fell so far behind that its buffer filled: its stream was ended so that the
    /// store never waits for it nor grows; watch again after `last_revision`.
    #[error("watcher fell behind; watch again after revision {last_revision}")]
    Lagged {
        /// The revision up to which every change was delivered.
        last_revision: u64,
    },
    /// A key the store cannot hold (empty or too long).
    #[error("invalid key: {reason}")]
    InvalidKey {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A value is larger than the store accepts.
    #[error("value of {size} bytes exceeds the limit of {max} bytes")]
    ValueTooLarge {
        /// The value's size.
        size: usize,
        /// The configured limit.
        max: usize,
    },
    /// The backend failed or is unreachable (I/O, database locked, store closed).
    #[error("store unavailable: {source}")]
    Unavailable {
        /// What the backend reported.
        #[source]
        source: BoxError,
    },
    /// The store is full: a create or update would take it past its quota (etcd's `NOSPACE`).
    /// Reads, watches and deletes still work; deletes and then compaction free space.
    #[error("{full}")]
    QuotaExceeded {
        /// Which quota is full, and by how much when the backend knows.
        full: QuotaFull,
    },
    /// A stored row cannot be decoded or contradicts the log.
    #[error("corrupt store row at revision {revision}: {reason}")]
    Corrupt {
        /// The revision of the row.
        revision: u64,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// Which quota a refused write met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaFull {
    /// The embedded store's `quota_bytes`: `used` bytes of log rows (live values and kept
    /// history) plus this write's `write` bytes would pass `quota`.
    Embedded {
        /// Bytes of log rows stored now.
        used: u64,
        /// Bytes the refused write would add.
        write: u64,
        /// The configured quota.
        quota: u64,
    },
    /// etcd answered `mvcc: database space exceeded`: its `--quota-backend-bytes` is reached
    /// and its NOSPACE alarm is raised.
    Etcd,
}

impl std::fmt::Display for QuotaFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QuotaFull::Embedded { used, write, quota } => write!(
                f,
                "the store's quota of {quota} bytes is full ({used} bytes of objects and kept \
                 history are stored; this write needs {write} more): delete objects, then \
                 compaction (every --compaction-interval) frees their history, or raise \
                 --store-quota-bytes"
            ),
            QuotaFull::Etcd => f.write_str(
                "etcd's database space is exceeded (its --quota-backend-bytes): delete objects, \
                 compact and defragment etcd, then disarm its NOSPACE alarm \
                 (etcdctl alarm disarm)",
            ),
        }
    }
}

impl StoreError {
    /// Whether the same request may succeed if repeated unchanged: true for a lagged watch
    /// (watch again from its last revision), an unavailable backend and a future revision (the
    /// store may catch up); false where the caller must change the request first (re-read,
    /// re-list) or where repeating cannot help.
    pub fn retryable(&self) -> bool {
        match self {
            StoreError::Lagged { .. }
            | StoreError::Unavailable { .. }
            | StoreError::FutureRevision { .. } => true,
            StoreError::NotFound { .. }
            | StoreError::AlreadyExists { .. }
            | StoreError::Conflict { .. }
            | StoreError::Compacted { .. }
            | StoreError::InvalidKey { .. }
            | StoreError::ValueTooLarge { .. }
            | StoreError::QuotaExceeded { .. }
            | StoreError::Corrupt { .. } => false,
        }
    }

    /// The HTTP status of the Kubernetes `Status` this error becomes.
    ///
    /// Follows kube-apiserver's storage errors: 410 Gone for a compacted or lagged watch (the
    /// client re-lists or re-watches), 504 for a too-large resource version (the apiserver's
    /// "Too large resource version", retried by clients), 413 for an oversized value, 507
    /// Insufficient Storage for a full store (a write that repeats unchanged keeps failing
    /// until space is freed, so it is not retryable as such).
    pub fn http_status(&self) -> u16 {
        match self {
            StoreError::InvalidKey { .. } => 400,
            StoreError::NotFound { .. } => 404,
            StoreError::AlreadyExists { .. } | StoreError::Conflict { .. } => 409,
            StoreError::Compacted { .. } | StoreError::Lagged { .. } => 410,
            StoreError::ValueTooLarge { .. } => 413,
            StoreError::Corrupt { .. } => 500,
            StoreError::QuotaExceeded { .. } => 507,
            StoreError::Unavailable { .. } => 503,
            StoreError::FutureRevision { .. } => 504,
        }
    }

    /// Wraps a backend failure.
    pub(crate) fn unavailable(source: impl Into<BoxError>) -> Self {
        StoreError::Unavailable {
            source: source.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_kube_apiserver() {
        let kv = KeyValue {
            key: "k".into(),
            value: bytes::Bytes::new(),
            create_revision: 1,
            mod_revision: 2,
            version: 2,
        };
        let cases: Vec<(StoreError, u16, bool)> = vec![
            (StoreError::NotFound { key: "k".into() }, 404, false),
            (StoreError::AlreadyExists { key: "k".into() }, 409, false),
            (
                StoreError::Conflict {
                    current: Box::new(kv),
                },
                409,
                false,
            ),
            (
                StoreError::Compacted {
                    compact_revision: 3,
                },
                410,
                false,
            ),
            (StoreError::Lagged { last_revision: 3 }, 410, true),
            (StoreError::InvalidKey { reason: "x" }, 400, false),
            (StoreError::ValueTooLarge { size: 2, max: 1 }, 413, false),
            (StoreError::unavailable("down"), 503, true),
            (
                StoreError::QuotaExceeded {
                    full: QuotaFull::Etcd,
                },
                507,
                false,
            ),
            (
                StoreError::Corrupt {
                    revision: 1,
                    reason: "x",
                },
                500,
                false,
            ),
            (
                StoreError::FutureRevision {
                    requested: 9,
                    current: 1,
                },
                504,
                true,
            ),
        ];
        for (error, status, retryable) in cases {
            assert_eq!(error.http_status(), status, "{error}");
            assert_eq!(error.retryable(), retryable, "{error}");
        }
    }
}
