//! The private hop between nodes: framed calls (the holding node splices the routing node's
//! tunnel messages into the agent's tunnel unread) where both nodes offer them, plain gRPC
//! requests to and from a node that does not (`tunnel.splice_private_hop: false`, as a node
//! without framed calls), and a framed call's checks against a node-token holder.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use common::{
    assert_shapes, client_args, metric, private_args, start_agent, wait_for_idle_tunnels, Secrets,
};
use test_support::{on_both_drivers, tunnel_client, GrpcBackend, RedisServer, SluiceProcess};

on_both_drivers!(
    framed_calls_carry_every_call_shape_between_nodes,
    a_node_without_framed_calls_gets_and_sends_plain_ones,
    a_framed_call_is_checked_before_the_agent_sees_it
);

struct Nodes {
    secrets: Secrets,
    private_secret: std::path::PathBuf,
    nodes: Vec<SluiceProcess>,
    _redis: RedisServer,
}

/// How a node of a test speaks on the private hop.
#[derive(Clone, Copy)]
enum Hop {
    /// This build, `tunnel.splice_private_hop: true` (the default).
    Framed,
    /// The build `SLUICE_PREVIOUS_BIN` names (a release without framed calls, which does not
    /// know the setting), or this build with the setting off when it is not set.
    Previous,
}

/// The older build [`Hop::Previous`] runs, if one is given.
fn previous_build() -> Option<String> {
    std::env::var("SLUICE_PREVIOUS_BIN")
        .ok()
        .filter(|path| !path.is_empty())
}

/// One node per entry of `hops`, sharing a redis-server.
fn nodes(driver: &str, hops: &[Hop]) -> Nodes {
    let redis = RedisServer::start().unwrap();
    let redis_yaml = format!(
        "redis:\n  url: '{}'\n  key_prefix: hop\n  unregister_delay: 500ms\n",
        redis.unix_url()
    );
    let secrets = Secrets::on(driver);
    let private_secret = secrets.private_secret();
    let nodes = hops
        .iter()
        .enumerate()
        .map(|(index, hop)| {
            let previous = previous_build().filter(|_| matches!(hop, Hop::Previous));
            let splice = match (hop, &previous) {
                (Hop::Framed, _) => "  splice_private_hop: true\n",
                (_, None) => "  splice_private_hop: false\n",
                (_, Some(_)) => "",
            };
            let tunnel_extra = format!(
                "  node_name: node-{index}\n{splice}  private_jwt: {{secret_file: '{}', issuer: sluice-node, audience: sluice-private}}\n",
                private_secret.display()
            );
            let yaml = common::node_yaml(&secrets, "10s", 32 * 1024 * 1024, None, driver, &tunnel_extra, &redis_yaml, None);
            match previous {
                Some(binary) => {
                    eprintln!("node-{index} runs the previous build {binary}");
                    common::run_node_with(&binary, &yaml)
                }
                None => common::run_node(&yaml),
            }
        })
        .collect();
    Nodes {
        secrets,
        private_secret,
        nodes,
        _redis: redis,
    }
}

fn counter(node: &SluiceProcess, name: &str) -> f64 {
    metric(node, &format!("{name}_total")).unwrap_or(0.0)
}

const FRAMED: &str = "sluice_tunnel_remote_framed_calls";
const SPLICED: &str = "sluice_tunnel_private_spliced_calls";

fn shapes_through(caller: &SluiceProcess, secrets: &Secrets, agent: i64) {
    assert_shapes(&tunnel_client(
        "shapes",
        &client_args(caller, secrets, agent),
    ));
}

/// Both nodes offer framed calls: after the first call on a connection (plain, which carries
/// the offer), every call goes framed, and each shape (metadata both ways, streams, a 4 MiB
/// echo, an error status) arrives as the client sent it and the backend answered.
fn framed_calls_carry_every_call_shape_between_nodes(driver: &str) {
    let cluster = nodes(driver, &[Hop::Framed, Hop::Framed]);
    let backend = GrpcBackend::start().unwrap();
    let (a, c) = (&cluster.nodes[0], &cluster.nodes[1]);
    let _agent = start_agent(&cluster.secrets, 7, c, backend.address, 20, None);
    wait_for_idle_tunnels(c, 2.0);
    shapes_through(a, &cluster.secrets, 7);
    let framed_before = counter(a, FRAMED);
    let remote_before = metric(a, "sluice_tunnel_routes_total{decision=\"remote\"}").unwrap();
    shapes_through(a, &cluster.secrets, 7);
    let framed = counter(a, FRAMED) - framed_before;
    let remote =
        metric(a, "sluice_tunnel_routes_total{decision=\"remote\"}").unwrap() - remote_before;
    // Each round's client is one connection, served by one core of A, whose connection to C
    // carries plain only the first call it ever carried (the offer comes on its 100 Continue):
    // the second round's client may land on the other core.
    assert!(remote >= 5.0, "calls routed to C: {remote}");
    assert!(
        framed >= remote - 1.0,
        "{framed} of the second round's {remote} calls went framed"
    );
    assert_eq!(
        counter(c, SPLICED),
        counter(a, FRAMED),
        "C spliced what A framed"
    );
    assert!(counter(c, "sluice_tunnel_tunnels_reused") >= 1.0);
    // Calls one after another go down the stream the previous call kept (`relays.rs`).
    let reused = counter(a, "sluice_tunnel_relay_streams_reused");
    assert!(
        reused >= framed - 2.0,
        "{reused} of {framed} framed calls went down a kept stream"
    );
}

/// A node that does not offer framed calls gets plain requests, and one that does not send
/// them sends plain requests to a node that offers them: with `SLUICE_PREVIOUS_BIN` naming a
/// build from before framed calls, across versions, as in a rolling upgrade.
fn a_node_without_framed_calls_gets_and_sends_plain_ones(driver: &str) {
    let cluster = nodes(driver, &[Hop::Framed, Hop::Previous]);
    let backend = GrpcBackend::start().unwrap();
    let (on, off) = (&cluster.nodes[0], &cluster.nodes[1]);
    let _on_off = start_agent(&cluster.secrets, 7, off, backend.address, 10, None);
    let _on_on = start_agent(&cluster.secrets, 8, on, backend.address, 10, None);
    wait_for_idle_tunnels(off, 2.0);
    wait_for_idle_tunnels(on, 2.0);
    for _ in 0..2 {
        // To the node without framed calls, and from it.
        shapes_through(on, &cluster.secrets, 7);
        shapes_through(off, &cluster.secrets, 8);
    }
    for node in [on, off] {
        assert_eq!(counter(node, FRAMED), 0.0);
        assert_eq!(counter(node, SPLICED), 0.0);
        assert!(metric(node, "sluice_tunnel_private_requests_total{code=\"OK\"}").unwrap() >= 10.0);
    }
}

fn spliced(node: &SluiceProcess, cluster: &Nodes, frames: &[&str]) -> serde_json::Value {
    let mut args = private_args(node, &cluster.private_secret, 7);
    args.extend(["--payload".into(), "framed-by-grpcio".into()]);
    if !frames.is_empty() {
        args.extend(["--frames".into(), frames.join(",")]);
    }
    tunnel_client("spliced", &args)
}

/// A framed call written by grpcio (each gRPC message a tunnel message, as a routing node sends
/// them) is answered with the agent's messages; what is not one well-formed call is refused
/// INVALID_ARGUMENT naming what was wrong, counted, and the node goes on serving. (A call cut
/// short before its CloseSend may still be answered first, as a server may answer a local call
/// before its request ends: that case is the scanner's unit tests'.)
fn a_framed_call_is_checked_before_the_agent_sees_it(driver: &str) {
    let cluster = nodes(driver, &[Hop::Framed]);
    let backend = GrpcBackend::start().unwrap();
    let node = &cluster.nodes[0];
    let _agent = start_agent(&cluster.secrets, 7, node, backend.address, 10, None);
    wait_for_idle_tunnels(node, 2.0);

    let answered = spliced(node, &cluster, &[]);
    assert_eq!(answered["code"], "OK", "{answered}");
    let replies: Vec<&str> = answered["replies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|reply| reply.as_str().unwrap())
        .collect();
    // Header (field 2), Message (field 3) holding the echo, Trailer (field 4) with status 0.
    assert!(replies.first().unwrap().starts_with("12"), "{answered}");
    let echo: String = "framed-by-grpcio"
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(
        replies
            .iter()
            .any(|reply| reply.starts_with("1a") && reply.contains(&echo)),
        "{answered}"
    );
    assert!(replies.last().unwrap().starts_with("22"), "{answered}");
    assert_eq!(counter(node, SPLICED), 1.0);

    let info = "0a120a102f746573742e4563686f2f556e617279"; // RequestInfo{/test.Echo/Unary}
    let message = "12060a0470696e67"; // Message{"ping"}
    let close = "1a00";
    // Two calls one after the other on one stream: each answered whole, in order.
    let twice = spliced(
        node,
        &cluster,
        &[info, message, close, info, message, close],
    );
    assert_eq!(twice["code"], "OK", "{twice}");
    let replies = twice["replies"].as_array().unwrap();
    let trailers = replies
        .iter()
        .filter(|reply| reply.as_str().unwrap().starts_with("22"))
        .count();
    assert_eq!(trailers, 2, "{twice}");
    assert_eq!(counter(node, SPLICED), 3.0);
    let cases: [(&[&str], &str); 4] = [
        (&[message, close], "first message is its RequestInfo"),
        (&[info, "1a001200"], "not exactly one known message"),
        (&[info, info, close], "a second RequestInfo"),
        (&[info, "2200", close], "not exactly one known message"),
    ];
    for (frames, why) in cases {
        let refused = spliced(node, &cluster, frames);
        assert_eq!(refused["code"], "INVALID_ARGUMENT", "{frames:?}: {refused}");
        let details = refused["details"].as_str().unwrap();
        assert!(details.contains(why), "{frames:?}: {refused}");
    }
    assert!(counter(node, "sluice_tunnel_protocol_errors") >= 4.0);
    let again = spliced(node, &cluster, &[]);
    assert_eq!(again["code"], "OK", "the node still serves: {again}");
    let plain = tunnel_client("unary", &client_args(node, &cluster.secrets, 7));
    assert_eq!(
        plain["code"],
        "OK",
        "{plain}\n{}\n{}",
        node.stderr(),
        _agent.stderr()
    );
}
