//! Create, get, update and delete: etcd's semantics and errors.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use sluice_store::{Store, StoreError};

use super::{base, open, Backend};
use crate::common::value;

pub async fn writes_advance_one_revision_each_and_track_versions(backend: &dyn Backend) {
    let store = open(backend).await;
    let b = base(&*store).await;
    assert_eq!(store.get("/a").await.unwrap(), None);

    let created = store.create("/a", value("one")).await.unwrap();
    let revisions = |kv: &sluice_store::KeyValue| (kv.create_revision, kv.mod_revision, kv.version);
    assert_eq!(revisions(&created), (b + 1, b + 1, 1));
    assert_eq!(store.get("/a").await.unwrap(), Some(created.clone()));

    let updated = store.update("/a", value("two"), Some(b + 1)).await.unwrap();
    assert_eq!(revisions(&updated), (b + 1, b + 2, 2));
    assert_eq!(updated.value, value("two"));
    let unconditional = store.update("/a", value("three"), None).await.unwrap();
    assert_eq!(
        (unconditional.mod_revision, unconditional.version),
        (b + 3, 3)
    );
    assert_eq!(store.get("/a").await.unwrap(), Some(unconditional.clone()));

    let deleted = store.delete("/a", Some(b + 3)).await.unwrap();
    assert_eq!(deleted, unconditional, "delete returns the deleted state");
    assert_eq!(store.get("/a").await.unwrap(), None);
    assert_eq!(store.current_revision().await.unwrap(), b + 4);

    // A new incarnation starts over: new create_revision, version 1.
    let again = store.create("/a", value("four")).await.unwrap();
    assert_eq!(revisions(&again), (b + 5, b + 5, 1));
}

pub async fn refused_writes_say_why_and_change_nothing(backend: &dyn Backend) {
    let store = open(backend).await;
    let b = base(&*store).await;
    store.create("/a", value("one")).await.unwrap();
    let current = store.update("/a", value("two"), None).await.unwrap();

    let exists = store.create("/a", value("x")).await.unwrap_err();
    assert!(matches!(exists, StoreError::AlreadyExists { ref key } if key == "/a"));
    assert_eq!(exists.http_status(), 409);

    for error in [
        store
            .update("/a", value("x"), Some(b + 1))
            .await
            .unwrap_err(),
        store.delete("/a", Some(b + 1)).await.unwrap_err(),
    ] {
        match error {
            StoreError::Conflict { current: got } => assert_eq!(*got, current),
            other => panic!("expected a conflict, got {other}"),
        }
    }
    for error in [
        store.update("/b", value("x"), None).await.unwrap_err(),
        store.delete("/b", None).await.unwrap_err(),
        store.delete("/b", Some(b + 2)).await.unwrap_err(),
        // An expected revision of 0 must not turn an update into a creation.
        store.update("/b", value("x"), Some(0)).await.unwrap_err(),
    ] {
        assert!(
            matches!(error, StoreError::NotFound { ref key } if key == "/b"),
            "{error}"
        );
    }
    assert_eq!(
        store.current_revision().await.unwrap(),
        b + 2,
        "refusals write nothing"
    );
    assert_eq!(store.get("/a").await.unwrap(), Some(current));
}

pub async fn oversized_values_and_bad_keys_are_refused_with_typed_errors(backend: &dyn Backend) {
    let store = backend.open(16).await;
    let b = base(&*store).await;
    store
        .create("/a", Bytes::from(vec![b'x'; 16]))
        .await
        .unwrap();
    let too_large = store
        .create("/b", Bytes::from(vec![b'x'; 17]))
        .await
        .unwrap_err();
    assert!(matches!(
        too_large,
        StoreError::ValueTooLarge { size: 17, max: 16 }
    ));
    assert_eq!(too_large.http_status(), 413);
    let update = store.update("/a", Bytes::from(vec![b'x'; 17]), None).await;
    assert!(matches!(update, Err(StoreError::ValueTooLarge { .. })));
    for key in [String::new(), "k".repeat(8 * 1024 + 1)] {
        assert!(matches!(
            store.create(&key, value("x")).await,
            Err(StoreError::InvalidKey { .. })
        ));
        assert!(matches!(
            store.delete(&key, None).await,
            Err(StoreError::InvalidKey { .. })
        ));
    }
    assert_eq!(store.current_revision().await.unwrap(), b + 1);
}

pub async fn default_limit_is_etcds_request_size(backend: &dyn Backend) {
    let store = open(backend).await;
    let limit = sluice_store::DEFAULT_MAX_VALUE_BYTES;
    assert_eq!(limit, 1536 * 1024);
    store
        .create("/big", Bytes::from(vec![7u8; limit]))
        .await
        .unwrap();
    assert_eq!(store.get("/big").await.unwrap().unwrap().value.len(), limit);
    let over = store
        .create("/bigger", Bytes::from(vec![7u8; limit + 1]))
        .await;
    assert!(matches!(over, Err(StoreError::ValueTooLarge { .. })));
}

pub async fn concurrent_updates_with_the_same_expectation_have_one_winner(backend: &dyn Backend) {
    let store = open(backend).await;
    let base = store.create("/contended", value("0")).await.unwrap();
    let mut tasks = Vec::new();
    for writer in 0..16 {
        let store: Arc<dyn Store> = store.clone();
        tasks.push(tokio::spawn(async move {
            let body = value(&format!("writer {writer}"));
            store
                .update("/contended", body, Some(base.mod_revision))
                .await
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            Ok(kv) => winners.push(kv),
            Err(StoreError::Conflict { current }) => {
                assert!(current.mod_revision > base.mod_revision)
            }
            Err(other) => panic!("unexpected error: {other}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one conditional update wins");
    assert_eq!(
        store.get("/contended").await.unwrap(),
        Some(winners[0].clone())
    );
    assert_eq!(
        store.current_revision().await.unwrap(),
        base.mod_revision + 1
    );
}

/// Many writers at once (the embedded store commits them in groups): every write gets its own
/// revision, the revisions are gap-free, the answers match what is stored, a refused write in
/// the middle of the crowd changes nothing, and a watch sees each change once, in order.
pub async fn concurrent_writers_each_get_their_own_revision(backend: &dyn Backend) {
    let store = open(backend).await;
    let start = store.current_revision().await.unwrap();
    store.create("/crowd/taken", value("first")).await.unwrap();
    let mut watch = store.watch("/crowd/", start);
    let mut tasks = Vec::new();
    for writer in 0..32 {
        let store: Arc<dyn Store> = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for n in 0..8 {
                let key = format!("/crowd/{writer:02}-{n}");
                answers.push(store.create(&key, value(&key)).await.unwrap());
                let refused = store.create("/crowd/taken", value("again")).await;
                assert!(matches!(refused, Err(StoreError::AlreadyExists { .. })));
            }
            answers
        }));
    }
    let mut revisions = Vec::new();
    for task in tasks {
        for kv in task.await.unwrap() {
            assert_eq!(kv.value, value(&kv.key), "the answer is the write's own");
            revisions.push(kv.mod_revision);
        }
    }
    revisions.sort_unstable();
    let first = start + 2;
    let expected: Vec<u64> = (first..first + 256).collect();
    assert_eq!(
        revisions, expected,
        "one revision each, no gap, none shared"
    );
    assert_eq!(store.current_revision().await.unwrap(), first + 255);
    let mut seen = Vec::new();
    while seen.len() < 257 {
        let batch = tokio::time::timeout(std::time::Duration::from_secs(10), watch.next())
            .await
            .expect("the watch keeps up")
            .expect("the watch goes on")
            .unwrap();
        seen.extend(batch.events.iter().map(|event| event.revision()));
    }
    let all: Vec<u64> = (start + 1..=first + 255).collect();
    assert_eq!(seen, all, "each change once, in revision order");
}
