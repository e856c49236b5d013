//! Helpers of the tests that run a real Open vSwitch: a tokio runtime, clients on a fresh
//! bridge, and what `ovs-ofctl` reads back.

use std::time::Duration;

use sluice_openflow::flow::{eth_type, Match};
use sluice_ovs::{ClientConfig, OpenFlowClient, OvsdbClient};
use test_support::{unique_name, OvsInstance};

use super::loads_as_set_fields;

pub const TIMEOUT: Duration = Duration::from_secs(20);

/// The timing test holds this exclusively so that the other tests of its binary (which hold it
/// shared) do not compete with it for the two cores; cargo runs test binaries one at a time.
pub static CPU: std::sync::RwLock<()> = std::sync::RwLock::new(());

pub fn shared_cpu() -> std::sync::RwLockReadGuard<'static, ()> {
    CPU.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub async fn ovsdb(ovs: &OvsInstance) -> OvsdbClient {
    OvsdbClient::connect(ovs.db_socket(), TIMEOUT)
        .await
        .unwrap()
}

/// A bridge created through our OVSDB client, and an OpenFlow client on it.
pub async fn bridge_with_client(ovs: &OvsInstance) -> (String, OpenFlowClient) {
    let bridge = unique_name("br");
    ovsdb(ovs).await.create_bridge(&bridge).await.unwrap();
    let client = OpenFlowClient::connect(ovs.mgmt_socket(&bridge), ClientConfig::default())
        .await
        .unwrap_or_else(|e| panic!("connecting: {e}\n{}", ovs.logs()));
    (bridge, client)
}

/// `ovs-ofctl dump-flows` without statistics, one sorted line per flow.
pub fn dump_flows(ovs: &OvsInstance, bridge: &str) -> Vec<String> {
    let text = ovs
        .ovs_ofctl(&["-O", "OpenFlow14", "--no-stats", "dump-flows", bridge])
        .unwrap();
    let mut lines: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with("OFPST_FLOW"))
        // OVS prints a masked set-field the way it was sent: as `load:` when ovs-ofctl sent it.
        .map(loads_as_set_fields)
        .collect();
    lines.sort();
    lines
}

pub fn ip_match() -> Match {
    Match {
        eth_type: Some(eth_type::IPV4),
        ..Match::default()
    }
}
