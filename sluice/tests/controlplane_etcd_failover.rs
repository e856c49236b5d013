//! etcd maintenance under load: two control-plane replicas on a 3-member etcd take a steady
//! stream of creates and updates (through both) while each member in turn, the leader first,
//! is SIGKILLed for a while and restarted. Quorum holds throughout, so every write must
//! succeed, the final state must be exactly the acknowledged writes, and a watch on each
//! replica must see every acknowledged change exactly once and nothing else.
//! Built with the `etcd` feature only (scripts/test.sh enables it).
#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use test_support::{etcd_or_skip, wait_until, ControlPlane, EtcdCluster};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const AGENTS: &str = "/apis/tunnel.sluice.dev/v1alpha1/agents";
/// How long each member stays down: several election timeouts of the fixture (500 ms), and
/// long enough for dozens of writes to go through the remaining two.
const DOWN: Duration = Duration::from_millis(2500);
/// Each object is created, then updated this many times.
const UPDATES: usize = 2;

/// One write as its client saw it.
#[derive(Debug, Clone)]
struct Write {
    name: String,
    /// The resourceVersion answered (empty when the write failed).
    version: String,
    created: bool,
    status: u16,
    latency: Duration,
    /// Sent while a member was down.
    during_kill: bool,
}

/// An HTTP call with the admin token to `url` (any replica): `(status, body)`.
fn call(
    url: &str,
    ca: &std::path::Path,
    token: &str,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    let output = Command::new("curl")
        .args(["--silent", "--max-time", "30", "--request", method])
        .arg("--cacert")
        .arg(ca)
        .args(["--header", &format!("Authorization: Bearer {token}")])
        .args(["--header", "Content-Type: application/json"])
        .args(["--write-out", "\n%{http_code}", "--data-binary", body])
        .arg(format!("{url}{path}"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

fn agent(name: &str, id: usize, generation: usize, version: Option<&str>) -> String {
    let mut metadata = json!({"name": name, "labels": {"generation": generation.to_string()}});
    if let Some(version) = version {
        metadata["resourceVersion"] = json!(version);
    }
    json!({"apiVersion": "tunnel.sluice.dev/v1alpha1", "kind": "Agent", "metadata": metadata,
        "spec": {"id": id, "tokenSha256": "0".repeat(64)}})
    .to_string()
}

/// Writes through one replica until `stop`: create an Agent, update it UPDATES times.
struct Writer {
    url: String,
    ca: std::path::PathBuf,
    token: String,
    prefix: String,
    first_id: usize,
    killing: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
}

impl Writer {
    fn run(self) -> Vec<Write> {
        let mut writes = Vec::new();
        let mut index = 0;
        while !self.stop.load(Ordering::Acquire) {
            let name = format!("{}-{index:04}", self.prefix);
            let mut version: Option<String> = None;
            for generation in 0..=UPDATES {
                let body = agent(&name, self.first_id + index, generation, version.as_deref());
                let (method, path) = match &version {
                    None => ("POST", AGENTS.to_string()),
                    Some(_) => ("PUT", format!("{AGENTS}/{name}")),
                };
                let during_kill = self.killing.load(Ordering::Acquire);
                let started = Instant::now();
                let (status, answer) = call(&self.url, &self.ca, &self.token, method, &path, &body);
                let latency = started.elapsed();
                self.sent.fetch_add(1, Ordering::AcqRel);
                let answered = (200..300)
                    .contains(&status)
                    .then(|| serde_json::from_str::<Value>(&answer).ok())
                    .flatten()
                    .and_then(|object| {
                        object["metadata"]["resourceVersion"]
                            .as_str()
                            .map(str::to_owned)
                    });
                if answered.is_none() {
                    eprintln!("{method} {name} (generation {generation}): {status} {answer}");
                }
                writes.push(Write {
                    name: name.clone(),
                    version: answered.clone().unwrap_or_default(),
                    created: version.is_none(),
                    status,
                    latency,
                    during_kill,
                });
                // A failed write ends this object: the next starts fresh.
                let Some(answered) = answered else { break };
                version = Some(answered);
            }
            index += 1;
        }
        writes
    }
}

/// The events of a `curl -N` watch on `url` (the CA and token of the first replica, which
/// the second shares) as `(type, name, resourceVersion)`, collected on a thread; the curl
/// process is returned to be killed at the end.
type Events = Arc<Mutex<Vec<(String, String, String)>>>;

fn watch(url: &str, ca: &std::path::Path, token: &str, path: &str) -> (Child, Events) {
    let mut child = Command::new("curl")
        .args(["-sS", "-N", "--cacert"])
        .arg(ca)
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .arg(format!("{url}{path}"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let events = Events::default();
    let sink = events.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(event) = serde_json::from_str::<Value>(&line.unwrap_or_default()) else {
                break;
            };
            let kind = event["type"].as_str().unwrap_or("").to_string();
            let metadata = &event["object"]["metadata"];
            let name = metadata["name"].as_str().unwrap_or("").to_string();
            let version = metadata["resourceVersion"]
                .as_str()
                .unwrap_or("")
                .to_string();
            sink.lock().unwrap().push((kind, name, version));
        }
    });
    (child, events)
}

/// Two control-plane replicas on one etcd, and what a client needs to call either.
struct Replicas {
    first: ControlPlane,
    second: ControlPlane,
    token: String,
    ca: PathBuf,
}

impl Replicas {
    fn start(etcd: &EtcdCluster) -> Replicas {
        let endpoints = etcd.endpoints().join(",");
        let store_args = [
            "--etcd-endpoints",
            endpoints.as_str(),
            "--etcd-prefix",
            "/sluice-failover",
        ];
        let first = ControlPlane::start(BIN, &store_args).unwrap();
        let pki = first.pki_dir();
        let mut replica_args = store_args.to_vec();
        replica_args.extend(["--pki-dir", pki.to_str().unwrap()]);
        let second = ControlPlane::start_replica(BIN, &replica_args).unwrap();
        let (token, ca) = (first.admin_token(), first.ca_file());
        Replicas {
            first,
            second,
            token,
            ca,
        }
    }

    fn urls(&self) -> [String; 2] {
        [self.first.url(), self.second.url()]
    }

    fn get(&self, url: &str, path: &str) -> (u16, String) {
        call(url, &self.ca, &self.token, "GET", path, "")
    }

    /// A watch of Agents on `url` from its list's resourceVersion.
    fn watch_from_now(&self, url: &str) -> (Child, Events) {
        let mut listed = (0, String::new());
        assert!(
            wait_until(Duration::from_secs(20), || {
                listed = self.get(url, AGENTS);
                listed.0 == 200
            }),
            "list through {url}: {listed:?}"
        );
        let list: Value = serde_json::from_str(&listed.1).unwrap();
        let version = list["metadata"]["resourceVersion"].as_str().unwrap();
        let path = format!("{AGENTS}?watch=1&timeoutSeconds=300&resourceVersion={version}");
        watch(url, &self.ca, &self.token, &path)
    }
}

/// The shared state of the writers and the member killer.
#[derive(Default)]
struct Load {
    killing: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
}

impl Load {
    /// One writer thread per replica, with disjoint names and Agent ids.
    fn start(&self, replicas: &Replicas) -> Vec<JoinHandle<Vec<Write>>> {
        let [first, second] = replicas.urls();
        [(first, "one", 1), (second, "two", 100_000)]
            .into_iter()
            .map(|(url, prefix, first_id)| {
                let writer = Writer {
                    url,
                    ca: replicas.ca.clone(),
                    token: replicas.token.clone(),
                    prefix: prefix.to_string(),
                    first_id,
                    killing: self.killing.clone(),
                    stop: self.stop.clone(),
                    sent: self.sent.clone(),
                };
                std::thread::spawn(move || writer.run())
            })
            .collect()
    }

    fn sent(&self) -> usize {
        self.sent.load(Ordering::Acquire)
    }

    /// Each member in turn, the leader first: SIGKILL, down for DOWN, restart, wait healthy,
    /// then some writes with all three up before the next.
    fn kill_each_member(&self, etcd: &mut EtcdCluster) {
        assert!(wait_until(Duration::from_secs(10), || self.sent() >= 20));
        let leader = etcd.leader().expect("an etcd leader");
        for member in [leader, (leader + 1) % 3, (leader + 2) % 3] {
            let before = self.sent();
            eprintln!(
                "killing etcd member {member} (leader: {:?}) after {before} writes",
                etcd.leader()
            );
            self.killing.store(true, Ordering::Release);
            etcd.kill(member);
            std::thread::sleep(DOWN);
            etcd.restart(member).unwrap();
            self.killing.store(false, Ordering::Release);
            let after = self.sent();
            eprintln!(
                "member {member} back after {} writes while it was down",
                after - before
            );
            assert!(wait_until(Duration::from_secs(10), || self.sent() >= after + 10));
        }
    }
}

#[test]
fn killing_each_etcd_member_in_turn_fails_no_write_through_two_replicas() {
    if !etcd_or_skip("killing_each_etcd_member_in_turn_fails_no_write_through_two_replicas") {
        return;
    }
    let mut etcd = EtcdCluster::start(3).unwrap();
    let replicas = Replicas::start(&etcd);
    // A watch on each replica from its list's resourceVersion (nothing exists yet).
    let (curls, watches): (Vec<Child>, Vec<Events>) = replicas
        .urls()
        .iter()
        .map(|url| replicas.watch_from_now(url))
        .unzip();

    let load = Load::default();
    let started = Instant::now();
    let writers = load.start(&replicas);
    load.kill_each_member(&mut etcd);
    load.stop.store(true, Ordering::Release);
    let writes: Vec<Write> = writers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();

    let failed: Vec<&Write> = writes
        .iter()
        .filter(|w| !(200..300).contains(&w.status))
        .collect();
    let during: Vec<&Write> = writes.iter().filter(|w| w.during_kill).collect();
    let slowest = during.iter().map(|w| w.latency).max().unwrap_or_default();
    eprintln!(
        "{} writes in {:?}, {} while a member was down (slowest {slowest:?}), {} failed",
        writes.len(),
        started.elapsed(),
        during.len(),
        failed.len()
    );
    // The load really ran through every kill (3 kills of DOWN each).
    assert!(
        during.len() >= 30,
        "only {} writes while members were down",
        during.len()
    );
    assert!(failed.is_empty(), "failed writes: {failed:?}");
    assert_state_is_the_acknowledged_writes(&replicas, &writes);
    assert_each_watch_saw_each_write_once(&watches, &writes);
    assert_failovers_counted(&replicas);
    for mut curl in curls {
        let _ = curl.kill();
        let _ = curl.wait();
    }
}

/// The final state through each replica is exactly the acknowledged writes: each object at its
/// last version.
fn assert_state_is_the_acknowledged_writes(replicas: &Replicas, writes: &[Write]) {
    let mut expected: BTreeMap<String, String> = BTreeMap::new();
    for write in writes {
        expected.insert(write.name.clone(), write.version.clone());
    }
    for url in replicas.urls() {
        let (status, body) = replicas.get(&url, AGENTS);
        assert_eq!(status, 200, "{body}");
        let list: Value = serde_json::from_str(&body).unwrap();
        let stored: BTreeMap<String, String> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| {
                let metadata = &item["metadata"];
                let name = metadata["name"].as_str().unwrap().to_string();
                let version = metadata["resourceVersion"].as_str().unwrap().to_string();
                (name, version)
            })
            .collect();
        assert_eq!(stored, expected, "state through {url}");
    }
}

/// Each watch saw every acknowledged change exactly once, as ADDED or MODIFIED, and nothing
/// else (a change that landed without being acknowledged would show up here).
fn assert_each_watch_saw_each_write_once(watches: &[Events], writes: &[Write]) {
    let mut acknowledged: Vec<(String, String, String)> = writes
        .iter()
        .map(|w| {
            let kind = if w.created { "ADDED" } else { "MODIFIED" };
            (kind.to_string(), w.name.clone(), w.version.clone())
        })
        .collect();
    acknowledged.sort();
    for (which, events) in watches.iter().enumerate() {
        let complete = wait_until(Duration::from_secs(10), || {
            events.lock().unwrap().len() >= acknowledged.len()
        });
        let mut seen = events.lock().unwrap().clone();
        seen.sort();
        assert!(
            complete,
            "watch on replica {which}: {} of {} events",
            seen.len(),
            acknowledged.len()
        );
        assert_eq!(seen, acknowledged, "watch on replica {which}");
    }
}

/// Each replica's preferred member died at some point, and so did each watch's: both moved,
/// and `/metrics` counted it.
fn assert_failovers_counted(replicas: &Replicas) {
    for url in replicas.urls() {
        let (status, text) = replicas.get(&url, "/metrics");
        assert_eq!(status, 200, "{text}");
        let value = |name: &str| -> u64 {
            let line = text
                .lines()
                .find(|line| line.starts_with(&format!("{name} ")));
            let value = line.and_then(|line| line.rsplit(' ').next());
            value.and_then(|value| value.parse().ok()).unwrap_or(0)
        };
        let failovers = value("sluice_controlplane_etcd_failovers_total");
        let watch_retries = value("sluice_controlplane_etcd_retries_total{op=\"watch\"}");
        let write_retries = value("sluice_controlplane_etcd_retries_total{op=\"write\"}");
        let applied = value("sluice_controlplane_etcd_writes_found_applied_total");
        eprintln!(
            "{url}: {failovers} failovers, retries: {write_retries} write, {watch_retries} \
             watch; {applied} writes found applied"
        );
        assert!(failovers >= 1, "no failover counted by {url}");
        assert!(watch_retries >= 1, "no watch resumed by {url}");
    }
}
