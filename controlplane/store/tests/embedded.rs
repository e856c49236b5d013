//! The conformance cases (see `conformance/mod.rs`) on the embedded store.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;
#[macro_use]
mod conformance;

use std::sync::Arc;
use std::time::Duration;

use sluice_store::{EmbeddedConfig, EmbeddedStore, Store};
use tempfile::TempDir;

/// An embedded store in a temporary directory.
struct Embedded {
    dir: TempDir,
}

#[async_trait::async_trait]
impl conformance::Backend for Embedded {
    async fn open(&self, max_value_bytes: usize) -> Arc<dyn Store> {
        let config = EmbeddedConfig {
            max_value_bytes,
            progress_interval: Duration::from_millis(30),
            ..EmbeddedConfig::default()
        };
        let path = self.dir.path().join("store.redb");
        Arc::new(EmbeddedStore::open_with(path, config).expect("the store opens"))
    }
}

fn embedded(_case: &str) -> Option<Embedded> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    Some(Embedded { dir })
}

conformance_tests!(embedded);

/// A store past its quota refuses creates and updates with a typed 507 error while reads,
/// watches and deletes go on; compaction frees the deleted objects' history and writes work
/// again; the count survives a reopen.
#[tokio::test]
async fn the_quota_refuses_puts_until_deletes_and_compaction_free_space() {
    use sluice_store::{QuotaFull, StoreError};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let config = EmbeddedConfig {
        quota_bytes: 64 * 1024,
        ..EmbeddedConfig::default()
    };
    let store = EmbeddedStore::open_with(&path, config.clone()).unwrap();
    let value = || bytes::Bytes::from(vec![b'v'; 10 * 1024]);
    let mut watch = store.watch("/k/", 0);
    let mut written = Vec::new();
    let refused = loop {
        let key = format!("/k/{}", written.len());
        match store.create(&key, value()).await {
            Ok(_) => written.push(key),
            Err(error) => break error,
        }
        assert!(
            written.len() < 10,
            "10 values of 10 KiB never filled 64 KiB"
        );
    };
    let StoreError::QuotaExceeded { full } = &refused else {
        panic!("expected the quota, got {refused:?}");
    };
    assert!(matches!(full, QuotaFull::Embedded { quota: 65536, .. }));
    assert_eq!(refused.http_status(), 507);
    let usage = store.usage().unwrap();
    assert!(usage.used_bytes <= usage.quota_bytes && usage.used_bytes > 50 * 1024);
    // An update of an existing key is refused too; reads and the watch go on.
    let update = store.update(&written[0], value(), None).await;
    assert!(matches!(update, Err(StoreError::QuotaExceeded { .. })));
    assert!(store.get(&written[0]).await.unwrap().is_some());
    let listed = store.list("/k/", None, 0, None).await.unwrap();
    assert_eq!(listed.items.len(), written.len());
    let mut seen = 0;
    while seen < written.len() {
        let batch = futures_util::StreamExt::next(&mut watch)
            .await
            .unwrap()
            .unwrap();
        seen += batch.events.len();
    }
    // Deletes pass; compaction to after them gives the space back.
    for key in &written {
        store.delete(key, None).await.unwrap();
    }
    let refused_after_deletes = store.create("/k/new", value()).await;
    assert!(matches!(
        refused_after_deletes,
        Err(StoreError::QuotaExceeded { .. })
    ));
    store
        .compact(store.current_revision().await.unwrap())
        .await
        .unwrap();
    let freed = store.usage().unwrap().used_bytes;
    assert!(freed < 1024, "compaction left {freed} bytes");
    store.create("/k/new", value()).await.unwrap();
    let used = store.usage().unwrap().used_bytes;
    drop((watch, store));
    let reopened = EmbeddedStore::open_with(&path, config).unwrap();
    assert_eq!(reopened.usage().unwrap().used_bytes, used);
}

/// Group commit, measured (not a pass/fail timing: run it by name with `--ignored`): 64
/// writers at once against one writer, the same number of writes, on the same disk. Without
/// group commit each write pays its own fsync and the two rates are about equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: cargo test --release -p sluice-store --test embedded group_commit -- --ignored --nocapture"]
async fn group_commit_rate() {
    const WRITES: usize = 2_048;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(EmbeddedStore::open(dir.path().join("store.redb")).unwrap());
    let started = std::time::Instant::now();
    for n in 0..WRITES {
        store
            .create(&format!("/one/{n}"), bytes::Bytes::from_static(b"v"))
            .await
            .unwrap();
    }
    let one = WRITES as f64 / started.elapsed().as_secs_f64();
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|writer| {
            let store = store.clone();
            tokio::spawn(async move {
                for n in 0..WRITES / 64 {
                    let key = format!("/many/{writer}/{n}");
                    store
                        .create(&key, bytes::Bytes::from_static(b"v"))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let many = WRITES as f64 / started.elapsed().as_secs_f64();
    println!(
        "one writer: {one:.0} writes/s; 64 writers: {many:.0} writes/s ({:.1}x)",
        many / one
    );
}
