//! From etcd's answers to the store's types: key-values, watch events and errors.

use bytes::Bytes;

use super::keys::Namespace;
use crate::error::StoreError;
use crate::types::{Event, KeyValue};

/// etcd's message for a read or watch at a revision older than its compaction point.
const COMPACTED: &str = "required revision has been compacted";
/// etcd's message for a read or compaction at a revision it has not reached.
const FUTURE_REVISION: &str = "required revision is a future revision";
/// etcd's message for a request larger than its `--max-request-bytes`.
const TOO_LARGE: &str = "request is too large";
/// etcd's message (`ErrGRPCNoSpace`) for a write past its `--quota-backend-bytes`; its gRPC
/// code, ResourceExhausted, is shared with "too many requests".
const NO_SPACE: &str = "database space exceeded";

/// What an etcd failure means to the store. Decided on etcd's messages, the only thing that
/// tells these cases apart (they share gRPC codes with other failures).
#[derive(Debug)]
pub(crate) enum Failure {
    /// The revision asked for is compacted; the caller looks up the compaction point.
    Compacted,
    /// The revision asked for is in the future; the caller looks up the current revision.
    FutureRevision,
    /// The request exceeded etcd's size limit.
    TooLarge,
    /// Anything else: connection loss, timeouts, no leader, refusals.
    Other(StoreError),
}

/// Sorts an etcd client error.
pub(crate) fn failure(error: etcd_client::Error) -> Failure {
    if let etcd_client::Error::GRpcStatus(status) = &error {
        let message = status.message();
        if message.contains(COMPACTED) {
            return Failure::Compacted;
        }
        if message.contains(FUTURE_REVISION) {
            return Failure::FutureRevision;
        }
        if message.contains(TOO_LARGE) {
            return Failure::TooLarge;
        }
        if message.contains(NO_SPACE) {
            return Failure::Other(StoreError::QuotaExceeded {
                full: crate::error::QuotaFull::Etcd,
            });
        }
    }
    Failure::Other(StoreError::unavailable(error))
}

/// A revision from etcd (an `i64` that is never negative in a key-value or header).
pub(crate) fn revision(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// A revision for etcd; revisions above `i64::MAX` cannot exist there.
pub(crate) fn etcd_revision(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The store's view of an etcd key-value, or `Corrupt` when its key is not one of ours.
pub(crate) fn key_value(
    namespace: &Namespace,
    kv: &etcd_client::KeyValue,
) -> Result<KeyValue, StoreError> {
    let key = namespace.strip(kv.key()).ok_or(StoreError::Corrupt {
        revision: revision(kv.mod_revision()),
        reason: "etcd returned a key outside the store's prefix or not UTF-8",
    })?;
    Ok(KeyValue {
        key: key.to_owned(),
        value: Bytes::copy_from_slice(kv.value()),
        create_revision: revision(kv.create_revision()),
        mod_revision: revision(kv.mod_revision()),
        version: revision(kv.version()),
    })
}

/// Why an etcd watch event could not become a store event.
#[derive(Debug)]
pub(crate) enum EventError {
    /// etcd sent an update or deletion without the state it replaced: that state was
    /// compacted before etcd could read it, so the watch cannot go on.
    PreviousCompacted,
    /// The event itself is unusable.
    Store(StoreError),
}

/// The store's event of an etcd watch event (watched with `prev_kv`).
pub(crate) fn event(
    namespace: &Namespace,
    event: &etcd_client::Event,
) -> Result<Event, EventError> {
    let kv = event.kv().ok_or(EventError::Store(StoreError::Corrupt {
        revision: 0,
        reason: "etcd sent a watch event without a key-value",
    }))?;
    let convert = |kv| key_value(namespace, kv).map_err(EventError::Store);
    let prev = event.prev_kv().map(convert).transpose()?;
    match event.event_type() {
        etcd_client::EventType::Put => {
            let kv = convert(kv)?;
            // A creation has no previous state; etcd sends none (version 1 marks it).
            if kv.version > 1 && prev.is_none() {
                return Err(EventError::PreviousCompacted);
            }
            let prev = if kv.version == 1 { None } else { prev };
            Ok(Event::Put { kv, prev })
        }
        etcd_client::EventType::Delete => Ok(Event::Delete {
            prev: prev.ok_or(EventError::PreviousCompacted)?,
            revision: revision(kv.mod_revision()),
        }),
    }
}
