//! Compaction: dropping the rows superseded at a revision.
//!
//! After compacting to `c`, each key keeps its newest row at or before `c` if that row is live
//! (the state at `c`), and every row after `c`. That is exactly what lists at revisions `>= c`
//! and watches after revisions `>= c` read; deletions at or before `c` go, and so does the
//! index entry of a key whose newest row is such a deletion.

use std::collections::HashMap;

use redb::{ReadableTable, WriteTransaction};

use super::record::Record;
use super::tables::{self, backend, COMPACT_REVISION, INDEX, LOG, META};
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
    for (key, newest) in newest_in_range {
        let record = tables::load_required(&log, newest, "a compacted range lost a row")?;
        remove_chain(&mut log, record.prev_revision)?;
        if record.deleted {
            log.remove(newest).map_err(backend)?;
            let indexed = index.get(key.as_str()).map_err(backend)?.map(|g| g.value());
            if indexed == Some(newest) {
                index.remove(key.as_str()).map_err(backend)?;
            }
        }
    }
    meta.insert(COMPACT_REVISION, end).map_err(backend)?;
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
/// (everything before it went in an earlier compaction).
fn remove_chain(
    log: &mut redb::Table<'_, u64, &'static [u8]>,
    revision: u64,
) -> Result<(), StoreError> {
    let mut revision = revision;
    while revision != 0 {
        let removed = log.remove(revision).map_err(backend)?;
        let Some(bytes) = removed else {
            return Ok(());
        };
        revision = Record::decode(revision, bytes.value())?.prev_revision;
    }
    Ok(())
}
