//! The fixed part of the pipeline (tables 0, 1 and 4 and the table-miss flows) and the
//! per-interface default drops. See the module comment of `compile` for the table layout.

use std::net::SocketAddr;

use sluice_openflow::flow::{ct_state, eth_type, ip_proto, Action, Flow, Masked, Match};

use super::matches::{match_net, End};
use super::priority::{cookie, CookieKind, DEFAULT_DROP_PRIORITY};
use crate::model::{Direction, VmInterface};

pub const CLASSIFIER_TABLE: u8 = 0;
pub const CONNTRACK_TABLE: u8 = 1;
pub const EGRESS_TABLE: u8 = 2;
pub const INGRESS_TABLE: u8 = 3;
pub const COMMIT_TABLE: u8 = 4;

/// Conntrack zone of all policy traffic.
pub const CT_ZONE: u16 = 0;

/// The OpenFlow meter every Reject flow sends its packets through before the controller: the
/// engine installs it (a drop band at the configured rate) before any flow that uses it, since
/// OVS refuses a flow naming a meter that does not exist.
pub const REJECT_METER_ID: u32 = 1;

const NEIGHBOUR_PRIORITY: u16 = 200;
const CONTROL_TRAFFIC_PRIORITY: u16 = 190;
const TO_CONNTRACK_PRIORITY: u16 = 100;
const CT_INVALID_PRIORITY: u16 = 200;
const CT_ESTABLISHED_PRIORITY: u16 = 190;
const COMMIT_PRIORITY: u16 = 100;
const TABLE_MISS_PRIORITY: u16 = 0;

/// ICMPv6 router/neighbour solicitation and advertisement: IPv6's ARP, never filtered.
const NEIGHBOUR_DISCOVERY_TYPES: [u8; 4] = [133, 134, 135, 136];

fn flow(table: u8, priority: u16, cookie: u64, matches: Match, actions: Vec<Action>) -> Flow {
    Flow {
        table,
        priority,
        cookie,
        matches,
        actions,
    }
}

fn ip_match(eth: u16) -> Match {
    Match {
        eth_type: Some(eth),
        ..Match::default()
    }
}

/// Flows that do not depend on any policy.
pub(crate) fn fixed_flows(round: u16, control_plane: &[SocketAddr]) -> Vec<Flow> {
    let pipeline = cookie(round, CookieKind::Pipeline, 0);
    let mut flows = vec![
        flow(
            CLASSIFIER_TABLE,
            NEIGHBOUR_PRIORITY,
            pipeline,
            ip_match(eth_type::ARP),
            vec![Action::Normal],
        ),
        // Non-IP traffic (LLDP, ...) is not subject to IP policies.
        flow(
            CLASSIFIER_TABLE,
            TABLE_MISS_PRIORITY,
            pipeline,
            Match::default(),
            vec![Action::Normal],
        ),
    ];
    for icmp_type in NEIGHBOUR_DISCOVERY_TYPES {
        let matches = Match {
            eth_type: Some(eth_type::IPV6),
            ip_proto: Some(ip_proto::ICMPV6),
            icmpv6_type: Some(icmp_type),
            ..Match::default()
        };
        flows.push(flow(
            CLASSIFIER_TABLE,
            NEIGHBOUR_PRIORITY,
            pipeline,
            matches,
            vec![Action::Normal],
        ));
    }
    for eth in [eth_type::IPV4, eth_type::IPV6] {
        flows.push(flow(
            CLASSIFIER_TABLE,
            TO_CONNTRACK_PRIORITY,
            pipeline,
            ip_match(eth),
            vec![Action::Ct {
                commit: false,
                zone: CT_ZONE,
                table: Some(CONNTRACK_TABLE),
                set_mark: None,
                set_label: None,
            }],
        ));
        flows.push(flow(
            COMMIT_TABLE,
            COMMIT_PRIORITY,
            pipeline,
            ip_match(eth),
            vec![
                Action::Ct {
                    commit: true,
                    zone: CT_ZONE,
                    table: None,
                    set_mark: None,
                    set_label: None,
                },
                Action::Normal,
            ],
        ));
    }
    let conntrack = [
        // Invalid packets never reach the rules.
        (
            CT_INVALID_PRIORITY,
            Masked::new(ct_state::INV | ct_state::TRK, ct_state::INV | ct_state::TRK),
            vec![],
        ),
        // Packets of a connection a rule admitted earlier (both directions) and related ones
        // (ICMP errors) skip the rules.
        (
            CT_ESTABLISHED_PRIORITY,
            Masked::new(
                ct_state::EST | ct_state::TRK,
                ct_state::NEW | ct_state::EST | ct_state::TRK,
            ),
            vec![Action::Normal],
        ),
        (
            CT_ESTABLISHED_PRIORITY,
            Masked::new(
                ct_state::REL | ct_state::TRK,
                ct_state::NEW | ct_state::REL | ct_state::TRK,
            ),
            vec![Action::Normal],
        ),
    ];
    for (priority, state, actions) in conntrack {
        let matches = Match {
            ct_state: Some(state),
            ..Match::default()
        };
        flows.push(flow(CONNTRACK_TABLE, priority, pipeline, matches, actions));
    }
    for (table, next) in [
        (CONNTRACK_TABLE, EGRESS_TABLE),
        (EGRESS_TABLE, INGRESS_TABLE),
        (INGRESS_TABLE, COMMIT_TABLE),
    ] {
        flows.push(flow(
            table,
            TABLE_MISS_PRIORITY,
            pipeline,
            Match::default(),
            vec![Action::GotoTable(next)],
        ));
    }
    let control = cookie(round, CookieKind::ControlTraffic, 0);
    for endpoint in control_plane {
        let net = ipnet::IpNet::from(endpoint.ip());
        let mut outbound = Match {
            ip_proto: Some(ip_proto::TCP),
            tcp_dst: Some(Masked::exact(endpoint.port())),
            ..Match::default()
        };
        match_net(&mut outbound, End::Destination, net);
        let mut inbound = Match {
            ip_proto: Some(ip_proto::TCP),
            tcp_src: Some(Masked::exact(endpoint.port())),
            ..Match::default()
        };
        match_net(&mut inbound, End::Source, net);
        for matches in [outbound, inbound] {
            flows.push(flow(
                CLASSIFIER_TABLE,
                CONTROL_TRAFFIC_PRIORITY,
                control,
                matches,
                vec![Action::Normal],
            ));
        }
    }
    flows
}

/// The default drop of one interface in one direction, below every rule: egress by input port,
/// ingress by each of its addresses (the output port is unknown before NORMAL forwarding).
pub(crate) fn default_drops(
    round: u16,
    direction: Direction,
    interface: &VmInterface,
    mut emit: impl FnMut(Flow),
) {
    let drop_cookie = cookie(round, CookieKind::DefaultDrop, 0);
    match direction {
        Direction::Egress => emit(flow(
            EGRESS_TABLE,
            DEFAULT_DROP_PRIORITY,
            drop_cookie,
            Match {
                in_port: Some(interface.ofport),
                ..Match::default()
            },
            vec![],
        )),
        Direction::Ingress => {
            for ip in &interface.ips {
                let mut matches = Match::default();
                match_net(&mut matches, End::Destination, ipnet::IpNet::from(*ip));
                emit(flow(
                    INGRESS_TABLE,
                    DEFAULT_DROP_PRIORITY,
                    drop_cookie,
                    matches,
                    vec![],
                ));
            }
        }
    }
}
