//! Simulated VM agents, many in this process: each speaks what `sluice vm-agent` speaks to the
//! control plane and nothing else (no OVS): its own token, a runtime-info report at start and
//! a heartbeat patch every interval (with jitter), and the agent's four watches (the three
//! policy resources and its VirtualMachine) run by the real `sluice-watch-client`, the code the
//! VM agent itself runs, reconnects and resumes included. As in the agent, the watches and the
//! reports share one `Transport`: one h2 connection per simulated agent.
//!
//! Each agent records, for its own policy, when each new value of the send-time annotation
//! arrives: the delivery latency of a policy write to every agent it affects.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{json, Value};
use sluice_watch_client::{
    ObjectKey, Resource, Snapshot, Transport, WatchClient, WatchClientConfig, WatchError,
    WatchMetrics,
};
use tokio::sync::watch;

/// The annotation holding a write's send time, nanoseconds since the Unix epoch.
pub const SENT_ANNOTATION: &str = "perf.sluice.dev/sent-unix-nanos";
pub const POLICY_GROUP: &str = "policy.sluice.dev";
pub const VM_GROUP: &str = "vm.sluice.dev";
pub const VERSION: &str = "v1alpha1";
const POLICY_RESOURCES: [&str; 3] = ["addressgroups", "appliedtogroups", "networkpolicies"];
const ANSWER_LIMIT: usize = 1 << 20;

pub fn vm_name(index: usize) -> String {
    format!("vm-{index:05}")
}

/// VM `index`'s uplink address: 10.x.y.z, unique for up to 16 million VMs.
pub fn vm_ip(index: usize) -> String {
    let n = index + 1;
    format!("10.{}.{}.{}", (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff)
}

pub fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos())
}

/// What all simulated agents share: where the control plane is, and what they saw.
pub struct Fleet {
    pub url: String,
    pub ca: PathBuf,
    pub heartbeat: Duration,
    pub metrics: WatchMetrics,
    /// Agents whose initial report was accepted.
    pub reported: AtomicUsize,
    /// Runtime-info writes refused (after retries) or failed.
    pub write_errors: AtomicUsize,
    /// What the first few of them were, for the run's log.
    pub first_errors: Mutex<Vec<String>>,
    /// Heartbeats sent and accepted.
    pub heartbeats: AtomicUsize,
    /// Watch errors the clients reported (from their metrics: reconnects are normal).
    pub latencies_us: Mutex<Vec<u64>>,
    /// Per (policy, send time) write, the agents that received it.
    pub received: Mutex<HashMap<(String, u128), usize>>,
    /// The latest send time of the marker address group each agent saw (0: none).
    pub markers: Mutex<Vec<u128>>,
}

impl Fleet {
    pub fn new(url: String, ca: PathBuf, heartbeat: Duration, vms: usize) -> Self {
        let mut registry = prometheus_client::registry::Registry::default();
        Self {
            url,
            ca,
            heartbeat,
            metrics: WatchMetrics::register(&mut registry),
            reported: AtomicUsize::new(0),
            write_errors: AtomicUsize::new(0),
            first_errors: Mutex::new(Vec::new()),
            heartbeats: AtomicUsize::new(0),
            latencies_us: Mutex::new(Vec::new()),
            received: Mutex::new(HashMap::new()),
            markers: Mutex::new(vec![0; vms]),
        }
    }

    /// Counts a failed write and keeps the first few descriptions.
    pub fn write_failed(&self, what: std::fmt::Arguments<'_>) {
        let count = self.write_errors.fetch_add(1, Ordering::Relaxed);
        if count < 5 {
            let note = format!("{what}");
            eprintln!("vms: an agent's write failed: {note}");
            if let Ok(mut errors) = self.first_errors.lock() {
                errors.push(note);
            }
        }
    }

    /// The marker send times every agent saw, oldest first.
    pub fn markers_seen(&self) -> Vec<u128> {
        self.markers
            .lock()
            .map(|markers| markers.clone())
            .unwrap_or_default()
    }
}

/// One agent, until `stop` turns true.
pub async fn run_agent(
    fleet: Arc<Fleet>,
    index: usize,
    token_file: PathBuf,
    policy: String,
    marker: String,
    stop: watch::Receiver<bool>,
) {
    let vm = vm_name(index);
    let mut config = WatchClientConfig::new(fleet.url.clone(), fleet.ca.clone());
    config.token_file = Some(token_file);
    // As the VM agent does (`vm-datapath/agent/src/lifecycle/feed.rs`): back quickly.
    config.backoff_max = Duration::from_secs(2);
    let transport = match Transport::new(&config) {
        Ok(transport) => Arc::new(transport),
        Err(error) => {
            fleet.write_failed(format_args!("{vm}: no transport: {error}"));
            return;
        }
    };
    if let Err(error) = report(&transport, &vm).await {
        fleet.write_failed(format_args!("{vm}: first report: {error}"));
        return;
    }
    fleet.reported.fetch_add(1, Ordering::Relaxed);
    let mut snapshots = Vec::new();
    let resources = POLICY_RESOURCES
        .iter()
        .map(|plural| Resource::new(POLICY_GROUP, VERSION, *plural))
        .chain([Resource::new(VM_GROUP, VERSION, "virtualmachines")]);
    for resource in resources {
        let plural = resource.plural.clone();
        let client = WatchClient::with_transport(
            config.clone(),
            resource,
            fleet.metrics.for_resource(&plural),
            transport.clone(),
        );
        snapshots.push(client.subscribe());
        let mut stopped = stop.clone();
        tokio::spawn(client.run(async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }));
    }
    let [groups, _, mut policies, _] =
        <[_; 4]>::try_from(snapshots).unwrap_or_else(|_| unreachable!());
    let mut groups = groups;
    // Spread the first heartbeat over the interval, as a fleet started over time would be.
    let jitter = fleet.heartbeat.mul_f64((index % 97) as f64 / 97.0);
    let mut next_beat = tokio::time::Instant::now() + jitter;
    let mut beat = 0u64;
    let mut seen_policy = 0u128;
    let mut seen_marker = 0u128;
    let mut stop_here = stop.clone();
    let stopped = async move {
        let _ = stop_here.wait_for(|stop| *stop).await;
    };
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = tokio::time::sleep_until(next_beat) => {
                beat += 1;
                heartbeat(&fleet, &transport, &vm, beat).await;
                next_beat += fleet.heartbeat;
            }
            changed = policies.changed() => {
                if changed.is_err() { return; }
                let snapshot = policies.borrow_and_update().clone();
                if let Some(sent) = newer_sent(&snapshot, &policy, seen_policy) {
                    seen_policy = sent;
                    fleet.delivered(&policy, sent);
                }
            }
            changed = groups.changed() => {
                if changed.is_err() { return; }
                let snapshot = groups.borrow_and_update().clone();
                if let Some(sent) = newer_sent(&snapshot, &marker, seen_marker) {
                    seen_marker = sent;
                    if let Ok(mut markers) = fleet.markers.lock() {
                        markers[index] = sent;
                    }
                }
            }
        }
    }
}

impl Fleet {
    fn delivered(&self, policy: &str, sent: u128) {
        let latency = now_nanos().saturating_sub(sent) / 1000;
        if let Ok(mut latencies) = self.latencies_us.lock() {
            latencies.push(u64::try_from(latency).unwrap_or(u64::MAX));
        }
        if let Ok(mut received) = self.received.lock() {
            *received.entry((policy.to_string(), sent)).or_insert(0) += 1;
        }
    }
}

/// The send time on cluster-scoped object `name` in `snapshot`, when newer than `seen`.
fn newer_sent(snapshot: &Snapshot, name: &str, seen: u128) -> Option<u128> {
    let object = snapshot.get(&ObjectKey::new("", name))?;
    let sent = object
        .pointer("/metadata/annotations")?
        .get(SENT_ANNOTATION)?
        .as_str()?
        .parse::<u128>()
        .ok()?;
    (sent > seen).then_some(sent)
}

fn runtime_infos() -> String {
    format!("/apis/{VM_GROUP}/{VERSION}/virtualmachineruntimeinfos")
}

/// The agent's first report (what makes its VM AgentedConnected).
async fn report(transport: &Transport, vm: &str) -> Result<(), WatchError> {
    let body = json!({"apiVersion": format!("{VM_GROUP}/{VERSION}"),
        "kind": "VirtualMachineRuntimeInfo", "metadata": {"name": vm},
        "agentState": "Active", "os": "Debian 12", "agentVersion": "perf-fleet",
        "conditions": [{"type": "OVSDBConnected", "status": "True", "reason": "Connected"}]});
    let body = Bytes::from(body.to_string());
    // A VM agent retries its first report until it lands: give it as long as the run waits
    // for every VM to connect (with 5,000 agents dialling at once, some wait minutes).
    retrying_for(Duration::from_secs(600), || async {
        match transport
            .post_json(&runtime_infos(), body.clone(), ANSWER_LIMIT)
            .await
        {
            Err(WatchError::Status { status: 409, .. }) => Ok(Bytes::new()),
            other => other,
        }
    })
    .await
    .map(drop)
}

async fn heartbeat(fleet: &Fleet, transport: &Transport, vm: &str, beat: u64) {
    let patch = json!({"reportedAt": format!("2026-01-01T{:02}:{:02}:{:02}Z",
        (beat / 3600) % 24, (beat / 60) % 60, beat % 60)});
    let path = format!("{}/{vm}", runtime_infos());
    let body = Bytes::from(patch.to_string());
    let sent = retrying(|| transport.merge_patch(&path, body.clone(), ANSWER_LIMIT)).await;
    match sent {
        Ok(_) => {
            fleet.heartbeats.fetch_add(1, Ordering::Relaxed);
        }
        Err(error) => fleet.write_failed(format_args!("{vm}: heartbeat {beat}: {error}")),
    }
}

/// Runs `send` until it succeeds, waiting out 429s and connection failures (a control plane
/// restarting) for up to a minute, as an agent's retry loop would.
pub async fn retrying<F, Fut>(send: F) -> Result<Bytes, WatchError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Bytes, WatchError>>,
{
    retrying_for(Duration::from_secs(60), send).await
}

/// [`retrying`] for up to `patience`.
pub async fn retrying_for<F, Fut>(patience: Duration, mut send: F) -> Result<Bytes, WatchError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Bytes, WatchError>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    let mut pause = Duration::from_millis(200);
    loop {
        let error = match send().await {
            Ok(answer) => return Ok(answer),
            Err(error) => error,
        };
        let retry = match &error {
            WatchError::Status { status, .. } => *status == 429 || *status >= 500,
            WatchError::Connect { .. } | WatchError::Tls { .. } | WatchError::Http(_) => true,
            WatchError::Timeout { .. } => true,
            _ => false,
        };
        if !retry || tokio::time::Instant::now() + pause > deadline {
            return Err(error);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// The objects of the fleet's policy set, as (plural, object): for every policy `k`, an
/// AppliedToGroup with the VMs whose index is `k` modulo the policy count, an AddressGroup of
/// 10 to 1,000 peer addresses, and the NetworkPolicy joining them (its peers also name the
/// marker group every agent sees).
pub fn policy_set(vms: usize, policies: usize) -> Vec<(&'static str, Value)> {
    let api_version = format!("{POLICY_GROUP}/{VERSION}");
    let mut objects = vec![(
        "addressgroups",
        json!({"apiVersion": api_version, "kind": "AddressGroup",
            "metadata": {"name": marker_name()}, "spec": {"members": ["192.0.2.1"]}}),
    )];
    for k in 0..policies {
        let members: Vec<Value> = (k..vms)
            .step_by(policies)
            .map(|index| {
                let vm = vm_name(index);
                json!({"name": format!("{vm}-eth0"), "vm": vm, "ofport": 1, "ips": [vm_ip(index)]})
            })
            .collect();
        let peers = 10 + (k * 37) % 991;
        let addresses: Vec<String> = (0..peers)
            .map(|peer| format!("172.{}.{}.{}", 16 + k % 16, peer / 250, 1 + peer % 250))
            .collect();
        objects.push((
            "appliedtogroups",
            json!({"apiVersion": api_version, "kind": "AppliedToGroup",
                "metadata": {"name": format!("atg-{k}")}, "spec": {"members": members}}),
        ));
        objects.push((
            "addressgroups",
            json!({"apiVersion": api_version, "kind": "AddressGroup",
                "metadata": {"name": format!("ag-{k}")}, "spec": {"members": addresses}}),
        ));
        objects.push((
            "networkpolicies",
            json!({"apiVersion": api_version, "kind": "NetworkPolicy",
                "metadata": {"name": policy_name(k)},
                "spec": {"namespace": "default", "priority": 10, "appliedTo": [format!("atg-{k}")],
                    "rules": [{"name": "in", "direction": "Ingress", "action": "Allow",
                        "peers": {"addressGroups": [format!("ag-{k}"), marker_name()]},
                        "services": [{"protocol": "TCP", "port": 443}]}]}}),
        ));
    }
    objects
}

pub fn policy_name(k: usize) -> String {
    format!("np-{k}")
}

pub fn marker_name() -> String {
    "fleet-marker".to_string()
}
