//! Reopening the same file keeps every key, the revision counter and the compaction point.

mod common;

use common::{events_until, revisions, value};
use sluice_store::{EmbeddedStore, Store, StoreError};

#[tokio::test]
async fn a_reopened_store_keeps_keys_revisions_and_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (before, listed) = {
        let store = EmbeddedStore::open(&path).unwrap();
        store.create("/r/a", value("1")).await.unwrap();
        store.create("/r/b", value("1")).await.unwrap();
        store.update("/r/a", value("2"), None).await.unwrap();
        store.create("/r/c", value("1")).await.unwrap();
        store.delete("/r/b", None).await.unwrap();
        store.compact(3).await.unwrap();
        let listed = store.list("/r/", None, 0, None).await.unwrap();
        (store.current_revision().await.unwrap(), listed)
    };
    assert_eq!(before, 5);

    let store = EmbeddedStore::open(&path).unwrap();
    assert_eq!(store.current_revision().await.unwrap(), 5);
    assert_eq!(store.compact_revision().await.unwrap(), 3);
    assert_eq!(store.list("/r/", None, 0, None).await.unwrap(), listed);
    let a = store.get("/r/a").await.unwrap().unwrap();
    assert_eq!(
        (a.value, a.create_revision, a.mod_revision, a.version),
        (value("2"), 1, 3, 2)
    );
    assert_eq!(store.get("/r/b").await.unwrap(), None);
    assert!(matches!(
        store.list("/r/", None, 0, Some(2)).await,
        Err(StoreError::Compacted {
            compact_revision: 3
        })
    ));

    // The counter never goes back: the next write follows the last one before the restart,
    // and a watch resumes across the restart.
    let next = store.create("/r/d", value("1")).await.unwrap();
    assert_eq!(next.mod_revision, 6);
    let mut resumed = store.watch("/r/", 3);
    assert_eq!(revisions(&events_until(&mut resumed, 6).await), [4, 5, 6]);
}

#[tokio::test]
async fn a_store_file_open_elsewhere_is_reported_not_shared() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let _first = EmbeddedStore::open(&path).unwrap();
    match EmbeddedStore::open(&path) {
        Err(error @ StoreError::Unavailable { .. }) => assert_eq!(error.http_status(), 503),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

/// The on-disk log table, as the embedded backend lays it out (see README.md).
const LOG: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("log");

#[tokio::test]
async fn a_damaged_row_fails_the_requests_that_read_it_and_nothing_else() {
    use redb::Database;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    {
        let store = EmbeddedStore::open(&path).unwrap();
        store.create("/r/a", value("1")).await.unwrap();
        store.create("/r/b", value("1")).await.unwrap();
    }
    {
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(LOG)
            .unwrap()
            .insert(1, &b"\x01garbage"[..])
            .unwrap();
        txn.commit().unwrap();
    }
    let store = EmbeddedStore::open(&path).unwrap();
    let damaged = store.get("/r/a").await.unwrap_err();
    assert!(
        matches!(damaged, StoreError::Corrupt { revision: 1, .. }),
        "{damaged}"
    );
    assert_eq!((damaged.http_status(), damaged.retryable()), (500, false));
    assert!(
        store.get("/r/b").await.unwrap().is_some(),
        "other rows still read"
    );
    let mut watch = store.watch("/r/", 0);
    match common::next(&mut watch).await {
        Some(Err(StoreError::Corrupt { revision: 1, .. })) => {}
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[tokio::test]
async fn a_watch_over_a_missing_row_fails_instead_of_spinning() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    {
        let store = EmbeddedStore::open(&path).unwrap();
        store.create("/r/a", value("1")).await.unwrap();
        store.create("/r/b", value("1")).await.unwrap();
    }
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(LOG).unwrap().remove(2).unwrap();
        txn.commit().unwrap();
    }
    let store = EmbeddedStore::open(&path).unwrap();
    let mut watch = store.watch("/r/", 1);
    match common::next(&mut watch).await {
        Some(Err(StoreError::Corrupt { revision: 2, .. })) => {}
        other => panic!("expected Corrupt, got {other:?}"),
    }
}
