//! Lists: prefix, paging with limit and start_after, and consistent snapshots at a revision.

use sluice_store::{KeyValue, StoreError};

use super::{base, open, Backend};
use crate::common::value;

fn keys(items: &[KeyValue]) -> Vec<&str> {
    items.iter().map(|kv| kv.key.as_str()).collect()
}

pub async fn lists_stay_inside_their_prefix_in_key_order(backend: &dyn Backend) {
    let store = open(backend).await;
    let b = base(&*store).await;
    for key in ["/r/b", "/r/a", "/q/x", "/r/c", "/s/a", "/r"] {
        store.create(key, value(key)).await.unwrap();
    }
    store.delete("/r/c", None).await.unwrap();
    let page = store.list("/r/", None, 0, None).await.unwrap();
    assert_eq!(keys(&page.items), ["/r/a", "/r/b"]);
    assert_eq!((page.revision, page.more), (b + 7, false));
    let all = store.list("", None, 0, None).await.unwrap();
    assert_eq!(keys(&all.items), ["/q/x", "/r", "/r/a", "/r/b", "/s/a"]);
    // A cursor outside the prefix does not widen the list.
    let page = store.list("/r/", Some("/a"), 0, None).await.unwrap();
    assert_eq!(keys(&page.items), ["/r/a", "/r/b"]);
    assert!(store
        .list("/t/", None, 0, None)
        .await
        .unwrap()
        .items
        .is_empty());
}

pub async fn pages_follow_each_other_and_say_when_more_remain(backend: &dyn Backend) {
    let store = open(backend).await;
    for index in 0..7 {
        store
            .create(&format!("/r/{index}"), value("v"))
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut start_after: Option<String> = None;
    loop {
        let page = store
            .list("/r/", start_after.as_deref(), 3, None)
            .await
            .unwrap();
        assert!(page.items.len() <= 3);
        seen.extend(page.items.iter().map(|kv| kv.key.clone()));
        if !page.more {
            break;
        }
        start_after = page.items.last().map(|kv| kv.key.clone());
    }
    let expected: Vec<String> = (0..7).map(|index| format!("/r/{index}")).collect();
    assert_eq!(seen, expected);
    // A page exactly as long as what remains has no more.
    let exact = store.list("/r/", Some("/r/3"), 3, None).await.unwrap();
    assert_eq!((exact.items.len(), exact.more), (3, false));
}

pub async fn pages_at_a_revision_see_one_snapshot_across_writes(backend: &dyn Backend) {
    let store = open(backend).await;
    let b = base(&*store).await;
    for index in 0..4 {
        store
            .create(&format!("/r/{index}"), value("old"))
            .await
            .unwrap();
    }
    let first = store.list("/r/", None, 2, None).await.unwrap();
    assert_eq!((first.revision, first.more), (b + 4, true));

    // Writes between the pages: an update, a deletion, a creation, a delete + re-create.
    store.update("/r/2", value("new"), None).await.unwrap();
    store.delete("/r/3", None).await.unwrap();
    store.create("/r/4", value("new")).await.unwrap();
    store.delete("/r/1", None).await.unwrap();
    store.create("/r/1", value("new")).await.unwrap();

    let after = first.items.last().map(|kv| kv.key.as_str());
    let second = store
        .list("/r/", after, 2, Some(first.revision))
        .await
        .unwrap();
    assert_eq!(second.revision, b + 4);
    assert_eq!(keys(&second.items), ["/r/2", "/r/3"]);
    assert!(second.items.iter().all(|kv| kv.value == value("old")));
    assert!(!second.more);
    let snapshot = store.list("/r/", None, 0, Some(b + 4)).await.unwrap();
    assert!(snapshot
        .items
        .iter()
        .all(|kv| kv.value == value("old") && kv.version == 1));

    let latest = store.list("/r/", None, 0, None).await.unwrap();
    assert_eq!(latest.revision, b + 9);
    assert_eq!(keys(&latest.items), ["/r/0", "/r/1", "/r/2", "/r/4"]);
    let recreated = &latest.items[1];
    assert_eq!((recreated.create_revision, recreated.version), (b + 9, 1));

    // The state in the middle: /r/1 deleted, /r/4 created.
    let middle = store.list("/r/", None, 0, Some(b + 8)).await.unwrap();
    assert_eq!(keys(&middle.items), ["/r/0", "/r/2", "/r/4"]);
    for empty in [0, b] {
        let before = store.list("/r/", None, 0, Some(empty)).await.unwrap();
        assert!(before.items.is_empty(), "nothing at revision {empty}");
        assert_eq!(before.revision, empty);
    }
}

pub async fn revisions_outside_the_readable_range_are_refused(backend: &dyn Backend) {
    let store = open(backend).await;
    let b = base(&*store).await;
    for index in 0..5 {
        store
            .create(&format!("/r/{index}"), value("v"))
            .await
            .unwrap();
    }
    let future = store.list("/r/", None, 0, Some(b + 6)).await.unwrap_err();
    assert!(
        matches!(future, StoreError::FutureRevision { requested, current }
            if (requested, current) == (b + 6, b + 5)),
        "{future}"
    );
    store.compact(b + 3).await.unwrap();
    let compacted = store.list("/r/", None, 0, Some(b + 2)).await.unwrap_err();
    assert!(
        matches!(compacted, StoreError::Compacted { compact_revision } if compact_revision == b + 3),
        "{compacted}"
    );
    assert_eq!(compacted.http_status(), 410);
    assert_eq!(
        store
            .list("/r/", None, 0, Some(b + 3))
            .await
            .unwrap()
            .items
            .len(),
        3
    );
}
