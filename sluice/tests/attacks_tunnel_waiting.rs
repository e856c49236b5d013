//! A greedy client against the real `sluice run` binary: calls waiting for one agent's tunnel are
//! capped per agent (`tunnel.max_waiting_calls_per_agent`), so a client cannot queue unbounded
//! work on an agent id; calls over the cap are refused at once, on the node the client called or
//! on the node holding the agent, and other agents are untouched.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;
/// The tunnel crate's harness, for its gRPC outcome reader.
#[path = "../../dataplane/tunnel/tests/common/mod.rs"]
mod tunnel_harness;

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;

use bytes::Bytes;
use common::{
    client_jwt, metric, node_yaml, run_node, start_agent, start_agent_on, start_node_on,
    wait_for_idle_tunnels, Secrets,
};
use sluice_grpc::encode_message;
use sluice_grpc::transport::{connect, ClientConnection, H2Settings};
use test_support::{on_both_drivers, GrpcBackend, RedisServer, SluiceProcess};

on_both_drivers!(
    calls_waiting_for_one_agent_are_capped_and_the_rest_refused_at_once,
    a_refusal_of_the_one_node_holding_the_agent_reaches_the_client_at_once,
    a_race_every_node_refused_reaches_the_client_at_once
);

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .unwrap()
        .block_on(future)
}

/// When a call's request message goes out.
#[derive(Clone, Copy)]
enum Body {
    /// With its head.
    Now,
    /// Never: the head alone, so a node that refuses the call has taken nothing of it.
    Held,
}

/// One call of `method` for `agent` on an open connection; returns (grpc-status, grpc-message).
async fn call_on(
    send_request: h2::client::SendRequest<Bytes>,
    token: &str,
    agent: i64,
    method: &str,
    body: Body,
) -> (String, String) {
    let mut ready = send_request.ready().await.unwrap();
    let request = common::echo_call_head(token, agent, method);
    let (response, mut send) = ready.send_request(request, false).unwrap();
    if let Body::Now = body {
        let _ = send.send_data(encode_message(false, b"hello"), true);
    }
    let outcome = tunnel_harness::grpc_outcome(response).await;
    drop(send);
    outcome
}

/// Outcomes of calls, in the order they ended.
type Ended = Rc<RefCell<Vec<(String, String)>>>;

/// `calls` unary calls for `agent` started at once on `connection`, each pushing its outcome
/// to `ended` when it ends.
fn start_calls(
    connection: &ClientConnection,
    token: &str,
    agent: i64,
    calls: usize,
    body: Body,
    ended: &Ended,
) -> Vec<monoio::task::JoinHandle<()>> {
    (0..calls)
        .map(|_| {
            let (send_request, token, ended) = (
                connection.send_request.clone(),
                token.to_string(),
                ended.clone(),
            );
            monoio::spawn(async move {
                let outcome = call_on(send_request, &token, agent, "Unary", body).await;
                ended.borrow_mut().push(outcome);
            })
        })
        .collect()
}

/// `calls` unary calls for `agent` at once on one connection; their outcomes in the order they
/// ended.
async fn calls_at_once(
    node: SocketAddr,
    token: &str,
    agent: i64,
    calls: usize,
) -> Vec<(String, String)> {
    let connection = connect(node, None, &H2Settings::default()).await.unwrap();
    let ended = Ended::default();
    for task in start_calls(&connection, token, agent, calls, Body::Now, &ended) {
        task.await;
    }
    ended.take()
}

/// Polls `node`'s gauge `name` between sleeps of this runtime (which runs the test's call
/// tasks meanwhile) until it reads `value`; whether it did within 10 s.
async fn gauge_reaches(node: &SluiceProcess, name: &str, value: f64) -> bool {
    for _ in 0..100 {
        monoio::time::sleep(std::time::Duration::from_millis(100)).await;
        if metric(node, name) == Some(value) {
            return true;
        }
    }
    false
}

/// With `tunnel.max_waiting_calls_per_agent: 4` and agent 7 never connected, one client's 10
/// calls for agent 7 at once: 4 wait (and end DEADLINE_EXCEEDED at `max_wait`), 6 are refused
/// RESOURCE_EXHAUSTED naming the limit, each before any of the waits ended, and counted. While
/// the 4 wait, agent 8 is called as usual; once they ended, agent 7 has room for waits again.
fn calls_waiting_for_one_agent_are_capped_and_the_rest_refused_at_once(driver: &str) {
    let secrets = Secrets::on(driver);
    let backend = GrpcBackend::start().unwrap();
    let limits = "  max_waiting_calls_per_agent: 4\n";
    let node = start_node_on(&secrets, "5s", 1024 * 1024, None, driver, limits, "", None);
    let _agent = start_agent(&secrets, 8, &node, backend.address, 4, None);
    wait_for_idle_tunnels(&node, 2.0);
    let external = node.address("external");
    let token = client_jwt(&secrets, 60);
    block_on(async {
        let greedy = monoio::spawn({
            let token = token.clone();
            async move { calls_at_once(external, &token, 7, 10).await }
        });
        // Agent 8 is served while agent 7's queue is full.
        let polite = calls_at_once(external, &token, 8, 3).await;
        for (status, message) in &polite {
            assert_eq!(status, "0", "agent 8: {message}");
        }
        let ended = greedy.await;
        let codes: Vec<&str> = ended.iter().map(|(status, _)| status.as_str()).collect();
        assert_eq!(
            codes,
            ["8", "8", "8", "8", "8", "8", "4", "4", "4", "4"],
            "refusals come at once, before the waits end: {ended:?}"
        );
        for (status, message) in &ended[..6] {
            assert!(
                message.contains("4 calls already wait for a tunnel of agent 7")
                    && message.contains("tunnel.max_waiting_calls_per_agent is 4"),
                "{status}: {message}"
            );
        }
        // The waits ended: room for as many again, not more.
        let again = calls_at_once(external, &token, 7, 5).await;
        let refused = again.iter().filter(|(status, _)| status == "8").count();
        assert_eq!(refused, 1, "{again:?}");
    });
    let refused = metric(&node, "sluice_tunnel_waiting_refused_total").unwrap_or(0.0);
    assert_eq!(refused, 7.0);
}

/// Node 0 and `holders` nodes over one Redis. Agent 8 holds two tunnels on each holder, each
/// carrying a call that hangs; the holders allow one waiting call per agent
/// (`tunnel.max_waiting_calls_per_agent: 1`), node 0 the default. A call sent to node 0 waits on
/// every holder (sent directly to one, raced over two); two more, their request messages held
/// back, are refused by every holder, and node 0 passes each refusal on at once
/// (RESOURCE_EXHAUSTED naming the limit, before the wait ended) instead of waiting for a tunnel
/// only those nodes hold.
fn refusals_of_the_nodes_holding_the_agent_reach_the_client_at_once(driver: &str, holders: usize) {
    let redis = RedisServer::start().unwrap();
    let redis_yaml = format!(
        "redis:\n  url: '{}'\n  key_prefix: waiting\n  unregister_delay: 500ms\n",
        redis.unix_url()
    );
    let secrets = Secrets::on(driver);
    let private_secret = secrets.private_secret();
    let nodes: Vec<_> = (0..=holders)
        .map(|index| {
            let cap = if index == 0 { "" } else { "  max_waiting_calls_per_agent: 1\n" };
            let tunnel_extra = format!(
                "  node_name: node-{index}\n{cap}  private_jwt: {{secret_file: '{}', issuer: sluice-node, audience: sluice-private}}\n",
                private_secret.display()
            );
            let yaml = node_yaml(&secrets, "5s", 1024 * 1024, None, driver, &tunnel_extra, &redis_yaml, None);
            run_node(&yaml)
        })
        .collect();
    let holding: Vec<&SluiceProcess> = nodes[1..].iter().collect();
    let backend = GrpcBackend::start().unwrap();
    let _agent = start_agent_on(&secrets, 8, &holding, backend.address, 2, None);
    for node in &holding {
        wait_for_idle_tunnels(node, 2.0);
    }
    let caller = nodes[0].address("external");
    let token = client_jwt(&secrets, 60);
    block_on(async {
        // Node 0 finds the agent through Redis once it is registered there.
        let mut reachable = false;
        for _ in 0..100 {
            if calls_at_once(caller, &token, 8, 1).await[0].0 == "0" {
                reachable = true;
                break;
            }
            monoio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert!(reachable, "node 0 never reached agent 8");
        let connection = connect(caller, None, &H2Settings::default()).await.unwrap();
        // Opened and left unanswered (the backend holds each up to 30 s): not awaited. One at a
        // time, each once it holds a tunnel: raced at once, two could queue on one holder, whose
        // one waiting place would refuse the second.
        let mut hanging = Vec::new();
        for sent in 1..=2 * holders {
            let mut ready = connection.send_request.clone().ready().await.unwrap();
            let request = common::echo_call_head(&token, 8, "Hang");
            let (response, mut send) = ready.send_request(request, false).unwrap();
            let _ = send.send_data(encode_message(false, b"hello"), true);
            hanging.push((response, send));
            let idle_left = (2 * holders - sent) as f64;
            let mut settled = false;
            for _ in 0..100 {
                monoio::time::sleep(std::time::Duration::from_millis(100)).await;
                let idle: Option<f64> = holding
                    .iter()
                    .map(|node| metric(node, "sluice_tunnel_idle_tunnels"))
                    .sum();
                if idle == Some(idle_left) {
                    settled = true;
                    break;
                }
            }
            assert!(
                settled,
                "hanging call {sent} holds one of agent 8's tunnels"
            );
        }
        let ended = Ended::default();
        let mut calls = start_calls(&connection, &token, 8, 1, Body::Held, &ended);
        for node in &holding {
            let waiting = gauge_reaches(node, "sluice_tunnel_waiting_calls", 1.0).await;
            assert!(
                waiting,
                "the first call waits on every node holding the agent"
            );
        }
        calls.extend(start_calls(&connection, &token, 8, 2, Body::Held, &ended));
        for call in calls {
            call.await;
        }
        let ended = ended.take();
        let codes: Vec<&str> = ended.iter().map(|(status, _)| status.as_str()).collect();
        assert_eq!(codes, ["8", "8", "4"], "{ended:?}");
        for (_, message) in &ended[..2] {
            assert!(
                message.contains("tunnel.max_waiting_calls_per_agent is 1"),
                "{message}"
            );
        }
        drop((hanging, connection));
    });
    for node in &holding {
        assert_eq!(
            metric(node, "sluice_tunnel_waiting_refused_total"),
            Some(2.0)
        );
    }
    assert_eq!(
        metric(&nodes[0], "sluice_tunnel_waiting_refused_total"),
        Some(0.0)
    );
}

/// One node holds the agent: node 0 sends each call to it directly.
fn a_refusal_of_the_one_node_holding_the_agent_reaches_the_client_at_once(driver: &str) {
    refusals_of_the_nodes_holding_the_agent_reach_the_client_at_once(driver, 1);
}

/// Two nodes hold the agent: node 0 races each call over both, and both refuse.
fn a_race_every_node_refused_reaches_the_client_at_once(driver: &str) {
    refusals_of_the_nodes_holding_the_agent_reach_the_client_at_once(driver, 2);
}
