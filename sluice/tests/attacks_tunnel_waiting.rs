//! A greedy client against the real `sluice run` binary: calls waiting for one agent's tunnel are
//! capped per agent (`tunnel.max_waiting_calls_per_agent`), so a client cannot queue unbounded
//! work on an agent id; calls over the cap are refused at once, and other agents are untouched.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;
/// The tunnel crate's harness, for its gRPC outcome reader.
#[path = "../../dataplane/tunnel/tests/common/mod.rs"]
mod tunnel_harness;

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;

use bytes::Bytes;
use common::{client_jwt, metric, start_agent, start_node_on, wait_for_idle_tunnels, Secrets};
use http::Request;
use sluice_grpc::encode_message;
use sluice_grpc::transport::{connect, H2Settings};
use test_support::GrpcBackend;

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .unwrap()
        .block_on(future)
}

/// One unary call for `agent` on an open connection; returns (grpc-status, grpc-message).
async fn call_on(
    send_request: h2::client::SendRequest<Bytes>,
    token: &str,
    agent: i64,
) -> (String, String) {
    let mut ready = send_request.ready().await.unwrap();
    let request = Request::post("http://node/test.Echo/Unary")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .header("sluice-agent-id", agent.to_string())
        .body(())
        .unwrap();
    let (response, mut send) = ready.send_request(request, false).unwrap();
    let _ = send.send_data(encode_message(false, b"hello"), true);
    tunnel_harness::grpc_outcome(response).await
}

/// `calls` calls for `agent` at once on one connection; their outcomes in the order they ended.
async fn calls_at_once(
    node: SocketAddr,
    token: &str,
    agent: i64,
    calls: usize,
) -> Vec<(String, String)> {
    let connection = connect(node, None, &H2Settings::default()).await.unwrap();
    let ended = Rc::new(RefCell::new(Vec::new()));
    let tasks: Vec<_> = (0..calls)
        .map(|_| {
            let (send_request, token, ended) = (
                connection.send_request.clone(),
                token.to_string(),
                ended.clone(),
            );
            monoio::spawn(async move {
                let outcome = call_on(send_request, &token, agent).await;
                ended.borrow_mut().push(outcome);
            })
        })
        .collect();
    for task in tasks {
        task.await;
    }
    ended.take()
}

/// With `tunnel.max_waiting_calls_per_agent: 4` and agent 7 never connected, one client's 10
/// calls for agent 7 at once: 4 wait (and end DEADLINE_EXCEEDED at `max_wait`), 6 are refused
/// RESOURCE_EXHAUSTED naming the limit, each before any of the waits ended, and counted. While
/// the 4 wait, agent 8 is called as usual; once they ended, agent 7 has room for waits again.
#[test]
fn calls_waiting_for_one_agent_are_capped_and_the_rest_refused_at_once() {
    let secrets = Secrets::on("auto");
    let backend = GrpcBackend::start().unwrap();
    let limits = "  max_waiting_calls_per_agent: 4\n";
    let node = start_node_on(&secrets, "2s", 1024 * 1024, None, "auto", limits, "", None);
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
