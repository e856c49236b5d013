//! A VM agent's connection pattern against the real control plane: four watch clients and a
//! stream of creates and merge patches on one shared `sluice-watch-client` Transport all work
//! over ONE connection (h2, both the client's sockets and the control plane's own gauge say
//! so); the control plane killed and started again, the Transport dials one new connection and
//! every watch resumes. (An HTTP/1.1-only server still gets a connection per request: the
//! watch client's own tests, tests/watch.rs there.)
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use sluice_watch_client::{
    Resource, Snapshot, Transport, WatchClient, WatchClientConfig, WatchMetrics,
};
use test_support::ControlPlane;
use tokio::sync::watch;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const AGENTS: &str = "/apis/tunnel.sluice.dev/v1alpha1/agents";
const WAIT: Duration = Duration::from_secs(20);

/// Client sockets of this process in ESTABLISHED state to `port` on loopback.
fn established_to(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let remote = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3 && fields[2].ends_with(&remote) && fields[3] == "01"
        })
        .count()
}

/// The control plane's `sluice_controlplane_connections` gauge (read over a connection of its
/// own, which the gauge includes).
fn connections_gauge(cp: &ControlPlane) -> f64 {
    let (code, text) = cp.curl("GET", "/metrics", None);
    assert_eq!(code, 200, "{text}");
    text.lines()
        .find_map(|line| line.strip_prefix("sluice_controlplane_connections "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap()
}

fn agent(index: usize) -> Bytes {
    let object = json!({"apiVersion": "tunnel.sluice.dev/v1alpha1", "kind": "Agent",
        "metadata": {"name": format!("agent-{index}")},
        "spec": {"id": index, "tokenSha256": "0".repeat(64)}});
    Bytes::from(object.to_string())
}

/// Creates agent-`index` and labels it with a merge patch, retrying while the control plane
/// comes back (the first request after a restart may still pick the dead connection).
async fn create_and_patch(transport: &Transport, index: usize) {
    let patch = Bytes::from(json!({"metadata": {"labels": {"patched": "yes"}}}).to_string());
    let path = format!("{AGENTS}/agent-{index}");
    for attempt in 0.. {
        let created = transport.post_json(AGENTS, agent(index), 1 << 20).await;
        let created = match created {
            Err(sluice_watch_client::WatchError::Status { status: 409, .. }) => Ok(Bytes::new()),
            other => other,
        };
        let outcome = match created {
            Ok(_) => transport.merge_patch(&path, patch.clone(), 1 << 20).await,
            Err(error) => Err(error),
        };
        match outcome {
            Ok(_) => return,
            Err(error) if attempt < 20 => {
                eprintln!("agent-{index}: {error}; again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("agent-{index}: {error}"),
        }
    }
}

/// Waits until every receiver's snapshot holds exactly `count` agents, all labelled.
async fn all_see(receivers: &mut [watch::Receiver<Arc<Snapshot>>], count: usize) {
    for receiver in receivers {
        let seen = receiver.wait_for(|snapshot| {
            snapshot.objects.len() == count
                && snapshot
                    .objects
                    .values()
                    .all(|object| object.pointer("/metadata/labels/patched") == Some(&json!("yes")))
        });
        tokio::time::timeout(WAIT, seen)
            .await
            .expect("every watch sees every agent")
            .unwrap();
    }
}

#[test]
fn four_watches_and_writes_on_one_transport_hold_one_connection_across_a_restart() {
    let mut cp = ControlPlane::start(BIN, &[]).unwrap();
    let port = cp.address.port();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, cp.admin_token()).unwrap();
    let mut config = WatchClientConfig::new(cp.url(), cp.ca_file());
    config.token_file = Some(token);
    config.backoff_min = Duration::from_millis(50);
    config.backoff_max = Duration::from_millis(500);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let transport = Arc::new(Transport::new(&config).unwrap());
        let metrics = WatchMetrics::register(&mut Default::default());
        let mut receivers: Vec<_> = (0..4)
            .map(|_| {
                let client = WatchClient::with_transport(
                    config.clone(),
                    Resource::new("tunnel.sluice.dev", "v1alpha1", "agents"),
                    metrics.for_resource("agents"),
                    transport.clone(),
                );
                let receiver = client.subscribe();
                tokio::spawn(client.run(std::future::pending()));
                receiver
            })
            .collect();
        for index in 1..=3 {
            create_and_patch(&transport, index).await;
        }
        all_see(&mut receivers, 3).await;
        assert_eq!(established_to(port), 1, "one connection from this process");
        assert_eq!(
            connections_gauge(&cp),
            2.0,
            "this process's and the scrape's"
        );

        // Killed (no GOAWAY: the connection just ends) and started on the same store.
        cp.kill();
        cp.restart().unwrap();
        create_and_patch(&transport, 4).await;
        all_see(&mut receivers, 4).await;
        assert_eq!(
            established_to(port),
            1,
            "one new connection, not one per watch"
        );
        assert_eq!(connections_gauge(&cp), 2.0);
    });
}
