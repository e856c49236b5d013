//! The watch client against a fake API server over TLS with a bearer token.

mod fake;

use std::sync::Arc;
use std::time::Duration;

use fake::FakeApi;
use serde_json::json;
use sluice_watch_client::{
    Change, ClientCertFiles, Resource, ResourceMetrics, Snapshot, Transport, WatchClient,
    WatchClientConfig, WatchMetrics,
};
use tokio::sync::{oneshot, watch};

const WAIT: Duration = Duration::from_secs(10);
const MAX_EVENT: usize = 4096;

/// A running client, its consumer side and the stop switch.
struct Running {
    snapshots: watch::Receiver<Arc<Snapshot>>,
    previous: Arc<Snapshot>,
    metrics: ResourceMetrics,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

fn config(api: &FakeApi) -> WatchClientConfig {
    let mut config = WatchClientConfig::new(api.url(), &api.certs.ca_cert);
    config.token_file = Some(api.token_file.clone());
    config.connect_timeout = Duration::from_secs(2);
    config.backoff_min = Duration::from_millis(50);
    config.backoff_max = Duration::from_millis(200);
    config.max_event_bytes = MAX_EVENT;
    config.page_size = 2;
    config
}

fn start(config: WatchClientConfig) -> Running {
    let transport = Arc::new(Transport::new(&config).expect("transport"));
    start_on(config, transport)
}

/// A client sending on `transport`, which other clients may share.
fn start_on(config: WatchClientConfig, transport: Arc<Transport>) -> Running {
    let metrics = WatchMetrics::register(&mut Default::default()).for_resource("agents");
    let resource = Resource::new("sluice.dev", "v1", "agents");
    let client = WatchClient::with_transport(config, resource, metrics.clone(), transport);
    let snapshots = client.subscribe();
    let previous = snapshots.borrow().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(client.run(async {
        let _ = stopped.await;
    }));
    Running {
        snapshots,
        previous,
        metrics,
        stop: Some(stop),
        task,
    }
}

impl Running {
    /// Waits until the consumer has seen `expected` as the net changes (in key order per
    /// snapshot) since the last call, and no more.
    async fn expect_changes(&mut self, expected: &[&str]) {
        let mut seen: Vec<String> = Vec::new();
        let collect = async {
            while seen.len() < expected.len() {
                self.snapshots.changed().await.expect("client alive");
                let current = self.snapshots.borrow_and_update().clone();
                seen.extend(current.changes_since(&self.previous).iter().map(describe));
                self.previous = current;
            }
        };
        let timed_out = tokio::time::timeout(WAIT, collect).await.is_err();
        assert!(!timed_out, "waited for {expected:?}, saw {seen:?}");
        assert_eq!(seen, expected);
    }

    /// No new snapshot shows up within a short while.
    async fn expect_quiet(&mut self) {
        // A check that nothing happens cannot wait for an event: 300 ms is many times what a
        // local watch takes to deliver a snapshot, so an unexpected one would show.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !self.snapshots.has_changed().expect("alive"),
            "unexpected snapshot: {:?}",
            self.snapshots.borrow().changes_since(&self.previous)
        );
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("stops")
            .expect("no panic");
        assert_eq!(self.metrics.connected.get(), 0);
    }
}

fn describe(change: &Change) -> String {
    match change {
        Change::Added { key, object } => format!("+{key}={}", object["spec"]),
        Change::Modified { key, new, .. } => format!("~{key}={}", new["spec"]),
        Change::Deleted { key, .. } => format!("-{key}"),
    }
}

async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The number of watch requests the server has seen.
fn watches(api: &FakeApi) -> usize {
    api.read(|state| state.watch_requests().len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_then_watch_delivers_adds_updates_and_deletes() {
    let api = FakeApi::start("secret-1").await;
    api.mutate(|state| {
        for name in ["a", "b", "c"] {
            state.put(name, json!(1));
        }
    });
    let mut client = start(config(&api));
    // Three objects with pages of two: one continue token.
    client.expect_changes(&["+a=1", "+b=1", "+c=1"]).await;
    let snapshot = client.snapshots.borrow().clone();
    assert!(snapshot.synced);
    assert_eq!(snapshot.resource_version, "3");
    assert!(api.read(|s| s.requests.iter().any(|r| r.contains("continue=2"))));

    api.mutate(|state| state.put("d", json!(1)));
    client.expect_changes(&["+d=1"]).await;
    api.mutate(|state| state.put("a", json!(2)));
    client.expect_changes(&["~a=2"]).await;
    api.mutate(|state| state.delete("b"));
    client.expect_changes(&["-b"]).await;

    assert_eq!(client.snapshots.borrow().resource_version, "6");
    let metrics = &client.metrics;
    assert_eq!(metrics.events("ADDED"), 1);
    assert_eq!(metrics.events("MODIFIED"), 1);
    assert_eq!(metrics.events("DELETED"), 1);
    assert_eq!(metrics.connected.get(), 1);
    assert!(metrics.last_event.get() > 0.0);
    assert_eq!((metrics.relists.get(), metrics.reconnects.get()), (0, 0));
    let watch = &api.read(|s| s.watch_requests())[0];
    assert!(
        watch.contains("resourceVersion=3&allowWatchBookmarks=true&timeoutSeconds=300"),
        "{watch}"
    );
    client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_advance_the_resume_point() {
    let api = FakeApi::start("secret-1").await;
    api.mutate(|state| state.put("a", json!(1)));
    let mut client = start(config(&api));
    client.expect_changes(&["+a=1"]).await;
    eventually("watching", || watches(&api) == 1).await;

    // Other resources moved the revision to 41; the bookmark says so.
    api.mutate(|state| {
        state.bump(40);
        state.bookmark();
    });
    eventually("bookmark counted", || {
        client.metrics.events("BOOKMARK") == 1
    })
    .await;
    client.expect_quiet().await;
    api.close_watches();
    eventually("re-watched", || watches(&api) == 2).await;
    let resumed = &api.read(|s| s.watch_requests())[1];
    assert!(resumed.contains("resourceVersion=41&"), "{resumed}");
    assert_eq!(client.metrics.reconnects.get(), 1);
    client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_watch_resumes_from_the_last_version_without_duplicates() {
    let api = FakeApi::start("secret-1").await;
    api.mutate(|state| state.replay_inclusive = true);
    let mut client = start(config(&api));
    client.expect_changes(&[]).await;
    eventually("watching", || watches(&api) == 1).await;
    api.mutate(|state| state.put("a", json!(1)));
    api.mutate(|state| state.put("b", json!(1)));
    client.expect_changes(&["+a=1", "+b=1"]).await;

    api.close_watches();
    eventually("re-watched", || watches(&api) == 2).await;
    // The server replays the event at the resume point; the consumer sees nothing new.
    client.expect_quiet().await;
    api.mutate(|state| state.put("c", json!(1)));
    client.expect_changes(&["+c=1"]).await;

    let resumed = &api.read(|s| s.watch_requests())[1];
    assert!(resumed.contains("resourceVersion=2&"), "{resumed}");
    let lists = api.read(|s| s.requests.iter().filter(|r| r.contains("limit=")).count());
    assert_eq!(lists, 1, "a resume is not a re-list");
    assert_eq!(client.metrics.reconnects.get(), 1);
    assert_eq!(client.metrics.relists.get(), 0);
    client.stop().await;
}

/// While the client is cut off, `a` is deleted, `b` changed and `c` created, then history is
/// compacted: the resumed watch gets 410 and the consumer sees exactly the net difference.
async fn expired_watch_relists(http_410: bool) {
    let api = FakeApi::start("secret-1").await;
    api.mutate(|state| {
        state.http_410 = http_410;
        state.put("a", json!(1));
        state.put("b", json!(1));
        state.put("keep", json!(1));
    });
    let mut client = start(config(&api));
    client.expect_changes(&["+a=1", "+b=1", "+keep=1"]).await;
    eventually("watching", || watches(&api) == 1).await;

    api.mutate(|state| {
        // Also a change that is undone before the client looks: it must not show up.
        state.put("transient", json!(1));
        state.delete("transient");
        state.delete("a");
        state.put("b", json!(2));
        state.put("c", json!(1));
        state.compact();
        if http_410 {
            state.close_generation += 1;
        }
    });
    client.expect_changes(&["-a", "~b=2", "+c=1"]).await;
    client.expect_quiet().await;
    assert_eq!(client.metrics.relists.get(), 1);
    assert_eq!(client.metrics.events("ERROR"), u64::from(!http_410));
    let snapshot = client.snapshots.borrow().clone();
    assert_eq!(snapshot.objects.len(), 3);
    assert!(snapshot.synced);
    client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_error_event_relists_and_shows_the_net_difference() {
    expired_watch_relists(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_410_relists_and_shows_the_net_difference() {
    expired_watch_relists(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_continue_token_restarts_the_list() {
    let api = FakeApi::start("secret-1").await;
    api.mutate(|state| {
        for name in ["a", "b", "c", "d", "e"] {
            state.put(name, json!(1));
        }
        state.expire_next_continue = true;
    });
    let mut client = start(config(&api));
    client
        .expect_changes(&["+a=1", "+b=1", "+c=1", "+d=1", "+e=1"])
        .await;
    let first_pages = api.read(|s| {
        s.requests
            .iter()
            .filter(|r| r.contains("limit=") && !r.contains("continue="))
            .count()
    });
    assert_eq!(first_pages, 2, "the list started over once");
    assert_eq!(client.metrics.relists.get(), 0, "still the first list");
    client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_server_keeps_the_snapshot_then_recovers_with_a_rotated_token() {
    let mut api = FakeApi::start("secret-1").await;
    api.mutate(|state| state.put("a", json!(1)));
    let mut client = start(config(&api));
    client.expect_changes(&["+a=1"]).await;
    eventually("connected", || client.metrics.connected.get() == 1).await;

    api.stop();
    eventually("disconnected", || client.metrics.connected.get() == 0).await;
    // Several failed attempts while down (each one a watch tried again); the consumer's view
    // does not move.
    let attempts = client.metrics.reconnects.get();
    eventually("three failed attempts while down", || {
        client.metrics.reconnects.get() >= attempts + 3
    })
    .await;
    assert!(!client.snapshots.has_changed().expect("alive"));
    let snapshot = client.snapshots.borrow().clone();
    assert!(snapshot.synced && snapshot.objects.len() == 1);

    // The token rotates while the server is away; the client reads the file again.
    api.mutate(|state| {
        state.token = "secret-2".into();
        state.put("b", json!(1));
    });
    std::fs::write(&api.token_file, "secret-2\n").expect("rotate");
    api.restart().await;
    client.expect_changes(&["+b=1"]).await;
    eventually("reconnected", || client.metrics.connected.get() == 1).await;
    assert_eq!(
        client.metrics.relists.get(),
        0,
        "resumed, no re-list needed"
    );
    assert!(client.metrics.reconnects.get() >= 1);
    client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_retried_and_never_clears_the_snapshot() {
    let api = FakeApi::start("secret-1").await;
    api.mutate(|state| state.put("a", json!(1)));
    std::fs::write(&api.token_file, "wrong\n").expect("token");
    let mut client = start(config(&api));
    eventually("refused twice", || api.read(|s| s.requests.len()) >= 2).await;
    assert!(!client.snapshots.borrow().synced);
    std::fs::write(&api.token_file, "secret-1").expect("token");
    client.expect_changes(&["+a=1"]).await;
    client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_long_event_line_is_refused_and_the_watch_resumes() {
    let api = FakeApi::start("secret-1").await;
    api.mutate(|state| state.put("a", json!(1)));
    let mut client = start(config(&api));
    client.expect_changes(&["+a=1"]).await;
    eventually("watching", || watches(&api) == 1).await;

    let padding = "x".repeat(MAX_EVENT * 2);
    let huge = json!({"type": "ADDED", "object": {"metadata": {"name": "huge",
        "resourceVersion": "99"}, "spec": padding}});
    api.mutate(|state| state.raw.push(format!("{huge}\n").into()));
    eventually("re-watched", || watches(&api) == 2).await;
    let resumed = &api.read(|s| s.watch_requests())[1];
    assert!(resumed.contains("resourceVersion=1&"), "{resumed}");
    client.expect_quiet().await;

    api.mutate(|state| state.put("b", json!(1)));
    client.expect_changes(&["+b=1"]).await;
    assert!(client.snapshots.borrow().objects.len() == 2);
    client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_with_a_client_certificate() {
    let api = FakeApi::start_with("secret-1", true).await;
    api.mutate(|state| state.put("a", json!(1)));
    // Without a certificate the handshake is refused; the client keeps retrying.
    let refused = start(config(&api));
    eventually("two refused handshakes", || {
        api.read(|s| s.refused_handshakes) >= 2
    })
    .await;
    assert!(!refused.snapshots.borrow().synced);
    assert_eq!(api.read(|s| s.requests.len()), 0, "no request got through");
    refused.stop().await;

    let node = api.certs.client("node-1", &["node"]).expect("client cert");
    let mut config = config(&api);
    config.client_cert = Some(ClientCertFiles {
        cert: node.cert,
        key: node.key,
    });
    let mut client = start(config);
    client.expect_changes(&["+a=1"]).await;
    client.stop().await;
}

/// The ALPN protocol of each connection the server accepted, in order.
fn connections(api: &FakeApi) -> Vec<Option<Vec<u8>>> {
    api.read(|state| state.connections.clone())
}

/// Four watches and the writes on one Transport, against a server that speaks h2 (as the
/// control plane does): `count` clients started on it, each synced with `a`.
async fn shared_clients(api: &FakeApi, transport: &Arc<Transport>, count: usize) -> Vec<Running> {
    let mut clients: Vec<Running> = (0..count)
        .map(|_| start_on(config(api), transport.clone()))
        .collect();
    for client in &mut clients {
        client.expect_changes(&["+a=1"]).await;
    }
    clients
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_and_writes_on_one_transport_share_one_h2_connection_and_redial_after_it_ends() {
    let mut api = FakeApi::start_h2("secret-1").await;
    api.mutate(|state| state.put("a", json!(1)));
    let transport = Arc::new(Transport::new(&config(&api)).expect("transport"));
    let mut clients = shared_clients(&api, &transport, 4).await;
    for _ in 0..3 {
        let patch = bytes::Bytes::from_static(b"{}");
        transport
            .merge_patch(fake::PATH, patch.clone(), 1 << 20)
            .await
            .expect("patch");
        transport
            .post_json(fake::PATH, patch, 1 << 20)
            .await
            .expect("post");
    }
    eventually("four watches open", || watches(&api) >= 4).await;
    let h2 = Some(b"h2".to_vec());
    assert_eq!(connections(&api), vec![h2.clone()]);

    // The connection ends with the server; every watch comes back on one new connection.
    api.stop();
    api.mutate(|state| state.put("b", json!(1)));
    api.restart().await;
    for client in &mut clients {
        client.expect_changes(&["+b=1"]).await;
    }
    assert_eq!(connections(&api), vec![h2.clone(), h2]);
    for client in clients {
        client.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_server_gets_a_connection_per_request_from_a_shared_transport() {
    // No ALPN (an HTTP/1.1-only server), then a client that does not offer h2 to one that
    // speaks it: both keep the one-connection-per-request behaviour.
    let h1_only = FakeApi::start("secret-1").await;
    let h2_server = FakeApi::start_h2("secret-1").await;
    let mut no_h2 = config(&h2_server);
    no_h2.http2 = false;
    for (api, config, alpn) in [
        (&h1_only, config(&h1_only), None),
        (&h2_server, no_h2, Some(b"http/1.1".to_vec())),
    ] {
        api.mutate(|state| state.put("a", json!(1)));
        let transport = Arc::new(Transport::new(&config).expect("transport"));
        let clients = shared_clients(api, &transport, 2).await;
        eventually("both watches open", || watches(api) >= 2).await;
        let seen = connections(api);
        assert!(seen.len() >= 4, "a LIST and a WATCH each: {seen:?}");
        assert!(seen.iter().all(|protocol| *protocol == alpn), "{seen:?}");
        for client in clients {
            client.stop().await;
        }
    }
}
