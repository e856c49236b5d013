//! Watches of the embedded store only: a slow watcher is cut with `Lagged` (etcd has no such
//! buffer: its gRPC stream applies back-pressure instead). The behaviours every backend shares
//! are in `conformance/watch.rs`.

mod common;

use std::time::Duration;

use common::{events_until, next, open_with, revisions, value};
use futures_util::StreamExt;
use sluice_store::{EmbeddedConfig, Store, StoreError};

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

    // The slow watcher is never polled while the writes go on: a writer waiting for it would
    // hang here. The fast one reads each event before the next write, so it never holds more
    // than one (a spawned reader could be outrun by the writes on a busy 2-core machine and
    // be cut itself, which is not what this test is about).
    let writes = async {
        let mut seen = Vec::new();
        for index in 0..50u64 {
            let key = format!("/r/{index:02}");
            store.create(&key, value("v")).await.unwrap();
            seen.extend(events_until(&mut fast, index + 1).await);
        }
        seen
    };
    let seen = tokio::time::timeout(common::DEADLINE, writes)
        .await
        .expect("writers were held up by the slow watcher");
    assert_eq!(revisions(&seen), (1..=50).collect::<Vec<_>>());
    drop(fast);

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
