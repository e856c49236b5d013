//! `Chunks`: how a watch's event lines are joined into body chunks; `Following`: a watch's body
//! against a real embedded store, polled as hyper polls it.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use sluice_apimachinery::options::ListOptions;
use sluice_apimachinery::table::{IncludeObject, ResponseFormat, TableOptions, TableVersion};
use sluice_store::{EmbeddedConfig, EmbeddedStore, Store};

use super::*;
use crate::auth::{Identity, Role};
use crate::server::admission::{BudgetKind, Pool, PoolLimits, RoleShare};
use crate::server::keys::list_prefix;
use crate::server::metrics::{ApiMetrics, WatchEventCounters};

/// An embedded store whose watchers are cut after `watch_buffer` unread events, and which
/// reports progress every 20 ms.
fn store(watch_buffer: usize) -> (Arc<EmbeddedStore>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = EmbeddedConfig {
        watch_buffer,
        progress_interval: Duration::from_millis(20),
        ..EmbeddedConfig::default()
    };
    let store = EmbeddedStore::open_with(dir.path().join("store.redb"), config).unwrap();
    (Arc::new(store), dir)
}

fn shared(store: &Arc<EmbeddedStore>) -> Arc<dyn Store> {
    store.clone()
}

/// An admin's watch of every agent, as `ApiServer::watch` builds it.
fn watch(store: &Arc<EmbeddedStore>, options: ListOptions, duration: Duration) -> Watch {
    let spec = crate::kinds::agent();
    let metrics = ApiMetrics::new();
    Watch {
        prefix: list_prefix(&spec, None),
        events: WatchEventCounters::new(&metrics, &spec.plural),
        spec,
        options,
        visibility: Visibility::All,
        format: ResponseFormat::Object,
        table_options: TableOptions {
            version: TableVersion::V1,
            include_object: IncludeObject::default(),
            now: std::time::SystemTime::now(),
        },
        store: shared(store),
        duration,
        bookmark_every: Duration::from_millis(1),
        metrics,
        encoded: Arc::default(),
    }
}

fn permit() -> Slot {
    let share = RoleShare {
        reserved: 1,
        per_identity: 1,
    };
    let limits = PoolLimits {
        total: 4,
        shares: [share; 4],
    };
    let identity = Identity::new(Role::Admin, "test").unwrap();
    Pool::new(BudgetKind::Watches, limits)
        .acquire(&identity)
        .unwrap()
}

async fn create_agents(store: &Arc<EmbeddedStore>, count: usize) {
    let prefix = list_prefix(&crate::kinds::agent(), None);
    for index in 0..count {
        let name = format!("agent-{index:03}");
        let object = format!(r#"{{"metadata":{{"name":"{name}"}},"spec":{{"id":{index}}}}}"#);
        let key = format!("{prefix}{name}");
        store.create(&key, Bytes::from(object)).await.unwrap();
    }
}

/// The resourceVersions of the ADDED events in `chunks`, in order.
fn added_versions(chunks: &[Bytes]) -> Vec<u64> {
    chunks
        .iter()
        .flat_map(|chunk| chunk.split(|byte| *byte == b'\n'))
        .filter(|line| !line.is_empty())
        .map(|line| serde_json::from_slice::<Value>(line).unwrap())
        .filter(|event| event["type"] == "ADDED")
        .map(|event| {
            let version = event["object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap();
            version.parse().unwrap()
        })
        .collect()
}

/// Reads `body` until `events` ADDED events arrived, failing after 10 s.
async fn read_added(body: &mut Following, events: usize) -> Vec<u64> {
    let mut chunks = Vec::new();
    while added_versions(&chunks).len() < events {
        let chunk = tokio::time::timeout(Duration::from_secs(10), body.next()).await;
        chunks.push(
            chunk
                .expect("no chunk within 10 s")
                .expect("the body ended"),
        );
    }
    added_versions(&chunks)
}

#[tokio::test]
async fn a_body_nobody_polls_is_cut_by_the_store_and_resumes_from_history_without_a_gap() {
    let (store, _dir) = store(4);
    let mut body = Following::new(
        watch(&store, ListOptions::default(), Duration::from_secs(60)),
        Vec::new(),
        0,
        permit(),
    );
    // Subscribed once polled: nothing to send yet.
    let quiet = tokio::time::timeout(Duration::from_millis(50), body.next()).await;
    assert!(quiet.is_err(), "{quiet:?}");
    // Writers never wait for this body: the store cuts it after 4 unread events.
    create_agents(&store, 40).await;
    assert_eq!(
        read_added(&mut body, 40).await,
        (1..=40).collect::<Vec<_>>()
    );
    // Past the history, the resumed watch follows live changes again.
    let quiet = tokio::time::timeout(Duration::from_millis(50), body.next()).await;
    assert!(quiet.is_err(), "{quiet:?}");
    assert_eq!(
        store.live_watchers(),
        1,
        "watching live again after the resume"
    );
}

#[tokio::test]
async fn the_current_state_comes_first_joined_in_chunks_and_the_body_ends_at_its_deadline() {
    let (store, _dir) = store(64);
    create_agents(&store, 3).await;
    let initial: Vec<Value> = (1..=3u64)
        .map(|revision| {
            let name = format!("agent-{:03}", revision - 1);
            serde_json::json!({"metadata": {"name": name, "resourceVersion": revision.to_string()}})
        })
        .collect();
    let mut body = Following::new(
        watch(&store, ListOptions::default(), Duration::from_millis(200)),
        initial,
        3,
        permit(),
    );
    let first = body.next().await.expect("the current state");
    assert_eq!(
        added_versions(std::slice::from_ref(&first)),
        vec![1, 2, 3],
        "one chunk"
    );
    create_agents_from(&store, 3, 2).await;
    assert_eq!(read_added(&mut body, 2).await, vec![4, 5]);
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        while body.next().await.is_some() {}
    })
    .await;
    assert!(end.is_ok(), "the body outlived its deadline");
}

#[tokio::test]
async fn progress_becomes_a_bookmark_only_when_the_client_allows_bookmarks() {
    let (store, _dir) = store(64);
    let options = ListOptions {
        allow_watch_bookmarks: true,
        ..ListOptions::default()
    };
    let mut body = Following::new(
        watch(&store, options, Duration::from_secs(60)),
        Vec::new(),
        0,
        permit(),
    );
    // A write under another prefix moves the store's revision without an event for this watch.
    store
        .create("/elsewhere/x", Bytes::from_static(b"{}"))
        .await
        .unwrap();
    let bookmark = loop {
        let chunk = tokio::time::timeout(Duration::from_secs(10), body.next())
            .await
            .expect("a bookmark within 10 s")
            .expect("the body ended");
        if chunk.windows(8).any(|window| window == b"BOOKMARK") {
            break chunk;
        }
    };
    let event: Value = serde_json::from_slice(bookmark.trim_ascii_end()).unwrap();
    assert_eq!(event["object"]["metadata"]["resourceVersion"], "1");
}

async fn create_agents_from(store: &Arc<EmbeddedStore>, first: usize, count: usize) {
    let prefix = list_prefix(&crate::kinds::agent(), None);
    for index in first..first + count {
        let name = format!("agent-{index:03}");
        let key = format!("{prefix}{name}");
        let object = format!(r#"{{"metadata":{{"name":"{name}"}}}}"#);
        store.create(&key, Bytes::from(object)).await.unwrap();
    }
}

fn lines(chunk: &Chunk) -> Vec<&[u8]> {
    chunk.0.split_inclusive(|byte| *byte == b'\n').collect()
}

#[test]
fn lines_are_joined_in_order_up_to_the_limit() {
    let mut chunks = Chunks::new(10);
    assert!(chunks
        .push(Bytes::from_static(b"abc\n"), WatchEventType::Added)
        .is_none());
    assert!(chunks
        .push(Bytes::from_static(b"de\n"), WatchEventType::Modified)
        .is_none());
    let full = chunks.push(Bytes::from_static(b"fghi\n"), WatchEventType::Deleted);
    let full = full.expect("the third line does not fit");
    assert_eq!(lines(&full), vec![&b"abc\n"[..], b"de\n"]);
    assert_eq!(
        full.1,
        vec![WatchEventType::Added, WatchEventType::Modified]
    );
    let last = chunks.take().expect("the third line is kept");
    assert_eq!(last.0, Bytes::from_static(b"fghi\n"));
    assert_eq!(last.1, vec![WatchEventType::Deleted]);
    assert!(chunks.take().is_none());
}

#[test]
fn a_line_over_the_limit_is_a_chunk_of_its_own_and_a_lone_line_is_not_copied() {
    let mut chunks = Chunks::new(4);
    let long = Bytes::from(b"0123456789\n".to_vec());
    assert!(chunks.push(long.clone(), WatchEventType::Added).is_none());
    let full = chunks.push(Bytes::from_static(b"x\n"), WatchEventType::Added);
    let full = full.expect("the long line goes alone");
    assert_eq!(full.0.as_ptr(), long.as_ptr(), "passed on without a copy");
    let (rest, event_types) = chunks.take().expect("the short line is kept");
    assert_eq!((rest, event_types.len()), (Bytes::from_static(b"x\n"), 1));
}

#[test]
fn a_chunk_never_exceeds_the_limit_unless_one_line_does() {
    let mut chunks = Chunks::new(CHUNK_BYTES);
    let mut sent = Vec::new();
    for n in 0..2_000usize {
        let line = Bytes::from(format!("{}\n", "x".repeat(n % 300)));
        sent.extend(chunks.push(line, WatchEventType::Modified));
    }
    sent.extend(chunks.take());
    assert!(sent.len() > 1);
    assert!(sent.iter().all(|(bytes, _)| bytes.len() <= CHUNK_BYTES));
    let events: usize = sent.iter().map(|(_, types)| types.len()).sum();
    let lines_sent: usize = sent.iter().map(|chunk| lines(chunk).len()).sum();
    assert_eq!((events, lines_sent), (2_000, 2_000));
}
