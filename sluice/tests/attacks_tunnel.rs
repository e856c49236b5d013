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
use common::{
    client_jwt, metric, rss_kib, start_agent, start_node_on, wait_for_idle_tunnels, Secrets,
};
use http::Request;
use sluice_grpc::encode_message;
use sluice_grpc::transport::{connect, recv_data, H2Settings};
use sluice_proto::agents::v1::{ListConnectedAgentsRequest, ListConnectedAgentsResponse};
use sluice_proto::prost::Message as _;
use sluice_proto::tunnel::v1::{
    connect_request, ConnectRequest, Descriptor, Header, MetadataEntry,
};
use sluice_tunnel::wire::frame;
use test_support::{
    http_get, on_both_drivers, wait_until, GrpcBackend, RedisServer, SluiceProcess,
};

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

/// The head of a tunnel Connect with the agent `token`; announce headers are the caller's.
fn connect_head(token: &str) -> http::request::Builder {
    Request::post(format!(
        "http://node{}",
        sluice_tunnel::protocol::CONNECT_PATH
    ))
    .header("content-type", "application/grpc")
    .header("authorization", format!("Bearer {token}"))
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
    let request = connect_head(token).body(()).unwrap();
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
fn the_configured_metadata_limit_is_the_one_applied(driver: &str) {
    let secrets = Secrets::new();
    let node = start_node_on(
        &secrets,
        "1s",
        32 * 1024 * 1024,
        None,
        driver,
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

on_both_drivers!(the_configured_metadata_limit_is_the_one_applied);

// --- Issue 32, finding 6: one agent's share of the node and of Redis -------------------------

/// The ListConnectedAgents of one page, and the encoded size of the answer.
struct Page {
    status: String,
    message: String,
    answer: ListConnectedAgentsResponse,
    bytes: usize,
}

/// One ListConnectedAgents call asking for `page_size` entries after `page_token`.
async fn list_page(node: SocketAddr, token: &str, page_size: u32, page_token: &str) -> Page {
    let connection = connect(node, None, &H2Settings::default()).await.unwrap();
    let mut ready = connection.send_request.ready().await.unwrap();
    let request = common::list_agents_request(token);
    let (response, mut send) = ready.send_request(request, false).unwrap();
    let asked = ListConnectedAgentsRequest {
        page_size,
        page_token: page_token.to_string(),
    };
    send.send_data(encode_message(false, &asked.encode_to_vec()), true)
        .unwrap();
    let response = monoio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("the node answers in time")
        .unwrap();
    let headers = response.headers().clone();
    let mut body = response.into_body();
    let mut data = Vec::new();
    while let Some(Ok(chunk)) = recv_data(&mut body).await {
        data.extend_from_slice(&chunk);
    }
    let trailers = if headers.contains_key("grpc-status") {
        headers
    } else {
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
    let answer = match data.get(5..) {
        Some(message) => ListConnectedAgentsResponse::decode(message).unwrap(),
        None => ListConnectedAgentsResponse::default(),
    };
    Page {
        status: text("grpc-status"),
        message: text("grpc-message"),
        answer,
        bytes: data.len(),
    }
}

/// What an agent announces on one Connect.
struct Announce<'a> {
    connection_id: &'a str,
    version: &'a str,
    services: Vec<String>,
}

/// One Connect of agent `token` on `connection`. Accepted, its streams are kept in `held` (the
/// tunnel stays open) and `None` is returned; refused, its (grpc-status, grpc-message).
async fn open_tunnel(
    connection: &sluice_grpc::transport::ClientConnection,
    token: &str,
    announce: &Announce<'_>,
    held: &mut Vec<(h2::RecvStream, h2::SendStream<Bytes>)>,
) -> Option<(String, String)> {
    let mut ready = connection.send_request.clone().ready().await.unwrap();
    let request = connect_head(token)
        .header(
            sluice_tunnel::protocol::CONNECTION_ID_HEADER,
            announce.connection_id,
        )
        .header(
            sluice_tunnel::protocol::AGENT_VERSION_HEADER,
            announce.version,
        )
        .body(())
        .unwrap();
    let (response, mut send) = ready.send_request(request, false).unwrap();
    let descriptor = frame(&ConnectRequest {
        msg: Some(connect_request::Msg::Descriptor(Descriptor {
            services: announce.services.clone(),
            agent_version: announce.version.to_string(),
            reusable: true,
        })),
    });
    let _ = send.send_data(descriptor, false);
    let response = monoio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("the node answers a Connect in time")
        .unwrap();
    let text = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|value| value.to_str().unwrap().to_string())
    };
    match text("grpc-status") {
        Some(status) => Some((status, text("grpc-message").unwrap_or_default())),
        None => {
            held.push((response.into_body(), send));
            None
        }
    }
}

/// A client call for `agent`; returns (grpc-status, grpc-message).
async fn call_agent(node: SocketAddr, token: &str, agent: i64) -> (String, String) {
    let connection = connect(node, None, &H2Settings::default()).await.unwrap();
    let mut ready = connection.send_request.ready().await.unwrap();
    let request = common::echo_call_head(token, agent, "Unary");
    let (response, mut send) = ready.send_request(request, false).unwrap();
    let _ = send.send_data(encode_message(false, b"hello"), true);
    tunnel_harness::grpc_outcome(response).await
}

fn redis_number(redis: &RedisServer, args: &[&str]) -> u64 {
    let reply = redis.command(args).unwrap();
    reply.trim_start_matches(':').trim().parse().unwrap()
}

fn redis_used_memory(redis: &RedisServer) -> u64 {
    let info = redis.command(&["INFO", "memory"]).unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|value| value.trim().parse().ok())
        .unwrap()
}

/// Connection attempts of the hostile agent, each with its own connection id and version.
const ATTEMPTS: usize = 3_000;
/// `tunnel.max_connections_per_agent`'s default: the bound this test holds the node and Redis to.
const CONNECTIONS_PER_AGENT: usize = 64;

// Finding 6 of issue 32: 3,000 connection records of one agent cost +80 MiB of node RSS, +48 MiB
// in Redis and a 46 MB ListConnectedAgents answer. Every case runs on both monoio drivers.
on_both_drivers!(a_hostile_agent_cannot_grow_the_nodes_or_redis_records_past_its_share);

/// A hostile agent (valid token) opens 3,000 Connects, each with a connection id and version of
/// its own choosing (versions at the 128-byte limit), every 100th with an oversized version,
/// over several HTTP/2 connections it keeps open. Bounds asserted: exactly 64 of its connection
/// ids accepted (the default `tunnel.max_connections_per_agent`), the rest RESOURCE_EXHAUSTED
/// naming the limit (or INVALID_ARGUMENT for the oversized versions) and counted; at most 64
/// fields in its Redis hash and Redis `used_memory` up by less than 1 MiB; node RSS up by less
/// than 32 MiB; ListConnectedAgents pages of at most the asked size that together list every
/// connection once. A well-behaved agent is still called, and the node stays ready.
fn a_hostile_agent_cannot_grow_the_nodes_or_redis_records_past_its_share(driver: &str) {
    let redis = RedisServer::start().unwrap();
    let secrets = Secrets::on(driver);
    let backend = GrpcBackend::start().unwrap();
    let extra = format!(
        "redis:\n  url: '{}'\n  key_prefix: flood\n  ttl: 30s\n  refresh: 20s\n  unregister_delay: 500ms\n",
        redis.url()
    );
    let node = start_node_with_private_jwt(&secrets, "5s", driver, &extra);
    let _agent = start_agent(&secrets, 8, &node, backend.address, 20, None);
    wait_for_idle_tunnels(&node, 2.0);
    let external = node.address("external");
    let agent_endpoint = node.address("agent");
    let token = client_jwt(&secrets, 60);
    let hostile = secrets.token(7).to_string();
    let rss_before = rss_kib(node.pid());
    let redis_before = redis_used_memory(&redis);

    let (accepted, refusals) = block_on(async {
        let mut held = Vec::new();
        let mut connections = Vec::new();
        let mut refusals = Vec::new();
        for attempt in 0..ATTEMPTS {
            if attempt % 500 == 0 {
                connections.push(
                    connect(agent_endpoint, None, &H2Settings::default())
                        .await
                        .unwrap(),
                );
            }
            let connection_id = (1_000_000 + attempt).to_string();
            let version = if attempt % 100 == 99 {
                "x".repeat(129)
            } else {
                format!("{attempt:0>128}")
            };
            let announce = Announce {
                connection_id: &connection_id,
                version: &version,
                services: vec!["test.Echo".into()],
            };
            let connection = connections.last().unwrap();
            if let Some(refused) = open_tunnel(connection, &hostile, &announce, &mut held).await {
                refusals.push((attempt, refused));
            }
        }
        let accepted = held.len();
        // The hostile agent keeps everything it won open while the node is checked.
        std::mem::forget(held);
        std::mem::forget(connections);
        (accepted, refusals)
    });
    let oversized = ATTEMPTS / 100;
    assert_eq!(
        accepted, CONNECTIONS_PER_AGENT,
        "{driver}: accepted tunnels"
    );
    for (attempt, (status, message)) in &refusals {
        if attempt % 100 == 99 {
            assert_eq!(status, "3", "{driver} attempt {attempt}: {message}");
            assert!(message.contains("max_agent_version_bytes"), "{message}");
        } else {
            assert_eq!(status, "8", "{driver} attempt {attempt}: {message}");
            assert!(message.contains("max_connections_per_agent"), "{message}");
        }
    }
    assert_eq!(refusals.len(), ATTEMPTS - CONNECTIONS_PER_AGENT, "{driver}");
    let refused = |reason: &str| {
        metric(
            &node,
            &format!("sluice_tunnel_agent_refused_total{{reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(
        refused("connections"),
        Some((ATTEMPTS - CONNECTIONS_PER_AGENT - oversized) as f64),
        "{driver}"
    );
    assert_eq!(refused("descriptor"), Some(oversized as f64), "{driver}");

    // Redis: the tracker writes asynchronously; once agent 7's 64 records are there, no more
    // come (every refusal happened before anything was sent to the tracker).
    let hash = "flood:tunnel:conns:{7}";
    assert!(
        wait_until(Duration::from_secs(10), || redis_number(
            &redis,
            &["HLEN", hash]
        ) >= CONNECTIONS_PER_AGENT
            as u64),
        "{driver}: agent 7's records reach redis"
    );
    assert_eq!(
        redis_number(&redis, &["HLEN", hash]),
        CONNECTIONS_PER_AGENT as u64,
        "{driver}: fields in agent 7's redis hash"
    );
    let redis_grown = redis_used_memory(&redis).saturating_sub(redis_before);
    assert!(
        redis_grown < 1024 * 1024,
        "{driver}: redis used_memory grew by {redis_grown} bytes"
    );

    // ListConnectedAgents: bounded pages that together list every connection once.
    let all = CONNECTIONS_PER_AGENT + 1; // and agent 8's one connection
    let first = block_on(list_page(external, &token, 0, ""));
    assert_eq!(first.status, "0", "{driver}: {}", first.message);
    assert_eq!(first.answer.agents.len(), all, "{driver}: one default page");
    assert!(first.answer.next_page_token.is_empty(), "{driver}");
    assert!(first.bytes < 64 * 1024, "{driver}: {} bytes", first.bytes);
    let mut listed = Vec::new();
    let mut page_token = String::new();
    let mut pages = 0;
    loop {
        let page = block_on(list_page(external, &token, 10, &page_token));
        assert_eq!(page.status, "0", "{driver}: {}", page.message);
        assert!(page.answer.agents.len() <= 10, "{driver}: a page of 10");
        listed.extend(
            page.answer
                .agents
                .iter()
                .map(|agent| (agent.agent_id, agent.connection_id)),
        );
        pages += 1;
        if page.answer.next_page_token.is_empty() {
            break;
        }
        page_token = page.answer.next_page_token;
        assert!(pages < 20, "{driver}: the pages end");
    }
    assert_eq!(pages, all.div_ceil(10), "{driver}");
    let mut unique = listed.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), all, "{driver}: each connection once");
    assert_eq!(listed, unique, "{driver}: in order");
    let foreign = block_on(list_page(external, &token, 10, "not-a-token"));
    assert_eq!(foreign.status, "3", "{driver}: {}", foreign.message);

    // Everyone else is still served.
    let (status, message) = block_on(call_agent(external, &token, 8));
    assert_eq!(status, "0", "{driver}: the well-behaved agent: {message}");
    let ready = http_get(node.address("admin"), "/readyz").unwrap();
    assert_eq!(ready.status, 200, "{driver}: still ready");
    let rss_grown = rss_kib(node.pid()).saturating_sub(rss_before);
    assert!(
        rss_grown < 32 * 1024,
        "{driver}: node RSS grew by {rss_grown} KiB"
    );
}

on_both_drivers!(an_agents_tunnels_and_descriptors_are_bounded);

/// With `tunnel.max_tunnels_per_agent: 40`, a malformed connection id, too many services, a
/// bad service name and a Descriptor larger than the limits allow are INVALID_ARGUMENT; then the hostile agent's 100 Connects on one
/// connection id get 40 tunnels and 60 RESOURCE_EXHAUSTED naming the limit; each is counted by
/// reason. Tunnels
/// it closes are given back (it may open as many again), and another agent keeps its own share.
fn an_agents_tunnels_and_descriptors_are_bounded(driver: &str) {
    let secrets = Secrets::on(driver);
    let backend = GrpcBackend::start().unwrap();
    let limits = "  max_tunnels_per_agent: 40\n  max_agent_services: 4\n";
    let node = start_node_on(&secrets, "5s", 1024 * 1024, None, driver, limits, "", None);
    let _agent = start_agent(&secrets, 8, &node, backend.address, 20, None);
    wait_for_idle_tunnels(&node, 2.0);
    let external = node.address("external");
    let agent_endpoint = node.address("agent");
    let token = client_jwt(&secrets, 60);
    let hostile = secrets.token(7).to_string();
    let announce = Announce {
        connection_id: "5",
        version: "v1",
        services: vec!["test.Echo".into()],
    };
    block_on(async {
        let connection = connect(agent_endpoint, None, &H2Settings::default())
            .await
            .unwrap();
        let malformed = [
            Announce {
                connection_id: "12abc",
                ..announce_like(&announce)
            },
            Announce {
                services: (0..5).map(|index| format!("s.S{index}")).collect(),
                ..announce_like(&announce)
            },
            Announce {
                services: vec!["../etc/passwd".into()],
                ..announce_like(&announce)
            },
            // Larger than any Descriptor the limits allow: refused as its size arrives.
            Announce {
                services: vec!["a".repeat(100_000)],
                ..announce_like(&announce)
            },
        ];
        // Checked before the agent is at its tunnel limit: past it, that refusal comes first.
        for bad in &malformed {
            let (status, message) = open_tunnel(&connection, &hostile, bad, &mut Vec::new())
                .await
                .expect("refused");
            assert_eq!(status, "3", "{driver}: {message}");
        }
        let mut held = Vec::new();
        let mut refused = Vec::new();
        for _ in 0..100 {
            if let Some(refusal) = open_tunnel(&connection, &hostile, &announce, &mut held).await {
                refused.push(refusal);
            }
        }
        assert_eq!(held.len(), 40, "{driver}: tunnels accepted");
        assert_eq!(refused.len(), 60, "{driver}");
        for (status, message) in &refused {
            assert_eq!(status, "8", "{driver}: {message}");
            assert!(message.contains("max_tunnels_per_agent"), "{message}");
        }
        // Ten tunnels closed by the agent: ten more may open, not eleven.
        held.truncate(30);
        let mut reopened = 0;
        for _ in 0..200 {
            if reopened == 10 {
                break;
            }
            match open_tunnel(&connection, &hostile, &announce, &mut held).await {
                None => reopened += 1,
                Some(_) => monoio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        assert_eq!(reopened, 10, "{driver}: closed tunnels are given back");
        let over = open_tunnel(&connection, &hostile, &announce, &mut held).await;
        assert_eq!(
            over.map(|(status, _)| status).as_deref(),
            Some("8"),
            "{driver}"
        );
        // Agent 8's share is its own.
        let (status, message) = call_agent(external, &token, 8).await;
        assert_eq!(status, "0", "{driver}: the well-behaved agent: {message}");
    });
    let refused = |reason: &str| {
        metric(
            &node,
            &format!("sluice_tunnel_agent_refused_total{{reason=\"{reason}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert!(refused("tunnels") >= 61.0, "{driver}");
    assert_eq!(refused("descriptor"), 4.0, "{driver}");
    assert_eq!(refused("connections"), 0.0, "{driver}");
}

fn announce_like<'a>(announce: &Announce<'a>) -> Announce<'a> {
    Announce {
        connection_id: announce.connection_id,
        version: announce.version,
        services: announce.services.clone(),
    }
}

// Issue 32, finding 8: a JWT `crit` header was accepted. RFC 7515 §4.1.11: a recipient that does
// not understand a listed critical extension must reject the token; the node understands none.
on_both_drivers!(a_jwt_naming_critical_extensions_is_refused_on_both_endpoints);

/// A JWT signed with the right key, issuer, audience and lifetime, whose header lists `crit`.
fn jwt_with_crit(secrets: &Secrets, issuer: &str, audience: &str) -> String {
    let secret = std::fs::read_to_string(&secrets.jwt_secret).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = serde_json::json!({"iss": issuer, "aud": audience, "iat": now, "exp": now + 5});
    let header = jsonwebtoken::Header {
        crit: Some(vec!["exp".into()]),
        ..Default::default()
    };
    jsonwebtoken::encode(
        &header,
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.trim_end().as_bytes()),
    )
    .unwrap()
}

/// A node on `driver` whose private endpoint takes node JWTs signed with the test's secret
/// (issuer `nodes`), with `max_wait`, messages up to 1 MiB and `extra` top-level config.
fn start_node_with_private_jwt(
    secrets: &Secrets,
    max_wait: &str,
    driver: &str,
    extra: &str,
) -> SluiceProcess {
    let private = format!(
        "  private_jwt: {{secret_file: '{}', issuer: nodes}}\n",
        secrets.jwt_secret.display()
    );
    start_node_on(
        secrets,
        max_wait,
        1024 * 1024,
        None,
        driver,
        &private,
        extra,
        None,
    )
}

/// A client JWT (external endpoint) and a node JWT (private endpoint) that are valid but for
/// their `crit` header are refused UNAUTHENTICATED and counted as `critical_extension`; the
/// same client without `crit` is served.
fn a_jwt_naming_critical_extensions_is_refused_on_both_endpoints(driver: &str) {
    let redis = RedisServer::start().unwrap();
    let secrets = Secrets::on(driver);
    let extra = format!("redis:\n  url: '{}'\n  key_prefix: crit\n", redis.url());
    let node = start_node_with_private_jwt(&secrets, "1s", driver, &extra);
    let path = sluice_tunnel::protocol::LIST_AGENTS_PATH;
    let client = jwt_with_crit(&secrets, "gitlab", "gitlab-kas");
    let (status, message) = block_on(call(node.address("external"), &client, path));
    assert_eq!(status, "16", "{driver}: {message}");
    assert!(message.contains("crit"), "{driver}: {message}");
    let peer = jwt_with_crit(&secrets, "nodes", "sluice-private");
    let (status, message) = block_on(call(node.address("private"), &peer, path));
    assert_eq!(status, "16", "{driver}: {message}");
    for endpoint in ["external", "private"] {
        assert_eq!(
            metric(
                &node,
                &format!(
                    "sluice_tunnel_auth_failures_total{{endpoint=\"{endpoint}\",reason=\"critical_extension\"}}"
                )
            ),
            Some(1.0),
            "{driver}: {endpoint}"
        );
    }
    let (status, message) = block_on(call(
        node.address("external"),
        &client_jwt(&secrets, 30),
        path,
    ));
    assert_eq!(
        status, "0",
        "{driver}: the same client without crit: {message}"
    );
}
