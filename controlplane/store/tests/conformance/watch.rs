//! Watches: history replay, the switch to live changes, compaction, progress, shutdown.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use sluice_store::{Event, Store, StoreError};

use super::{base, open, Backend};
use crate::common::{assert_quiet, events_until, next, revisions, value};

/// `first..=last`, for expected revisions.
fn range(first: u64, last: u64) -> Vec<u64> {
    (first..=last).collect()
}

pub async fn a_watch_replays_history_then_follows_live_changes(backend: &dyn Backend) {
    let store = open(backend).await;
    let b = base(&*store).await;
    store.create("/r/a", value("1")).await.unwrap();
    store.create("/other/x", value("1")).await.unwrap();
    store.update("/r/a", value("2"), None).await.unwrap();
    store.create("/r/b", value("1")).await.unwrap();
    store.delete("/r/a", None).await.unwrap();

    let mut from_start = store.watch("/r/", b);
    let history = events_until(&mut from_start, b + 5).await;
    assert_eq!(revisions(&history), [b + 1, b + 3, b + 4, b + 5]);
    assert!(matches!(&history[0], Event::Put { prev: None, kv } if kv.key == "/r/a"));
    match &history[1] {
        Event::Put {
            kv,
            prev: Some(prev),
        } => {
            assert_eq!(
                (kv.version, prev.mod_revision, prev.value.as_ref()),
                (2, b + 1, &b"1"[..])
            )
        }
        other => panic!("expected an update, got {other:?}"),
    }
    match &history[3] {
        Event::Delete { prev, revision } => {
            assert_eq!(
                (*revision, prev.mod_revision, prev.version),
                (b + 5, b + 3, 2)
            )
        }
        other => panic!("expected a deletion, got {other:?}"),
    }

    let mut from_middle = store.watch("/r/", b + 3);
    assert_eq!(
        revisions(&events_until(&mut from_middle, b + 5).await),
        [b + 4, b + 5]
    );

    store.update("/r/b", value("2"), None).await.unwrap();
    store.create("/other/y", value("1")).await.unwrap();
    store.create("/r/c", value("1")).await.unwrap();
    for stream in [&mut from_start, &mut from_middle] {
        assert_eq!(
            revisions(&events_until(stream, b + 8).await),
            [b + 6, b + 8]
        );
    }
    assert_quiet(&mut from_start).await;
}

pub async fn a_watch_started_during_writes_sees_each_change_exactly_once(backend: &dyn Backend) {
    let store = open(backend).await;
    let b = base(&*store).await;
    let total = 600u64;
    let writer = {
        let store: Arc<dyn Store> = store.clone();
        tokio::spawn(async move {
            for index in 0..total {
                store
                    .create(&format!("/r/{index:04}"), value("v"))
                    .await
                    .unwrap();
            }
        })
    };
    // Watches start at staggered moments while the writer runs: each crosses from history to
    // live at a different point.
    let mut watchers = Vec::new();
    for delay_ms in [0u64, 2, 5, 10, 20] {
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        let mut stream = store.watch("/r/", b);
        watchers.push(tokio::spawn(async move {
            events_until(&mut stream, b + total).await
        }));
    }
    writer.await.unwrap();
    for watcher in watchers {
        let seen = revisions(&watcher.await.unwrap());
        assert_eq!(seen, range(b + 1, b + total));
    }
}

pub async fn a_watch_after_the_current_revision_waits_for_it(backend: &dyn Backend) {
    let store = open(backend).await;
    let b = base(&*store).await;
    store.create("/r/a", value("1")).await.unwrap();
    let mut future = store.watch("/r/", b + 2);
    store.update("/r/a", value("2"), None).await.unwrap();
    store.update("/r/a", value("3"), None).await.unwrap();
    assert_eq!(revisions(&events_until(&mut future, b + 3).await), [b + 3]);
}

pub async fn a_watch_older_than_the_compaction_point_is_told_so(backend: &dyn Backend) {
    let store = open(backend).await;
    let b = base(&*store).await;
    store.create("/r/a", value("0")).await.unwrap();
    for version in 1..6 {
        store
            .update("/r/a", value(&version.to_string()), None)
            .await
            .unwrap();
    }
    let current = store.current_revision().await.unwrap();
    store.compact(b + 4).await.unwrap();
    // Just before the compaction point (where the first change's previous state is gone) and
    // far before it.
    for after in [b + 3, b] {
        let mut old = store.watch("/r/", after);
        match next(&mut old).await {
            Some(Err(error @ StoreError::Compacted { compact_revision })) => {
                assert_eq!(compact_revision, b + 4);
                assert_eq!(error.http_status(), 410);
                assert!(!error.retryable());
            }
            other => panic!("expected Compacted after {after}, got {other:?}"),
        }
        assert!(
            next(&mut old).await.is_none(),
            "the stream ends after its error"
        );
    }
    let mut at_point = store.watch("/r/", b + 4);
    let events = events_until(&mut at_point, current).await;
    assert_eq!(revisions(&events), range(b + 5, current));
    // The first change after the compaction point still carries the state it replaced.
    assert!(
        matches!(&events[0], Event::Put { prev: Some(prev), .. } if prev.mod_revision == b + 4)
    );
}

pub async fn dropping_the_store_ends_live_watches_as_unavailable(backend: &dyn Backend) {
    let store = open(backend).await;
    let b = base(&*store).await;
    store.create("/r/a", value("1")).await.unwrap();
    let mut stream = store.watch("/r/", b);
    assert_eq!(revisions(&events_until(&mut stream, b + 1).await), [b + 1]);
    assert!(
        tokio::time::timeout(Duration::from_millis(50), stream.next())
            .await
            .is_err()
    );
    drop(store);
    match next(&mut stream).await {
        Some(Err(error @ StoreError::Unavailable { .. })) => assert!(error.retryable()),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

pub async fn an_idle_watch_reports_progress_past_other_prefixes_writes(backend: &dyn Backend) {
    let store = open(backend).await;
    let b = base(&*store).await;
    store.create("/r/a", value("1")).await.unwrap();
    let mut stream = store.watch("/r/", b);
    assert_eq!(revisions(&events_until(&mut stream, b + 1).await), [b + 1]);
    store.create("/other/x", value("1")).await.unwrap();
    store.create("/other/y", value("1")).await.unwrap();
    // A report may fall between the two writes; each one moves forward and the last covers
    // both of the other prefix's writes.
    let mut last = b + 1;
    while last < b + 3 {
        match next(&mut stream).await {
            Some(Ok(batch)) => {
                assert!(batch.events.is_empty(), "{batch:?}");
                assert!(
                    batch.revision > last && batch.revision <= b + 3,
                    "{batch:?}"
                );
                last = batch.revision;
            }
            other => panic!("expected a progress notification, got {other:?}"),
        }
    }
    // Without new writes there is nothing new to report.
    assert_quiet(&mut stream).await;
    store.update("/r/a", value("2"), None).await.unwrap();
    assert_eq!(revisions(&events_until(&mut stream, b + 4).await), [b + 4]);
}

/// A watch of the empty prefix follows every key, in one ordered stream (the API server's
/// span view follows policies and VMs so), live changes and history alike.
pub async fn a_watch_of_the_empty_prefix_sees_every_key(backend: &dyn Backend) {
    let store = open(backend).await;
    let b = base(&*store).await;
    store.create("/a/x", value("1")).await.unwrap();
    let mut everything = store.watch("", b);
    store.create("/b/y", value("1")).await.unwrap();
    store.update("/a/x", value("2"), None).await.unwrap();
    let seen = events_until(&mut everything, b + 3).await;
    assert_eq!(revisions(&seen), range(b + 1, b + 3));
    let keys: Vec<&str> = seen.iter().map(Event::key).collect();
    assert_eq!(keys, ["/a/x", "/b/y", "/a/x"]);
    assert_eq!(store.current_revision().await.unwrap(), b + 3);
}
