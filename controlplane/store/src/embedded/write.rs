//! One write (create, update, delete) as a row appended to the log in a redb transaction.

use bytes::Bytes;
use redb::{ReadableTable, WriteTransaction};

use super::record::Record;
use super::tables::{self, backend, CURRENT_REVISION, INDEX, LOG, LOG_BYTES, META};
use crate::error::{QuotaFull, StoreError};
use crate::types::{Event, KeyValue};

/// What a write does to its key.
#[derive(Debug, Clone)]
pub(crate) enum WriteOp {
    /// Create the key; it must not exist.
    Create { value: Bytes },
    /// Replace an existing key's value, if its mod_revision is `expected` when given.
    Update { value: Bytes, expected: Option<u64> },
    /// Delete an existing key, if its mod_revision is `expected` when given.
    Delete { expected: Option<u64> },
}

/// A write waiting for a group commit, and where its caller waits for the answer.
#[derive(Debug)]
pub(crate) struct Queued {
    pub key: String,
    pub op: WriteOp,
    answer: std::sync::mpsc::SyncSender<Result<KeyValue, StoreError>>,
}

pub(crate) type Answer = std::sync::mpsc::Receiver<Result<KeyValue, StoreError>>;

impl Queued {
    pub fn new(key: &str, op: WriteOp) -> (Self, Answer) {
        let (answer, receiver) = std::sync::mpsc::sync_channel(1);
        let key = key.to_owned();
        (Self { key, op, answer }, receiver)
    }

    pub fn answer(self, result: Result<KeyValue, StoreError>) {
        // The caller waits under the write lock or has returned already: never blocks.
        let _ = self.answer.try_send(result);
    }

    /// Answers every write of a group whose transaction failed with that failure.
    pub fn fail_all(batch: Vec<Queued>, error: &StoreError) {
        for queued in batch {
            queued.answer(Err(Self::copy_of(error)));
        }
    }

    /// A transaction failure for each write of its group (the errors are not `Clone`: their
    /// sources are boxed).
    pub fn copy_of(error: &StoreError) -> StoreError {
        match error {
            StoreError::Corrupt { revision, reason } => StoreError::Corrupt {
                revision: *revision,
                reason,
            },
            other => StoreError::unavailable(other.to_string()),
        }
    }
}

/// A committed-to-be write: its change and the log's bytes after it.
#[derive(Debug)]
pub(crate) struct Applied {
    pub event: Event,
    pub log_bytes: u64,
}

/// Appends the row for `op` on `key` at the next revision inside `txn` and returns the change.
///
/// A create or update that would take the log past `quota` bytes is refused; a deletion never
/// is, since deleting (then compacting) is how a full store gets space back, as with etcd's
/// NOSPACE alarm. Nothing is written when the op is refused; the caller commits (or drops)
/// the transaction.
pub(crate) fn apply(
    txn: &WriteTransaction,
    key: &str,
    op: WriteOp,
    quota: u64,
) -> Result<Applied, StoreError> {
    let mut log = txn.open_table(LOG).map_err(backend)?;
    let mut index = txn.open_table(INDEX).map_err(backend)?;
    let mut meta = txn.open_table(META).map_err(backend)?;
    let revision = tables::revisions(&meta)?.current + 1;
    let newest = index.get(key).map_err(backend)?.map(|guard| guard.value());
    let current = tables::latest_live(&index, &log, key)?;
    let (record, event) = next_row(key, revision, newest.unwrap_or(0), current, op)?;
    let encoded = record.encode();
    let used = tables::log_bytes(&meta)?.unwrap_or(0);
    let write = tables::row_bytes(encoded.len());
    if !record.deleted && used.saturating_add(write) > quota {
        let full = QuotaFull::Embedded { used, write, quota };
        return Err(StoreError::QuotaExceeded { full });
    }
    log.insert(revision, encoded.as_slice()).map_err(backend)?;
    index.insert(key, revision).map_err(backend)?;
    meta.insert(CURRENT_REVISION, revision).map_err(backend)?;
    let log_bytes = used.saturating_add(write);
    meta.insert(LOG_BYTES, log_bytes).map_err(backend)?;
    Ok(Applied { event, log_bytes })
}

/// The row `op` appends at `revision` given the key's live state `current` and its newest row
/// `newest` (0: none), or why the op is refused. Pure, so the revision logic is unit-tested.
pub(crate) fn next_row(
    key: &str,
    revision: u64,
    newest: u64,
    current: Option<KeyValue>,
    op: WriteOp,
) -> Result<(Record, Event), StoreError> {
    let not_found = || StoreError::NotFound {
        key: key.to_owned(),
    };
    let check = |expected: Option<u64>, current: &KeyValue| match expected {
        Some(expected) if expected != current.mod_revision => Err(StoreError::Conflict {
            current: Box::new(current.clone()),
        }),
        _ => Ok(()),
    };
    let row = |value: Bytes, create_revision, version, deleted| Record {
        key: key.to_owned(),
        value,
        create_revision,
        prev_revision: newest,
        version,
        deleted,
    };
    match op {
        WriteOp::Create { value } => {
            if current.is_some() {
                return Err(StoreError::AlreadyExists {
                    key: key.to_owned(),
                });
            }
            let record = row(value, revision, 1, false);
            let kv = live(&record, revision)?;
            Ok((record, Event::Put { kv, prev: None }))
        }
        WriteOp::Update { value, expected } => {
            let prev = current.ok_or_else(not_found)?;
            check(expected, &prev)?;
            let record = row(value, prev.create_revision, prev.version + 1, false);
            let kv = live(&record, revision)?;
            Ok((
                record,
                Event::Put {
                    kv,
                    prev: Some(prev),
                },
            ))
        }
        WriteOp::Delete { expected } => {
            let prev = current.ok_or_else(not_found)?;
            check(expected, &prev)?;
            let record = row(Bytes::new(), 0, 0, true);
            Ok((record, Event::Delete { prev, revision }))
        }
    }
}

/// The key's state after a live row; a deletion here would be a logic error, not a panic.
fn live(record: &Record, revision: u64) -> Result<KeyValue, StoreError> {
    record.key_value(revision).ok_or(StoreError::Corrupt {
        revision,
        reason: "a put produced a deletion row",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(create_revision: u64, mod_revision: u64, version: u64) -> KeyValue {
        KeyValue {
            key: "/k".into(),
            value: Bytes::from_static(b"old"),
            create_revision,
            mod_revision,
            version,
        }
    }

    fn value() -> Bytes {
        Bytes::from_static(b"new")
    }

    #[test]
    fn create_starts_a_new_incarnation_linked_to_the_previous_row() {
        // Key deleted at revision 4: its newest row is the deletion, it has no live state.
        let (record, event) =
            next_row("/k", 5, 4, None, WriteOp::Create { value: value() }).unwrap();
        assert_eq!(
            (record.create_revision, record.prev_revision, record.version),
            (5, 4, 1)
        );
        assert_eq!(event.revision(), 5);
        assert!(matches!(event, Event::Put { prev: None, .. }));
        let exists = next_row(
            "/k",
            6,
            5,
            Some(state(5, 5, 1)),
            WriteOp::Create { value: value() },
        );
        assert!(matches!(exists, Err(StoreError::AlreadyExists { .. })));
    }

    #[test]
    fn update_keeps_the_creation_and_counts_versions() {
        let op = WriteOp::Update {
            value: value(),
            expected: Some(7),
        };
        let (record, event) = next_row("/k", 9, 7, Some(state(3, 7, 2)), op).unwrap();
        assert_eq!(
            (record.create_revision, record.prev_revision, record.version),
            (3, 7, 3)
        );
        let Event::Put {
            kv,
            prev: Some(prev),
        } = event
        else {
            panic!("not an update")
        };
        assert_eq!((kv.mod_revision, prev.mod_revision), (9, 7));
    }

    #[test]
    fn stale_expectations_conflict_with_the_current_state() {
        let current = state(3, 7, 2);
        for op in [
            WriteOp::Update {
                value: value(),
                expected: Some(6),
            },
            WriteOp::Delete { expected: Some(6) },
        ] {
            match next_row("/k", 9, 7, Some(current.clone()), op) {
                Err(StoreError::Conflict { current: got }) => assert_eq!(*got, current),
                other => panic!("expected a conflict, got {other:?}"),
            }
        }
    }

    #[test]
    fn update_and_delete_of_a_missing_key_are_not_found() {
        for op in [
            WriteOp::Update {
                value: value(),
                expected: None,
            },
            WriteOp::Delete { expected: Some(1) },
        ] {
            assert!(matches!(
                next_row("/k", 2, 1, None, op),
                Err(StoreError::NotFound { .. })
            ));
        }
    }

    #[test]
    fn delete_writes_a_tombstone_carrying_the_last_state() {
        let (record, event) = next_row(
            "/k",
            8,
            7,
            Some(state(3, 7, 2)),
            WriteOp::Delete { expected: None },
        )
        .unwrap();
        assert!(record.deleted);
        assert_eq!(
            (record.prev_revision, record.version, record.value.len()),
            (7, 0, 0)
        );
        assert_eq!(
            event,
            Event::Delete {
                prev: state(3, 7, 2),
                revision: 8
            }
        );
    }
}
