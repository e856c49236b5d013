//! Attacks on the real `sluice run` binary's tunnel: a hostile agent (holding a valid agent
//! token) answers a call with 30,000 metadata keys, which used to panic inside the call's task
//! and kill a worker thread while `/readyz` stayed 200. The node must refuse it with
//! RESOURCE_EXHAUSTED, count it, stay ready, keep its memory bounded and keep serving others.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;
/// The tunnel crate's harness, for its gRPC outcome reader (as node_tracker.rs borrows it).
#[path = "../../dataplane/tunnel/tests/common/mod.rs"]
mod tunnel_harness;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::{client_jwt, metric, rss_kib, start_node_on, Secrets};
use http::Request;
use sluice_grpc::encode_message;
use sluice_grpc::transport::{connect, recv_data, H2Settings};
use sluice_proto::tunnel::v1::{
    connect_request, ConnectRequest, Descriptor, Header, MetadataEntry,
};
use sluice_tunnel::wire::frame;
use test_support::http_get;

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .unwrap()
        .block_on(future)
}

/// One client call; returns (grpc-status, grpc-message).
async fn call(node: SocketAddr, token: &str, path: &str) -> (String, String) {
    call_with_metadata(node, token, path, 0).await
}

/// One client call carrying `extra` metadata entries of its own.
async fn call_with_metadata(
    node: SocketAddr,
    token: &str,
    path: &str,
    extra: usize,
) -> (String, String) {
    let connection = connect(node, None, &H2Settings::default()).await.unwrap();
    let mut ready = connection.send_request.ready().await.unwrap();
    let mut request = Request::post(format!("http://node{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .header("sluice-agent-id", "7");
    for index in 0..extra {
        request = request.header(format!("x-m{index}"), "v");
    }
    let request = request.body(()).unwrap();
    let (response, mut send) = ready.send_request(request, false).unwrap();
    let _ = send.send_data(encode_message(false, b""), true);
    tunnel_harness::grpc_outcome(response).await
}

/// A hostile agent's tunnel: Connect with agent 7's token, a Descriptor, then wait for a call.
async fn hostile_tunnel(
    node: SocketAddr,
    token: &str,
) -> (
    h2::RecvStream,
    h2::SendStream<Bytes>,
    sluice_grpc::transport::ClientConnection,
) {
    let connection = connect(node, None, &H2Settings::default()).await.unwrap();
    let mut ready = connection.send_request.clone().ready().await.unwrap();
    let request = Request::post(format!(
        "http://node{}",
        sluice_tunnel::protocol::CONNECT_PATH
    ))
    .header("content-type", "application/grpc")
    .header("authorization", format!("Bearer {token}"))
    .body(())
    .unwrap();
    let (response, mut send) = ready.send_request(request, false).unwrap();
    let descriptor = frame(&ConnectRequest {
        msg: Some(connect_request::Msg::Descriptor(Descriptor::default())),
    });
    send.send_data(descriptor, false).unwrap();
    let response = response.await.unwrap();
    (response.into_body(), send, connection)
}

#[test]
fn a_hostile_agents_metadata_bomb_is_refused_and_the_node_stays_whole() {
    for driver in ["uring", "legacy"] {
        let secrets = Secrets::new();
        let node = start_node_on(&secrets, "5s", 32 * 1024 * 1024, None, driver, "", "", None);
        let external = node.address("external");
        let agent = node.address("agent");
        let token = client_jwt(&secrets, 30);
        let agent_token = secrets.token(7).to_string();
        let before = rss_kib(node.pid());
        for round in 0..4 {
            let (status, message) = block_on(async {
                let (mut recv, mut send, _connection) = hostile_tunnel(agent, &agent_token).await;
                let token = token.clone();
                let client =
                    monoio::spawn(async move { call(external, &token, "/test.Echo/Unary").await });
                let first = monoio::time::timeout(Duration::from_secs(10), recv_data(&mut recv))
                    .await
                    .expect("the call reached the hostile agent");
                assert!(matches!(first, Some(Ok(_))));
                let metadata = (0..30_000)
                    .map(|index| MetadataEntry {
                        key: format!("x-k{index}"),
                        values: vec![Bytes::from_static(b"v")],
                    })
                    .collect();
                let header = frame(&ConnectRequest {
                    msg: Some(connect_request::Msg::Header(Header { metadata })),
                });
                send.send_data(header, false).unwrap();
                client.await
            });
            assert_eq!(status, "8", "{driver} round {round}: {message}");
            assert!(
                message.contains("limit of 512 entries"),
                "{driver} round {round}: {message}"
            );
        }
        assert_eq!(
            metric(
                &node,
                "sluice_tunnel_metadata_refused_total{from=\"agent\"}"
            ),
            Some(4.0),
            "{driver}"
        );
        let ready = http_get(node.address("admin"), "/readyz").unwrap();
        assert_eq!(ready.status, 200, "{driver}: still ready");
        // A well-behaved client is served on every worker (fresh connections spread by
        // SO_REUSEPORT): a dead worker would leave calls unanswered.
        for _ in 0..8 {
            let (status, message) = block_on(call(
                external,
                &token,
                sluice_tunnel::protocol::LIST_AGENTS_PATH,
            ));
            assert_eq!(status, "0", "{driver}: {message}");
        }
        let grown = rss_kib(node.pid()).saturating_sub(before);
        assert!(
            grown < 64 * 1024,
            "{driver}: node RSS grew by {grown} KiB under the attack"
        );
    }
}

/// `tunnel.max_metadata_entries` is the limit the node holds clients to: with 16, a call with 20
/// metadata entries of its own is refused RESOURCE_EXHAUSTED naming the limit and counted, and
/// one with 4 passes the check (it then waits for agent 7, who never comes).
#[test]
fn the_configured_metadata_limit_is_the_one_applied() {
    let secrets = Secrets::new();
    let node = start_node_on(
        &secrets,
        "1s",
        32 * 1024 * 1024,
        None,
        "auto",
        "  max_metadata_entries: 16\n",
        "",
        None,
    );
    let external = node.address("external");
    let token = client_jwt(&secrets, 30);
    let (status, message) = block_on(call_with_metadata(external, &token, "/test.Echo/Unary", 20));
    assert_eq!(status, "8", "{message}");
    assert!(message.contains("limit of 16 entries"), "{message}");
    assert_eq!(
        metric(
            &node,
            "sluice_tunnel_metadata_refused_total{from=\"client\"}"
        ),
        Some(1.0)
    );
    let (status, message) = block_on(call_with_metadata(external, &token, "/test.Echo/Unary", 4));
    assert_eq!(
        status, "4",
        "passed the check, then waited for the agent: {message}"
    );
}
