//! An in-process node on real sockets and raw HTTP/2 peers, shared by this crate's tests.
#![allow(dead_code, clippy::unwrap_used)]

pub mod agents;

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use http::Request;
use prometheus_client::registry::Registry;
use sha2::{Digest, Sha256};
use sluice_config::{AgentTokenConfig, JwtConfig, ListenerConfig, TunnelConfig};
use sluice_grpc::transport::{connect, recv_data, H2Settings};
use sluice_proto::tunnel::v1::{connect_request, ConnectRequest, Descriptor};
use sluice_runtime::{
    ConnectionHandler, Driver, DriverSelection, HandlerFactory, Lifecycle, Placement,
    RunningServer, RuntimeOptions, ServerBuilder, WorkerContext,
};
use sluice_tunnel::metrics::TunnelMetrics;
use sluice_tunnel::node::{AgentEndpoint, ExternalEndpoint, NodeShared, PrivateEndpoint};
use sluice_tunnel::protocol::{CONNECT_PATH, LIST_AGENTS_PATH};
use sluice_tunnel::wire::frame;

pub const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
pub const AGENT_TOKEN: &str = "malformed-test-agent-token";
pub const LIMIT: usize = 4096;

pub struct Node {
    pub running: Option<RunningServer>,
    pub agent: SocketAddr,
    pub external: SocketAddr,
    /// The private endpoint (node-to-node calls, [`private_jwt`]), when started with one.
    pub private: Option<SocketAddr>,
    pub shared: Arc<NodeShared>,
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            running.shutdown();
        }
    }
}

pub fn listener() -> ListenerConfig {
    ListenerConfig {
        address: "127.0.0.1:0".parse().unwrap(),
        backlog: 128,
        max_connections_per_worker: 4096,
        limits: sluice_config::ConnectionLimits {
            header_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            ..Default::default()
        },
        tls: None,
    }
}

pub fn start_node(driver: Driver) -> Node {
    start_node_with(driver, agent_tokens(&[7]), None)
}

/// Token of a numbered test agent: agent 7 has `AGENT_TOKEN`, others a derived one.
pub fn token_of(agent: i64) -> String {
    if agent == 7 {
        AGENT_TOKEN.to_string()
    } else {
        format!("{AGENT_TOKEN}-{agent}")
    }
}

pub fn agent_tokens(agents: &[i64]) -> Vec<AgentTokenConfig> {
    agents
        .iter()
        .map(|agent| AgentTokenConfig {
            id: *agent,
            token_sha256: Sha256::digest(token_of(*agent).as_bytes()).into(),
        })
        .collect()
}

pub fn start_node_with(
    driver: Driver,
    agents: Vec<AgentTokenConfig>,
    tracker: Option<Arc<dyn sluice_locator::AgentLocator>>,
) -> Node {
    start_node_limited(driver, agents, tracker, LIMIT)
}

/// A node whose largest message is `max_message_bytes` (in both directions).
pub fn start_node_limited(
    driver: Driver,
    agents: Vec<AgentTokenConfig>,
    tracker: Option<Arc<dyn sluice_locator::AgentLocator>>,
    max_message_bytes: usize,
) -> Node {
    start_node_buffered(
        driver,
        agents,
        tracker,
        max_message_bytes,
        256 * 1024 * 1024,
    )
}

/// [`start_node_limited`] with a node-wide budget for partly received agent messages.
pub fn start_node_buffered(
    driver: Driver,
    agents: Vec<AgentTokenConfig>,
    tracker: Option<Arc<dyn sluice_locator::AgentLocator>>,
    max_message_bytes: usize,
    max_buffered_bytes: usize,
) -> Node {
    let limits = (max_message_bytes, max_buffered_bytes);
    start_node_full(driver, agents, tracker, limits, false)
}

/// A node that also serves its private endpoint, for callers holding [`private_jwt`].
pub fn start_node_private(driver: Driver, agents: Vec<AgentTokenConfig>) -> Node {
    start_node_full(driver, agents, None, (LIMIT, 256 * 1024 * 1024), true)
}

pub const PRIVATE_SECRET: &[u8] = b"private-0123456789abcdef01234567";

fn private_jwt_config() -> JwtConfig {
    JwtConfig {
        secret: PRIVATE_SECRET.to_vec(),
        secret_file: "unused".into(),
        issuer: "sluice-node".into(),
        audience: "sluice-private".into(),
        leeway: Duration::from_secs(5),
        max_lifetime: Duration::from_secs(60),
    }
}

/// A node-to-node token, as another node sends on the private endpoint.
pub fn private_jwt() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = serde_json::json!({"iss": "sluice-node", "aud": "sluice-private", "iat": now, "exp": now + 5});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(PRIVATE_SECRET),
    )
    .unwrap()
}

fn start_node_full(
    driver: Driver,
    agents: Vec<AgentTokenConfig>,
    tracker: Option<Arc<dyn sluice_locator::AgentLocator>>,
    limits: (usize, usize),
    with_private: bool,
) -> Node {
    start_node_hooked(driver, agents, tracker, limits, with_private, || {})
}

/// A node whose agent endpoint runs `on_agent_worker` on each worker thread it is built on (a
/// memory test marks the threads it measures).
pub fn start_node_marking(
    driver: Driver,
    agents: Vec<AgentTokenConfig>,
    on_agent_worker: fn(),
) -> Node {
    let limits = (LIMIT, 256 * 1024 * 1024);
    start_node_hooked(driver, agents, None, limits, false, on_agent_worker)
}

/// A listener's handlers, with `.1` run on each worker thread they are built on.
struct OnWorker<F>(F, fn());

impl<F: HandlerFactory> HandlerFactory for OnWorker<F> {
    fn create(&self, worker: &WorkerContext) -> Rc<dyn ConnectionHandler> {
        (self.1)();
        self.0.create(worker)
    }
}

fn start_node_hooked(
    driver: Driver,
    agents: Vec<AgentTokenConfig>,
    tracker: Option<Arc<dyn sluice_locator::AgentLocator>>,
    (max_message_bytes, max_buffered_bytes): (usize, usize),
    with_private: bool,
    on_agent_worker: fn(),
) -> Node {
    let config = TunnelConfig {
        node_name: "malformed".into(),
        max_wait: Duration::from_secs(5),
        max_message_bytes,
        max_metadata_entries: 512,
        max_metadata_bytes: 64 * 1024,
        max_buffered_bytes,
        agents,
        agents_from: None,
        jwt: JwtConfig {
            secret: SECRET.to_vec(),
            secret_file: "unused".into(),
            issuer: "gitlab".into(),
            audience: "gitlab-kas".into(),
            leeway: Duration::from_secs(5),
            max_lifetime: Duration::from_secs(60),
        },
        private_jwt: with_private.then(private_jwt_config),
        advertise_address: None,
        peer_tls: None,
        peer_allowlist: Vec::new(),
        peer_timeouts: Default::default(),
        splice_private_hop: true,
        agent_limits: Default::default(),
        access_log: Default::default(),
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
    let private = with_private.then(|| {
        server
            .bind("private", &listener(), Placement::Workers)
            .unwrap()
    });
    let metrics = TunnelMetrics::register(&mut Registry::default(), 2);
    let private_listener = with_private.then(listener);
    let shared = NodeShared::new(
        &config,
        &listener(),
        &listener(),
        private_listener.as_ref(),
        metrics,
        tracker,
    )
    .unwrap();
    if let Some(private) = private {
        server.serve(
            private,
            PrivateEndpoint {
                node: shared.clone(),
            },
        );
    }
    server.serve(
        agent,
        OnWorker(
            AgentEndpoint {
                node: shared.clone(),
            },
            on_agent_worker,
        ),
    );
    server.serve(
        external,
        ExternalEndpoint {
            node: shared.clone(),
        },
    );
    let (agent, external) = (server.local_addr(agent), server.local_addr(external));
    let private = private.map(|private| server.local_addr(private));
    Node {
        running: Some(server.start().unwrap()),
        agent,
        external,
        private,
        shared,
    }
}

pub fn jwt() -> String {
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

pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .unwrap()
        .block_on(future)
}

/// A hand-driven agent tunnel: the node -> agent body and the agent -> node send stream.
pub async fn fake_tunnel(
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

pub fn descriptor() -> Bytes {
    frame(&ConnectRequest {
        msg: Some(connect_request::Msg::Descriptor(Descriptor::default())),
    })
}

/// A client's gRPC request head for `path`, to agent 7 with a valid JWT.
pub fn call_head(path: &str) -> Request<()> {
    Request::post(format!("http://node{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {}", jwt()))
        .header("sluice-agent-id", "7")
        .body(())
        .unwrap()
}

/// One client call with raw body chunks; returns (grpc-status, grpc-message).
pub async fn raw_call(node: SocketAddr, path: &str, body: Vec<Bytes>) -> (String, String) {
    let connection = connect(node, None, &H2Settings::default()).await.unwrap();
    let mut ready = connection.send_request.ready().await.unwrap();
    let request = call_head(path);
    let (response, mut send) = ready.send_request(request, false).unwrap();
    for chunk in body {
        let _ = send.send_data(chunk, false);
    }
    let _ = send.send_data(Bytes::new(), true);
    grpc_outcome(response).await
}

/// The call's outcome as (grpc-status, grpc-message): from the headers of a trailers-only
/// answer, or from the trailers after the body was read to its end.
pub async fn grpc_outcome(response: h2::client::ResponseFuture) -> (String, String) {
    let response = monoio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("the node answers in time")
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

pub fn still_serves(node: &Node) {
    let (status, _) = block_on(raw_call(node.external, LIST_AGENTS_PATH, vec![]));
    assert_eq!(status, "0", "the node keeps serving");
}
