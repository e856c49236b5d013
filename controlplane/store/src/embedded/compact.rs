//! Compaction: dropping the rows superseded at a revision.
//!
//! After compacting to `c`, each key keeps its newest row at or before `c` if that row is live
//! (the state at `c`), and every row after `c`. That is exactly what lists at revisions `>= c`
//! and watches after revisions `>= c` read; deletions at or before `c` go, and so does the
//! index entry of a key whose newest row is such a deletion.

use std::collections::HashMap;

use redb::{ReadableTable, WriteTransaction};

use super::record::Record;
use super::tables::{self, backend, COMPACT_REVISION, INDEX, LOG, LOG_BYTES, META};
use crate::error::StoreError;

/// Revisions compacted per transaction: bounds how long one compaction holds the writer and how
/// many keys it remembers, so a first compaction of a long history does not stall writes.
pub(crate) const REVISIONS_PER_STEP: u64 = 4096;

/// How far one step got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// The compaction point moved to this revision; more steps may follow.
    Advanced(u64),
    /// The compaction point is already at or past the target.
    Done,
}

/// Moves the compaction point towards `target` by at most [`REVISIONS_PER_STEP`] in `txn`.
pub(crate) fn step(txn: &WriteTransaction, target: u64) -> Result<Step, StoreError> {
    let mut log = txn.open_table(LOG).map_err(backend)?;
    let mut index = txn.open_table(INDEX).map_err(backend)?;
    let mut meta = txn.open_table(META).map_err(backend)?;
    let revisions = tables::revisions(&meta)?;
    if target > revisions.current {
        return Err(StoreError::FutureRevision {
            requested: target,
            current: revisions.current,
        });
    }
    if target <= revisions.compacted {
        return Ok(Step::Done);
    }
    let end = target.min(revisions.compacted.saturating_add(REVISIONS_PER_STEP));
    let newest_in_range = newest_rows(&log, revisions.compacted + 1, end)?;
    let mut freed = 0;
    for (key, newest) in newest_in_range {
        let record = tables::load_required(&log, newest, "a compacted range lost a row")?;
        freed += remove_chain(&mut log, record.prev_revision)?;
        if record.deleted {
            if let Some(bytes) = log.remove(newest).map_err(backend)? {
                freed += tables::row_bytes(bytes.value().len());
            }
            let indexed = index.get(key.as_str()).map_err(backend)?.map(|g| g.value());
            if indexed == Some(newest) {
                index.remove(key.as_str()).map_err(backend)?;
            }
        }
    }
    meta.insert(COMPACT_REVISION, end).map_err(backend)?;
    // A store without the count gets it from its rows when it opens; none is left here.
    if let Some(used) = tables::log_bytes(&meta)? {
        meta.insert(LOG_BYTES, used.saturating_sub(freed))
            .map_err(backend)?;
    }
    Ok(Step::Advanced(end))
}

/// Each key written in `first..=last` with the revision of its newest row there.
fn newest_rows(
    log: &impl ReadableTable<u64, &'static [u8]>,
    first: u64,
    last: u64,
) -> Result<HashMap<String, u64>, StoreError> {
    let mut newest = HashMap::new();
    for entry in log.range(first..=last).map_err(backend)? {
        let (revision, bytes) = entry.map_err(backend)?;
        let revision = revision.value();
        let key = Record::decode_key(revision, bytes.value())?;
        // Ascending revisions: the last insert per key is its newest row.
        newest.insert(key.to_owned(), revision);
    }
    Ok(newest)
}

/// Removes the rows a chain links back from `revision`, up to the first one already gone
/// (everything before it went in an earlier compaction); returns their [`tables::row_bytes`].
fn remove_chain(
    log: &mut redb::Table<'_, u64, &'static [u8]>,
    revision: u64,
) -> Result<u64, StoreError> {
    let mut revision = revision;
    let mut freed = 0;
    while revision != 0 {
        let removed = log.remove(revision).map_err(backend)?;
        let Some(bytes) = removed else {
            return Ok(freed);
        };
        freed += tables::row_bytes(bytes.value().len());
        revision = Record::decode(revision, bytes.value())?.prev_revision;
    }
    Ok(freed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::write::{self, WriteOp};
    use bytes::Bytes;
    use redb::{backends::InMemoryBackend, Database, ReadableTableMetadata};

    fn database() -> Database {
        let db = Database::builder()
            .create_with_backend(InMemoryBackend::new())
            .unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(LOG).unwrap();
        txn.open_table(INDEX).unwrap();
        txn.open_table(META).unwrap();
        txn.commit().unwrap();
        db
    }

    fn apply(db: &Database, key: &str, op: WriteOp) {
        let txn = db.begin_write().unwrap();
        write::apply(&txn, key, op, u64::MAX).unwrap();
        txn.commit().unwrap();
    }

    /// The kept count of log bytes, and the count from the rows themselves.
    fn log_bytes(db: &Database) -> (u64, u64) {
        use redb::ReadableDatabase;
        let txn = db.begin_read().unwrap();
        let meta = txn.open_table(META).unwrap();
        let log = txn.open_table(LOG).unwrap();
        (
            tables::log_bytes(&meta).unwrap().unwrap_or(0),
            tables::count_log_bytes(&log).unwrap(),
        )
    }

    fn put_new(text: &'static str) -> WriteOp {
        WriteOp::Create {
            value: Bytes::from_static(text.as_bytes()),
        }
    }

    fn put(text: &'static str) -> WriteOp {
        WriteOp::Update {
            value: Bytes::from_static(text.as_bytes()),
            expected: None,
        }
    }

    fn compact(db: &Database, target: u64) -> Vec<Step> {
        let mut steps = Vec::new();
        loop {
            let txn = db.begin_write().unwrap();
            let step = step(&txn, target).unwrap();
            txn.commit().unwrap();
            steps.push(step);
            if step == Step::Done {
                return steps;
            }
        }
    }

    /// The revisions left in the log and the keys left in the index.
    fn rows(db: &Database) -> (Vec<u64>, Vec<String>) {
        use redb::ReadableDatabase;
        let txn = db.begin_read().unwrap();
        let log = txn.open_table(LOG).unwrap();
        let index = txn.open_table(INDEX).unwrap();
        let revisions = log
            .range(0..)
            .unwrap()
            .map(|row| row.unwrap().0.value())
            .collect();
        let keys = index
            .range::<&str>(..)
            .unwrap()
            .map(|row| row.unwrap().0.value().to_owned())
            .collect();
        assert_eq!(
            index.len().unwrap() as usize,
            index.range::<&str>(..).unwrap().count()
        );
        (revisions, keys)
    }

    #[test]
    fn superseded_rows_and_old_tombstones_are_removed() {
        let db = database();
        let create = |text: &'static str| WriteOp::Create {
            value: Bytes::from_static(text.as_bytes()),
        };
        apply(&db, "/a", create("1")); // 1
        apply(&db, "/b", create("1")); // 2
        apply(&db, "/a", put("2")); // 3
        apply(&db, "/b", WriteOp::Delete { expected: None }); // 4
        apply(&db, "/c", create("1")); // 5
        apply(&db, "/c", WriteOp::Delete { expected: None }); // 6
        apply(&db, "/a", put("3")); // 7
        apply(&db, "/c", create("2")); // 8

        assert_eq!(compact(&db, 5), [Step::Advanced(5), Step::Done]);
        // /a keeps 3 (its state at 5) and 7; /b is gone entirely; /c keeps 5 and later rows.
        assert_eq!(
            rows(&db),
            (vec![3, 5, 6, 7, 8], vec!["/a".into(), "/c".into()])
        );

        assert_eq!(compact(&db, 7), [Step::Advanced(7), Step::Done]);
        // /c's tombstone at 6 goes; the re-creation at 8 keeps /c in the index.
        assert_eq!(rows(&db), (vec![7, 8], vec!["/a".into(), "/c".into()]));
    }

    #[test]
    fn the_kept_byte_count_follows_writes_and_compaction() {
        let db = database();
        let create = |text: &'static str| WriteOp::Create {
            value: Bytes::from_static(text.as_bytes()),
        };
        apply(&db, "/a", create("first value"));
        apply(&db, "/a", put("a second, longer value"));
        apply(&db, "/b", create("b"));
        apply(&db, "/b", WriteOp::Delete { expected: None });
        let (kept, counted) = log_bytes(&db);
        assert_eq!(kept, counted);
        compact(&db, 4);
        let (after, counted) = log_bytes(&db);
        assert_eq!(after, counted);
        assert!(after < kept, "compaction freed nothing: {after} of {kept}");
    }

    #[test]
    fn puts_past_the_quota_are_refused_and_deletes_are_not() {
        let db = database();
        let txn = db.begin_write().unwrap();
        let big = WriteOp::Create {
            value: Bytes::from(vec![b'x'; 100]),
        };
        let refused = write::apply(&txn, "/a", big, 100);
        assert!(matches!(
            refused,
            Err(StoreError::QuotaExceeded {
                full: crate::QuotaFull::Embedded {
                    used: 0,
                    quota: 100,
                    ..
                }
            })
        ));
        drop(txn);
        apply(&db, "/a", put_new("x"));
        let (used, _) = log_bytes(&db);
        let txn = db.begin_write().unwrap();
        let applied = write::apply(&txn, "/a", WriteOp::Delete { expected: None }, used);
        assert!(applied.is_ok(), "a delete must pass a full quota");
    }

    #[test]
    fn long_ranges_compact_in_bounded_steps() {
        let db = database();
        apply(
            &db,
            "/a",
            WriteOp::Create {
                value: Bytes::new(),
            },
        );
        let total = REVISIONS_PER_STEP + 10;
        for _ in 1..total {
            apply(&db, "/a", put("x"));
        }
        let steps = compact(&db, total);
        let expected = [
            Step::Advanced(REVISIONS_PER_STEP),
            Step::Advanced(total),
            Step::Done,
        ];
        assert_eq!(steps, expected);
        assert_eq!(rows(&db), (vec![total], vec!["/a".into()]));
        let txn = db.begin_write().unwrap();
        assert!(matches!(
            step(&txn, total + 1),
            Err(StoreError::FutureRevision { .. })
        ));
    }
}
