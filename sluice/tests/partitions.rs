//! Partitions and slow peers with real packets: two tunnel nodes, redis-server and the clients in
//! namespaces joined by a routing hub, where links are black-holed (packets vanish: no RST, no
//! ICMP) or slowed (200 ms each way and 5% loss). Each case asserts the outcome documented in
//! docs/OPERATIONS.md ("Partitions and slow peers") and prints the figures quoted there.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;
#[path = "partitions/rig.rs"]
mod rig;
#[path = "partitions/upstream.rs"]
mod upstream;

use std::io::Read;
use std::ops::RangeInclusive;
use std::process::Child;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rig::{read_client, Rig, NODE_A, NODE_B, REDIS};
use serde_json::Value;
use test_support::wait_until;

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// `steady` client arguments: sequential calls for `duration` seconds, each with a deadline of
/// `timeout` seconds, 50 ms apart.
fn steady_args(duration: u32, timeout: u32) -> Vec<String> {
    let (duration, timeout) = (duration.to_string(), timeout.to_string());
    [
        "--duration",
        &duration,
        "--timeout",
        &timeout,
        "--delay",
        "0.05",
    ]
    .map(String::from)
    .to_vec()
}

/// No extra client arguments.
const NO_ARGS: [&str; 0] = [];

/// The `steady` client's pause between calls (`--delay` in [`steady_args`]): its top pace is one
/// call per 50 ms, 20 per second, when the calls themselves take no time.
const STEADY_PAUSE_SECS: f64 = 0.05;

/// The share of that top pace a stream of calls that "keeps working" must reach in a window: a
/// local call takes a few ms, so ~18 calls/s were measured (about 800 in 45 s, OPERATIONS.md);
/// a quarter (5 calls/s) leaves a 3.5x margin for a loaded 2-core CI, and a stream that stopped
/// calling, or never started, fails.
const KEPT_WORKING_SHARE: f64 = 0.25;

/// Asserts `result` (a `steady` client) failed no call and succeeded at least
/// [`KEPT_WORKING_SHARE`] of its top pace between `from` and `to` (Unix seconds, inside the
/// time the client called); the count.
fn assert_kept_working(what: &str, result: &Value, from: f64, to: f64) -> usize {
    assert!(to > from, "{what}: an empty window ({from} to {to})");
    assert_calls(what, result, to - from, from..=to)
}

/// [`assert_kept_working`] over the whole `steady` stream of `duration` seconds.
fn assert_kept_working_throughout(what: &str, result: &Value, duration: u32) -> usize {
    assert_calls(what, result, f64::from(duration), f64::MIN..=f64::MAX)
}

fn assert_calls(what: &str, result: &Value, window: f64, ends: RangeInclusive<f64>) -> usize {
    assert_eq!(failures(result), &Vec::<Value>::new(), "{what}: {result}");
    let ok = result["ok_ends"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_f64)
        .filter(|end| ends.contains(end))
        .count();
    let minimum = ((window / STEADY_PAUSE_SECS * KEPT_WORKING_SHARE).floor() as usize).max(1);
    assert!(
        ok >= minimum,
        "{what}: {ok} calls succeeded in {window:.1} s, at least {minimum} expected \
         ({KEPT_WORKING_SHARE} of one per {STEADY_PAUSE_SECS} s): {result}"
    );
    ok
}

/// Waits for a spawned `steady` stream's progress line (its first successful call). Reads
/// byte by byte, so the result line stays in the pipe for [`read_client`]; a stream that never
/// succeeds prints its result instead, after its duration, which fails here.
fn wait_first_ok(what: &str, stream: &mut Child) {
    let stdout = stream.stdout.as_mut().unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while stdout.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    let line = String::from_utf8_lossy(&line);
    let progress: Value = serde_json::from_str(&line).unwrap_or_default();
    assert!(
        progress["first_ok"].is_f64(),
        "{what}: no call succeeded before the cut: {line}"
    );
}

fn failures(result: &Value) -> &Vec<Value> {
    result["failures"].as_array().unwrap()
}

/// The first successful call's end after `since` (Unix seconds).
fn first_ok_after(result: &Value, since: f64) -> Option<f64> {
    result["ok_ends"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_f64)
        .find(|end| *end > since)
}

/// The client's deadline in the Redis and peer cases: "fail fast" means far inside it.
const DEADLINE_SECS: u32 = 20;

/// Node A loses Redis for 30 s (the scenario). Calls for agent 7, which holds tunnels
/// on A, never need Redis and must all succeed; calls through A for agent 8 (on B) need the
/// tracker's lookup and must fail fast with UNAVAILABLE naming it; calls through B for agent 7
/// keep working (A's Redis entry outlives the cut by its TTL, and A<->B is intact). Once the
/// link is back, remote routing through A recovers; the time is printed.
#[test]
fn a_node_cut_from_redis_for_30_s_keeps_local_calls_and_fails_remote_ones_fast() {
    let rig = Rig::start("");
    let warm = rig.call("unary", rig.client_args(0, 8, NO_ARGS));
    assert_eq!(
        warm["code"], "OK",
        "remote routing works before the cut: {warm}"
    );

    let steady = |node: usize, agent: i64| {
        rig.spawn_call(
            "steady",
            rig.client_args(node, agent, steady_args(45, DEADLINE_SECS)),
        )
    };
    let mut local = steady(0, 7);
    let mut remote = steady(0, 8);
    let mut through_b = steady(1, 7);
    // Cut once every stream is calling (its first call succeeded), so the window below starts
    // inside them.
    for (what, stream) in [
        ("local via A", &mut local),
        ("remote via A", &mut remote),
        ("via B", &mut through_b),
    ] {
        wait_first_ok(what, stream);
    }
    let cut_at = unix_now();
    rig.net.cut(NODE_A, REDIS).unwrap();
    // Not a synchronisation: the scenario is a 30 s partition under load.
    std::thread::sleep(Duration::from_secs(30));
    rig.net.heal(NODE_A, REDIS).unwrap();
    let healed_at = unix_now();

    let (local, remote, through_b) = (
        read_client(local),
        read_client(remote),
        read_client(through_b),
    );
    // Both streams outlast the cut: started before it, they call for 45 s.
    let local_in_cut = assert_kept_working("local via A", &local, cut_at, healed_at);
    let through_b_in_cut = assert_kept_working("via B", &through_b, cut_at, healed_at);

    let remote_failures = failures(&remote);
    assert!(
        !remote_failures.is_empty(),
        "remote calls never noticed the cut: {remote}"
    );
    let mut slowest: f64 = 0.0;
    for failure in remote_failures {
        let (started, ended) = (failure[0].as_f64().unwrap(), failure[1].as_f64().unwrap());
        let (code, message) = (failure[2].as_str().unwrap(), failure[3].as_str().unwrap());
        assert!(
            ended >= cut_at && started <= healed_at + 10.0,
            "a remote call failed outside the cut (cut {cut_at}, healed {healed_at}): {failure}"
        );
        assert_eq!(code, "UNAVAILABLE", "{failure}");
        assert!(
            message.contains("tracker (Redis) did not answer"),
            "{failure}"
        );
        slowest = slowest.max(ended - started);
    }
    // Fail fast: the tracker's 2 s Redis timeout plus the 1 s grace, far inside the deadline.
    assert!(slowest < 8.0, "a remote call took {slowest:.1} s to fail");
    let recovered = first_ok_after(&remote, healed_at).expect("remote routing recovers");
    let recovery = recovered - healed_at;
    eprintln!(
        "redis cut 30 s: local {} calls ({local_in_cut} during the cut), 0 failed; via B {} calls \
         ({through_b_in_cut} during the cut), 0 failed; remote {} calls, {} failed (UNAVAILABLE, \
         slowest failure {slowest:.2} s); remote routing recovered {recovery:.2} s after the link returned",
        local["calls"],
        through_b["calls"],
        remote["calls"],
        remote_failures.len(),
    );
    assert!(
        recovery < 10.0,
        "remote routing recovered {recovery:.2} s after the link returned"
    );
    assert!(rig.metric(0, "sluice_tracker_redis_errors_total") >= 1.0);
    rig.assert_no_panics();
}

/// Node A loses node B (Redis stays reachable from both). Calls through A for agent 8 (on B),
/// and through B for agent 7 (on A), fail fast with UNAVAILABLE: a kept connection is closed by
/// `peer_unacked_timeout`, a new one gives up after `peer_connect_timeout`, instead of a
/// black-holed SYN or stream holding the call until the client's deadline. Local calls on both
/// nodes keep working; the link's return is noticed by the next call.
#[test]
fn a_node_cut_from_its_peer_fails_remote_calls_fast_and_keeps_local_ones() {
    let rig = Rig::start("  peer_connect_timeout: 2s\n  peer_unacked_timeout: 3s\n");
    for (node, agent) in [(0, 8), (1, 7)] {
        let warm = rig.call("unary", rig.client_args(node, agent, NO_ARGS));
        assert_eq!(
            warm["code"], "OK",
            "remote routing works before the cut: {warm}"
        );
    }
    let echo_ok = "sluice_tunnel_requests_total{method=\"/test.Echo/Unary\",code=\"OK\"}";
    let served_before = [rig.metric(0, echo_ok), rig.metric(1, echo_ok)];
    // The local streams call for 16 s from their start, which is after this.
    let spawned_at = unix_now();
    let local_a = rig.spawn_call(
        "steady",
        rig.client_args(0, 7, steady_args(16, DEADLINE_SECS)),
    );
    let local_b = rig.spawn_call(
        "steady",
        rig.client_args(1, 8, steady_args(16, DEADLINE_SECS)),
    );
    // Cut once both streams are calling (their first calls are served), so the window below
    // starts inside them.
    assert!(
        wait_until(Duration::from_secs(20), || {
            (0..2).all(|node| rig.metric(node, echo_ok) >= served_before[node] + 3.0)
        }),
        "the local streams never got going"
    );
    let cut_at = unix_now();
    rig.net.cut(NODE_A, NODE_B).unwrap();

    let deadline = DEADLINE_SECS.to_string();
    let mut slowest: f64 = 0.0;
    // The first call of each direction meets the connection kept from before the cut, the
    // others a new connection whose SYN goes nowhere.
    for (node, agent) in [(0, 8), (0, 8), (0, 8), (1, 7), (1, 7)] {
        let result = rig.call(
            "unary",
            rig.client_args(node, agent, ["--timeout", deadline.as_str()]),
        );
        assert_eq!(result["code"], "UNAVAILABLE", "{result}");
        let elapsed = result["elapsed"].as_f64().unwrap();
        slowest = slowest.max(elapsed);
        eprintln!("cut from peer: node {node} agent {agent}: {result}");
    }
    let result = rig.call(
        "unary",
        rig.client_args(0, 8, ["--timeout", deadline.as_str()]),
    );
    // Each core keeps its own peer connection: a call may be the first on its core to meet
    // the one kept from before the cut (the dial's own error) or find the node already tried
    // (the routing's summary). Either way the client is told which node is unreachable.
    let details = result["details"].as_str().unwrap_or_default();
    assert!(
        details.contains("node node-b (10.200."),
        "a call after the first names the unreachable node: {result}"
    );
    assert!(slowest < 8.0, "a remote call took {slowest:.1} s to fail");

    let before_heal = unix_now();
    rig.net.heal(NODE_A, NODE_B).unwrap();
    let healed_at = unix_now();
    let mut recovered = None;
    while unix_now() < healed_at + 20.0 {
        let result = rig.call("unary", rig.client_args(0, 8, ["--timeout", "5"]));
        if result["code"] == "OK" {
            recovered = result["ended_at"].as_f64();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let recovery = recovered.expect("remote calls succeed once the link is back") - healed_at;

    let (local_a, local_b) = (read_client(local_a), read_client(local_b));
    // The window: the cut, up to the heal or the streams' end, whichever came first.
    let window_end = before_heal.min(spawned_at + 16.0);
    let in_cut_a = assert_kept_working("local on A", &local_a, cut_at, window_end);
    let in_cut_b = assert_kept_working("local on B", &local_b, cut_at, window_end);
    let connect_failures = rig.metric(0, "sluice_tunnel_peer_connect_failures_total");
    eprintln!(
        "peer cut: local calls {} + {} ({in_cut_a} + {in_cut_b} in {:.1} s of the cut), 0 failed; \
         remote calls UNAVAILABLE within {slowest:.2} s \
         (deadline {DEADLINE_SECS} s); {connect_failures} peer connect failures on A; \
         recovered {recovery:.2} s after the link returned",
        local_a["calls"],
        local_b["calls"],
        window_end - cut_at,
    );
    assert!(connect_failures >= 1.0);
    assert!(
        recovery < 5.0,
        "recovered {recovery:.2} s after the link returned"
    );
    rig.assert_no_panics();
}

/// 200 ms each way and 5% loss on the A<->B link (both directions, through the relay): remote
/// calls are slower by at least a round trip and all succeed within a generous deadline (TCP
/// retransmits what the link loses). Local calls do not cross the link.
#[test]
fn latency_and_loss_between_nodes_slow_remote_calls_without_failing_them() {
    let mut rig = Rig::start("  peer_connect_timeout: 10s\n");
    let baseline = rig.call("steady", rig.client_args(0, 8, steady_args(3, 30)));
    assert_eq!(failures(&baseline), &Vec::<Value>::new(), "{baseline}");
    // The mean below needs calls to compare with: a remote call on the intact link is as fast
    // as a local one, give or take a hop.
    assert_kept_working_throughout("baseline remote", &baseline, 3);
    rig.net
        .slow(NODE_A, NODE_B, Duration::from_millis(200), 0.05)
        .unwrap();
    let local = rig.spawn_call("steady", rig.client_args(0, 7, steady_args(12, 30)));
    let slowed = rig.call("steady", rig.client_args(0, 8, steady_args(12, 30)));
    let local = read_client(local);
    let mean = |result: &Value| {
        let elapsed = result["ok_elapsed"].as_array().unwrap();
        elapsed.iter().filter_map(Value::as_f64).sum::<f64>() / elapsed.len().max(1) as f64
    };
    let max = |result: &Value| {
        result["ok_elapsed"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_f64)
            .fold(0.0, f64::max)
    };
    let calls = slowed["calls"].as_u64().unwrap();
    let failed = failures(&slowed).len() as u64;
    let (forwarded, dropped) = rig.net.relay().unwrap().counts();
    eprintln!(
        "slow link (200 ms each way, 5% loss): {} of {calls} remote calls succeeded; mean {:.3} s \
         (baseline {:.3} s), slowest {:.3} s; relay forwarded {forwarded} packets, dropped {dropped}; \
         local calls {} with mean {:.3} s",
        calls - failed,
        mean(&slowed),
        mean(&baseline),
        max(&slowed),
        local["calls"],
        mean(&local),
    );
    assert_eq!(failures(&slowed), &Vec::<Value>::new(), "{slowed}");
    assert!(calls >= 5, "{slowed}");
    // Each remote call crosses the link at least once there and back (400 ms).
    assert!(mean(&slowed) >= mean(&baseline) + 0.4, "{slowed}");
    assert!(
        dropped > 0,
        "the relay dropped nothing: the loss was not applied"
    );
    // The whole local stream ran while the link was slowed.
    assert_kept_working_throughout("local during the slowdown", &local, 12);
    assert!(
        mean(&local) < 0.4,
        "local calls crossed the slowed link: {local}"
    );
    rig.assert_no_panics();
}
