//! Agent processes (`AgentTask` on a runtime of its own) and the echo backend they forward
//! to, for the tests that run a real agent against an in-process node.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use sluice_config::{AgentConfig, Endpoint, PoolConfig, ReconnectConfig};
use sluice_runtime::{
    Driver, DriverSelection, Lifecycle, Placement, RunningServer, RuntimeOptions, ServerBuilder,
};
use sluice_tunnel::agent::{AgentMetrics, AgentTask};
use sluice_tunnel::echo::EchoBackend;

use sluice_grpc::encode_message;
use sluice_grpc::transport::{connect, H2Settings};

use super::{call_head, grpc_outcome, listener, Node, AGENT_TOKEN, LIMIT};

/// One worker on `driver`.
pub fn options(driver: Driver) -> RuntimeOptions {
    RuntimeOptions {
        workers: 1,
        driver: DriverSelection {
            driver,
            fallback_reason: None,
        },
        uring_entries: 256,
        drain_timeout: Duration::from_secs(1),
    }
}

/// A plain-HTTP/2 endpoint at `address`.
pub fn endpoint(address: SocketAddr) -> Endpoint {
    Endpoint {
        url: format!("http://{address}"),
        tls: false,
        host: address.ip().to_string(),
        port: address.port(),
    }
}

/// An echo backend for agents to forward to.
pub fn start_backend(driver: Driver) -> (RunningServer, SocketAddr) {
    let mut server = ServerBuilder::new(options(driver), Arc::new(Lifecycle::new()));
    let id = server
        .bind("backend", &listener(), Placement::Workers)
        .unwrap();
    server.serve(id, EchoBackend);
    let address = server.local_addr(id);
    (server.start().unwrap(), address)
}

/// An agent process of agent 7 with this tunnel pool.
pub fn start_agent(
    driver: Driver,
    node: SocketAddr,
    backend: SocketAddr,
    pool: PoolConfig,
) -> RunningServer {
    let config = AgentConfig {
        token: AGENT_TOKEN.into(),
        token_file: "unused".into(),
        nodes: vec![endpoint(node)],
        ca_file: None,
        forward_to: endpoint(backend),
        forward_ca_file: None,
        max_message_bytes: LIMIT,
        pool,
        reconnect: ReconnectConfig {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
        },
        kubernetes_api: None,
    };
    let metrics = AgentMetrics::register(&mut Registry::default());
    let mut server = ServerBuilder::new(options(driver), Arc::new(Lifecycle::new()));
    server.spawn_background(AgentTask::new(config, metrics).unwrap());
    server.start().unwrap()
}

/// Waits until the node holds at least `count` idle tunnels.
pub fn wait_idle(node: &Node, count: usize) {
    for _ in 0..200 {
        if node.shared.registry.idle_count() >= count {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!(
        "the node holds {} idle tunnels, not {count}",
        node.shared.registry.idle_count()
    );
}

/// A unary call whose body follows its headers `hold` later: the node starts it on a tunnel
/// before the request is whole (as a client's call that arrives in two TCP segments), and the
/// tunnel stays taken for that long. Returns the gRPC status and message.
pub async fn split_call(node: SocketAddr, hold: Duration) -> (String, String) {
    let connection = connect(node, None, &H2Settings::default()).await.unwrap();
    let mut ready = connection.send_request.ready().await.unwrap();
    let (response, mut send) = ready
        .send_request(call_head("/test.Echo/Unary"), false)
        .unwrap();
    monoio::time::sleep(hold).await;
    let _ = send.send_data(encode_message(false, b"split"), true);
    grpc_outcome(response).await
}
