//! Meters against a real Open vSwitch: the client's meter mod (add, the switch's refusal of a
//! second add, modify) and meter statistics, and a flow that sends its packets through a meter
//! before the controller, as `ovs-ofctl` prints them, over OpenFlow 1.4 and 1.3.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use sluice_openflow::flow::{eth_type, ip_proto, Action, Flow, Match};
use sluice_openflow::{
    DropBand, FlowMod, MeterCommand, MeterMod, METER_ALL, METER_EXISTS, METER_MOD_FAILED, OFP13,
    OFP14,
};
use sluice_ovs::{ClientConfig, ClientError, OpenFlowClient, OvsdbClient};
use test_support::{unique_name, OvsInstance};

fn meter(command: MeterCommand, rate: u32, burst: u32) -> MeterMod {
    MeterMod {
        command,
        meter_id: 1,
        bands: vec![DropBand { rate, burst }],
    }
}

fn metered_reject_flow() -> Flow {
    Flow {
        table: 3,
        priority: 300,
        cookie: 0x42,
        matches: Match {
            eth_type: Some(eth_type::IPV4),
            ip_proto: Some(ip_proto::UDP),
            ..Match::default()
        },
        actions: vec![
            Action::Meter(1),
            Action::Controller {
                max_len: u16::MAX,
                userdata: vec![0, 1, 0, 0, 0, 9],
            },
        ],
    }
}

#[test]
fn meters_are_installed_modified_read_and_used_by_flows() {
    let ovs = OvsInstance::start().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut db = OvsdbClient::connect(ovs.db_socket(), Duration::from_secs(20))
            .await
            .unwrap();
        for (protocols, version) in [(None, OFP14), (Some("OpenFlow13"), OFP13)] {
            let bridge = unique_name("br");
            db.create_bridge(&bridge).await.unwrap();
            if let Some(protocols) = protocols {
                ovs.ovs_vsctl(&["set", "Bridge", &bridge, &format!("protocols={protocols}")])
                    .unwrap();
            }
            let client = OpenFlowClient::connect(ovs.mgmt_socket(&bridge), ClientConfig::default())
                .await
                .unwrap();
            assert_eq!(client.version().unwrap(), version);
            check_meter_life(&ovs, &bridge, &client).await;
        }
    });
}

async fn check_meter_life(ovs: &OvsInstance, bridge: &str, client: &OpenFlowClient) {
    client
        .meter_mod(&meter(MeterCommand::Add, 100, 200))
        .await
        .unwrap();
    // A second add is refused with a code the engine can act on (it then modifies).
    match client.meter_mod(&meter(MeterCommand::Add, 100, 200)).await {
        Err(ClientError::Rejected { error, .. }) => {
            assert_eq!(
                (error.err_type, error.code),
                (METER_MOD_FAILED, METER_EXISTS)
            )
        }
        other => panic!("second add: {other:?}"),
    }
    client
        .meter_mod(&meter(MeterCommand::Modify, 50, 80))
        .await
        .unwrap();
    let meters = ovs
        .ovs_ofctl(&["-O", "OpenFlow13", "dump-meters", bridge])
        .unwrap();
    assert!(meters.contains("meter=1 pktps burst stats"), "{meters}");
    assert!(
        meters.contains("type=drop rate=50 burst_size=80"),
        "{meters}"
    );

    let flow = metered_reject_flow();
    client
        .apply_bundle(&[FlowMod::Add(flow.clone())])
        .await
        .unwrap();
    let dumped = ovs
        .ovs_ofctl(&["-O", "OpenFlow13", "--no-stats", "dump-flows", bridge])
        .unwrap();
    assert!(
        dumped.contains("actions=meter:1,controller(userdata=00.01.00.00.00.09"),
        "{dumped}"
    );
    let read_back: Vec<Flow> = client
        .flow_stats(0, 0)
        .await
        .unwrap()
        .iter()
        .filter_map(|stats| stats.flow())
        .collect();
    assert_eq!(read_back, vec![flow]);

    for request in [1, METER_ALL] {
        let stats = client.meter_stats(request).await.unwrap();
        assert_eq!(stats.len(), 1, "{stats:?}");
        assert_eq!(stats[0].meter_id, 1);
        assert_eq!(stats[0].flow_count, 1);
        assert_eq!(stats[0].bands.len(), 1);
        assert_eq!(stats[0].bands[0].packets, 0);
    }
}
