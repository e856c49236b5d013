//! The encoder checked against Open vSwitch's own parser: `ovs-ofctl ofp-print` decodes the
//! bytes we encode, and must describe the same flow mod as `ovs-ofctl parse-flow` reads from
//! the model's `Display` text.
#![allow(clippy::unwrap_used)]

use std::net::Ipv4Addr;
use std::process::Command;

use sluice_openflow::flow::{ct_state, eth_type, ip_proto, port, Action, Flow, Masked, Match};
use sluice_openflow::{encode_flow_mod, FlowMod, OFP13, OFP14};

mod support;
use support::loads_as_set_fields;

fn ofctl(args: &[&str]) -> String {
    let output = Command::new("ovs-ofctl")
        .args(args)
        .output()
        .expect("ovs-ofctl is installed (openvswitch-common)");
    assert!(
        output.status.success(),
        "ovs-ofctl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The flow description after `ADD` in ofp-print / parse-flow output.
fn described_flow(text: &str) -> String {
    let line = text
        .lines()
        .find(|line| line.contains("OFPT_FLOW_MOD"))
        .unwrap_or_else(|| panic!("no flow mod in {text}"));
    line.split_once(" ADD ")
        .unwrap_or_else(|| panic!("no ADD in {line}"))
        .1
        .trim()
        .to_string()
}

fn sample_flows() -> Vec<Flow> {
    let ip = || Match {
        eth_type: Some(eth_type::IPV4),
        ..Match::default()
    };
    let mut regs = [None; 16];
    regs[1] = Some(Masked::new(0x10, 0xf0));
    vec![
        Flow {
            table: 0,
            priority: 100,
            cookie: 0x1234,
            matches: Match {
                ip_proto: Some(ip_proto::TCP),
                ipv4_src: Some(Masked::ipv4_cidr(Ipv4Addr::new(10, 0, 0, 0), 24)),
                tcp_dst: Some(Masked::new(0x1000, 0xf000)),
                ..ip()
            },
            actions: vec![Action::Conjunction {
                id: 7,
                clause: 2,
                n_clauses: 3,
            }],
        },
        Flow {
            table: 2,
            priority: 200,
            cookie: 0xffff_0000_0000_0001,
            matches: Match {
                in_port: Some(3),
                ct_state: Some(Masked::new(
                    ct_state::TRK | ct_state::EST,
                    ct_state::TRK | ct_state::EST | ct_state::INV,
                )),
                ct_mark: Some(Masked::new(1, 0xff)),
                ct_label: Some(Masked::new(5u128 << 64, u128::MAX << 64)),
                regs,
                conj_id: Some(9),
                ..ip()
            },
            actions: vec![
                Action::Ct {
                    commit: true,
                    zone: 4,
                    table: Some(3),
                    set_mark: Some(Masked::exact(2)),
                    set_label: Some(Masked::new(0x500, 0xff00)),
                },
                Action::SetReg {
                    reg: 5,
                    value: 3,
                    mask: 0xff,
                },
                Action::Resubmit { table: 9 },
                Action::Controller {
                    max_len: 128,
                    userdata: vec![1, 2, 3],
                },
                Action::Output(2),
                Action::Output(port::IN_PORT),
                Action::GotoTable(5),
            ],
        },
        Flow {
            table: 1,
            priority: 1,
            cookie: 0,
            matches: Match {
                eth_type: Some(eth_type::IPV6),
                ip_proto: Some(ip_proto::ICMPV6),
                ipv6_src: Some(Masked::ipv6_cidr("fd00::".parse().unwrap(), 64)),
                icmpv6_type: Some(128),
                eth_src: Some(Masked::exact([2, 0, 0, 0, 0, 1])),
                ..Match::default()
            },
            actions: vec![Action::Normal],
        },
        // A Reject flow: the meter instruction before the controller action.
        Flow {
            table: 3,
            priority: 300,
            cookie: 2,
            matches: Match {
                ip_proto: Some(ip_proto::UDP),
                ..ip()
            },
            actions: vec![
                Action::Controller {
                    max_len: u16::MAX,
                    userdata: vec![0, 1, 0, 0, 0, 9],
                },
                Action::Meter(1),
            ],
        },
        Flow {
            table: 0,
            priority: 10,
            cookie: 1,
            matches: Match {
                eth_type: Some(eth_type::ARP),
                arp_op: Some(1),
                arp_tpa: Some(Masked::exact(Ipv4Addr::new(10, 0, 0, 1))),
                ..Match::default()
            },
            actions: vec![],
        },
    ]
}

#[test]
fn ovs_decodes_our_bytes_to_the_flow_our_display_describes() {
    for version in [OFP13, OFP14] {
        let protocol = if version == OFP13 {
            "OpenFlow13"
        } else {
            "OpenFlow14"
        };
        for flow in sample_flows() {
            let mut bytes = Vec::new();
            encode_flow_mod(&mut bytes, version, 1, &FlowMod::Add(flow.clone())).unwrap();
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let ours = described_flow(&ofctl(&["ofp-print", &hex]));
            let theirs = loads_as_set_fields(&described_flow(&ofctl(&[
                "-O",
                protocol,
                "parse-flow",
                &flow.to_string(),
            ])));
            assert_eq!(ours, theirs, "flow {flow}");
        }
    }
}
