//! The etcd backend against real `etcd` processes (Debian's `etcd-server`): the conformance
//! cases (see `conformance/mod.rs`) on a fresh single member each, then what only a real
//! cluster shows: a watch ended by etcd fails with a resumable error, and a 3-member cluster
//! that loses a member mid-stream of writes loses no acknowledged write.
//!
//! Without an `etcd` binary the tests skip with a message, unless `CI` is set.
//! Built with the `etcd` feature only (scripts/test.sh enables it).
#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;
#[macro_use]
mod conformance;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_store::{
    EtcdClientCert, EtcdConfig, EtcdStore, EtcdTls, Event, Store, StoreError, WatchStream,
};
use test_support::{etcd_or_skip, Certificates, EtcdCluster, EtcdServer, EtcdTlsFiles};

use common::{events_until, next, revisions, value, DEADLINE};
use conformance::model;

/// A fresh single-member etcd per case.
struct Etcd {
    server: EtcdServer,
}

#[async_trait::async_trait]
impl conformance::Backend for Etcd {
    async fn open(&self, max_value_bytes: usize) -> Arc<dyn Store> {
        let config = EtcdConfig {
            endpoints: vec![self.server.endpoint()],
            max_value_bytes,
            ..EtcdConfig::default()
        };
        Arc::new(connect(config).await)
    }
}

fn etcd(case: &str) -> Option<Etcd> {
    if !etcd_or_skip(case) {
        return None;
    }
    let server = EtcdServer::start().expect("etcd starts");
    Some(Etcd { server })
}

conformance_tests!(etcd);

async fn connect(config: EtcdConfig) -> EtcdStore {
    EtcdStore::connect(config)
        .await
        .expect("the store connects to etcd")
}

/// A store on `endpoints` that gives up on a request after `request_timeout`.
async fn store_on(endpoints: Vec<String>, request_timeout: Duration) -> EtcdStore {
    connect(EtcdConfig {
        endpoints,
        request_timeout,
        ..EtcdConfig::default()
    })
    .await
}

#[tokio::test]
async fn connecting_to_no_etcd_fails_as_unavailable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let config = EtcdConfig {
        endpoints: vec![format!("http://127.0.0.1:{port}")],
        dial_timeout: Duration::from_millis(500),
        request_timeout: Duration::from_millis(500),
        ..EtcdConfig::default()
    };
    let started = Instant::now();
    match EtcdStore::connect(config).await {
        Err(error @ StoreError::Unavailable { .. }) => {
            assert!(error.retryable());
            assert_eq!(error.http_status(), 503);
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the timeouts held"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate_reaches_etcd_and_nothing_less_does() {
    if !etcd_or_skip("tls_with_a_client_certificate_reaches_etcd_and_nothing_less_does") {
        return;
    }
    let certs = Certificates::generate(&[]).expect("test certificates");
    let client = certs
        .client("sluice-apiserver", &[])
        .expect("a client certificate");
    let server = EtcdServer::start_tls(EtcdTlsFiles {
        cert: certs.server_cert.clone(),
        key: certs.server_key.clone(),
        ca: certs.ca_cert.clone(),
    })
    .expect("etcd starts with TLS");
    let config = |tls| EtcdConfig {
        endpoints: vec![server.endpoint()],
        dial_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(2),
        tls,
        ..EtcdConfig::default()
    };
    let with_cert = EtcdTls {
        ca: certs.ca_cert.clone(),
        client: Some(EtcdClientCert {
            cert: client.cert.clone(),
            key: client.key.clone(),
        }),
    };
    let store = connect(config(Some(with_cert))).await;
    let base = store.current_revision().await.unwrap();
    let created = store.create("/r/a", value("1")).await.unwrap();
    assert_eq!(created.mod_revision, base + 1);
    let mut stream = store.watch("/r/", base);
    assert_eq!(
        revisions(&events_until(&mut stream, base + 1).await),
        [base + 1]
    );

    // Without a client certificate, or trusting another CA, the store cannot connect.
    let other = Certificates::generate(&[]).expect("other certificates");
    let refused = [
        Some(EtcdTls {
            ca: certs.ca_cert.clone(),
            client: None,
        }),
        Some(EtcdTls {
            ca: other.ca_cert.clone(),
            client: Some(EtcdClientCert {
                cert: client.cert.clone(),
                key: client.key.clone(),
            }),
        }),
        None,
    ];
    for tls in refused {
        match EtcdStore::connect(config(tls)).await {
            Err(error @ StoreError::Unavailable { .. }) => assert!(error.retryable()),
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_ended_by_etcd_fails_with_a_resumable_error() {
    if !etcd_or_skip("a_watch_ended_by_etcd_fails_with_a_resumable_error") {
        return;
    }
    let mut cluster = EtcdCluster::start(1).expect("etcd starts");
    let store = store_on(cluster.endpoints(), Duration::from_secs(1)).await;
    let base = store.current_revision().await.unwrap();
    store.create("/r/a", value("1")).await.unwrap();
    let mut stream = store.watch("/r/", base);
    assert_eq!(
        revisions(&events_until(&mut stream, base + 1).await),
        [base + 1]
    );

    // The request timeout bounds requests, not a watch's stream: idle for longer, it goes on.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let later = store.create("/r/later", value("1")).await.unwrap();
    let events = events_until(&mut stream, later.mod_revision).await;
    assert_eq!(events.last().map(Event::key), Some("/r/later"));

    cluster.kill(0);
    match next(&mut stream).await {
        Some(Err(error @ StoreError::Unavailable { .. })) => {
            assert!(error.retryable());
            let resume = format!("watch again after revision {}", later.mod_revision);
            assert!(error.to_string().contains(&resume), "{error}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(
        next(&mut stream).await.is_none(),
        "the stream ends after its error"
    );
    let started = Instant::now();
    let down = store.get("/r/a").await.unwrap_err();
    assert!(matches!(down, StoreError::Unavailable { .. }), "{down}");
    eprintln!("a read with etcd down failed after {:?}", started.elapsed());

    cluster.restart(0).expect("etcd restarts on its data");
    let written = retry(|| store.create("/r/b", value("1"))).await;
    let mut resumed = store.watch("/r/", later.mod_revision);
    let events = events_until(&mut resumed, written).await;
    assert_eq!(revisions(&events), [written]);
}

/// Retries a write until it succeeds (the cluster elects a leader, the client reconnects);
/// returns the revision it wrote at. A retry that finds its own earlier attempt committed
/// (the answer was lost) counts as written.
async fn retry<F, Fut>(mut write: F) -> u64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<sluice_store::KeyValue, StoreError>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match write().await {
            Ok(kv) => return kv.mod_revision,
            Err(StoreError::AlreadyExists { .. }) => return 0,
            Err(error) if error.retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("a write failed for good: {error}"),
        }
    }
}

/// The member id of the cluster's leader and of each member, by asking each endpoint.
async fn leader_index(endpoints: &[String]) -> usize {
    for (index, endpoint) in endpoints.iter().enumerate() {
        let mut client = etcd_client::Client::connect([endpoint], None)
            .await
            .expect("a client of one member");
        let status = client.status().await.expect("the member's status");
        let own = status.header().map(|header| header.member_id());
        if own == Some(status.leader()) {
            return index;
        }
    }
    panic!("no member is the leader");
}

/// Follows `/w/` from `after` until `last`, re-watching after a retryable error from the last
/// revision seen, as a client does; returns every change.
async fn follow(
    store: Arc<dyn Store>,
    after: u64,
    last: Arc<tokio::sync::Mutex<u64>>,
) -> Vec<Event> {
    let mut events: Vec<Event> = Vec::new();
    let mut cursor = after;
    let mut stream: WatchStream = store.watch("/w/", cursor);
    loop {
        let target = *last.lock().await;
        if target != 0 && cursor >= target {
            return events;
        }
        match tokio::time::timeout(Duration::from_millis(200), next_item(&mut stream)).await {
            Err(_) => continue,
            Ok(Some(Ok(batch))) => {
                cursor = batch.revision;
                events.extend(batch.events);
            }
            Ok(Some(Err(error))) if error.retryable() => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                stream = store.watch("/w/", cursor);
            }
            Ok(other) => panic!("the watch failed: {other:?}"),
        }
    }
}

async fn next_item(
    stream: &mut WatchStream,
) -> Option<Result<sluice_store::WatchBatch, StoreError>> {
    use futures_util::StreamExt;
    stream.next().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_lose_no_acknowledged_write_when_one_dies() {
    if !etcd_or_skip("three_members_lose_no_acknowledged_write_when_one_dies") {
        return;
    }
    let mut cluster = EtcdCluster::start(3).expect("a 3-member etcd cluster starts");
    let endpoints = cluster.endpoints();
    let store: Arc<dyn Store> = Arc::new(store_on(endpoints.clone(), Duration::from_secs(2)).await);
    let base = store.current_revision().await.unwrap();
    let last = Arc::new(tokio::sync::Mutex::new(0));
    let watcher = tokio::spawn(follow(store.clone(), base, last.clone()));

    let total = 300usize;
    let (acked_sender, mut acked) = tokio::sync::mpsc::unbounded_channel();
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut written = BTreeMap::new();
            let mut longest_pause = Duration::ZERO;
            let mut previous = Instant::now();
            for index in 0..total {
                let key = format!("/w/{index:04}");
                let revision = retry(|| store.create(&key, value(&key))).await;
                written.insert(key, revision);
                longest_pause = longest_pause.max(previous.elapsed());
                previous = Instant::now();
                let _ = acked_sender.send(index);
            }
            (written, longest_pause)
        })
    };
    // Kill the leader mid-stream, and bring it back while the writes go on.
    let victim = leader_index(&endpoints).await;
    while acked.recv().await.is_some_and(|index| index < total / 3) {}
    let killed = Instant::now();
    tokio::task::block_in_place(|| cluster.kill(victim));
    eprintln!("killed leader m{victim}");
    while acked
        .recv()
        .await
        .is_some_and(|index| index < 2 * total / 3)
    {}
    eprintln!("writes went on {:?} after the kill", killed.elapsed());
    tokio::task::block_in_place(|| cluster.restart(victim)).expect("the member restarts");
    let (written, longest_pause) = tokio::time::timeout(Duration::from_secs(120), writer)
        .await
        .expect("the writes finish")
        .expect("the writer");
    eprintln!("longest pause between acknowledged writes: {longest_pause:?}");
    *last.lock().await = store.current_revision().await.unwrap();

    // Every acknowledged write is in the cluster, as acknowledged, also as read through the
    // member that was killed (linearizable reads: after it caught up).
    let restarted = store_on(vec![cluster.endpoint(victim)], Duration::from_secs(5)).await;
    for reader in [&*store, &restarted as &dyn Store] {
        let listed = reader.list("/w/", None, 0, None).await.unwrap();
        assert_eq!(listed.items.len(), total);
        for kv in &listed.items {
            let acknowledged = written[&kv.key];
            assert!(
                acknowledged == 0 || acknowledged == kv.mod_revision,
                "{kv:?}"
            );
            assert_eq!(kv.value, value(&kv.key));
        }
    }
    // The watch, resumed across the failure, saw each write once, in order.
    let events = tokio::time::timeout(DEADLINE * 6, watcher)
        .await
        .expect("the watch catches up")
        .expect("the watcher");
    let seen = revisions(&events);
    assert!(seen.windows(2).all(|pair| pair[0] < pair[1]), "{seen:?}");
    assert_eq!(events.len(), total);
}

/// Runs a model property (`conformance/model.rs`) for `cases` cases on one etcd member, each
/// case on a fresh store in its own prefix: cases run one after another, so each sees the
/// revisions its writes make, from where the previous case left them.
fn model_property<S: std::fmt::Debug>(
    name: &str,
    cases: u32,
    strategy: impl proptest::strategy::Strategy<Value = S>,
    case: impl Fn(Arc<dyn Store>, S) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>,
) {
    use proptest::test_runner::{Config, TestRunner};
    if !etcd_or_skip(name) {
        return;
    }
    let server = EtcdServer::start().expect("etcd starts");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let prefixes = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config::with_cases(cases));
    let outcome = runner.run(&strategy, |input| {
        let prefix = format!("/model-{}", prefixes.fetch_add(1, Ordering::Relaxed));
        let config = EtcdConfig {
            endpoints: vec![server.endpoint()],
            prefix,
            ..EtcdConfig::default()
        };
        runtime.block_on(async {
            let store: Arc<dyn Store> = Arc::new(connect(config).await);
            case(store, input).await;
        });
        Ok(())
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}

#[test]
fn model_watches_deliver_every_change_once_in_order() {
    model_property(
        "model_watches_deliver_every_change_once_in_order",
        16,
        proptest::collection::vec(model::step(false), 1..40),
        |store, steps| {
            Box::pin(async move {
                // etcd has no watch buffer to overflow: its watches never lag.
                assert_eq!(model::watches_match(store, steps).await, 0);
            })
        },
    );
}

#[test]
fn model_lists_gets_and_watches_survive_compaction() {
    model_property(
        "model_lists_gets_and_watches_survive_compaction",
        16,
        (
            proptest::collection::vec(model::step(true), 1..40),
            0usize..4,
        ),
        |store, (steps, page)| Box::pin(model::lists_match(store, steps, page)),
    );
}

/// A watch whose reader stops (an API client that stops reading its watch) must not stall
/// the store: etcd keeps sending it changes, and on a connection it shares with the other
/// requests those changes would fill the connection's flow-control window and leave every
/// later answer unsent (issue 36: 5,000 VM agents on etcd never synced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_nobody_reads_stalls_no_other_request() {
    if !etcd_or_skip("a_watch_nobody_reads_stalls_no_other_request") {
        return;
    }
    let server = EtcdServer::start().expect("etcd starts");
    let store = store_on(vec![server.endpoint()], Duration::from_secs(3)).await;
    let base = store.current_revision().await.unwrap();
    store.create("/stall/first", value("1")).await.unwrap();
    // Several, so that their streams' windows add up past the connection's.
    let mut streams = Vec::new();
    for _ in 0..8 {
        let mut stream = store.watch("/stall/", base);
        assert_eq!(
            revisions(&events_until(&mut stream, base + 1).await),
            [base + 1]
        );
        streams.push(stream);
    }
    // Not read again: 64 MiB of changes flow past them, far beyond any window.
    let big = bytes::Bytes::from(vec![b'x'; 1 << 20]);
    for index in 0..64 {
        let key = format!("/stall/{index}");
        let written = store.create(&key, big.clone()).await;
        assert!(
            written.is_ok(),
            "write {index} behind an unread watch: {written:?}"
        );
    }
    let last = store.get("/stall/63").await.unwrap().unwrap().mod_revision;
    // Each unread watch was cut, not left holding the connection: what was queued, then
    // Lagged, and watching again from there misses nothing.
    for mut stream in streams {
        let mut seen = base + 1;
        let lagged_at = loop {
            match next(&mut stream).await {
                Some(Ok(batch)) => seen = batch.revision,
                Some(Err(StoreError::Lagged { last_revision })) => break last_revision,
                other => panic!("expected batches then Lagged, got {other:?}"),
            }
        };
        assert_eq!(lagged_at, seen);
        assert!(lagged_at < last, "an unread watch was never cut");
        let mut again = store.watch("/stall/", lagged_at);
        let events = events_until(&mut again, last).await;
        assert_eq!(
            revisions(&events),
            (lagged_at + 1..=last).collect::<Vec<_>>()
        );
    }
}

/// A compaction another client already made is still one this client asked for: compacted
/// at revision 1 reads the same as never compacted, so only the refusal tells (the model
/// property found it when one case compacted etcd to 1 and a later one asked for 1 again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacting_where_another_client_already_did_reports_that_point() {
    if !etcd_or_skip("compacting_where_another_client_already_did_reports_that_point") {
        return;
    }
    let server = EtcdServer::start().expect("etcd starts");
    let first = store_on(vec![server.endpoint()], DEADLINE).await;
    for index in 0..3 {
        first
            .create(&format!("/again/{index}"), value("1"))
            .await
            .unwrap();
    }
    first.compact(1).await.unwrap();
    assert_eq!(first.compact_revision().await.unwrap(), 1);
    let second = store_on(vec![server.endpoint()], DEADLINE).await;
    assert_eq!(
        second.compact_revision().await.unwrap(),
        0,
        "nothing dropped"
    );
    second.compact(1).await.unwrap();
    assert_eq!(second.compact_revision().await.unwrap(), 1);
    // Further on, bisection finds what the refusal reports.
    first.compact(3).await.unwrap();
    let third = store_on(vec![server.endpoint()], DEADLINE).await;
    third.compact(3).await.unwrap();
    assert_eq!(third.compact_revision().await.unwrap(), 3);
    assert_eq!(second.compact_revision().await.unwrap(), 3);
}
