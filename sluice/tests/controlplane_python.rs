//! The control plane with the Python `kubernetes` client (`CustomObjectsApi`) as its client:
//! list with a label selector and limit + continue paging, create, a watch from a
//! resourceVersion, a watch resumed after a control-plane restart (every event after the last
//! resourceVersion seen, each once), and 410 Gone for a watch from a compacted version.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use test_support::{python, python_script, ControlPlane};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const GROUP: &str = "policy.sluice.dev";
const VERSION: &str = "v1alpha1";
const PLURAL: &str = "addressgroups";
/// Longest wait for one answer or event of the Python client.
const TIMEOUT: Duration = Duration::from_secs(30);

/// `controlplane_client.py` as a child speaking JSON lines; killed on drop.
struct PythonClient {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl PythonClient {
    fn start(cp: &ControlPlane, mode: &[&str]) -> Self {
        let mut child = Command::new(python())
            .arg(python_script("controlplane_client.py"))
            .arg(cp.kubeconfig())
            .args([GROUP, VERSION, PLURAL])
            .args(mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the test venv's python (scripts/test.sh creates it)");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            stdin,
            lines,
        }
    }

    fn send_line(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn next(&self) -> Value {
        let line = self
            .lines
            .recv_timeout(TIMEOUT)
            .expect("the Python client answered in time");
        serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}"))
    }

    /// One request of `serve` mode and its answer.
    fn call(&mut self, request: Value) -> Value {
        self.send_line(&request.to_string());
        let answer = self.next();
        assert!(answer.get("error").is_none(), "{request} failed: {answer}");
        answer
    }
}

impl Drop for PythonClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn address_group(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "policy.sluice.dev/v1alpha1",
        "kind": "AddressGroup",
        "metadata": {"name": name, "labels": labels},
        "spec": {"members": ["10.0.0.1"]},
    })
}

/// An event row as the watcher prints it and the test expects it.
fn row(event_type: &str, name: &str, rv: &Value) -> (String, String, String) {
    (
        event_type.to_string(),
        name.to_string(),
        rv.as_str().unwrap().to_string(),
    )
}

fn rows_of(events: &[Value]) -> Vec<(String, String, String)> {
    events
        .iter()
        .map(|event| {
            row(
                event["type"].as_str().unwrap(),
                event["name"].as_str().unwrap(),
                &event["rv"],
            )
        })
        .collect()
}

/// The watcher's next `count` events (failing on the end of the watch).
fn next_events(watcher: &PythonClient, count: usize) -> Vec<Value> {
    let mut events = Vec::new();
    while events.len() < count {
        let event = watcher.next();
        assert!(
            event["type"] != "ENDED" && event["type"] != "BROKEN",
            "the watch ended early: {event} after {events:?}"
        );
        events.push(event);
    }
    events
}

#[test]
fn python_client_lists_pages_creates_and_watches() {
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    let mut client = PythonClient::start(&cp, &["serve"]);
    let empty = client.call(json!({"op": "list"}));
    assert_eq!(empty["pages"], json!([[]]));
    let start = empty["rvs"][0].clone();

    let mut expected = Vec::new();
    for index in 0..5 {
        let tier = if index % 2 == 0 { "even" } else { "odd" };
        let name = format!("group-{index}");
        let created = client.call(json!({"op": "create", "object":
            address_group(&name, json!({"app": "paging", "tier": tier}))}));
        assert_eq!(created["name"], name.as_str());
        expected.push(row("ADDED", &name, &created["rv"]));
    }
    client.call(json!({"op": "create", "object": address_group("other", json!({"app": "other"}))}));

    // limit + continue: pages of two in name order, all read at the first page's version.
    let paged = client.call(json!({"op": "list", "labelSelector": "app=paging", "limit": 2}));
    assert_eq!(
        paged["pages"],
        json!([["group-0", "group-1"], ["group-2", "group-3"], ["group-4"]])
    );
    let versions = paged["rvs"].as_array().unwrap();
    assert!(
        versions.iter().all(|rv| rv == &versions[0]),
        "pages of one list at one version: {paged}"
    );
    let odd = client.call(json!({"op": "list", "labelSelector": "app=paging,tier=odd"}));
    assert_eq!(odd["pages"], json!([["group-1", "group-3"]]));
    let not_paging = client.call(json!({"op": "list", "labelSelector": "app!=paging"}));
    assert_eq!(not_paging["pages"], json!([["other"]]));

    // ADDED, MODIFIED, DELETED in write order, each with the version its write returned.
    let patched = client.call(json!({"op": "patch", "name": "group-1",
        "patch": {"spec": {"members": ["10.0.0.9"]}}}));
    expected.push(row("MODIFIED", "group-1", &patched["rv"]));
    let deleted = client.call(json!({"op": "delete", "name": "group-3"}));
    expected.push(row("DELETED", "group-3", &deleted["list_rv"]));
    let watched = client.call(json!({"op": "watch_once", "resourceVersion": start, "timeout": 2}));
    let mut events = rows_of(
        &watched["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|event| json!({"type": event[0], "name": event[1], "rv": event[2]}))
            .collect::<Vec<_>>(),
    );
    // "other" is in the watch (no selector) between the creates and the patch.
    let other = events.iter().position(|(_, name, _)| name == "other");
    assert_eq!(other, Some(5), "{events:?}");
    events.remove(5);
    assert_eq!(events, expected);
}

#[test]
fn python_watch_resumes_after_a_restart_without_missing_or_repeating_an_event() {
    let mut cp = ControlPlane::start(BIN, &[]).unwrap();
    let mut client = PythonClient::start(&cp, &["serve"]);
    let start = client.call(json!({"op": "list"}))["rvs"][0]
        .as_str()
        .unwrap()
        .to_string();
    let mut watcher = PythonClient::start(&cp, &["watch", &start]);

    let mut written = Vec::new();
    for name in ["a", "b"] {
        let created =
            client.call(json!({"op": "create", "object": address_group(name, json!({}))}));
        written.push(row("ADDED", name, &created["rv"]));
    }
    let patched = client.call(json!({"op": "patch", "name": "a",
        "patch": {"metadata": {"labels": {"step": "1"}}}}));
    written.push(row("MODIFIED", "a", &patched["rv"]));
    let deleted = client.call(json!({"op": "delete", "name": "b"}));
    written.push(row("DELETED", "b", &deleted["list_rv"]));
    let before = next_events(&watcher, written.len());
    assert_eq!(rows_of(&before), written);

    // The control plane stops: the watch ends at the last version the client saw.
    cp.restart().unwrap();
    let ended = loop {
        let event = watcher.next();
        match event["type"].as_str().unwrap() {
            "ENDED" => break event,
            "BROKEN" => continue,
            other => panic!("an event after the last write: {other} {event}"),
        }
    };
    assert_eq!(ended["rv"], written.last().unwrap().2.as_str());

    // Writes while the client is away, on the restarted control plane.
    let mut after = Vec::new();
    let created = client.call(json!({"op": "create", "object": address_group("c", json!({}))}));
    after.push(row("ADDED", "c", &created["rv"]));
    let patched = client.call(json!({"op": "patch", "name": "a",
        "patch": {"metadata": {"labels": {"step": "2"}}}}));
    after.push(row("MODIFIED", "a", &patched["rv"]));
    let deleted = client.call(json!({"op": "delete", "name": "a"}));
    after.push(row("DELETED", "a", &deleted["list_rv"]));

    // Resumed from its last version, the client sees exactly those writes, then the live ones.
    watcher.send_line("resume");
    let created = client.call(json!({"op": "create", "object": address_group("d", json!({}))}));
    after.push(row("ADDED", "d", &created["rv"]));
    let resumed = next_events(&watcher, after.len());
    assert_eq!(rows_of(&resumed), after);
    // Nothing more: a last write is the next (and only next) event.
    let created = client.call(json!({"op": "create", "object": address_group("e", json!({}))}));
    let last = next_events(&watcher, 1);
    assert_eq!(rows_of(&last), vec![row("ADDED", "e", &created["rv"])]);
    watcher.send_line("exit");
}

#[test]
fn python_watch_from_a_compacted_version_gets_410() {
    let cp = ControlPlane::start(BIN, &["--compaction-interval", "1s"]).unwrap();
    let mut client = PythonClient::start(&cp, &["serve"]);
    let created = client.call(json!({"op": "create", "object": address_group("a", json!({}))}));
    let old = created["rv"].clone();
    for step in 0..3 {
        client.call(json!({"op": "patch", "name": "a",
            "patch": {"metadata": {"labels": {"step": step.to_string()}}}}));
    }
    // Until the compactor passes the old version, the watch replays history; then it is 410.
    let deadline = Instant::now() + Duration::from_secs(20);
    let gone = loop {
        let answer = client.call(json!({"op": "watch_once", "resourceVersion": old, "timeout": 1}));
        if answer.get("status").is_some() {
            break answer;
        }
        assert_eq!(
            answer["events"].as_array().unwrap().len(),
            3,
            "before compaction, the history after {old}: {answer}"
        );
        assert!(Instant::now() < deadline, "no 410 within 20 s: {answer}");
        // Each attempt waits its one-second timeout; the compactor ticks every second.
    };
    assert_eq!(gone["status"], 410, "{gone}");
    assert_eq!(gone["events"], json!([]), "{gone}");
    assert!(
        gone["reason"].as_str().unwrap().starts_with("Expired: "),
        "{gone}"
    );
}
