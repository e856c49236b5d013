//! Helpers shared by the integration tests: a store in a temporary directory, and reading
//! watch streams with a deadline so a missing event fails the test instead of hanging it.

#![allow(dead_code)] // each test file uses a different subset

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use sluice_store::{EmbeddedConfig, EmbeddedStore, Event, StoreError, WatchBatch, WatchStream};
use tempfile::TempDir;

/// How long a test waits for an event that must come.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A store in its own temporary directory (kept alive by the returned `TempDir`).
pub fn open() -> (EmbeddedStore, TempDir) {
    open_with(EmbeddedConfig::default())
}

/// A store with `config` in its own temporary directory.
pub fn open_with(config: EmbeddedConfig) -> (EmbeddedStore, TempDir) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = EmbeddedStore::open_with(dir.path().join("store.redb"), config)
        .expect("the store opens in a new directory");
    (store, dir)
}

/// `text` as a value.
pub fn value(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
}

/// The next item of `stream`, failing the test after [`DEADLINE`].
pub async fn next(stream: &mut WatchStream) -> Option<Result<WatchBatch, StoreError>> {
    tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("no watch item within the deadline")
}

/// Events from `stream` until one has revision `last` (or more), failing on an error;
/// progress notifications are checked and skipped.
pub async fn events_until(stream: &mut WatchStream, last: u64) -> Vec<Event> {
    let mut events = Vec::new();
    while events
        .last()
        .is_none_or(|event: &Event| event.revision() < last)
    {
        match next(stream).await {
            Some(Ok(batch)) => {
                let last_event = batch.events.last().map(Event::revision);
                assert_eq!(last_event.unwrap_or(batch.revision), batch.revision);
                events.extend(batch.events);
            }
            Some(Err(error)) => panic!("watch failed: {error}"),
            None => panic!("watch ended before revision {last}"),
        }
    }
    events
}

/// Asserts that nothing more arrives on `stream` for a short while.
pub async fn assert_quiet(stream: &mut WatchStream) {
    let more = tokio::time::timeout(Duration::from_millis(100), stream.next()).await;
    assert!(more.is_err(), "unexpected watch item: {more:?}");
}

/// The revisions of `events`.
pub fn revisions(events: &[Event]) -> Vec<u64> {
    events.iter().map(Event::revision).collect()
}
