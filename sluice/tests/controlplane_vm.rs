//! The VMManager in the real `sluice controlplane` (2 s heartbeat timeout), driven with real
//! kubectl and curl: a VM applied Agented is AgentedBootstrap, its agent's runtime-info reports
//! make it AgentedConnected, their absence makes it AgentedBootstrap again; the agent's span
//! watch follows that state (ADDED, DELETED, BOOKMARKs past the VM's version); the agent can
//! touch only its own VM objects; NetworkPolicy status counts realized VMs; and a control plane
//! restarted after the timeout gives a Connected VM one timeout to report: a reporting agent's
//! VM stays Connected, a silent one's is demoted after that grace. Separately: BOOKMARKs for
//! progress alone come at most once per `--watch-bookmark-interval`.
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use test_support::{examples, wait_until, ControlPlane, CurlWatch};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const VMS: &str = "/apis/vm.sluice.dev/v1alpha1/virtualmachines";
const INFOS: &str = "/apis/vm.sluice.dev/v1alpha1/virtualmachineruntimeinfos";
const POLICIES: &str = "/apis/policy.sluice.dev/v1alpha1/networkpolicies";

/// curl with a bearer token: (HTTP status, body as JSON or Null).
fn call(
    cp: &ControlPlane,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let content_type = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    let mut command = Command::new("curl");
    command
        .args(["-sS", "--max-time", "10", "-X", method, "--cacert"])
        .arg(cp.ca_file())
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["-H", &format!("Content-Type: {content_type}")])
        .args(["-w", "\n%{http_code}"]);
    if let Some(body) = body {
        command.args(["--data-binary", &body.to_string()]);
    }
    let output = command.arg(format!("{}{path}", cp.url())).output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (
        code.trim().parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

fn admin_get(cp: &ControlPlane, path: &str) -> Value {
    let (code, body) = cp.curl("GET", path, None);
    assert_eq!(code, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn vm_state(cp: &ControlPlane, vm: &str) -> String {
    let object = admin_get(cp, &format!("{VMS}/{vm}"));
    object["status"]["state"].as_str().unwrap_or("").to_string()
}

fn wait_state(cp: &ControlPlane, vm: &str, state: &str, within: Duration) {
    let reached = wait_until(within, || vm_state(cp, vm) == state);
    assert!(reached, "{vm} is {:?}, not {state}", vm_state(cp, vm));
}

fn kubectl_ok(cp: &ControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    let output = cp.kubectl(args, stdin);
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// An agent's reports: the runtime info created once, then a merge patch every 300 ms with a
/// new `reportedAt` (so each is a real write), until stopped.
struct Reporter {
    running: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reporter {
    fn start(cp: &ControlPlane, token: &str, vm: &str, policies: Value) -> Self {
        let report = json!({"apiVersion": "vm.sluice.dev/v1alpha1",
            "kind": "VirtualMachineRuntimeInfo", "metadata": {"name": vm},
            "agentState": "Active", "os": "Debian 12", "agentVersion": "0.1.0-test",
            "networkPolicies": policies,
            "conditions": [{"type": "OVSDBConnected", "status": "True", "reason": "Connected"}]});
        let (code, body) = call(cp, token, "POST", INFOS, Some(&report));
        assert!(code == 201 || code == 409, "{code} {body}");
        let running = Arc::new(AtomicBool::new(true));
        let (url, ca, token, vm) = (cp.url(), cp.ca_file(), token.to_string(), vm.to_string());
        let flag = running.clone();
        let thread = std::thread::spawn(move || {
            let mut beat = 0u64;
            while flag.load(Ordering::SeqCst) {
                beat += 1;
                let patch = json!({"reportedAt": format!("2026-01-01T00:{:02}:{:02}Z",
                    (beat / 60) % 60, beat % 60), "networkPolicies": report["networkPolicies"]});
                let _ = Command::new("curl")
                    .args(["-sS", "--max-time", "5", "-X", "PATCH", "--cacert"])
                    .arg(&ca)
                    .args(["-H", &format!("Authorization: Bearer {token}")])
                    .args(["-H", "Content-Type: application/merge-patch+json"])
                    .args(["--data-binary", &patch.to_string(), "-o", "/dev/null"])
                    .arg(format!("{url}{INFOS}/{vm}"))
                    .output();
                // Not a synchronisation: the spacing between heartbeats, well inside the 2 s
                // heartbeat timeout after which the control plane demotes a silent VM.
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        Self {
            running,
            thread: Some(thread),
        }
    }

    fn stop(&mut self) {
        self.running.store(false, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A watch through curl, read event by event.
struct RawWatch(CurlWatch);

impl RawWatch {
    fn start(cp: &ControlPlane, token: &str, path: &str) -> Self {
        Self(CurlWatch::start(cp, token, path).unwrap())
    }

    /// The next event that is not a BOOKMARK, within `within`.
    fn next_change(&self, within: Duration) -> Option<Value> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let event = self.0.next_event(left)?;
            if event["type"] != "BOOKMARK" {
                return Some(event);
            }
        }
    }

    /// Waits for a BOOKMARK at `revision` or later, failing on any other change.
    fn bookmark_at_least(&self, revision: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.checked_duration_since(Instant::now()).unwrap();
            let event = self.0.next_event(left).expect("a bookmark in time");
            assert_eq!(event["type"], "BOOKMARK", "{event}");
            let at: u64 = event["object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            if at >= revision {
                return at;
            }
        }
    }
}

fn transitions(cp: &ControlPlane, from: &str, to: &str) -> u64 {
    let (_, metrics) = cp.curl("GET", "/metrics", None);
    let series = format!("sluice_vm_state_transitions_total{{from=\"{from}\",to=\"{to}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&series))
        .map_or(0, |count| count.trim().parse().unwrap())
}

const VM1: &str = "apiVersion: vm.sluice.dev/v1alpha1
kind: VirtualMachine
metadata: {name: vm1}
spec:
  management: Agented
  uplink: {name: eth0, ips: [10.0.0.1/24]}
";

#[test]
fn the_vm_lifecycle_through_the_api() {
    let mut cp = ControlPlane::start(BIN, &["--vm-heartbeat-timeout", "2s"]).unwrap();
    kubectl_ok(&cp, &["apply", "-f", "-"], Some(VM1));
    let vm2 = VM1.replace("vm1", "vm2");
    kubectl_ok(&cp, &["apply", "-f", "-"], Some(&vm2));
    // A name that extends vm1's: vm1's agent reads its own VM by key, and must not get this.
    let vm10 = VM1.replace("vm1", "vm10");
    kubectl_ok(&cp, &["apply", "-f", "-"], Some(&vm10));
    wait_state(&cp, "vm1", "AgentedBootstrap", Duration::from_secs(5));
    let policies = [examples::APPLIED_TO_GROUP, examples::NETWORK_POLICY].join("\n---\n");
    kubectl_ok(&cp, &["create", "-f", "-"], Some(&policies));
    let vm1 = cp.token("vm-agent", "vm1");

    // Bootstrap: nothing in the span.
    let (code, list) = call(&cp, &vm1, "GET", POLICIES, None);
    assert_eq!((code, list["items"].as_array().unwrap().len()), (200, 0));
    let watch = RawWatch::start(
        &cp,
        &vm1,
        &format!("{POLICIES}?watch=1&allowWatchBookmarks=true"),
    );
    assert!(watch.next_change(Duration::from_millis(800)).is_none());
    // A resourceVersion the store has not reached is refused at once, as for a plain watch.
    let future = format!("{POLICIES}?watch=1&resourceVersion=999999999");
    let (code, body) = call(&cp, &vm1, "GET", &future, None);
    assert_eq!(code, 503, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.starts_with("Too large resource version: 999999999"),
        "{body}"
    );

    // Reports make it Connected; the watch sends the policy, then a bookmark past the VM.
    let generation = admin_get(&cp, &format!("{POLICIES}/web"))["metadata"]["generation"]
        .as_i64()
        .unwrap();
    let mut reporter = Reporter::start(&cp, &vm1, "vm1", json!({"web": generation.to_string()}));
    wait_state(&cp, "vm1", "AgentedConnected", Duration::from_secs(5));
    let added = watch
        .next_change(Duration::from_secs(5))
        .expect("ADDED web");
    assert_eq!(
        (
            added["type"].as_str(),
            added["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("web"))
    );
    let vm_version: u64 = admin_get(&cp, &format!("{VMS}/vm1"))["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(watch.bookmark_at_least(vm_version) >= vm_version);

    // kubectl shows the VM with its columns, the policy with its realization.
    let table = kubectl_ok(&cp, &["get", "vm"], None);
    let header = table.lines().next().unwrap();
    for column in ["MANAGEMENT", "STATE", "AGENT", "POLICIES", "HEARTBEAT"] {
        assert!(header.contains(column), "{table}");
    }
    let row = table.lines().find(|line| line.starts_with("vm1")).unwrap();
    assert!(
        row.contains("AgentedConnected") && row.contains("0.1.0-test"),
        "{table}"
    );
    let realized = wait_until(Duration::from_secs(5), || {
        let status = admin_get(&cp, &format!("{POLICIES}/web"))["status"].clone();
        status
            == json!({"observedGeneration": generation, "desiredVMs": 1, "realizedVMs": 1,
                         "phase": "Realized"})
    });
    assert!(realized, "{}", admin_get(&cp, &format!("{POLICIES}/web")));
    let table = kubectl_ok(&cp, &["get", "vmnp"], None);
    assert!(
        table.lines().next().unwrap().contains("REALIZED"),
        "{table}"
    );

    the_agent_touches_only_its_own_vm_objects(&cp, &vm1);

    // Reports stop: AgentedBootstrap after the timeout, the policy leaves the span.
    reporter.stop();
    wait_state(&cp, "vm1", "AgentedBootstrap", Duration::from_secs(6));
    let deleted = watch
        .next_change(Duration::from_secs(5))
        .expect("DELETED web");
    assert_eq!(deleted["type"], "DELETED", "{deleted}");
    let pending = wait_until(Duration::from_secs(5), || {
        admin_get(&cp, &format!("{POLICIES}/web"))["status"]["phase"] == "Pending"
    });
    assert!(pending);
    drop(watch);

    // Connected again, then the control plane is away longer than the timeout while the agent
    // keeps trying: its absence is not the agent's fault, so the restarted process gives the
    // VM one timeout to report and the agent's next report holds it Connected.
    let mut reporter = Reporter::start(&cp, &vm1, "vm1", json!({}));
    wait_state(&cp, "vm1", "AgentedConnected", Duration::from_secs(5));
    cp.stop();
    // Not a synchronisation: the scenario is the control plane away longer than the timeout.
    std::thread::sleep(Duration::from_secs(3));
    cp.restart().unwrap();
    // Two timeouts with the reporter running: a demotion would have happened by now.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(vm_state(&cp, "vm1"), "AgentedConnected");
    assert_eq!(
        transitions(&cp, "AgentedConnected", "AgentedBootstrap"),
        0,
        "a reporting agent's VM was demoted after a control-plane outage"
    );

    // Away again with the agent gone too: demoted, but only after the grace of one timeout.
    reporter.stop();
    cp.stop();
    std::thread::sleep(Duration::from_secs(3));
    let restarted_at = std::time::SystemTime::now();
    cp.restart().unwrap();
    wait_state(&cp, "vm1", "AgentedBootstrap", Duration::from_secs(6));
    assert_eq!(
        transitions(&cp, "AgentedConnected", "AgentedBootstrap"),
        1,
        "the restarted process made the change"
    );
    let vm = admin_get(&cp, "/apis/vm.sluice.dev/v1alpha1/virtualmachines/vm1");
    let demoted = vm["status"]["conditions"][0]["lastTransitionTime"]
        .as_str()
        .map(epoch_seconds)
        .unwrap();
    let restarted_at = restarted_at
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        demoted >= restarted_at + 2,
        "demoted at once, not after the 2 s grace: {vm}"
    );
    let _reporter = Reporter::start(&cp, &vm1, "vm1", json!({}));
    wait_state(&cp, "vm1", "AgentedConnected", Duration::from_secs(5));
    assert_eq!(transitions(&cp, "AgentedBootstrap", "AgentedConnected"), 1);
}

/// An RFC 3339 time in whole seconds since the epoch, read by `date` (the test's clock).
fn epoch_seconds(time: &str) -> u64 {
    let output = Command::new("date")
        .args(["-u", "-d", time, "+%s"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap()
}

fn the_agent_touches_only_its_own_vm_objects(cp: &ControlPlane, vm1: &str) {
    let report = json!({"apiVersion": "vm.sluice.dev/v1alpha1",
        "kind": "VirtualMachineRuntimeInfo", "metadata": {"name": "vm2"}, "agentState": "Active"});
    let (code, body) = call(cp, vm1, "POST", INFOS, Some(&report));
    assert_eq!(code, 403, "{body}");
    assert_eq!(body["reason"], "Forbidden");
    let (code, _) = call(cp, vm1, "PATCH", &format!("{INFOS}/vm2"), Some(&json!({})));
    assert_eq!(code, 403);
    let (code, body) = call(cp, vm1, "GET", &format!("{VMS}/vm2"), None);
    assert_eq!(code, 403, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("virtualmachines.vm.sluice.dev \"vm2\" is forbidden: User \"sluice:vm-agent:vm1\" cannot get"),
        "{body}"
    );
    let (code, list) = call(cp, vm1, "GET", VMS, None);
    assert_eq!(code, 200);
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|vm| vm["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["vm1"]);
    // Its watch follows vm1 alone: vm10's change never reaches it, vm1's does.
    let watch = RawWatch::start(cp, vm1, &format!("{VMS}?watch=1"));
    let added = watch
        .next_change(Duration::from_secs(5))
        .expect("vm1 ADDED");
    assert_eq!(added["object"]["metadata"]["name"], "vm1", "{added}");
    kubectl_ok(cp, &["label", "vm", "vm10", "watched=no"], None);
    kubectl_ok(cp, &["label", "vm", "vm1", "watched=yes"], None);
    // (The VMManager may write vm1's status meanwhile: every event is vm1's, until the label.)
    loop {
        let changed = watch
            .next_change(Duration::from_secs(5))
            .expect("vm1 MODIFIED");
        assert_eq!(changed["object"]["metadata"]["name"], "vm1", "{changed}");
        if changed["object"]["metadata"]["labels"]["watched"] == "yes" {
            break;
        }
    }
    drop(watch);
    let status = json!({"status": {"state": "AgentedConnected"}});
    let (code, _) = call(
        cp,
        vm1,
        "PATCH",
        &format!("{VMS}/vm1/status"),
        Some(&status),
    );
    assert_eq!(code, 403);
    let (code, _) = call(cp, vm1, "PATCH", &format!("{VMS}/vm1"), Some(&json!({})));
    assert_eq!(code, 403);
    let (code, _) = call(cp, vm1, "GET", INFOS, None);
    assert_eq!(code, 403);
}

/// BOOKMARKs for progress alone come at most once a `--watch-bookmark-interval` (60 s by
/// default, kube-apiserver's pace), on plain and span watches alike, though the store moves
/// all along and reports progress every 10 s: 20,000 watches of 5,000 VM agents were 2,000
/// TLS writes a second at one per 10 s (issue 36).
#[test]
fn bookmarks_for_progress_alone_come_at_most_once_an_interval() {
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    let vm1 = cp.connect_vm("vm1");
    let admin = cp.admin_token();
    let groups = "/apis/policy.sluice.dev/v1alpha1/addressgroups";
    let plain = CurlWatch::start(
        &cp,
        &admin,
        &format!("{groups}?watch=1&allowWatchBookmarks=true"),
    )
    .unwrap();
    let span = CurlWatch::start(
        &cp,
        &vm1,
        &format!("{POLICIES}?watch=1&allowWatchBookmarks=true"),
    )
    .unwrap();
    // The store moves: other VMs are created (they wake neither watch).
    let started = Instant::now();
    let mut index = 0;
    while started.elapsed() < Duration::from_secs(13) {
        index += 1;
        let object = json!({"apiVersion": "vm.sluice.dev/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": format!("other{index}")},
            "spec": {"management": "Agentless", "uplink": {"name": "eth0"}}});
        let (code, body) = cp.curl("POST", VMS, Some(&object.to_string()));
        assert_eq!(code, 201, "{body}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let drain = |watch: &CurlWatch| {
        std::iter::from_fn(|| watch.next_event(Duration::from_millis(200)))
            .map(|event| event["type"].as_str().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
    };
    // The plain watch: no object, and no BOOKMARK within the interval (the store's progress
    // at 10 s is not forwarded).
    assert_eq!(drain(&plain), Vec::<String>::new());
    // The span watch: the one BOOKMARK that says its (empty) view is complete, nothing more.
    assert_eq!(drain(&span), ["BOOKMARK"]);
}
