//! `perf/check-smoke` against planted results: a good run passes, and each bad input the check
//! exists to catch fails it with a line naming the problem. Needs python3, as the check does.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

/// Runs the check on `dir`: (passed, what it printed).
fn check(dir: &Path, args: &[&str]) -> (bool, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("check-smoke");
    let output = Command::new("python3")
        .arg(script)
        .arg("--results")
        .arg(dir)
        .args(args)
        .output()
        .expect("python3 runs perf/check-smoke");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

fn write(dir: &Path, name: &str, value: &Value) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, serde_json::to_string_pretty(value).unwrap()).unwrap();
}

fn tunnel_record(case: &str, grpc_errors: Value) -> Value {
    // Direct has no proxy, so no proxy CPU (null, as the harness writes it).
    let (user, system) = if case == "direct" {
        (Value::Null, Value::Null)
    } else {
        (json!(30.5), json!(9.5))
    };
    json!({
        "scenario": "tunnel", "case": case, "workload": "grpc unary",
        "h2load": {"done": 2000, "status_2xx": 2000, "failed": 0, "errored": 0, "timeout": 0,
                   "status_4xx": 0, "status_5xx": 0},
        "grpc_errors": grpc_errors,
        "proxy_cpu_us_per_request": if case == "direct" { Value::Null } else { json!(40.0) },
        "proxy_user_us_per_request": user,
        "proxy_system_us_per_request": system,
    })
}

/// A tunnel smoke run of `direct` and `sluice-1-node` with nothing wrong.
fn good_tunnel_run(dir: &Path) {
    for case in ["direct", "sluice-1-node"] {
        write(
            dir,
            &format!("raw/{case}-c10-m10-r0.json"),
            &tunnel_record(case, json!(0)),
        );
    }
    write(
        dir,
        "summary.json",
        &json!([{"case": "direct", "errors": 0}, {"case": "sluice-1-node", "errors": 0}]),
    );
    std::fs::write(dir.join("summary.md"), "# tunnel\n").unwrap();
}

const TUNNEL_CASES: [&str; 3] = ["tunnel", "direct", "sluice-1-node"];

#[test]
fn a_clean_tunnel_run_passes() {
    let dir = tempfile::tempdir().unwrap();
    good_tunnel_run(dir.path());
    let (passed, text) = check(dir.path(), &TUNNEL_CASES);
    assert!(passed, "{text}");
}

#[test]
fn grpc_errors_of_a_peer_fail_the_tunnel_run() {
    let dir = tempfile::tempdir().unwrap();
    good_tunnel_run(dir.path());
    write(
        dir.path(),
        "raw/direct-c10-m10-r0.json",
        &tunnel_record("direct", json!(3)),
    );
    let (passed, text) = check(dir.path(), &TUNNEL_CASES);
    assert!(!passed, "{text}");
    assert!(
        text.contains("direct-c10-m10-r0.json: failed calls {'grpc_errors': 3}"),
        "{text}"
    );
}

#[test]
fn a_tunnel_record_that_did_not_count_grpc_statuses_fails() {
    let dir = tempfile::tempdir().unwrap();
    good_tunnel_run(dir.path());
    // What the harness wrote for direct, HAProxy and nginx before every case was counted.
    write(
        dir.path(),
        "raw/direct-c10-m10-r0.json",
        &tunnel_record("direct", Value::Null),
    );
    let (passed, text) = check(dir.path(), &TUNNEL_CASES);
    assert!(!passed, "{text}");
    assert!(
        text.contains("direct-c10-m10-r0.json: gRPC statuses not counted (grpc_errors None)"),
        "{text}"
    );
}

#[test]
fn a_run_whose_proxy_cpu_lost_its_system_part_fails() {
    let dir = tempfile::tempdir().unwrap();
    good_tunnel_run(dir.path());
    // What wiring that summed the proxy's CPU but dropped the split would write.
    let mut record = tunnel_record("sluice-1-node", json!(0));
    record["proxy_system_us_per_request"] = Value::Null;
    write(dir.path(), "raw/sluice-1-node-c10-m10-r0.json", &record);
    let (passed, text) = check(dir.path(), &TUNNEL_CASES);
    assert!(!passed, "{text}");
    assert!(
        text.contains("no run measured the proxy's system CPU"),
        "{text}"
    );
    assert!(!text.contains("proxy's user"), "{text}");
}

fn soak_window(window: u32, tunnel_errors: u64, cancelled: u64, churn: bool) -> Value {
    let process = |name: &str| json!({"name": name, "pid": 1, "rss_kib": 1000, "fds": 40});
    json!({
        "window": window,
        "processes": [process("sluice"), process("agent-steady"), process("agent-churn")],
        "tunnel": {"done": 500, "errors": tunnel_errors,
                   "grpc_codes": if cancelled > 0 { json!({"CANCELLED": cancelled}) } else { json!({}) }},
        "gateway": {"done": 500, "errors": 0},
        "churn": if churn { json!("agent-churn restarted (#1)") } else { Value::Null },
    })
}

/// A soak smoke run of four windows (one of warm-up); window 2 restarts an agent and has
/// `restart_errors` errors besides 5 CANCELLED ones.
fn soak_run(dir: &Path, restart_errors: u64) {
    let samples = json!([
        soak_window(1, 0, 0, false),
        soak_window(2, restart_errors + 5, 5, true),
        soak_window(3, 2, 2, false),
        soak_window(4, 0, 0, true),
    ]);
    write(dir, "raw/samples.json", &samples);
    write(
        dir,
        "summary.json",
        &json!({"summary": {"warm_up_windows": 1}}),
    );
    std::fs::write(dir.join("summary.md"), "![rss](rss.svg)\n").unwrap();
    std::fs::write(dir.join("rss.svg"), "<svg/>").unwrap();
}

#[test]
fn a_restart_explains_no_error_but_cancelled() {
    // A stopping agent drains (tunnels/tests/agent_stop.rs): one UNAVAILABLE in the restart's
    // window fails the check, as in any other window.
    for (errors, passes) in [(0, true), (1, false)] {
        let dir = tempfile::tempdir().unwrap();
        soak_run(dir.path(), errors);
        let (passed, text) = check(dir.path(), &["soak"]);
        assert_eq!(passed, passes, "{errors} errors: {text}");
        if !passes {
            assert!(
                text.contains("window 2: 1 error(s)") && text.contains("during an agent restart"),
                "{text}"
            );
        }
    }
}

#[test]
fn an_error_in_a_window_without_a_restart_fails_the_soak() {
    let dir = tempfile::tempdir().unwrap();
    soak_run(dir.path(), 0);
    let mut samples: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("raw/samples.json")).unwrap(),
    )
    .unwrap();
    samples[2]["tunnel"]["errors"] = json!(3);
    write(dir.path(), "raw/samples.json", &samples);
    let (passed, text) = check(dir.path(), &["soak"]);
    assert!(!passed, "{text}");
    assert!(text.contains("window 3: 1 error(s)"), "{text}");
}

#[test]
fn a_record_an_earlier_run_left_fails_the_check() {
    let dir = tempfile::tempdir().unwrap();
    good_tunnel_run(dir.path());
    // A clean record, but of a case this run did not have (say, an earlier `--only` run's).
    write(
        dir.path(),
        "raw/nginx-c10-m10-r0.json",
        &tunnel_record("nginx", json!(0)),
    );
    let (passed, text) = check(dir.path(), &TUNNEL_CASES);
    assert!(!passed, "{text}");
    assert!(
        text.contains("nginx-c10-m10-r0.json: a record of case 'nginx', not one of"),
        "{text}"
    );
}

/// A scale smoke run's agents record (one 2-node layout, nothing wrong), changed by `spoil`.
fn scale_agents_run(dir: &Path, spoil: impl FnOnce(&mut Value)) {
    let mut record = json!({"layouts": [{
        "layout": {"name": "2-nodes", "nodes": 2},
        "points": [{"agents_total": 200, "node_rss_kib_per_agent": 12.5}],
        "agent_errors": 0, "disconnects_outside_restart": 0,
        "restart": {"agents_on_node": 100, "agents_unreachable": 0, "seconds_to_all_listed": 2.8},
        "steady_calls": {"calls": 100, "errors": 0},
        "restart_calls": {"calls": 150, "errors": 0},
    }]});
    spoil(&mut record["layouts"][0]);
    write(dir, "raw/agents.json", &record);
}

#[test]
fn a_scale_run_fails_when_an_agent_saw_an_error_or_stayed_unreachable() {
    type Spoil = fn(&mut Value);
    let cases: [(Spoil, &str); 4] = [
        (
            |l| l["agent_errors"] = json!(1),
            "agents 2-nodes: agent_errors is 1",
        ),
        (
            |l| l["restart"]["agents_unreachable"] = json!(3),
            "3 of 100 agents unreachable after the node restart",
        ),
        (
            |l| l["restart_calls"]["errors"] = json!(2),
            "restart_calls errors is 2",
        ),
        (
            |l| l["disconnects_outside_restart"] = json!(5),
            "disconnects_outside_restart is 5",
        ),
    ];
    for (spoil, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        scale_run(dir.path(), 20, 0);
        scale_agents_run(dir.path(), spoil);
        let (passed, text) = check(dir.path(), &["scale"]);
        assert!(!passed && text.contains(expected), "{expected}: {text}");
    }
    let missing = tempfile::tempdir().unwrap();
    scale_run(missing.path(), 20, 0);
    std::fs::remove_file(missing.path().join("raw/agents.json")).unwrap();
    let (passed, text) = check(missing.path(), &["scale"]);
    assert!(!passed && text.contains("agents.json"), "{text}");
}

/// A scale smoke run's VM-fleet record with `delivered` of 20 deliveries and `errors` failed
/// runtime-info writes.
fn scale_run(dir: &Path, delivered: u64, errors: u64) {
    write(
        dir,
        "raw/vms.json",
        &json!({"deliveries_expected": 20, "deliveries": delivered,
                "agent_write_errors": errors, "misjudged_heartbeats": 0, "heartbeats": 280,
                "seconds_to_resync_after_restart": 0.9, "steady_controlplane_rss_mib": 48.0}),
    );
    std::fs::write(dir.join("summary.md"), "# scale\n").unwrap();
    scale_agents_run(dir, |_| {});
    scale_gateway_run(dir, 200, 0);
    for store in ["Embedded", "Etcd"] {
        scale_fanout_run(dir, store, 0, 0);
    }
    scale_fanout_record(dir, "Embedded", "raw", 0, 0);
}

/// A scale smoke run's fan-out record of `store` (`Embedded` or `Etcd`): 150 writes to 50
/// watchers of each kind, `missing` events not delivered, `watcher_errors` relists or
/// reconnects.
fn scale_fanout_run(dir: &Path, store: &str, missing: u64, watcher_errors: u64) {
    scale_fanout_record(dir, store, "product", missing, watcher_errors);
}

/// The same of `client`'s watchers (`product` or `raw`, the light ones: a `-light` file), as
/// the harness writes them.
fn scale_fanout_record(dir: &Path, store: &str, client: &str, missing: u64, watcher_errors: u64) {
    let light = if client == "raw" { "-light" } else { "" };
    write(
        dir,
        &format!("raw/fanout-{}-50{light}.json", store.to_lowercase()),
        &json!({"store": store, "client": client, "writes_acked": 150, "write_errors": 0,
                "events_expected": 7500, "events_delivered": 7500 - missing,
                "events_missing": missing, "watcher_errors": watcher_errors,
                "delivery_p99_ms": 12.5, "controlplane_rss_mib": 60.0}),
    );
}

/// A scale smoke run's gateway record: `watches` of 200 planned watches open, `errors` failed
/// client requests.
fn scale_gateway_run(dir: &Path, watches: u64, errors: u64) {
    write(
        dir,
        "raw/gateway.json",
        &json!({"plan": {"clients": 200}, "idle_connections": 200, "watches_open": watches,
                "client_errors": errors, "baseline_get_p99_ms": 2.5, "watching_get_p99_ms": 3.1,
                "rss_kib_per_idle_connection": 40.0, "upstream_sockets_watching": 3,
                "probe_requests": 800}),
    );
}

#[test]
fn a_scale_run_passes_only_with_every_delivery_every_client_and_no_error() {
    let good = tempfile::tempdir().unwrap();
    scale_run(good.path(), 20, 0);
    let (passed, text) = check(good.path(), &["scale"]);
    assert!(passed, "{text}");

    let missed = tempfile::tempdir().unwrap();
    scale_run(missed.path(), 19, 0);
    let (passed, text) = check(missed.path(), &["scale"]);
    assert!(
        !passed && text.contains("19 of 20 policy deliveries"),
        "{text}"
    );

    let failed = tempfile::tempdir().unwrap();
    scale_run(failed.path(), 20, 3);
    let (passed, text) = check(failed.path(), &["scale"]);
    assert!(
        !passed && text.contains("agent_write_errors is 3"),
        "{text}"
    );

    let unwatched = tempfile::tempdir().unwrap();
    scale_run(unwatched.path(), 20, 0);
    scale_gateway_run(unwatched.path(), 190, 0);
    let (passed, text) = check(unwatched.path(), &["scale"]);
    assert!(
        !passed && text.contains("watches_open is 190 of 200"),
        "{text}"
    );

    let refused = tempfile::tempdir().unwrap();
    scale_run(refused.path(), 20, 0);
    scale_gateway_run(refused.path(), 200, 2);
    let (passed, text) = check(refused.path(), &["scale"]);
    assert!(!passed && text.contains("client_errors is 2"), "{text}");

    let no_gateway = tempfile::tempdir().unwrap();
    scale_run(no_gateway.path(), 20, 0);
    std::fs::remove_file(no_gateway.path().join("raw/gateway.json")).unwrap();
    let (passed, text) = check(no_gateway.path(), &["scale"]);
    assert!(!passed && text.contains("gateway.json"), "{text}");
}

#[test]
fn a_scale_run_fails_when_a_fanout_watcher_missed_an_event_or_saw_an_error() {
    let missed = tempfile::tempdir().unwrap();
    scale_run(missed.path(), 20, 0);
    scale_fanout_run(missed.path(), "Etcd", 3, 0);
    let (passed, text) = check(missed.path(), &["scale"]);
    assert!(!passed, "{text}");
    assert!(
        text.contains("fanout-etcd-50.json: 7497 of 7500 events delivered"),
        "{text}"
    );
    assert!(
        text.contains("fanout-etcd-50.json: events_missing is 3"),
        "{text}"
    );

    let broken = tempfile::tempdir().unwrap();
    scale_run(broken.path(), 20, 0);
    scale_fanout_run(broken.path(), "Embedded", 0, 2);
    let (passed, text) = check(broken.path(), &["scale"]);
    assert!(
        !passed && text.contains("fanout-embedded-50.json: watcher_errors is 2"),
        "{text}"
    );
    assert!(!text.contains("etcd"), "{text}");

    let one_store = tempfile::tempdir().unwrap();
    scale_run(one_store.path(), 20, 0);
    std::fs::remove_file(one_store.path().join("raw/fanout-etcd-50.json")).unwrap();
    let (passed, text) = check(one_store.path(), &["scale"]);
    assert!(
        !passed && text.contains("no record of the etcd store"),
        "{text}"
    );

    let no_light = tempfile::tempdir().unwrap();
    scale_run(no_light.path(), 20, 0);
    std::fs::remove_file(no_light.path().join("raw/fanout-embedded-50-light.json")).unwrap();
    let (passed, text) = check(no_light.path(), &["scale"]);
    assert!(
        !passed && text.contains("no record of the light watchers"),
        "{text}"
    );

    let light_missed = tempfile::tempdir().unwrap();
    scale_run(light_missed.path(), 20, 0);
    scale_fanout_record(light_missed.path(), "Embedded", "raw", 2, 0);
    let (passed, text) = check(light_missed.path(), &["scale"]);
    assert!(
        !passed && text.contains("fanout-embedded-50-light.json: events_missing is 2"),
        "{text}"
    );
}
