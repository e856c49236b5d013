//! The three redb tables of the MVCC log and the reads every operation shares.
//!
//! - `log`: revision -> encoded [`Record`]; one row per write (kine's single table).
//! - `index`: key -> revision of the key's newest row, a deletion included until compaction
//!   removes it; lists and writes start here instead of scanning the log.
//! - `meta`: the current revision and the compaction point, written in the same transaction as
//!   the rows they describe, so a crash can never leave them out of step.

use std::ops::Bound;

use redb::{ReadableTable, TableDefinition};

use super::record::Record;
use crate::error::StoreError;
use crate::types::KeyValue;

/// revision -> encoded [`Record`].
pub(crate) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
/// key -> revision of its newest row.
pub(crate) const INDEX: TableDefinition<&str, u64> = TableDefinition::new("index");
/// [`CURRENT_REVISION`] and [`COMPACT_REVISION`].
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The revision of the last write.
pub(crate) const CURRENT_REVISION: &str = "current_revision";
/// The compaction point: rows superseded at or before it are gone.
pub(crate) const COMPACT_REVISION: &str = "compact_revision";
/// Bytes of the log's rows ([`row_bytes`] each): what the quota bounds. Kept in the same
/// transaction as the rows, so it never drifts from them.
pub(crate) const LOG_BYTES: &str = "log_bytes";

/// What one log row counts against the quota: its encoding and its revision key.
pub(crate) fn row_bytes(encoded_len: usize) -> u64 {
    encoded_len as u64 + 8
}

/// The stored [`LOG_BYTES`], `None` in a store written before it was kept.
pub(crate) fn log_bytes(
    meta: &impl ReadableTable<&'static str, u64>,
) -> Result<Option<u64>, StoreError> {
    Ok(meta
        .get(LOG_BYTES)
        .map_err(backend)?
        .map(|guard| guard.value()))
}

/// Counts [`LOG_BYTES`] from the rows, once, for a store that never kept it.
pub(crate) fn count_log_bytes(
    log: &impl ReadableTable<u64, &'static [u8]>,
) -> Result<u64, StoreError> {
    let mut total = 0;
    for entry in log.range(0..).map_err(backend)? {
        let (_, bytes) = entry.map_err(backend)?;
        total += row_bytes(bytes.value().len());
    }
    Ok(total)
}

/// Wraps any redb error; redb's own corruption report keeps its meaning.
pub(crate) fn backend(error: impl Into<redb::Error>) -> StoreError {
    match error.into() {
        redb::Error::Corrupted(_) => StoreError::Corrupt {
            revision: 0,
            reason: "the database file is corrupted",
        },
        other => StoreError::unavailable(other),
    }
}

/// The current revision and the compaction point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Revisions {
    pub current: u64,
    pub compacted: u64,
}

impl Revisions {
    /// Checks that the state at `revision` is still (and already) readable.
    pub fn check_readable(&self, revision: u64) -> Result<(), StoreError> {
        if revision < self.compacted {
            return Err(StoreError::Compacted {
                compact_revision: self.compacted,
            });
        }
        if revision > self.current {
            return Err(StoreError::FutureRevision {
                requested: revision,
                current: self.current,
            });
        }
        Ok(())
    }
}

/// Reads both revisions from `meta` (0 when absent: a new store).
pub(crate) fn revisions(
    meta: &impl ReadableTable<&'static str, u64>,
) -> Result<Revisions, StoreError> {
    let read = |name: &str| -> Result<u64, StoreError> {
        Ok(meta
            .get(name)
            .map_err(backend)?
            .map_or(0, |guard| guard.value()))
    };
    Ok(Revisions {
        current: read(CURRENT_REVISION)?,
        compacted: read(COMPACT_REVISION)?,
    })
}

/// The row at `revision`, if the log still has it.
pub(crate) fn load(
    log: &impl ReadableTable<u64, &'static [u8]>,
    revision: u64,
) -> Result<Option<Record>, StoreError> {
    match log.get(revision).map_err(backend)? {
        Some(bytes) => Record::decode(revision, bytes.value()).map(Some),
        None => Ok(None),
    }
}

/// The row at `revision`, which the log's invariants say must exist.
pub(crate) fn load_required(
    log: &impl ReadableTable<u64, &'static [u8]>,
    revision: u64,
    reason: &'static str,
) -> Result<Record, StoreError> {
    load(log, revision)?.ok_or(StoreError::Corrupt { revision, reason })
}

/// The key's live state now: (revision of its newest row, the row) or `None`.
pub(crate) fn latest_live(
    index: &impl ReadableTable<&'static str, u64>,
    log: &impl ReadableTable<u64, &'static [u8]>,
    key: &str,
) -> Result<Option<KeyValue>, StoreError> {
    let Some(newest) = index.get(key).map_err(backend)?.map(|guard| guard.value()) else {
        return Ok(None);
    };
    let record = load_required(log, newest, "the index points to a missing row")?;
    Ok(record.key_value(newest))
}

/// The key's live state as of `at`, walking back from its newest row (`newest`).
///
/// Rows after the compaction point all exist; at or before it only the newest live row of each
/// key survives, so a missing row there means the key was deleted at that time.
pub(crate) fn live_at(
    log: &impl ReadableTable<u64, &'static [u8]>,
    newest: u64,
    at: u64,
    compacted: u64,
) -> Result<Option<KeyValue>, StoreError> {
    let mut revision = newest;
    while revision > at {
        let record = load_required(log, revision, "a key's row chain has a gap")?;
        revision = record.prev_revision;
    }
    if revision == 0 {
        return Ok(None);
    }
    match load(log, revision)? {
        Some(record) => Ok(record.key_value(revision)),
        None if revision <= compacted => Ok(None),
        None => Err(StoreError::Corrupt {
            revision,
            reason: "a key's row chain points to a missing row",
        }),
    }
}

/// Where a list starts in the index: at the prefix, or just after `start_after` when that
/// lies at or beyond it.
pub(crate) fn list_start<'a>(prefix: &'a str, start_after: Option<&'a str>) -> Bound<&'a str> {
    match start_after {
        Some(after) if after >= prefix => Bound::Excluded(after),
        _ => Bound::Included(prefix),
    }
}

/// Up to `limit` (0: all) live keys under `prefix` after `start_after` as of `revisions.current`
/// or the older `at`, and whether more follow.
pub(crate) fn list_keys(
    index: &impl ReadableTable<&'static str, u64>,
    log: &impl ReadableTable<u64, &'static [u8]>,
    revisions: Revisions,
    query: &ListQuery<'_>,
) -> Result<(Vec<KeyValue>, bool), StoreError> {
    let start = list_start(query.prefix, query.start_after);
    let mut items = Vec::new();
    for entry in index
        .range::<&str>((start, Bound::Unbounded))
        .map_err(backend)?
    {
        let (key, newest) = entry.map_err(backend)?;
        if !key.value().starts_with(query.prefix) {
            break;
        }
        let state = live_at(log, newest.value(), query.at, revisions.compacted)?;
        if let Some(kv) = state {
            if query.limit != 0 && items.len() == query.limit {
                return Ok((items, true));
            }
            items.push(kv);
        }
    }
    Ok((items, false))
}

/// What a list asks for, resolved to a revision.
pub(crate) struct ListQuery<'a> {
    pub prefix: &'a str,
    pub start_after: Option<&'a str>,
    pub limit: usize,
    pub at: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_start_after_the_cursor_only_inside_the_prefix() {
        assert_eq!(list_start("/a/", None), Bound::Included("/a/"));
        assert_eq!(list_start("/a/", Some("/a/x")), Bound::Excluded("/a/x"));
        // A cursor before the prefix must not widen the list to other prefixes.
        assert_eq!(list_start("/b/", Some("/a/z")), Bound::Included("/b/"));
    }

    #[test]
    fn readable_revisions_lie_between_the_compaction_point_and_now() {
        let revisions = Revisions {
            current: 10,
            compacted: 4,
        };
        assert!(revisions.check_readable(4).is_ok());
        assert!(revisions.check_readable(10).is_ok());
        assert!(matches!(
            revisions.check_readable(3),
            Err(StoreError::Compacted {
                compact_revision: 4
            })
        ));
        assert!(matches!(
            revisions.check_readable(11),
            Err(StoreError::FutureRevision {
                requested: 11,
                current: 10
            })
        ));
    }
}
