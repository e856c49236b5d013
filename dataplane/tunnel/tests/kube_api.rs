//! The agent's Kubernetes API forwarder with real parts: the apiserver simulator (TLS, bearer
//! token), a node serving its private endpoint, a real agent with `kubernetes_api`, another
//! without, and a caller that opens `MakeRequest` on the node's private endpoint with a node
//! token, as the gateway's node does. Run on both monoio drivers.
#![allow(clippy::unwrap_used)]

mod common;
mod kube_caller;

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use common::agents::{endpoint, options};
use common::*;
use http::{HeaderMap, Method};
use kube_caller::*;
use prometheus_client::registry::Registry;
use sluice_config::{
    AgentConfig, KubeCredential, KubernetesApiConfig, PoolConfig, ReconnectConfig,
};
use sluice_grpc::{encode_message, Code, FrameDecoder};
use sluice_kube_tunnel::{
    encode_request_data, encode_request_end, encode_request_head, encode_request_upgrade_data,
    AssertionSigner, Identity, ResponseMessage,
};
use sluice_runtime::{Driver, Lifecycle, RunningServer, ServerBuilder};
use sluice_tunnel::agent::{AgentMetrics, AgentTask};
use test_support::{apiserver_options, ApiServer, Caller, Certificates, Ed25519Keys};

const KUBE_AGENT: i64 = 7;
const PLAIN_AGENT: i64 = 9;
const AGENT_SA_TOKEN: &str = "agent-service-account-token";

struct Keys {
    trusted: Ed25519Keys,
    other: Ed25519Keys,
}

struct Rig {
    _dir: tempfile::TempDir,
    /// Taken (stopped) by the last case.
    apiserver: Option<ApiServer>,
    node: Node,
    _agents: Vec<RunningServer>,
    kube_metrics: AgentMetrics,
    signer: AssertionSigner,
    other_signer: AssertionSigner,
}

fn agent_config(agent: i64, node: SocketAddr, kube: Option<KubernetesApiConfig>) -> AgentConfig {
    AgentConfig {
        token: token_of(agent),
        token_file: "unused".into(),
        nodes: vec![endpoint(node)],
        ca_file: None,
        // Nothing listens here: a Kubernetes API call must never come this way.
        forward_to: endpoint(SocketAddr::from(([127, 0, 0, 1], 9))),
        forward_ca_file: None,
        max_message_bytes: 2 * 1024 * 1024,
        pool: PoolConfig {
            min_idle: 2,
            max: 64,
            grow_by: 4,
            idle_timeout: Duration::from_secs(60),
        },
        reconnect: ReconnectConfig {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
        },
        kubernetes_api: kube,
    }
}

fn start_rig(driver: Driver, certs: &Certificates, keys: &Keys) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{AGENT_SA_TOKEN}\n")).unwrap();
    let key_file = dir.path().join("gateway.pub");
    std::fs::write(&key_file, &keys.trusted.public_pem).unwrap();
    let apiserver = ApiServer::start_with(
        apiserver_options(certs).caller_token(AGENT_SA_TOKEN, "sluice-agent"),
    )
    .unwrap();
    let node = start_node_private(driver, agent_tokens(&[KUBE_AGENT, PLAIN_AGENT]));
    let address = apiserver.address();
    let kube = KubernetesApiConfig {
        agent_id: KUBE_AGENT as u64,
        url: format!("https://localhost:{}", address.port()),
        host: "localhost".into(),
        port: address.port(),
        ca_file: certs.ca_cert.clone(),
        credential: KubeCredential::TokenFile(token_file),
        gateway_keys: vec![key_file],
        // Two: the watch test below fills it.
        max_in_flight: 2,
    };
    let kube_metrics = AgentMetrics::register(&mut Registry::default());
    let agents = [
        (KUBE_AGENT, Some(kube), kube_metrics.clone()),
        (
            PLAIN_AGENT,
            None,
            AgentMetrics::register(&mut Registry::default()),
        ),
    ]
    .into_iter()
    .map(|(agent, kube, metrics)| {
        let mut server = ServerBuilder::new(options(driver), Arc::new(Lifecycle::new()));
        let task = AgentTask::new(agent_config(agent, node.agent, kube), metrics).unwrap();
        server.spawn_background(task);
        server.start().unwrap()
    })
    .collect();
    wait_for_tunnels(&node, 4);
    Rig {
        _dir: dir,
        apiserver: Some(apiserver),
        node,
        _agents: agents,
        kube_metrics,
        signer: AssertionSigner::from_pem(&keys.trusted.private_pem).unwrap(),
        other_signer: AssertionSigner::from_pem(&keys.other.private_pem).unwrap(),
    }
}

fn wait_for_tunnels(node: &Node, count: usize) {
    for _ in 0..400 {
        if node.shared.registry.idle_count() >= count {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("the agents did not connect");
}

fn alice() -> Identity {
    Identity {
        user: "alice".into(),
        uid: Some("uid-1".into()),
        groups: vec!["dev".into(), "system:authenticated".into()],
        extra: Default::default(),
    }
}

/// The caller's own headers, which must never reach the apiserver.
fn hostile_headers(host: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("authorization", "Bearer caller-secret".parse().unwrap());
    headers.insert("impersonate-user", "admin".parse().unwrap());
    headers.insert("impersonate-group", "system:masters".parse().unwrap());
    headers.insert("x-remote-user", "admin".parse().unwrap());
    headers.insert("host", host.parse().unwrap());
    headers.insert("accept", "application/json".parse().unwrap());
    headers
}

impl Rig {
    fn api(&self) -> &ApiServer {
        self.apiserver.as_ref().unwrap()
    }

    fn assertion(&self, agent: i64, method: &str, path: &str, age: Duration) -> String {
        let now = SystemTime::now() - age;
        self.signer
            .sign(&alice(), agent as u64, method, path, now)
            .unwrap()
    }

    /// One `MakeRequest` on the node's private endpoint to `agent`.
    fn call(
        &self,
        agent: i64,
        method: Method,
        path: &str,
        assertion: &str,
        body: &[u8],
    ) -> Outcome {
        self.call_with(
            agent,
            method,
            path,
            assertion,
            body,
            hostile_headers("localhost"),
        )
    }

    fn call_with(
        &self,
        agent: i64,
        method: Method,
        path: &str,
        assertion: &str,
        body: &[u8],
        headers: HeaderMap,
    ) -> Outcome {
        let private = self.node.private.unwrap();
        let mut messages = vec![encode_request_head(&method, path, &headers, assertion)];
        if !body.is_empty() {
            messages.push(encode_request_data(Bytes::copy_from_slice(body)));
        }
        messages.push(encode_request_end());
        block_on(make_request(private, agent, messages))
    }
}

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

/// GET, LIST and a create (a streamed body) go through as alice, with the agent's token, and
/// nothing of the caller's identity headers reaches the apiserver.
fn requests_succeed_as_the_vouched_for_user(rig: &Rig) {
    let create = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"through-agent"},"data":{"k":"v"}}"#;
    let assertion = rig.assertion(KUBE_AGENT, "POST", CONFIGMAPS, Duration::ZERO);
    let created = rig.call(KUBE_AGENT, Method::POST, CONFIGMAPS, &assertion, create);
    assert_eq!(created.grpc_status, "0", "{created:?}");
    assert_eq!(created.http_status, Some(201), "{created:?}");
    let item = format!("{CONFIGMAPS}/through-agent");
    let assertion = rig.assertion(KUBE_AGENT, "GET", &item, Duration::ZERO);
    let got = rig.call(KUBE_AGENT, Method::GET, &item, &assertion, b"");
    assert_eq!(
        (got.grpc_status.as_str(), got.http_status),
        ("0", Some(200)),
        "{got:?}"
    );
    assert!(got.ended, "the answer ends with End");
    assert!(String::from_utf8_lossy(&got.body).contains("through-agent"));
    let assertion = rig.assertion(KUBE_AGENT, "GET", CONFIGMAPS, Duration::ZERO);
    let listed = rig.call(KUBE_AGENT, Method::GET, CONFIGMAPS, &assertion, b"");
    assert_eq!(listed.http_status, Some(200), "{listed:?}");
    assert!(String::from_utf8_lossy(&listed.body).contains("\"ConfigMapList\""));
    let seen = rig.api().requests();
    assert_eq!(seen.len(), 3, "{seen:?}");
    for request in &seen {
        assert_eq!(request.caller, Some(Caller::Token("sluice-agent".into())));
        assert_eq!(
            request.authorization.as_deref(),
            Some(format!("Bearer {AGENT_SA_TOKEN}").as_str())
        );
        assert_eq!(request.impersonate_user.as_deref(), Some("alice"));
        assert_eq!(request.impersonate_uid.as_deref(), Some("uid-1"));
        assert_eq!(
            request.impersonate_groups,
            vec!["dev", "system:authenticated"]
        );
        assert!(request.x_remote.is_empty(), "{request:?}");
    }
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[2].uri, CONFIGMAPS);
}

/// Every refused assertion is PERMISSION_DENIED, counted by reason, and the apiserver sees
/// nothing of it.
fn bad_assertions_are_refused_before_the_apiserver(rig: &Rig) {
    rig.api().clear_requests();
    let path = CONFIGMAPS;
    let old = Duration::from_secs(120);
    let replayed = rig.assertion(KUBE_AGENT, "GET", path, Duration::ZERO);
    let first = rig.call(KUBE_AGENT, Method::GET, path, &replayed, b"");
    assert_eq!(first.grpc_status, "0", "{first:?}");
    rig.api().clear_requests();
    let other_key = rig
        .other_signer
        .sign(&alice(), KUBE_AGENT as u64, "GET", path, SystemTime::now())
        .unwrap();
    let cases = [
        ("expired", rig.assertion(KUBE_AGENT, "GET", path, old), path),
        ("replayed", replayed, path),
        ("bad_signature", other_key, path),
        (
            "wrong_agent",
            rig.assertion(PLAIN_AGENT, "GET", path, Duration::ZERO),
            path,
        ),
        (
            "wrong_request",
            rig.assertion(
                KUBE_AGENT,
                "GET",
                "/api/v1/namespaces/default/secrets",
                Duration::ZERO,
            ),
            path,
        ),
        ("malformed", "not-a-jwt".to_string(), path),
    ];
    for (reason, assertion, path) in cases {
        let before = rig.kube_metrics.kube.refusals(reason);
        let refused = rig.call(KUBE_AGENT, Method::GET, path, &assertion, b"");
        assert_eq!(
            refused.grpc_status,
            code(Code::PermissionDenied),
            "{reason}: {refused:?}"
        );
        assert!(
            refused.grpc_message.contains(reason),
            "{reason}: {refused:?}"
        );
        assert_eq!(
            rig.kube_metrics.kube.refusals(reason),
            before + 1,
            "{reason}"
        );
        assert!(
            rig.api().requests().is_empty(),
            "{reason}: the apiserver saw it"
        );
    }
}

/// A Host header or an absolute URI naming another listener never makes the agent connect
/// there; the absolute URI is refused, the Host header is dropped.
fn the_request_never_chooses_where_the_agent_connects(rig: &Rig) {
    let bait = TcpListener::bind("127.0.0.1:0").unwrap();
    bait.set_nonblocking(true).unwrap();
    let bait_address = bait.local_addr().unwrap();
    rig.api().clear_requests();
    let absolute = format!("https://{bait_address}{CONFIGMAPS}");
    let assertion = rig.assertion(KUBE_AGENT, "GET", &absolute, Duration::ZERO);
    let refused = rig.call(KUBE_AGENT, Method::GET, &absolute, &assertion, b"");
    assert_eq!(
        refused.grpc_status,
        code(Code::InvalidArgument),
        "{refused:?}"
    );
    let assertion = rig.assertion(KUBE_AGENT, "GET", CONFIGMAPS, Duration::ZERO);
    let headers = hostile_headers(&bait_address.to_string());
    let hosted = rig.call_with(
        KUBE_AGENT,
        Method::GET,
        CONFIGMAPS,
        &assertion,
        b"",
        headers,
    );
    assert_eq!(hosted.http_status, Some(200), "{hosted:?}");
    assert_eq!(
        rig.api().requests().len(),
        1,
        "the configured apiserver answered"
    );
    let accepted = bait.accept();
    assert!(
        matches!(&accepted, Err(error) if error.kind() == std::io::ErrorKind::WouldBlock),
        "the bait listener saw a connection: {accepted:?}"
    );
}

fn get(rig: &Rig, path: &str) -> Vec<Bytes> {
    let assertion = rig.assertion(KUBE_AGENT, "GET", path, Duration::ZERO);
    let head = encode_request_head(&Method::GET, path, &HeaderMap::new(), &assertion);
    vec![head, encode_request_end()]
}

async fn until_in_flight(rig: &Rig, count: i64) {
    for _ in 0..200 {
        if rig.kube_metrics.kube.in_flight_now() == count {
            return;
        }
        monoio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{count} calls never were in flight");
}

/// A watch streams each event as it happens (its call stays open), and a call beyond
/// `max_in_flight` (watches count) is refused RESOURCE_EXHAUSTED.
async fn watches_stream_and_count_against_the_bound(rig: &Rig) {
    let private = rig.node.private.unwrap();
    let watch = format!("{CONFIGMAPS}?watch=true");
    let mut first = Streaming::open(private, KUBE_AGENT, get(rig, &watch)).await;
    let body = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"watched-one"}}"#;
    let assertion = rig.assertion(KUBE_AGENT, "POST", CONFIGMAPS, Duration::ZERO);
    let create = vec![
        encode_request_head(&Method::POST, CONFIGMAPS, &HeaderMap::new(), &assertion),
        encode_request_data(Bytes::from_static(body)),
        encode_request_end(),
    ];
    let created = make_request(private, KUBE_AGENT, create).await;
    assert_eq!(created.http_status, Some(201), "{created:?}");
    first.read_until("watched-one").await;
    until_in_flight(rig, 1).await;
    let _second = Streaming::open(private, KUBE_AGENT, get(rig, &watch)).await;
    until_in_flight(rig, 2).await;
    let refused = make_request(private, KUBE_AGENT, get(rig, CONFIGMAPS)).await;
    assert_eq!(
        refused.grpc_status,
        code(Code::ResourceExhausted),
        "{refused:?}"
    );
    assert!(refused.grpc_message.contains("at most 2"), "{refused:?}");
    // The gateway's own review still goes through: authentication has capacity of its own.
    let path = "/apis/authentication.k8s.io/v1/tokenreviews";
    let assertion = rig
        .signer
        .sign_review(KUBE_AGENT as u64, path, SystemTime::now())
        .unwrap();
    let review =
        br#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":"x"}}"#;
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    let reviewed = make_request(
        private,
        KUBE_AGENT,
        vec![
            encode_request_head(&Method::POST, path, &headers, &assertion),
            encode_request_data(Bytes::from_static(review)),
            encode_request_end(),
        ],
    )
    .await;
    assert_eq!(reviewed.grpc_status, code(Code::Ok), "{reviewed:?}");
    assert!(
        matches!(reviewed.http_status, Some(200 | 201)),
        "{reviewed:?}"
    );
}

/// exec: after the apiserver's 101 the bytes go both ways as UpgradeData (the simulator echoes
/// them), on the agent's own HTTP/1.1 connection; End closes it and the call ends OK.
async fn exec_streams_both_ways_after_the_switch(rig: &Rig) {
    rig.api().clear_requests();
    let path = "/api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true";
    let assertion = rig.assertion(KUBE_AGENT, "POST", path, Duration::ZERO);
    let mut headers = hostile_headers("localhost");
    headers.insert("connection", "Upgrade".parse().unwrap());
    headers.insert("upgrade", "SPDY/3.1".parse().unwrap());
    let head = encode_request_head(&Method::POST, path, &headers, &assertion);
    let (_connection, response, mut send) = send_call(
        rig.node.private.unwrap(),
        KUBE_AGENT,
        vec![head, encode_request_end()],
        false,
    )
    .await;
    let response = monoio::time::timeout(Duration::from_secs(10), response)
        .await
        .unwrap()
        .unwrap();
    let mut body = response.into_body();
    let mut frames = FrameDecoder::new(4 * 1024 * 1024);
    match next_response(&mut body, &mut frames).await {
        ResponseMessage::Head(head) => assert_eq!(head.status.as_u16(), 101),
        other => panic!("expected the 101 head, got {other:?}"),
    }
    let said = b"hello through the tunnel";
    let data = encode_request_upgrade_data(Bytes::from_static(said));
    send.send_data(encode_message(false, &data), false).unwrap();
    let mut echoed = Vec::new();
    while echoed.len() < said.len() {
        match next_response(&mut body, &mut frames).await {
            ResponseMessage::UpgradeData(data) => echoed.extend_from_slice(&data),
            other => panic!("expected upgrade data, got {other:?}"),
        }
    }
    assert_eq!(echoed, said);
    send.send_data(encode_message(false, &encode_request_end()), true)
        .unwrap();
    assert!(matches!(
        next_response(&mut body, &mut frames).await,
        ResponseMessage::End
    ));
    let trailers = std::future::poll_fn(|cx| body.poll_trailers(cx))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(trailers["grpc-status"], "0");
    let seen = rig.api().requests();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].version, http::Version::HTTP_11);
    assert_eq!(seen[0].impersonate_user.as_deref(), Some("alice"));
    assert_eq!(
        seen[0].authorization.as_deref(),
        Some(format!("Bearer {AGENT_SA_TOKEN}").as_str())
    );
}

/// With the apiserver gone the call is UNAVAILABLE, with the node's fixed text (the agent keeps
/// its apiserver's address to its log), and counted.
fn an_unreachable_apiserver_is_unavailable(mut rig: Rig) {
    let address = rig.api().address();
    drop(rig.apiserver.take());
    // The watches of the case before (their callers gone, but idle, so still relayed) end with
    // the apiserver: their failures must not count here.
    block_on(until_in_flight(&rig, 0));
    let before = rig.kube_metrics.kube.apiserver_errors();
    let assertion = rig.assertion(KUBE_AGENT, "GET", CONFIGMAPS, Duration::ZERO);
    let failed = rig.call(KUBE_AGENT, Method::GET, CONFIGMAPS, &assertion, b"");
    assert_eq!(failed.grpc_status, code(Code::Unavailable), "{failed:?}");
    assert!(
        !failed.grpc_message.contains(&address.port().to_string()),
        "{failed:?}"
    );
    assert_eq!(rig.kube_metrics.kube.apiserver_errors(), before + 1);
}

fn an_agent_without_the_section_answers_unimplemented(rig: &Rig) {
    rig.api().clear_requests();
    let assertion = rig.assertion(PLAIN_AGENT, "GET", CONFIGMAPS, Duration::ZERO);
    let refused = rig.call(PLAIN_AGENT, Method::GET, CONFIGMAPS, &assertion, b"");
    assert_eq!(
        refused.grpc_status,
        code(Code::Unimplemented),
        "{refused:?}"
    );
    assert!(
        refused.grpc_message.contains("kubernetes_api"),
        "{refused:?}"
    );
    assert!(rig.api().requests().is_empty());
}

#[test]
fn the_agent_forwards_kubernetes_api_calls_only_as_the_gateway_vouched() {
    let certs = Certificates::generate(&[]).unwrap();
    let keys = Keys {
        trusted: Ed25519Keys::generate().unwrap(),
        other: Ed25519Keys::generate().unwrap(),
    };
    for driver in [Driver::IoUring, Driver::Legacy] {
        let rig = start_rig(driver, &certs, &keys);
        requests_succeed_as_the_vouched_for_user(&rig);
        bad_assertions_are_refused_before_the_apiserver(&rig);
        the_request_never_chooses_where_the_agent_connects(&rig);
        an_agent_without_the_section_answers_unimplemented(&rig);
        block_on(exec_streams_both_ways_after_the_switch(&rig));
        assert_eq!(
            rig.kube_metrics.kube.requests(Code::Ok),
            6,
            "{driver:?}: requests answered OK"
        );
        block_on(watches_stream_and_count_against_the_bound(&rig));
        assert_eq!(rig.kube_metrics.kube.requests(Code::ResourceExhausted), 1);
        an_unreachable_apiserver_is_unavailable(rig);
    }
}
