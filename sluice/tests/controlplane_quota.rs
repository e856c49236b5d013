//! What one identity may put in the control plane's store, tried from outside with curl against
//! the real `sluice controlplane` (issue 32, finding 7 and part of 8):
//!
//! - a vm-agent's oversized annotations are 422 naming `metadata.annotations` and Kubernetes'
//!   256 KiB limit, an oversized object 413 naming the 1.5 MiB limit, an oversized body 413;
//! - a vm-agent writing fast gets 429 with `Retry-After` from its write budget while a node, a
//!   gateway and the admin still write;
//! - past the store quota writes get 507 `StorageQuotaExceeded` while gets, lists and an open
//!   watch keep working; deletes and compaction bring writes back;
//! - a node (gateway) writes only its own entry of an Agent's (UpstreamCluster's) status map.
#![allow(clippy::unwrap_used)]

use std::io::Write as _;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use test_support::{wait_until, ControlPlane, CurlWatch};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const AGENTS: &str = "/apis/tunnel.sluice.dev/v1alpha1/agents";
const CLUSTERS: &str = "/apis/proxy.sluice.dev/v1alpha1/upstreamclusters";
const INFOS: &str = "/apis/vm.sluice.dev/v1alpha1/virtualmachineruntimeinfos";
const KIB: usize = 1024;

/// An answer: status code, `Retry-After` if sent, body as JSON (Null when it is not).
#[derive(Debug)]
struct Answer {
    code: u16,
    retry_after: Option<u64>,
    body: Value,
}

/// curl with a bearer token; the body goes through a file (large bodies exceed an argument).
fn call(cp: &ControlPlane, token: &str, method: &str, path: &str, body: Option<&str>) -> Answer {
    let content_type = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    let mut file = tempfile::NamedTempFile::new().unwrap();
    let mut command = Command::new("curl");
    command
        .args(["-sS", "-i", "--max-time", "20", "-X", method, "--cacert"])
        .arg(cp.ca_file())
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["-H", &format!("Content-Type: {content_type}")]);
    if let Some(body) = body {
        file.write_all(body.as_bytes()).unwrap();
        file.flush().unwrap();
        command
            .arg("--data-binary")
            .arg(format!("@{}", file.path().display()));
    }
    let output = command.arg(format!("{}{path}", cp.url())).output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let retry_after = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("retry-after")
            .then(|| value.trim().parse().ok())?
    });
    Answer {
        code,
        retry_after,
        body: serde_json::from_str(body).unwrap_or(Value::Null),
    }
}

fn agent(name: &str, id: u32, annotation_bytes: usize) -> String {
    json!({"apiVersion": "tunnel.sluice.dev/v1alpha1", "kind": "Agent",
        "metadata": {"name": name, "annotations": {"note": "x".repeat(annotation_bytes)}},
        "spec": {"id": id, "tokenSha256": "0".repeat(64)}})
    .to_string()
}

fn message(answer: &Answer) -> &str {
    answer.body["message"].as_str().unwrap_or("")
}

/// The value of one sample of the control plane's metrics (`name{labels}`), if present.
fn metric(cp: &ControlPlane, sample: &str) -> Option<f64> {
    let (code, text) = cp.curl("GET", "/metrics", None);
    assert_eq!(code, 200, "{text}");
    text.lines()
        .find_map(|line| line.strip_prefix(sample)?.trim().parse().ok())
}

/// node-1 writes its own entry in agent-1's status (a node role's write): 200.
fn node_1_holds_agent_1(cp: &ControlPlane) {
    let node = cp.token("node", "node-1");
    let held = json!({"status": {"nodes": {"node-1": {"connected": true}}}}).to_string();
    let path = format!("{AGENTS}/agent-1/status");
    let patched = call(cp, &node, "PATCH", &path, Some(&held));
    assert_eq!(patched.code, 200, "{patched:?}");
}

/// An UpstreamCluster `name` made by the admin (the smallest spec the gateway accepts).
fn create_cluster(cp: &ControlPlane, name: &str) {
    let object = json!({"apiVersion": "proxy.sluice.dev/v1alpha1", "kind": "UpstreamCluster",
        "metadata": {"name": name},
        "spec": {"servers": [{"endpoint": "https://10.0.0.9:6443"}],
            "secureServing": {"certFile": "serving.pem", "keyFile": "serving-key.pem"},
            "clientConfig": {"certFile": "gateway.pem", "keyFile": "gateway-key.pem"}}});
    let created = call(
        cp,
        &cp.admin_token(),
        "POST",
        CLUSTERS,
        Some(&object.to_string()),
    );
    assert_eq!(created.code, 201, "{created:?}");
}

#[test]
fn a_vm_agents_large_or_fast_writes_are_refused_while_the_roles_still_write() {
    // 5 writes at once, then 1 a second: the test's writes come far faster than that.
    let cp = ControlPlane::start(BIN, &["--write-budget", "vm-agent=1/5,65536/1048576"]).unwrap();
    let vm = cp.connect_vm("vm-1");
    let info = format!("{INFOS}/vm-1");

    // 1.4 MiB of annotations (finding 7's size): 422 naming the field and kube's limit.
    let annotations = json!({"metadata": {"annotations": {"big": "x".repeat(1400 * KIB)}}});
    let refused = call(&cp, &vm, "PATCH", &info, Some(&annotations.to_string()));
    assert_eq!(refused.code, 422, "{refused:?}");
    assert!(
        message(&refused).contains("metadata.annotations")
            && message(&refused).contains("262144 bytes"),
        "{}",
        message(&refused)
    );
    // Valid labels adding up to more than an object may be: 413 naming the 1.5 MiB limit.
    let labels: serde_json::Map<String, Value> = (0..24_000)
        .map(|n| (format!("l{n}"), json!("v".repeat(60))))
        .collect();
    let labels = json!({"metadata": {"labels": labels}}).to_string();
    assert!(labels.len() > 1536 * KIB && labels.len() < 3 * 1024 * KIB);
    let too_large = call(&cp, &vm, "PATCH", &info, Some(&labels));
    assert_eq!(too_large.code, 413, "{too_large:?}");
    assert!(
        message(&too_large).contains("at most 1572864 bytes"),
        "{too_large:?}"
    );
    // A body past the 3 MiB request limit is 413 before it is parsed.
    let body = format!("{{\"x\":\"{}\"}}", "y".repeat(3 * 1024 * KIB));
    let huge = call(&cp, &vm, "PATCH", &info, Some(&body));
    assert_eq!(huge.code, 413, "{huge:?}");

    // Fast small writes (each changes the object, so each is stored): 429 with Retry-After.
    let mut throttled = None;
    for n in 0..60 {
        let report = json!({"agentVersion": format!("v{n}")}).to_string();
        let answer = call(&cp, &vm, "PATCH", &info, Some(&report));
        if answer.code == 429 {
            throttled = Some(answer);
            break;
        }
        assert_eq!(answer.code, 200, "{answer:?}");
    }
    let throttled = throttled.expect("60 writes in a row never met the vm-agent's budget");
    assert_eq!(throttled.body["reason"], "TooManyRequests", "{throttled:?}");
    assert!(
        throttled.retry_after.is_some_and(|seconds| seconds >= 1),
        "{throttled:?}"
    );
    assert!(
        message(&throttled).contains("sluice:vm-agent:vm-1"),
        "{throttled:?}"
    );

    // Meanwhile the roles that keep the system running write on their own budgets.
    let created = call(
        &cp,
        &cp.admin_token(),
        "POST",
        AGENTS,
        Some(&agent("agent-1", 1, 10)),
    );
    assert_eq!(created.code, 201, "{created:?}");
    node_1_holds_agent_1(&cp);
    create_cluster(&cp, "c1.example.com");
    let gateway = cp.token("gateway", "gw-1");
    let health = json!({"status": {"gateways": {"gw-1": {"servers": []}}}}).to_string();
    let path = format!("{CLUSTERS}/c1.example.com/status");
    let patched = call(&cp, &gateway, "PATCH", &path, Some(&health));
    assert_eq!(patched.code, 200, "{patched:?}");

    let refusals =
        "sluice_controlplane_write_refusals_total{role=\"vm-agent\",reason=\"identity_budget\"}";
    assert!(metric(&cp, refusals).is_some_and(|count| count >= 1.0));
}

#[test]
fn past_the_store_quota_writes_are_507_reads_and_watches_go_on_and_compaction_recovers() {
    // 1 MiB of objects and history; compaction every second frees what deletes leave.
    let cp = ControlPlane::start(
        BIN,
        &[
            "--store-quota-bytes",
            "1048576",
            "--compaction-interval",
            "1s",
        ],
    )
    .unwrap();
    let admin = cp.admin_token();
    let watch = CurlWatch::start(&cp, &admin, &format!("{AGENTS}?watch=1")).unwrap();

    // 200 KiB objects (under the annotation limit) until the store is full.
    let mut created = Vec::new();
    let full = loop {
        assert!(
            created.len() < 20,
            "20 objects of 200 KiB never filled 1 MiB"
        );
        let name = format!("fill-{}", created.len());
        let id = created.len() as u32 + 1;
        let answer = call(
            &cp,
            &admin,
            "POST",
            AGENTS,
            Some(&agent(&name, id, 200 * KIB)),
        );
        if answer.code != 201 {
            break answer;
        }
        created.push(name);
    };
    assert_eq!(full.code, 507, "{full:?}");
    assert_eq!(full.body["reason"], "StorageQuotaExceeded", "{full:?}");
    assert!(
        message(&full).contains("quota of 1048576 bytes") && message(&full).contains("delete"),
        "{full:?}"
    );
    assert!(!created.is_empty());

    // Reads, lists and the open watch keep working.
    let got = call(
        &cp,
        &admin,
        "GET",
        &format!("{AGENTS}/{}", created[0]),
        None,
    );
    assert_eq!(got.code, 200, "{got:?}");
    let listed = call(&cp, &admin, "GET", AGENTS, None);
    assert_eq!(listed.code, 200);
    assert_eq!(
        listed.body["items"].as_array().map(Vec::len),
        Some(created.len())
    );
    for name in &created {
        let event = watch
            .next_event(Duration::from_secs(10))
            .expect("an ADDED event");
        assert_eq!(event["type"], "ADDED");
        assert_eq!(event["object"]["metadata"]["name"], name.as_str());
    }
    let quota = "sluice_controlplane_store_quota_bytes";
    assert_eq!(metric(&cp, quota), Some(1048576.0));
    assert!(metric(&cp, "sluice_controlplane_store_bytes").is_some_and(|used| used > 800_000.0));
    let refusals =
        "sluice_controlplane_write_refusals_total{role=\"admin\",reason=\"storage_quota\"}";
    assert!(metric(&cp, refusals).is_some_and(|count| count >= 1.0));
    // The refusal's Warning event cannot be stored in a full store: dropped, counted, and the
    // refusal answered as above (recording never fails what it describes).
    let dropped = "sluice_controlplane_events_dropped_total{reason=\"store_full\"}";
    let counted = wait_until(Duration::from_secs(10), || {
        metric(&cp, dropped).is_some_and(|count| count >= 1.0)
    });
    assert!(counted, "{:?}", metric(&cp, dropped));

    // Deletes pass a full store; compaction then frees their history and writes work again.
    for name in &created {
        let deleted = call(&cp, &admin, "DELETE", &format!("{AGENTS}/{name}"), None);
        assert_eq!(deleted.code, 200, "{deleted:?}");
    }
    let mut last = None;
    let recovered = wait_until(Duration::from_secs(30), || {
        let answer = call(
            &cp,
            &admin,
            "POST",
            AGENTS,
            Some(&agent("after", 99, 200 * KIB)),
        );
        let done = answer.code == 201;
        last = Some(answer);
        done
    });
    assert!(
        recovered,
        "no write succeeded after deletes and compaction: {last:?}"
    );
    // The watch that was open throughout sees the deletions and the new object.
    let mut seen = Vec::new();
    while let Some(event) = watch.next_event(Duration::from_secs(10)) {
        let name = event["object"]["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_string();
        seen.push((
            event["type"].as_str().unwrap_or("").to_string(),
            name.clone(),
        ));
        if name == "after" {
            break;
        }
    }
    assert_eq!(
        seen.last(),
        Some(&("ADDED".to_string(), "after".to_string())),
        "{seen:?}"
    );
    assert_eq!(
        seen.iter().filter(|(kind, _)| kind == "DELETED").count(),
        created.len()
    );
}

#[test]
fn a_node_or_gateway_writes_only_its_own_entry_of_a_status_map() {
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    let admin = cp.admin_token();
    let created = call(&cp, &admin, "POST", AGENTS, Some(&agent("agent-7", 7, 10)));
    assert_eq!(created.code, 201, "{created:?}");
    let status = format!("{AGENTS}/agent-7/status");
    let (node_1, node_2) = (cp.token("node", "node-1"), cp.token("node", "node-2"));
    let entry = |node: &str, value: Value| json!({"status": {"nodes": {node: value}}}).to_string();

    let own = call(
        &cp,
        &node_1,
        "PATCH",
        &status,
        Some(&entry("node-1", json!({"connected": true}))),
    );
    assert_eq!(own.code, 200, "{own:?}");
    // node-2 rewriting or removing node-1's entry: 403 naming the map.
    for forged in [json!({"connected": false}), Value::Null] {
        let answer = call(
            &cp,
            &node_2,
            "PATCH",
            &status,
            Some(&entry("node-1", forged)),
        );
        assert_eq!(answer.code, 403, "{answer:?}");
        assert!(message(&answer).contains("status.nodes"), "{answer:?}");
    }
    // A PUT of the whole status that keeps node-2's own entry but drops node-1's: 403 too.
    let mut object = call(&cp, &node_2, "GET", &status, None).body;
    object["status"] = json!({"nodes": {"node-2": {"connected": true}}});
    let put = call(&cp, &node_2, "PUT", &status, Some(&object.to_string()));
    assert_eq!(put.code, 403, "{put:?}");
    let own = call(
        &cp,
        &node_2,
        "PATCH",
        &status,
        Some(&entry("node-2", json!({"connected": true}))),
    );
    assert_eq!(own.code, 200, "{own:?}");
    let stored = call(&cp, &admin, "GET", &format!("{AGENTS}/agent-7"), None);
    assert_eq!(
        stored.body["status"]["nodes"],
        json!({"node-1": {"connected": true}, "node-2": {"connected": true}})
    );

    create_cluster(&cp, "c1.example.com");
    let path = format!("{CLUSTERS}/c1.example.com/status");
    let health = |gateway: &str, healthy: bool| {
        json!({"status": {"gateways": {gateway: {"servers": [{"healthy": healthy}]}}}}).to_string()
    };
    let (gw_1, gw_2) = (cp.token("gateway", "gw-1"), cp.token("gateway", "gw-2"));
    assert_eq!(
        call(&cp, &gw_1, "PATCH", &path, Some(&health("gw-1", true))).code,
        200
    );
    let forged = call(&cp, &gw_2, "PATCH", &path, Some(&health("gw-1", false)));
    assert_eq!(forged.code, 403, "{forged:?}");
    assert!(message(&forged).contains("status.gateways"), "{forged:?}");
    // Only the admin may write the whole status as it likes.
    assert_eq!(
        call(&cp, &admin, "PATCH", &path, Some(&health("gw-1", false))).code,
        200
    );
}

#[test]
fn vm_agents_stop_at_the_stores_reserve_while_nodes_and_the_admin_still_write() {
    // Budgets out of the way: this is about the store's room, not the rate.
    let cp = ControlPlane::start(
        BIN,
        &[
            "--store-quota-bytes",
            "1048576",
            "--write-budget",
            "vm-agent=100/1000,1048576/8388608",
        ],
    )
    .unwrap();
    let admin = cp.admin_token();
    let vm = cp.connect_vm("vm-1");
    let info = format!("{INFOS}/vm-1");
    let created = call(&cp, &admin, "POST", AGENTS, Some(&agent("agent-1", 1, 10)));
    assert_eq!(created.code, 201, "{created:?}");

    // The admin fills the store 50 KiB at a time; the vm-agent reports after each.
    let mut reserve = None;
    for n in 0..30 {
        let report = json!({"agentVersion": format!("v{n}")}).to_string();
        let answer = call(&cp, &vm, "PATCH", &info, Some(&report));
        if answer.code != 200 {
            reserve = Some(answer);
            break;
        }
        let name = format!("fill-{n}");
        let filled = call(
            &cp,
            &admin,
            "POST",
            AGENTS,
            Some(&agent(&name, n + 2, 50 * KIB)),
        );
        assert_eq!(
            filled.code, 201,
            "the admin was refused before the vm-agent: {filled:?}"
        );
    }
    let reserve = reserve.expect("the vm-agent was never held back from the reserve");
    assert_eq!(reserve.code, 507, "{reserve:?}");
    assert_eq!(
        reserve.body["reason"], "StorageQuotaExceeded",
        "{reserve:?}"
    );
    assert!(
        message(&reserve).contains("kept for the admin, nodes and gateways"),
        "{reserve:?}"
    );

    // The reserve is there for the roles that keep the system running.
    node_1_holds_agent_1(&cp);
    let small = call(&cp, &admin, "POST", AGENTS, Some(&agent("small", 99, 10)));
    assert_eq!(small.code, 201, "{small:?}");
    let refusals =
        "sluice_controlplane_write_refusals_total{role=\"vm-agent\",reason=\"storage_reserve\"}";
    assert!(metric(&cp, refusals).is_some_and(|count| count >= 1.0));
}
