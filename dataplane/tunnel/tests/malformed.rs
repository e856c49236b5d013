//! Malformed gRPC frames, oversize messages and undecodable protobuf from a client or from an
//! agent end that call with an error status; the node keeps serving. The node runs in-process on
//! real sockets; the misbehaving peers are raw HTTP/2 clients.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use http::Request;
use prometheus_client::registry::Registry;
use sha2::{Digest, Sha256};
use sluice_config::{AgentTokenConfig, JwtConfig, ListenerConfig, TunnelConfig};
use sluice_grpc::transport::{connect, recv_data, H2Settings};
use sluice_grpc::{encode_message, message_header};
use sluice_proto::tunnel::v1::{connect_request, ConnectRequest, Descriptor};
use sluice_runtime::{
    Driver, DriverSelection, Lifecycle, Placement, RunningServer, RuntimeOptions, ServerBuilder,
};
use sluice_tunnel::metrics::TunnelMetrics;
use sluice_tunnel::node::{
    AgentEndpoint, ExternalEndpoint, NodeShared, CONNECT_PATH, LIST_AGENTS_PATH,
};
use sluice_tunnel::wire::frame;

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
const AGENT_TOKEN: &str = "malformed-test-agent-token";
const LIMIT: usize = 4096;

struct Node {
    running: Option<RunningServer>,
    agent: SocketAddr,
    external: SocketAddr,
    shared: Arc<NodeShared>,
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            running.shutdown();
        }
    }
}

fn listener() -> ListenerConfig {
    ListenerConfig {
        address: "127.0.0.1:0".parse().unwrap(),
        backlog: 128,
        max_connections_per_worker: 128,
        header_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(5),
        tls: None,
    }
}

fn start_node(driver: Driver) -> Node {
    let config = TunnelConfig {
        node_name: "malformed".into(),
        max_wait: Duration::from_secs(5),
        max_message_bytes: LIMIT,
        agents: vec![AgentTokenConfig {
            id: 7,
            token_sha256: Sha256::digest(AGENT_TOKEN.as_bytes()).into(),
        }],
        jwt: JwtConfig {
            secret: SECRET.to_vec(),
            secret_file: "unused".into(),
            issuer: "gitlab".into(),
            audience: "gitlab-kas".into(),
            leeway: Duration::from_secs(5),
            max_lifetime: Duration::from_secs(60),
        },
    };
    let options = RuntimeOptions {
        workers: 2,
        driver: DriverSelection {
            driver,
            fallback_reason: None,
        },
        uring_entries: 256,
        drain_timeout: Duration::from_secs(1),
    };
    let mut server = ServerBuilder::new(options, Arc::new(Lifecycle::new()));
    let agent = server
        .bind("agent", &listener(), Placement::Workers)
        .unwrap();
    let external = server
        .bind("external", &listener(), Placement::Workers)
        .unwrap();
    let metrics = TunnelMetrics::register(&mut Registry::default(), 2);
    let shared = NodeShared::new(&config, &listener(), &listener(), metrics).unwrap();
    server.serve(
        agent,
        AgentEndpoint {
            node: shared.clone(),
        },
    );
    server.serve(
        external,
        ExternalEndpoint {
            node: shared.clone(),
        },
    );
    let (agent, external) = (server.local_addr(agent), server.local_addr(external));
    Node {
        running: Some(server.start().unwrap()),
        agent,
        external,
        shared,
    }
}

fn jwt() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims =
        serde_json::json!({"iss": "gitlab", "aud": "gitlab-kas", "iat": now, "exp": now + 30});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(SECRET),
    )
    .unwrap()
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .unwrap()
        .block_on(future)
}

/// A hand-driven agent tunnel: the node -> agent body and the agent -> node send stream.
async fn fake_tunnel(
    node: SocketAddr,
    first_message: Bytes,
) -> (RecvStream, SendStream<Bytes>, Option<String>) {
    let connection = connect(node, None, &H2Settings::default()).await.unwrap();
    let mut ready = connection.send_request.ready().await.unwrap();
    let request = Request::post(format!("http://node{CONNECT_PATH}"))
        .header("content-type", "application/grpc")
        .header("authorization", format!("Bearer {AGENT_TOKEN}"))
        .body(())
        .unwrap();
    let (response, mut send) = ready.send_request(request, false).unwrap();
    send.send_data(first_message, false).unwrap();
    let response = response.await.unwrap();
    let status = response
        .headers()
        .get("grpc-status")
        .map(|value| value.to_str().unwrap().to_string());
    (response.into_body(), send, status)
}

fn descriptor() -> Bytes {
    frame(&ConnectRequest {
        msg: Some(connect_request::Msg::Descriptor(Descriptor::default())),
    })
}

/// One client call with raw body chunks; returns (grpc-status, grpc-message).
async fn raw_call(node: SocketAddr, path: &str, body: Vec<Bytes>) -> (String, String) {
    let connection = connect(node, None, &H2Settings::default()).await.unwrap();
    let mut ready = connection.send_request.ready().await.unwrap();
    let request = Request::post(format!("http://node{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {}", jwt()))
        .header("sluice-agent-id", "7")
        .body(())
        .unwrap();
    let (response, mut send) = ready.send_request(request, false).unwrap();
    for chunk in body {
        let _ = send.send_data(chunk, false);
    }
    let _ = send.send_data(Bytes::new(), true);
    let response = monoio::time::timeout(Duration::from_secs(10), response)
        .await
        .unwrap()
        .unwrap();
    let headers = response.headers().clone();
    let mut body = response.into_body();
    let trailers = if headers.contains_key("grpc-status") {
        headers
    } else {
        while let Some(Ok(_)) = recv_data(&mut body).await {}
        std::future::poll_fn(|cx| body.poll_trailers(cx))
            .await
            .unwrap()
            .unwrap_or_default()
    };
    let text = |name: &str| {
        trailers
            .get(name)
            .map(|value| value.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    (text("grpc-status"), text("grpc-message"))
}

fn still_serves(node: &Node) {
    let (status, _) = block_on(raw_call(node.external, LIST_AGENTS_PATH, vec![]));
    assert_eq!(status, "0", "the node keeps serving");
}

#[test]
fn malformed_client_frames_get_error_statuses() {
    for driver in [Driver::IoUring, Driver::Legacy] {
        let node = start_node(driver);
        let cases: Vec<(&str, Vec<Bytes>, &str)> = vec![
            (
                "bad compressed flag",
                vec![Bytes::from_static(&[7, 0, 0, 0, 1, 42])],
                "13",
            ),
            (
                "oversize message",
                vec![Bytes::copy_from_slice(&message_header(false, LIMIT + 1))],
                "8",
            ),
            (
                "truncated message",
                vec![
                    Bytes::copy_from_slice(&message_header(false, 100)),
                    Bytes::from_static(b"only ten b"),
                ],
                "13",
            ),
        ];
        for (name, body, expected) in cases {
            let status = block_on(async {
                // A tunnel must be there: the node checks the body while relaying it.
                let (_agent_recv, _agent_send, refused) =
                    fake_tunnel(node.agent, descriptor()).await;
                assert_eq!(refused, None);
                raw_call(node.external, "/test.Echo/Unary", body).await
            });
            assert_eq!(status.0, expected, "{driver} {name}: {status:?}");
            assert!(
                status.1.starts_with("request: "),
                "{driver} {name}: {status:?}"
            );
        }
        assert!(node.shared.metrics.protocol_errors.sum() >= 3);
        still_serves(&node);
    }
}

#[test]
fn malformed_agent_messages_end_the_call_and_are_refused_at_connect() {
    for driver in [Driver::IoUring, Driver::Legacy] {
        let node = start_node(driver);
        // Garbage instead of a Descriptor: refused with INVALID_ARGUMENT.
        let (_, _, refused) = block_on(fake_tunnel(
            node.agent,
            encode_message(false, &[0xff, 0xff, 0x01]),
        ));
        assert_eq!(refused.as_deref(), Some("3"), "{driver}");

        // Undecodable protobuf, then an oversize frame, in the middle of a call.
        for (name, garbage) in [
            (
                "garbage protobuf",
                encode_message(false, &[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]),
            ),
            (
                "oversize frame",
                Bytes::copy_from_slice(&message_header(false, LIMIT * 4)),
            ),
        ] {
            let (status, message) = block_on(async {
                let (mut agent_recv, mut agent_send, _) =
                    fake_tunnel(node.agent, descriptor()).await;
                let call = monoio::spawn(raw_call(
                    node.external,
                    "/test.Echo/Unary",
                    vec![encode_message(false, b"hi")],
                ));
                // Wait for the RequestInfo, then answer with garbage.
                let first = recv_data(&mut agent_recv).await;
                assert!(
                    matches!(first, Some(Ok(_))),
                    "{driver} {name}: the call reached the fake agent"
                );
                agent_send.send_data(garbage, false).unwrap();
                call.await
            });
            assert_eq!(status, "13", "{driver} {name}: {message}");
            assert!(
                message.contains("agent 7 broke the tunnel protocol"),
                "{driver} {name}: {message}"
            );
        }
        still_serves(&node);
    }
}
