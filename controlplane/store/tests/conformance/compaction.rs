//! Compaction keeps the current values and the state at the compaction point, drops the rest,
//! and the periodic compactor follows one tick behind.

use std::time::Duration;

use sluice_store::{Compactor, Event, StoreError};

use super::{base, open, Backend};
use crate::common::{events_until, revisions, value, DEADLINE};

pub async fn compaction_keeps_current_values_and_the_state_at_its_point(backend: &dyn Backend) {
    let store = open(backend).await;
    let b = base(&*store).await;
    store.create("/r/live", value("1")).await.unwrap(); // 1
    store.create("/r/gone", value("1")).await.unwrap(); // 2
    store.update("/r/live", value("2"), None).await.unwrap(); // 3
    store.delete("/r/gone", None).await.unwrap(); // 4
    store.create("/r/back", value("1")).await.unwrap(); // 5
    store.delete("/r/back", None).await.unwrap(); // 6
    store.create("/r/back", value("2")).await.unwrap(); // 7
    store.update("/r/live", value("3"), None).await.unwrap(); // 8
    let mut lists_before = Vec::new();
    for at in b + 6..=b + 8 {
        lists_before.push(store.list("/r/", None, 0, Some(at)).await.unwrap());
    }

    store.compact(b + 6).await.unwrap();
    assert_eq!(store.compact_revision().await.unwrap(), b + 6);
    for (at, expected) in (b + 6..=b + 8).zip(&lists_before) {
        assert_eq!(
            &store.list("/r/", None, 0, Some(at)).await.unwrap(),
            expected
        );
    }
    let live = store.get("/r/live").await.unwrap().unwrap();
    assert_eq!(
        (live.value, live.create_revision, live.version),
        (value("3"), b + 1, 3)
    );
    assert_eq!(store.get("/r/gone").await.unwrap(), None);

    // Re-creating a key whose tombstone was compacted away starts a clean incarnation.
    let gone = store.create("/r/gone", value("again")).await.unwrap();
    assert_eq!((gone.create_revision, gone.version), (b + 9, 1));
    let mut watch = store.watch("/r/", b + 6);
    let events = events_until(&mut watch, b + 9).await;
    assert_eq!(revisions(&events), [b + 7, b + 8, b + 9]);
    assert!(
        matches!(&events[1], Event::Put { prev: Some(prev), .. } if prev.mod_revision == b + 3)
    );

    // Compacting backwards does nothing; into the future is refused.
    store.compact(b + 2).await.unwrap();
    assert_eq!(store.compact_revision().await.unwrap(), b + 6);
    let future = store.compact(b + 10).await.unwrap_err();
    assert!(
        matches!(future, StoreError::FutureRevision { requested, current }
            if (requested, current) == (b + 10, b + 9)),
        "{future}"
    );
    store.compact(b + 9).await.unwrap();
    assert_eq!(store.compact_revision().await.unwrap(), b + 9);
    assert_eq!(
        store.list("/r/", None, 0, None).await.unwrap().items.len(),
        3
    );
}

pub async fn compacting_a_busy_history_keeps_every_current_value(backend: &dyn Backend) {
    // The step-by-step compaction of long ranges is unit-tested in `embedded::compact`.
    let store = open(backend).await;
    let b = base(&*store).await;
    let keys = 20;
    for index in 0..keys {
        store
            .create(&format!("/r/{index:02}"), value("0"))
            .await
            .unwrap();
    }
    for round in 1..=10 {
        for index in 0..keys {
            let body = value(&round.to_string());
            store
                .update(&format!("/r/{index:02}"), body, None)
                .await
                .unwrap();
        }
    }
    let current = store.current_revision().await.unwrap();
    assert_eq!(current, b + 220);
    let before = store.list("/r/", None, 0, None).await.unwrap();
    store.compact(current).await.unwrap();
    let after = store.list("/r/", None, 0, None).await.unwrap();
    assert_eq!(after, before);
    assert!(after
        .items
        .iter()
        .all(|kv| kv.value == value("10") && kv.version == 11));
}

pub async fn the_compactor_compacts_to_the_revision_seen_one_tick_earlier(backend: &dyn Backend) {
    let store = open(backend).await;
    let b = base(&*store).await;
    let mut compactor = Compactor::new(store.clone(), Duration::from_secs(300));
    assert_eq!(
        compactor.tick().await.unwrap(),
        None,
        "the first tick only remembers"
    );
    store.create("/r/a", value("1")).await.unwrap();
    store.update("/r/a", value("2"), None).await.unwrap();
    // An empty embedded store (revision 0) has nothing to compact; etcd's initial revision 1
    // can be compacted to.
    assert_eq!(compactor.tick().await.unwrap(), (b > 0).then_some(b));
    store.update("/r/a", value("3"), None).await.unwrap();
    assert_eq!(compactor.tick().await.unwrap(), Some(b + 2));
    assert_eq!(store.compact_revision().await.unwrap(), b + 2);
    assert_eq!(compactor.tick().await.unwrap(), Some(b + 3));
    assert_eq!(store.get("/r/a").await.unwrap().unwrap().value, value("3"));
}

pub async fn the_compactor_runs_on_its_interval(backend: &dyn Backend) {
    let store = open(backend).await;
    let b = base(&*store).await;
    store.create("/r/a", value("0")).await.unwrap();
    store.update("/r/a", value("1"), None).await.unwrap();
    store.update("/r/a", value("2"), None).await.unwrap();
    let interval = Duration::from_millis(20);
    let task = tokio::spawn(Compactor::new(store.clone(), interval).run());
    let deadline = std::time::Instant::now() + DEADLINE;
    while store.compact_revision().await.unwrap() != b + 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the compactor never ran"
        );
        tokio::time::sleep(interval).await;
    }
    task.abort();
}
