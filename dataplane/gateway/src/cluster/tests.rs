use std::path::Path;

use super::*;
use crate::flow_control::FlowLimit;
use crate::identity::UserInfo;
use crate::request_info::{RequestInfo, Verb};
use proptest::prelude::*;
use test_support::examples::UPSTREAM_CLUSTER as FULL;

fn file() -> &'static Path {
    Path::new("clusters/a.yaml")
}

#[test]
fn snapshot_maps_hosts_policies_and_schemas() {
    let snapshot = GatewaySnapshot::compile(parse_clusters(FULL, file()).unwrap()).unwrap();
    for host in [
        "cluster-a.example.com",
        "CLUSTER-A.example.com:443",
        "a.internal",
        "127.0.0.1:8443",
    ] {
        let (index, cluster) = snapshot.cluster_for_host(host).unwrap();
        assert_eq!(index, 0);
        assert_eq!(&*cluster.name, "cluster-a.example.com");
    }
    assert!(snapshot.cluster_for_host("other.example.com").is_none());
    assert!(snapshot.cluster_for_host(&"x".repeat(400)).is_none());
    let cluster = &snapshot.clusters()[0];
    assert_eq!(cluster.servers[1].host.as_ref(), "10.0.0.2");
    assert_eq!(cluster.servers[1].port, 6443);
    assert!(cluster.servers[2].disabled);
    assert_eq!(
        cluster.schemas[1].limit,
        FlowLimit::MaxRequestsInflight { max: 2 }
    );
    assert_eq!(
        cluster.schemas[2].limit,
        FlowLimit::TokenBucket { qps: 10, burst: 5 }
    );

    let user = UserInfo::new("alice", &[]);
    let read = RequestInfo::parse("GET", "/api/v1/pods", "").unwrap();
    let policy = cluster.dispatch.dispatch(&read, &user).unwrap();
    assert_eq!(
        (&*policy.name, &*policy.servers, policy.flow_control_schema),
        ("reads", &[1][..], Some(2))
    );
    let write = RequestInfo::parse("POST", "/api/v1/namespaces/a/pods", "").unwrap();
    let policy = cluster.dispatch.dispatch(&write, &user).unwrap();
    assert_eq!(
        (&*policy.servers, policy.flow_control_schema),
        (&[0, 1][..], None)
    );
    let openapi = RequestInfo::parse("GET", "/openapi/v2", "").unwrap();
    assert!(cluster.dispatch.dispatch(&openapi, &user).is_none());
}

#[test]
fn snapshot_finds_every_cluster_by_its_hostnames() {
    let second = FULL
        .replace("cluster-a.example.com", "cluster-b")
        .replace("a.internal, 127.0.0.1", "b.internal");
    let mut loaded = parse_clusters(FULL, file()).unwrap();
    loaded.extend(parse_clusters(&second, Path::new("clusters/b.yaml")).unwrap());
    let snapshot = GatewaySnapshot::compile(loaded).unwrap();
    assert_eq!(snapshot.clusters().len(), 2);
    assert_eq!(
        &*snapshot.cluster_for_host("b.internal").unwrap().1.name,
        "cluster-b"
    );
}

#[test]
fn dispatch_rules_may_name_exactly_the_verbs_request_info_derives() {
    let derived: Vec<&str> = Verb::ALL
        .into_iter()
        .filter(|verb| *verb != Verb::Other)
        .map(Verb::as_str)
        .collect();
    assert_eq!(derived, DISPATCH_VERBS);
}

#[test]
fn strip_port_handles_names_and_ip_literals() {
    assert_eq!(strip_port("a.example:443"), "a.example");
    assert_eq!(strip_port("a.example"), "a.example");
    assert_eq!(strip_port("[::1]:443"), "::1");
    assert_eq!(strip_port("::1"), "::1");
    assert_eq!(strip_port("127.0.0.1:6443"), "127.0.0.1");
}

proptest! {
    #[test]
    fn mutated_example_never_panics(cut in 0usize..FULL.len(), insert in "[\\[\\]{}:,\\-* a-z0-9\n]{0,12}") {
        let mut text = FULL.to_string();
        if text.is_char_boundary(cut) {
            text.insert_str(cut, &insert);
        }
        if let Ok(loaded) = parse_clusters(&text, file()) {
            let _ = GatewaySnapshot::compile(loaded);
        }
    }
}

#[test]
fn an_agent_server_compiles_to_a_placeholder_that_never_resolves() {
    let text = FULL
        .replace(
            "  - endpoint: https://10.0.0.2:6443\n",
            "  - agent: {id: 42}\n",
        )
        .replace(
            "upsteamSubset: [https://10.0.0.2:6443]",
            "upsteamSubset: [agent:42, https://10.0.0.1:6443]",
        );
    let snapshot = GatewaySnapshot::compile(parse_clusters(&text, file()).unwrap()).unwrap();
    let cluster = &snapshot.clusters()[0];
    let agent = &cluster.servers[1];
    assert_eq!(
        (
            &*agent.endpoint,
            agent.agent,
            agent.tls,
            agent.port,
            &*agent.host
        ),
        (
            "agent:42",
            Some(42),
            false,
            0,
            "agent-42.sluice-agent.invalid"
        )
    );
    assert_eq!(agent.uri, "http://agent-42.sluice-agent.invalid/");
    assert!(agent.host.ends_with(AGENT_HOST_DOMAIN));
    // Direct servers stay exactly as they were.
    let direct = &cluster.servers[0];
    assert_eq!(
        (
            &*direct.endpoint,
            direct.agent,
            direct.tls,
            direct.port,
            &*direct.host
        ),
        ("https://10.0.0.1:6443", None, true, 6443, "10.0.0.1")
    );
    // A policy's subset mixes both kinds, by index.
    let user = UserInfo::new("alice", &[]);
    let read = RequestInfo::parse("GET", "/api/v1/pods", "").unwrap();
    let policy = cluster.dispatch.dispatch(&read, &user).unwrap();
    assert_eq!((&*policy.name, &*policy.servers), ("reads", &[0, 1][..]));
}
