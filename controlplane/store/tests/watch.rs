//! Watches: history replay, the switch to live changes, compaction, slow watchers, shutdown.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{assert_quiet, events_until, next, open, open_with, revisions, value};
use futures_util::StreamExt;
use sluice_store::{EmbeddedConfig, Event, Store, StoreError};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_replays_history_then_follows_live_changes() {
    let (store, _dir) = open();
    store.create("/r/a", value("1")).await.unwrap();
    store.create("/other/x", value("1")).await.unwrap();
    store.update("/r/a", value("2"), None).await.unwrap();
    store.create("/r/b", value("1")).await.unwrap();
    store.delete("/r/a", None).await.unwrap();

    let mut from_start = store.watch("/r/", 0);
    let history = events_until(&mut from_start, 5).await;
    assert_eq!(revisions(&history), [1, 3, 4, 5]);
    assert!(matches!(&history[0], Event::Put { prev: None, kv } if kv.key == "/r/a"));
    match &history[1] {
        Event::Put {
            kv,
            prev: Some(prev),
        } => {
            assert_eq!(
                (kv.version, prev.mod_revision, prev.value.as_ref()),
                (2, 1, &b"1"[..])
            )
        }
        other => panic!("expected an update, got {other:?}"),
    }
    match &history[3] {
        Event::Delete { prev, revision: 5 } => {
            assert_eq!((prev.mod_revision, prev.version), (3, 2))
        }
        other => panic!("expected a deletion, got {other:?}"),
    }

    let mut from_middle = store.watch("/r/", 3);
    assert_eq!(revisions(&events_until(&mut from_middle, 5).await), [4, 5]);

    store.update("/r/b", value("2"), None).await.unwrap();
    store.create("/other/y", value("1")).await.unwrap();
    store.create("/r/c", value("1")).await.unwrap();
    assert_eq!(revisions(&events_until(&mut from_start, 8).await), [6, 8]);
    assert_eq!(revisions(&events_until(&mut from_middle, 8).await), [6, 8]);
    assert_quiet(&mut from_start).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_started_during_writes_sees_each_change_exactly_once() {
    let (store, _dir) = open();
    let store: Arc<dyn Store> = Arc::new(store);
    let total = 600u64;
    let writer = {
        let store = store.clone();
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
        let mut stream = store.watch("/r/", 0);
        watchers.push(tokio::spawn(async move {
            events_until(&mut stream, total).await
        }));
    }
    writer.await.unwrap();
    for watcher in watchers {
        let seen = revisions(&watcher.await.unwrap());
        assert_eq!(seen, (1..=total).collect::<Vec<_>>());
    }
}

#[tokio::test]
async fn a_watch_after_the_current_revision_waits_for_it() {
    let (store, _dir) = open();
    store.create("/r/a", value("1")).await.unwrap();
    let mut future = store.watch("/r/", 2);
    store.update("/r/a", value("2"), None).await.unwrap();
    store.update("/r/a", value("3"), None).await.unwrap();
    assert_eq!(revisions(&events_until(&mut future, 3).await), [3]);
}

#[tokio::test]
async fn a_watch_older_than_the_compaction_point_is_told_so() {
    let (store, _dir) = open();
    store.create("/r/a", value("0")).await.unwrap();
    for version in 1..6 {
        store
            .update("/r/a", value(&version.to_string()), None)
            .await
            .unwrap();
    }
    let current = store.current_revision().await.unwrap();
    store.compact(4).await.unwrap();
    let mut old = store.watch("/r/", 3);
    match next(&mut old).await {
        Some(Err(
            error @ StoreError::Compacted {
                compact_revision: 4,
            },
        )) => {
            assert_eq!(error.http_status(), 410);
            assert!(!error.retryable());
        }
        other => panic!("expected Compacted, got {other:?}"),
    }
    assert!(
        next(&mut old).await.is_none(),
        "the stream ends after its error"
    );
    let mut at_point = store.watch("/r/", 4);
    let events = events_until(&mut at_point, current).await;
    assert_eq!(revisions(&events), (5..=current).collect::<Vec<_>>());
    // The first change after the compaction point still carries the state it replaced.
    assert!(matches!(&events[0], Event::Put { prev: Some(prev), .. } if prev.mod_revision == 4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_watcher_is_cut_without_blocking_writers_and_can_resume() {
    let config = EmbeddedConfig {
        watch_buffer: 4,
        ..EmbeddedConfig::default()
    };
    let (store, _dir) = open_with(config);
    let mut slow = store.watch("/r/", 0);
    let mut fast = store.watch("/r/", 0);
    // Both are live (subscribed) once they have polled an empty history.
    assert!(tokio::time::timeout(Duration::from_millis(50), slow.next())
        .await
        .is_err());
    assert!(tokio::time::timeout(Duration::from_millis(50), fast.next())
        .await
        .is_err());
    assert_eq!(store.live_watchers(), 2);
    let fast = tokio::spawn(async move { events_until(&mut fast, 50).await });

    // The slow watcher is never polled while the writes go on: a writer waiting for it would
    // hang here.
    let writes = async {
        for index in 0..50 {
            let key = format!("/r/{index:02}");
            store.create(&key, value("v")).await.unwrap();
        }
    };
    tokio::time::timeout(common::DEADLINE, writes)
        .await
        .expect("writers were held up by the slow watcher");
    assert_eq!(
        revisions(&fast.await.unwrap()),
        (1..=50).collect::<Vec<_>>()
    );

    let mut delivered = Vec::new();
    let last_revision = loop {
        match next(&mut slow).await {
            Some(Ok(batch)) => delivered.extend(batch.events),
            Some(Err(error @ StoreError::Lagged { last_revision })) => {
                assert!(error.retryable());
                assert_eq!(error.http_status(), 410);
                break last_revision;
            }
            other => panic!("expected Lagged, got {other:?}"),
        }
    };
    assert!(last_revision < 50);
    assert_eq!(
        revisions(&delivered),
        (1..=last_revision).collect::<Vec<_>>()
    );
    assert!(next(&mut slow).await.is_none());
    assert_eq!(
        store.live_watchers(),
        0,
        "the slow watcher was dropped from the hub"
    );

    // Resuming from the last delivered revision loses nothing.
    let mut resumed = store.watch("/r/", last_revision);
    let rest = events_until(&mut resumed, 50).await;
    assert_eq!(
        revisions(&rest),
        (last_revision + 1..=50).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn dropping_the_store_ends_live_watches_as_unavailable() {
    let (store, _dir) = open();
    store.create("/r/a", value("1")).await.unwrap();
    let mut stream = store.watch("/r/", 0);
    assert_eq!(revisions(&events_until(&mut stream, 1).await), [1]);
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

#[tokio::test]
async fn an_idle_watch_reports_progress_past_other_prefixes_writes() {
    let config = EmbeddedConfig {
        progress_interval: Duration::from_millis(30),
        ..EmbeddedConfig::default()
    };
    let (store, _dir) = open_with(config);
    store.create("/r/a", value("1")).await.unwrap();
    let mut stream = store.watch("/r/", 0);
    assert_eq!(revisions(&events_until(&mut stream, 1).await), [1]);
    store.create("/other/x", value("1")).await.unwrap();
    store.create("/other/y", value("1")).await.unwrap();
    match next(&mut stream).await {
        Some(Ok(batch)) => {
            assert!(batch.events.is_empty());
            assert_eq!(
                batch.revision, 3,
                "progress covers the other prefix's writes"
            );
        }
        other => panic!("expected a progress notification, got {other:?}"),
    }
    // Without new writes there is nothing new to report.
    assert_quiet(&mut stream).await;
    store.update("/r/a", value("2"), None).await.unwrap();
    assert_eq!(revisions(&events_until(&mut stream, 4).await), [4]);
}
