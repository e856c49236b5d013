//! The control plane on a real 3-member etcd cluster with two replicas: writes through one
//! (kubectl as the admin) are seen by a watcher on the other, a token issued through one
//! authenticates on the other, and with the etcd leader killed mid-test every write succeeds and
//! none is lost.
//! Built with the `etcd` feature only (scripts/test.sh enables it).
#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use sluice_watch_client::{decode_event, LineDecoder, Transport, WatchClientConfig, WatchEvent};
use test_support::{etcd_or_skip, wait_until, ControlPlane, EtcdCluster};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const WRITES: usize = 60;
/// The write after which the etcd leader is killed.
const KILL_AFTER: usize = 20;

fn agent(name: &str, id: usize) -> String {
    format!(
        r#"{{"apiVersion":"tunnel.sluice.dev/v1alpha1","kind":"Agent","metadata":{{"name":"{name}"}},"spec":{{"id":{id},"tokenSha256":"{}"}}}}"#,
        "0".repeat(64)
    )
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn names(output: Output) -> Vec<String> {
    assert!(output.status.success(), "kubectl get: {}", text(&output));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| line.trim().rsplit('/').next().unwrap_or("").to_string())
        .filter(|name| !name.is_empty())
        .collect()
}

/// What the watcher on the second replica has seen: ADDED events per name.
#[derive(Default)]
struct Seen {
    added: BTreeMap<String, usize>,
    reconnects: usize,
    errors: Vec<String>,
    /// The list is done: every later create reaches the watch, which starts at its version.
    listed: bool,
}

/// A raw watch of Agents on `url` as `token_file`, resumed from the last resourceVersion
/// whenever the stream ends (as every client does); a 410 is recorded as an error.
async fn watch_agents(
    url: String,
    ca: std::path::PathBuf,
    token_file: std::path::PathBuf,
    seen: Arc<Mutex<Seen>>,
) {
    let mut config = WatchClientConfig::new(url, ca);
    config.token_file = Some(token_file);
    let transport = Transport::new(&config).unwrap();
    // The list's resourceVersion: the watch starts there, so every later create is an ADDED.
    let mut resource_version = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while resource_version.is_empty() {
        match transport
            .get("/apis/tunnel.sluice.dev/v1alpha1/agents")
            .await
        {
            Ok(mut answer) => {
                let mut body = Vec::new();
                while let Some(frame) = answer.body.frame().await {
                    if let Ok(data) = frame.unwrap().into_data() {
                        body.extend_from_slice(&data);
                    }
                }
                let list: serde_json::Value = serde_json::from_slice(&body).unwrap();
                resource_version = list["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .to_string();
            }
            // The replica learns the token from its watch of Token objects: retry a little.
            Err(error) if Instant::now() < deadline => {
                eprintln!("list through the second replica: {error}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => {
                panic!("the token issued through replica 1 never worked on replica 2: {error}")
            }
        }
    }
    seen.lock().unwrap().listed = true;
    loop {
        let path = format!(
            "/apis/tunnel.sluice.dev/v1alpha1/agents?watch=1&allowWatchBookmarks=true&resourceVersion={resource_version}"
        );
        let mut answer = match transport.get(&path).await {
            Ok(answer) => answer,
            Err(error) => {
                seen.lock().unwrap().reconnects += 1;
                eprintln!("watch through replica 2: {error}; resuming from {resource_version}");
                if matches!(error, sluice_watch_client::WatchError::Expired(_)) {
                    seen.lock().unwrap().errors.push(format!("410: {error}"));
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mut lines = LineDecoder::new(1 << 20);
        while let Some(frame) = answer.body.frame().await {
            let Ok(frame) = frame else { break };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            for line in lines.push(&data).unwrap() {
                match decode_event(&line) {
                    Ok(WatchEvent::Upsert {
                        added,
                        key,
                        resource_version: version,
                        ..
                    }) => {
                        let mut seen = seen.lock().unwrap();
                        if added {
                            *seen.added.entry(key.name.clone()).or_default() += 1;
                        } else {
                            seen.errors
                                .push(format!("unexpected MODIFIED of {}", key.name));
                        }
                        resource_version = version;
                    }
                    Ok(WatchEvent::Bookmark {
                        resource_version: version,
                    }) => resource_version = version,
                    Ok(WatchEvent::Deleted { key, .. }) => {
                        seen.lock()
                            .unwrap()
                            .errors
                            .push(format!("unexpected DELETED of {}", key.name));
                    }
                    // An ERROR event ends the stream: a 410 means re-list (recorded: the
                    // test expects none), anything else watch again from the last version.
                    Err(error) if error.needs_relist() => {
                        seen.lock()
                            .unwrap()
                            .errors
                            .push(format!("watch event: {error}"));
                        return;
                    }
                    Err(error) => eprintln!("watch through replica 2 ended: {error}; resuming"),
                }
            }
        }
        seen.lock().unwrap().reconnects += 1;
    }
}

#[test]
fn two_replicas_on_a_three_member_etcd_lose_no_acknowledged_write() {
    if !etcd_or_skip("two_replicas_on_a_three_member_etcd_lose_no_acknowledged_write") {
        return;
    }
    let mut etcd = EtcdCluster::start(3).unwrap();
    let endpoints = etcd.endpoints().join(",");
    let store_args = [
        "--etcd-endpoints",
        endpoints.as_str(),
        "--etcd-prefix",
        "/sluice-acceptance",
        "--etcd-request-timeout",
        "5s",
    ];
    let first = ControlPlane::start(BIN, &store_args).unwrap();
    let pki = first.pki_dir();
    let mut replica_args = store_args.to_vec();
    replica_args.extend(["--pki-dir", pki.to_str().unwrap()]);
    let second = ControlPlane::start_replica(BIN, &replica_args).unwrap();

    // One admin token per store: the second replica found the first's and issued none.
    assert!(
        !second.data_dir().join("admin.kubeconfig").exists(),
        "the second replica must not mint its own admin token"
    );
    let admin = first.kubeconfig();
    let tokens = names(second.kubectl_via(
        &admin,
        &["get", "tokens.auth.sluice.dev", "-o", "name"],
        None,
    ));
    assert_eq!(
        tokens
            .iter()
            .filter(|name| name.starts_with("admin."))
            .count(),
        1,
        "{tokens:?}"
    );
    // The same serving certificate: the first's kubeconfig (its CA) reaches the second.
    let version = second.kubectl_via(&admin, &["get", "agents"], None);
    assert!(version.status.success(), "{}", text(&version));

    // A token issued through replica 1 authenticates a watcher on replica 2.
    let node_token = first.token("node", "node-a");
    let token_file = second.data_dir().join("node.token");
    std::fs::write(&token_file, &node_token).unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.spawn(watch_agents(
        second.url(),
        pki.join("ca.crt"),
        token_file,
        seen.clone(),
    ));
    // The watch starts at its list's version: from then on it misses no create. The list is
    // retried for up to 20 s while the replica learns the token; 30 s covers that.
    assert!(
        wait_until(Duration::from_secs(30), || seen.lock().unwrap().listed),
        "the watcher on the second replica never listed"
    );

    // Any replica takes writes: one through the second, seen through the first.
    let through_second = second.kubectl_via(
        &admin,
        &["create", "-f", "-"],
        Some(&agent("agent-via-2", 1000)),
    );
    assert!(through_second.status.success(), "{}", text(&through_second));
    assert!(names(first.kubectl(&["get", "agents", "-o", "name"], None))
        .contains(&"agent-via-2".to_string()));

    // Writes through the first replica; the etcd leader is killed after KILL_AFTER of them.
    let mut acknowledged = vec!["agent-via-2".to_string()];
    let mut refused = Vec::new();
    let mut killed = None;
    let started = Instant::now();
    for index in 0..WRITES {
        if index == KILL_AFTER {
            let leader = etcd.leader().expect("an etcd leader");
            eprintln!("killing etcd member {leader} (the leader) after {index} writes");
            etcd.kill(leader);
            killed = Some(leader);
        }
        let name = format!("agent-{index:03}");
        let output = first.kubectl(&["create", "-f", "-"], Some(&agent(&name, index + 1)));
        if output.status.success() {
            acknowledged.push(name);
        } else {
            eprintln!("create {name} not acknowledged: {}", text(&output));
            refused.push(name);
        }
    }
    eprintln!(
        "{} of {} writes acknowledged in {:?} ({} refused: {refused:?})",
        acknowledged.len() - 1,
        WRITES,
        started.elapsed(),
        refused.len()
    );
    // Two members keep a quorum: every write goes through, those during the election too (the
    // store fails over and retries within the request timeout; controlplane_etcd_failover.rs
    // covers every member in turn under load).
    assert!(
        refused.is_empty(),
        "writes refused with quorum held: {refused:?}"
    );

    // Every acknowledged write is present through both replicas ...
    for (which, replica) in [("first", &first), ("second", &second)] {
        let present = names(replica.kubectl_via(&admin, &["get", "agents", "-o", "name"], None));
        for name in &acknowledged {
            assert!(
                present.contains(name),
                "{name} was acknowledged but is missing via the {which} replica: {present:?}"
            );
        }
    }
    // ... and the watcher on the second saw each exactly once.
    let all_seen = wait_until(Duration::from_secs(15), || {
        let seen = seen.lock().unwrap();
        acknowledged
            .iter()
            .all(|name| seen.added.contains_key(name))
    });
    let seen = seen.lock().unwrap();
    let missing: Vec<_> = acknowledged
        .iter()
        .filter(|name| !seen.added.contains_key(*name))
        .collect();
    assert!(all_seen, "the watcher on replica 2 missed {missing:?}");
    let duplicated: Vec<_> = seen.added.iter().filter(|(_, count)| **count > 1).collect();
    assert!(duplicated.is_empty(), "delivered twice: {duplicated:?}");
    assert!(seen.errors.is_empty(), "watch errors: {:?}", seen.errors);
    eprintln!(
        "watcher saw {} ADDED events with {} reconnects",
        seen.added.len(),
        seen.reconnects
    );
    drop(seen);

    // The killed member comes back; the replicas keep taking writes.
    etcd.restart(killed.unwrap()).unwrap();
    let mut last = String::new();
    let written = wait_until(Duration::from_secs(15), || {
        let output = first.kubectl(
            &["create", "-f", "-"],
            Some(&agent("agent-after-restart", 2000)),
        );
        last = text(&output);
        output.status.success() || last.contains("AlreadyExists")
    });
    assert!(written, "no write after the member's restart: {last}");
    runtime.shutdown_timeout(Duration::from_secs(1));
}
