//! A node's status reports under its write budget, real processes: a control plane whose node
//! budget is one write per second (burst 2), a node fed its agents by it, and eight real agents
//! connecting at once, so the node has eight `Agent.status.nodes.node-1` entries to write and
//! room for two. Each report round stops at the first 429 and waits for the next check, so the
//! control plane refuses about one patch per round; a node that sent every patch into the 429
//! each round (before issue 36's fix) was refused 12 times here, and a node holding 100,000
//! agents after a restart would have sent 100,000 refused patches every 2 s.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use test_support::{wait_until, ControlPlane, GrpcBackend};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const AGENTS: i64 = 8;
/// How often the node compares its view with what it reported (`daemon/status.rs` INTERVAL).
const REPORT_INTERVAL: Duration = Duration::from_secs(2);
const REFUSALS: &str =
    "sluice_controlplane_write_refusals_total{role=\"node\",reason=\"identity_budget\"}";

fn refusals(cp: &ControlPlane) -> f64 {
    let (code, text) = cp.curl("GET", "/metrics", None);
    assert_eq!(code, 200, "{text}");
    text.lines()
        .find_map(|line| line.strip_prefix(REFUSALS)?.trim().parse().ok())
        .unwrap_or(0.0)
}

fn connected(cp: &ControlPlane) -> usize {
    let output = cp.kubectl(
        &[
            "get",
            "agents",
            "-o",
            "jsonpath={range .items[*]}{.status.nodes.node-1.connected}{\"\\n\"}{end}",
        ],
        None,
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| *line == "true")
        .count()
}

#[test]
fn a_throttled_node_waits_for_its_budget_instead_of_sending_every_report_into_a_429() {
    let cp = ControlPlane::start(BIN, &["--write-budget", "node=1/2,1048576/4194304"]).unwrap();
    let mut secrets = common::Secrets::new();
    let ids: Vec<i64> = (1..=AGENTS).map(|n| 100 + n).collect();
    let mut items = Vec::new();
    for id in &ids {
        secrets.add_agent(*id);
        let digest = hex::encode(Sha256::digest(secrets.token(*id).as_bytes()));
        items.push(serde_json::json!({
            "apiVersion": "tunnel.sluice.dev/v1alpha1", "kind": "Agent",
            "metadata": {"name": format!("agent-{id}")}, "spec": {"id": id, "tokenSha256": digest}}));
    }
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    let created = cp.kubectl(&["create", "-f", "-"], Some(&list.to_string()));
    assert!(created.status.success(), "{created:?}");

    // Rounds are counted from the node's start: agents refused before its first sync connect
    // a moment later, and a round may meet a 429 while only some of them are held.
    let started = Instant::now();
    let node = common::run_fed_node(&cp, &secrets, 1);
    let backend = GrpcBackend::start().expect("grpc backend");
    // The node learns the Agent objects from its watch; agents dialling before that are
    // refused and retry within a second.
    // Started together, so that several arrive between two checks however slowly each one
    // starts: one at a time, a loaded machine could bring them within the budget's refill.
    let _agents: Vec<_> = std::thread::scope(|scope| {
        let starting: Vec<_> = ids
            .iter()
            .map(|id| {
                let (secrets, node) = (&secrets, &node);
                scope.spawn(move || {
                    common::start_agent(secrets, *id, node, backend.address, 2, None)
                })
            })
            .collect();
        starting
            .into_iter()
            .map(|agent| agent.join().unwrap())
            .collect()
    });
    common::wait_for_idle_tunnels(&node, (2 * AGENTS) as f64);
    assert!(
        wait_until(Duration::from_secs(40), || connected(&cp)
            == AGENTS as usize),
        "the node never reported every agent ({} of {AGENTS}); node stderr:\n{}",
        connected(&cp),
        node.stderr()
    );
    let took = started.elapsed();
    let refused = refusals(&cp);
    // At most one refusal per report round since the node started (its first check is at once,
    // hence the one more). Sending on past a 429 is refused for every patch the budget has no
    // room for: 6, 5, 4, ... here.
    let rounds = (took.as_secs_f64() / REPORT_INTERVAL.as_secs_f64()).ceil() + 1.0;
    println!(
        "{AGENTS} agents reported {took:?} after the node started: {refused} refusals, at most \
         {rounds} rounds"
    );
    assert!(
        refused >= 1.0,
        "the budget never refused the node: the test does not throttle it"
    );
    assert!(
        refused <= rounds,
        "{refused} refusals in {rounds} rounds: the node sent on past a 429"
    );
}
