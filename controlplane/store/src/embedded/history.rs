//! Replaying the log for a watch: the changes under a prefix after a revision, in batches.

use redb::ReadableTable;

use super::record::Record;
use super::tables::{self, backend, LOG, META};
use crate::error::StoreError;
use crate::types::Event;

/// Events per replayed batch: what a client gets in one go.
pub(crate) const EVENTS_PER_BATCH: usize = 256;
/// Rows looked at per read, matching or not: bounds how long one blocking read runs when the
/// prefix is rare in the log.
pub(crate) const ROWS_PER_READ: usize = 4096;

/// One read of the log.
#[derive(Debug)]
pub(crate) struct Batch {
    /// The changes under the prefix, in revision order.
    pub events: Vec<Event>,
    /// Every change under the prefix up to this revision is in `events` or was before.
    pub cursor: u64,
    /// Whether `cursor` reached the end asked for (or the store's current revision).
    pub reached_end: bool,
}

/// Reads the changes under `prefix` after `after`, up to `until` (at most the current
/// revision), from one consistent snapshot.
pub(crate) fn read(
    db: &redb::Database,
    prefix: &str,
    after: u64,
    until: Option<u64>,
) -> Result<Batch, StoreError> {
    use redb::ReadableDatabase;
    let txn = db.begin_read().map_err(backend)?;
    let log = txn.open_table(LOG).map_err(backend)?;
    let revisions = tables::revisions(&txn.open_table(META).map_err(backend)?)?;
    if after < revisions.compacted {
        return Err(StoreError::Compacted {
            compact_revision: revisions.compacted,
        });
    }
    let end = until.map_or(revisions.current, |until| until.min(revisions.current));
    let mut batch = Batch {
        events: Vec::new(),
        cursor: after,
        reached_end: after >= end,
    };
    if batch.reached_end {
        return Ok(batch);
    }
    let mut rows = 0;
    for entry in log
        .range(after + 1..=end)
        .map_err(backend)?
        .take(ROWS_PER_READ)
    {
        rows += 1;
        let (revision, bytes) = entry.map_err(backend)?;
        let revision = revision.value();
        if Record::decode_key(revision, bytes.value())?.starts_with(prefix) {
            let record = Record::decode(revision, bytes.value())?;
            batch.events.push(event(&log, revision, record)?);
        }
        batch.cursor = revision;
        if batch.events.len() == EVENTS_PER_BATCH {
            break;
        }
    }
    if rows == 0 {
        // Every revision after the compaction point has its row; without this check a watch
        // would spin on the hole instead of failing.
        return Err(StoreError::Corrupt {
            revision: after + 1,
            reason: "the log has no rows up to the current revision",
        });
    }
    batch.reached_end = batch.cursor >= end;
    Ok(batch)
}

/// The change a row made, with the state it replaced (kept by compaction: see `compact`).
fn event(
    log: &impl ReadableTable<u64, &'static [u8]>,
    revision: u64,
    record: Record,
) -> Result<Event, StoreError> {
    let previous = |record: &Record| -> Result<_, StoreError> {
        let reason = "a change's previous state is missing";
        let prev = tables::load_required(log, record.prev_revision, reason)?;
        prev.key_value(record.prev_revision)
            .ok_or(StoreError::Corrupt { revision, reason })
    };
    if record.deleted {
        return Ok(Event::Delete {
            prev: previous(&record)?,
            revision,
        });
    }
    let prev = if record.create_revision == revision {
        None
    } else {
        Some(previous(&record)?)
    };
    let kv = record.key_value(revision).ok_or(StoreError::Corrupt {
        revision,
        reason: "a live row has no state",
    })?;
    Ok(Event::Put { kv, prev })
}
