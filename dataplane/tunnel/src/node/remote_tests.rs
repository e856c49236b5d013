#![allow(clippy::unwrap_used)]
use sluice_locator::memory::MemoryCluster;

use super::super::test_node::{node, run};
use super::*;

fn routing(cluster: &Arc<MemoryCluster>) -> RemoteRouting {
    let locator: Arc<dyn AgentLocator> = cluster.locator("n", "10.0.0.1:1");
    RemoteRouting::new(&node(Some(locator))).unwrap()
}

#[test]
fn a_routing_node_signs_one_token_per_second_and_shares_it() {
    let cluster = MemoryCluster::new();
    let locator: Arc<dyn AgentLocator> = cluster.locator("n", "10.0.0.1:1");
    let private = sluice_config::JwtConfig {
        secret: vec![9; 32],
        secret_file: "p".into(),
        issuer: "sluice".into(),
        audience: "sluice-private".into(),
        leeway: Duration::from_secs(1),
        max_lifetime: Duration::from_secs(10),
    };
    let node = super::super::test_node::node_with(Some(locator), Some(private));
    let routing = RemoteRouting::new(&node).unwrap();
    let (first, second) = loop {
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let pair = (routing.token().unwrap(), routing.token().unwrap());
        let after = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        if before == after {
            break pair;
        }
    };
    // The same bytes, not signed again: both values share one buffer.
    assert_eq!(first.as_bytes().as_ptr(), second.as_bytes().as_ptr());
    let token = first.to_str().unwrap().strip_prefix("Bearer ").unwrap();
    let (validator, _) = node.private_jwt.as_ref().unwrap();
    assert!(
        validator.validate_token(token).is_ok(),
        "a valid node token"
    );
}

#[test]
fn peer_authorities_kept_per_core_are_bounded() {
    let cluster = MemoryCluster::new();
    let routing = routing(&cluster);
    for port in 1..=(KEPT_AUTHORITIES as u16 + 100) {
        let address = SocketAddr::from(([10, 0, 0, 9], port));
        let authority = routing.authority(address).unwrap();
        assert_eq!(authority.as_str(), address.to_string());
    }
    assert!(routing.authorities.borrow().len() <= KEPT_AUTHORITIES);
}

#[test]
fn a_node_without_a_locator_does_not_route_to_others() {
    assert!(RemoteRouting::new(&node(None)).is_none());
}

#[test]
fn a_listing_is_reused_within_its_ttl_unless_a_fresh_one_is_asked_for() {
    let cluster = MemoryCluster::new();
    let routing = routing(&cluster);
    let (b, c) = (
        cluster.locator("b", "10.0.0.2:2"),
        cluster.locator("c", "10.0.0.3:3"),
    );
    b.register(9);
    run(async {
        let until = Instant::now() + Duration::from_secs(1);
        let first = routing.remote_nodes(9, until, false).await.unwrap();
        assert_eq!(
            first,
            vec![("b".to_string(), "10.0.0.2:2".parse().unwrap())]
        );
        c.register(9);
        let cached = routing.remote_nodes(9, until, false).await.unwrap();
        assert_eq!(cached, first, "the core's cached listing");
        let fresh = routing.remote_nodes(9, until, true).await.unwrap();
        assert_eq!(fresh.len(), 2, "a fresh lookup sees the new node");
    });
}

#[test]
fn an_empty_listing_is_not_kept() {
    let cluster = MemoryCluster::new();
    let routing = routing(&cluster);
    let b = cluster.locator("b", "10.0.0.2:2");
    run(async {
        let until = Instant::now() + Duration::from_secs(1);
        assert!(routing
            .remote_nodes(9, until, false)
            .await
            .unwrap()
            .is_empty());
        b.register(9);
        let listed = routing.remote_nodes(9, until, false).await.unwrap();
        assert_eq!(
            listed.len(),
            1,
            "the agent's arrival is seen by the next call"
        );
    });
}

#[test]
fn a_failing_locator_is_an_error_not_an_empty_listing() {
    let cluster = MemoryCluster::new();
    let routing = routing(&cluster);
    cluster.set_failing(Some("redis is away"));
    run(async {
        let until = Instant::now() + Duration::from_secs(1);
        let error = routing.remote_nodes(9, until, false).await.unwrap_err();
        assert_eq!(error, LocatorError::Store("redis is away".into()));
    });
}

#[test]
fn advertised_addresses_outside_the_allowlist_are_not_dialled() {
    let allowlist = [
        sluice_config::IpNetwork::parse("10.0.0.0/8").unwrap(),
        sluice_config::IpNetwork::parse("fd00::/8").unwrap(),
    ];
    let allowed = |text: &str| peer_allowed(&allowlist, text.parse().unwrap());
    assert!(allowed("10.1.2.3:8155"));
    assert!(allowed("[fd00::1]:8155"));
    assert!(
        allowed("[::ffff:10.0.0.9]:8155"),
        "IPv4-mapped counts as IPv4"
    );
    assert!(!allowed("169.254.169.254:80"), "the cloud metadata service");
    assert!(!allowed("127.0.0.1:6443"));
    assert!(!allowed("11.0.0.1:8155"));
    assert!(
        peer_allowed(&[], "192.0.2.1:1".parse().unwrap()),
        "empty: any"
    );
}
