use std::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::*;
use crate::flow::{ct_state, eth_type, ip_proto, Action, Flow, FlowKey, Masked, Match};

fn masked<T: crate::flow::FullMask + std::fmt::Debug>(
    value: impl Strategy<Value = T>,
    mask: impl Strategy<Value = T>,
) -> impl Strategy<Value = Masked<T>> {
    (value, mask, any::<bool>()).prop_map(|(v, m, exact)| {
        if exact {
            Masked::exact(v)
        } else {
            Masked::new(v, m)
        }
    })
}

fn ipv4() -> impl Strategy<Value = Masked<Ipv4Addr>> {
    masked(
        any::<u32>().prop_map(Ipv4Addr::from),
        any::<u32>().prop_map(Ipv4Addr::from),
    )
}

fn ipv6() -> impl Strategy<Value = Masked<Ipv6Addr>> {
    masked(
        any::<u128>().prop_map(Ipv6Addr::from),
        any::<u128>().prop_map(Ipv6Addr::from),
    )
}

fn port16() -> impl Strategy<Value = Masked<u16>> {
    masked(any::<u16>(), any::<u16>())
}

fn arb_match() -> impl Strategy<Value = Match> {
    let l2 = (
        proptest::option::of(any::<u32>()),
        proptest::option::of(masked(any::<[u8; 6]>(), any::<[u8; 6]>())),
        proptest::option::of(masked(any::<[u8; 6]>(), any::<[u8; 6]>())),
        proptest::option::of(any::<u16>()),
        proptest::option::of(any::<u16>()),
        proptest::option::of(ipv4()),
        proptest::option::of(ipv4()),
    );
    let l3 = (
        proptest::option::of(ipv4()),
        proptest::option::of(ipv4()),
        proptest::option::of(ipv6()),
        proptest::option::of(ipv6()),
        proptest::option::of(any::<u8>()),
        proptest::collection::vec(proptest::option::of(port16()), 6),
        proptest::collection::vec(proptest::option::of(any::<u8>()), 4),
    );
    let nx = (
        proptest::option::of(masked(any::<u32>(), any::<u32>())),
        proptest::option::of(masked(any::<u32>(), any::<u32>())),
        proptest::option::of(masked(any::<u128>(), any::<u128>())),
        proptest::collection::vec(proptest::option::of(masked(any::<u32>(), any::<u32>())), 16),
        proptest::option::of(any::<u32>()),
    );
    (l2, l3, nx).prop_map(|(l2, l3, nx)| {
        let (in_port, eth_src, eth_dst, eth_type, arp_op, arp_spa, arp_tpa) = l2;
        let (ipv4_src, ipv4_dst, ipv6_src, ipv6_dst, ip_proto, ports, icmp) = l3;
        let (ct_state, ct_mark, ct_label, regs, conj_id) = nx;
        Match {
            in_port,
            eth_src,
            eth_dst,
            eth_type,
            arp_op,
            arp_spa,
            arp_tpa,
            ipv4_src,
            ipv4_dst,
            ipv6_src,
            ipv6_dst,
            ip_proto,
            tcp_src: ports[0],
            tcp_dst: ports[1],
            udp_src: ports[2],
            udp_dst: ports[3],
            sctp_src: ports[4],
            sctp_dst: ports[5],
            icmpv4_type: icmp[0],
            icmpv4_code: icmp[1],
            icmpv6_type: icmp[2],
            icmpv6_code: icmp[3],
            ct_state,
            ct_mark,
            ct_label,
            regs: std::array::from_fn(|i| regs[i]),
            conj_id,
        }
    })
}

fn arb_action() -> impl Strategy<Value = Action> {
    prop_oneof![
        (0u32..0xffff_ff00).prop_map(Action::Output),
        Just(Action::Output(crate::flow::port::IN_PORT)),
        Just(Action::Normal),
        (any::<u16>(), proptest::collection::vec(any::<u8>(), 0..40))
            .prop_map(|(max_len, userdata)| Action::Controller { max_len, userdata }),
        (any::<u32>(), 2u8..=64)
            .prop_flat_map(|(id, n)| (Just(id), 1..=n, Just(n)))
            .prop_map(|(id, clause, n_clauses)| Action::Conjunction {
                id,
                clause,
                n_clauses
            }),
        (
            any::<bool>(),
            any::<u16>(),
            proptest::option::of(0u8..0xff),
            proptest::option::of(masked(any::<u32>(), any::<u32>())),
            proptest::option::of(masked(any::<u128>(), any::<u128>())),
        )
            .prop_map(|(commit, zone, table, set_mark, set_label)| Action::Ct {
                commit,
                zone,
                table,
                set_mark,
                set_label
            }),
        (0u8..0xff).prop_map(|table| Action::Resubmit { table }),
        (0u8..16, masked(any::<u32>(), any::<u32>())).prop_map(|(reg, m)| Action::SetReg {
            reg,
            value: m.value,
            mask: m.mask
        }),
    ]
}

fn arb_flow() -> impl Strategy<Value = Flow> {
    (
        0u8..0xff,
        any::<u16>(),
        any::<u64>(),
        arb_match(),
        proptest::collection::vec(arb_action(), 0..6),
        proptest::option::of(0u8..0xff),
        proptest::option::of(any::<u32>()),
    )
        .prop_map(
            |(table, priority, cookie, matches, mut actions, goto, meter)| {
                // Instructions where the decoder puts them: the meter first, goto_table last.
                if let Some(id) = meter {
                    actions.insert(0, Action::Meter(id));
                }
                actions.extend(goto.map(Action::GotoTable));
                Flow {
                    table,
                    priority,
                    cookie,
                    matches,
                    actions,
                }
            },
        )
}

fn arb_flow_mod() -> impl Strategy<Value = FlowMod> {
    prop_oneof![
        arb_flow().prop_map(FlowMod::Add),
        arb_flow().prop_map(FlowMod::ModifyStrict),
        arb_flow().prop_map(|f| FlowMod::DeleteStrict(f.key())),
        (proptest::option::of(0u8..0xff), any::<u64>(), any::<u64>()).prop_map(
            |(table, cookie, cookie_mask)| FlowMod::DeleteByCookie {
                table,
                cookie,
                cookie_mask
            }
        ),
    ]
}

fn decode_one(bytes: &[u8]) -> Decoded {
    decode(bytes).expect("decodes")
}

proptest! {
    #[test]
    fn flow_mods_round_trip(flow_mod in arb_flow_mod(), xid in any::<u32>(), v14 in any::<bool>()) {
        let version = if v14 { OFP14 } else { OFP13 };
        let mut out = Vec::new();
        encode_flow_mod(&mut out, version, xid, &flow_mod).unwrap();
        prop_assert_eq!(out.len() % 8, 0);
        let decoded = decode_one(&out);
        prop_assert_eq!(decoded.xid, xid);
        prop_assert_eq!(decoded.version, version);
        prop_assert_eq!(decoded.message, Message::FlowMod(Box::new(flow_mod)));
    }

    #[test]
    fn bundle_adds_round_trip(flow_mod in arb_flow_mod(), xid in any::<u32>(), bundle_id in any::<u32>(), v14 in any::<bool>()) {
        let version = if v14 { OFP14 } else { OFP13 };
        let mut out = Vec::new();
        encode_bundle_add_flow_mod(&mut out, version, xid, bundle_id, BUNDLE_ATOMIC | BUNDLE_ORDERED, &flow_mod).unwrap();
        let expected = Message::BundleAdd {
            bundle_id,
            flags: BUNDLE_ATOMIC | BUNDLE_ORDERED,
            message: Box::new(Decoded { version, xid, message: Message::FlowMod(Box::new(flow_mod)) }),
        };
        prop_assert_eq!(decode_one(&out).message, expected);
    }

    #[test]
    fn packet_outs_round_trip(
        actions in proptest::collection::vec(arb_action(), 0..5),
        packet in proptest::collection::vec(any::<u8>(), 0..200),
        in_port in any::<u32>(),
    ) {
        let packet_out = PacketOut { in_port, actions, packet };
        let mut out = Vec::new();
        encode_packet_out(&mut out, OFP14, 7, &packet_out).unwrap();
        prop_assert_eq!(decode_one(&out).message, Message::PacketOut(packet_out));
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = decode(&bytes);
    }

    #[test]
    fn garbled_bodies_behind_valid_headers_never_panic(
        version in prop_oneof![Just(OFP13), Just(OFP14)],
        msg_type in prop_oneof![0u8..=35],
        body in proptest::collection::vec(any::<u8>(), 0..600),
        experimenter in prop_oneof![Just(0x2320u32), Just(0x4f4e_4600u32)],
        subtype in prop_oneof![Just(30u32), Just(2300u32), Just(2301u32)],
    ) {
        let mut message = vec![version, msg_type, 0, 0, 0, 0, 0, 1];
        if msg_type == 4 {
            message.extend_from_slice(&experimenter.to_be_bytes());
            message.extend_from_slice(&subtype.to_be_bytes());
        }
        message.extend_from_slice(&body);
        message.truncate(0xffff);
        let len = message.len() as u16;
        message[2..4].copy_from_slice(&len.to_be_bytes());
        let _ = decode(&message);
    }

    #[test]
    fn truncated_flow_mods_are_errors_not_panics(flow_mod in arb_flow_mod(), cut in any::<proptest::sample::Index>()) {
        let mut out = Vec::new();
        encode_flow_mod(&mut out, OFP14, 1, &flow_mod).unwrap();
        let cut = HEADER_LEN + cut.index(out.len() - HEADER_LEN);
        let mut short = out[..cut].to_vec();
        let len = short.len() as u16;
        short[2..4].copy_from_slice(&len.to_be_bytes());
        // Cutting inside padding may still decode; anywhere else it must be an error.
        if let Ok(decoded) = decode(&short) {
            prop_assert!(matches!(decoded.message, Message::FlowMod(_)));
        }
    }
}

#[test]
fn hello_offers_1_3_and_1_4_and_negotiation_picks_the_highest_common() {
    let mut out = Vec::new();
    encode_hello(&mut out, 9);
    assert_eq!(
        decode_one(&out).message,
        Message::Hello {
            versions: Some(SUPPORTED_VERSIONS)
        }
    );
    // OVS with OpenFlow10..15 enabled.
    assert_eq!(negotiate_version(0x06, Some(0b111_1110)), Some(OFP14));
    assert_eq!(negotiate_version(0x06, Some(0b001_0010)), Some(OFP13));
    assert_eq!(negotiate_version(0x06, Some(0b000_0010)), None);
    assert_eq!(negotiate_version(0x04, None), Some(OFP13));
    assert_eq!(negotiate_version(0x01, None), None);
    assert_eq!(negotiate_version(0xff, None), Some(OFP14));
}

#[test]
fn error_replies_name_the_failed_request() {
    let mut failed = Vec::new();
    encode_barrier_request(&mut failed, OFP14, 0x42);
    let mut out = vec![OFP14, 1, 0, 0, 0, 0, 0, 0x42, 0, 4, 0, 9];
    out.extend_from_slice(&failed);
    let len = out.len() as u16;
    out[2..4].copy_from_slice(&len.to_be_bytes());
    let Message::Error(error) = decode_one(&out).message else {
        panic!("not an error");
    };
    assert_eq!(
        error.to_string(),
        "OFPET_BAD_MATCH/BAD_PREREQ (4/9) for BARRIER_REQUEST xid 0x42"
    );
    let experimenter = [
        OFP14, 1, 0, 16, 0, 0, 0, 1, 0xff, 0xff, 0, 3, 0, 0, 0x23, 0x20,
    ];
    let Message::Error(error) = decode_one(&experimenter).message else {
        panic!("not an error");
    };
    assert_eq!(error.experimenter, Some(0x2320));
    assert_eq!(
        error.to_string(),
        "OFPET_EXPERIMENTER (experimenter 0x2320, code 3)"
    );
}

#[test]
fn bundle_control_uses_native_type_in_1_4_and_onf_extension_in_1_3() {
    let control = BundleControl {
        bundle_id: 5,
        kind: BundleControlType::CommitRequest,
        flags: BUNDLE_ATOMIC,
    };
    for (version, msg_type, len) in [(OFP14, 33, 16), (OFP13, 4, 24)] {
        let mut out = Vec::new();
        encode_bundle_control(&mut out, version, 3, &control).unwrap();
        assert_eq!((out[1], out.len()), (msg_type, len));
        assert_eq!(decode_one(&out).message, Message::BundleControl(control));
    }
}

#[test]
fn header_only_messages_carry_their_length() {
    let mut out = Vec::new();
    encode_barrier_request(&mut out, OFP14, 5);
    encode_features_request(&mut out, OFP13, 6);
    assert_eq!(out, [5, 20, 0, 8, 0, 0, 0, 5, 4, 5, 0, 8, 0, 0, 0, 6]);
    assert_eq!(decode_one(&out[..8]).message, Message::BarrierRequest);
    assert_eq!(decode_one(&out[8..]).message, Message::FeaturesRequest);
}

#[test]
fn flow_stats_requests_round_trip() {
    let request = FlowStatsRequest {
        table: None,
        cookie: 0x1_0000_0000,
        cookie_mask: 0xffff_ffff_0000_0000,
    };
    let mut out = Vec::new();
    encode_flow_stats_request(&mut out, OFP14, 1, &request).unwrap();
    assert_eq!(decode_one(&out).message, Message::FlowStatsRequest(request));
}

#[test]
fn invalid_models_are_refused_by_the_encoder() {
    let flow = |actions| {
        FlowMod::Add(Flow {
            table: 0,
            priority: 1,
            cookie: 0,
            matches: Match::default(),
            actions,
        })
    };
    let mut out = Vec::new();
    let bad = [
        flow(vec![Action::GotoTable(1), Action::GotoTable(2)]),
        flow(vec![Action::Meter(1), Action::Normal, Action::Meter(2)]),
        flow(vec![Action::SetReg {
            reg: 16,
            value: 0,
            mask: 0,
        }]),
        flow(vec![Action::Conjunction {
            id: 1,
            clause: 0,
            n_clauses: 2,
        }]),
        flow(vec![Action::Conjunction {
            id: 1,
            clause: 3,
            n_clauses: 2,
        }]),
        flow(vec![Action::Conjunction {
            id: 1,
            clause: 1,
            n_clauses: 1,
        }]),
    ];
    for flow_mod in bad {
        assert!(matches!(
            encode_flow_mod(&mut out, OFP14, 1, &flow_mod),
            Err(EncodeError::Invalid(_))
        ));
    }
    for instruction in [Action::Meter(1), Action::GotoTable(1)] {
        let packet_out = PacketOut {
            in_port: 1,
            actions: vec![instruction],
            packet: vec![],
        };
        assert!(matches!(
            encode_packet_out(&mut out, OFP14, 1, &packet_out),
            Err(EncodeError::Invalid(_))
        ));
    }
}

#[test]
fn meter_mod_and_meter_instruction_bytes_follow_the_specification() {
    let meter = MeterMod {
        command: MeterCommand::Modify,
        meter_id: 1,
        bands: vec![DropBand {
            rate: 100,
            burst: 200,
        }],
    };
    let mut out = Vec::new();
    encode_meter_mod(&mut out, OFP13, 7, &meter).unwrap();
    #[rustfmt::skip]
    let expected: [u8; 32] = [
        4, 29, 0, 32, 0, 0, 0, 7, // header: OFPT_METER_MOD, 32 bytes
        0, 1, 0, 0x0e, 0, 0, 0, 1, // OFPMC_MODIFY, PKTPS|BURST|STATS, meter 1
        0, 1, 0, 16, 0, 0, 0, 100, 0, 0, 0, 200, 0, 0, 0, 0, // drop band: rate, burst
    ];
    assert_eq!(out, expected);

    let flow = Flow {
        table: 3,
        priority: 5,
        cookie: 0,
        matches: Match::default(),
        actions: vec![
            Action::Controller {
                max_len: 0xffff,
                userdata: vec![],
            },
            Action::Meter(1),
        ],
    };
    out.clear();
    encode_flow_mod(&mut out, OFP14, 1, &FlowMod::Add(flow.clone())).unwrap();
    // After the 48-byte flow mod head and the empty 8-byte match: the meter instruction first.
    assert_eq!(&out[56..64], &[0, 6, 0, 8, 0, 0, 0, 1]);
    let Message::FlowMod(decoded) = decode_one(&out).message else {
        panic!("not a flow mod");
    };
    let FlowMod::Add(decoded) = *decoded else {
        panic!("not an add");
    };
    assert_eq!(decoded.actions[0], Action::Meter(1));
    assert_eq!(decoded.to_string(), flow.to_string());
}

#[test]
fn encode_flow_mods_writes_one_message_per_flow() {
    let flows: Vec<Flow> = (0..3u16)
        .map(|i| Flow {
            table: 0,
            priority: i,
            cookie: 1,
            matches: Match {
                eth_type: Some(eth_type::IPV4),
                ip_proto: Some(ip_proto::TCP),
                tcp_dst: Some(Masked::exact(80 + i)),
                ct_state: Some(Masked::new(ct_state::TRK, ct_state::TRK | ct_state::NEW)),
                ..Match::default()
            },
            actions: vec![Action::Normal],
        })
        .collect();
    let bytes = encode_flow_mods(&flows).unwrap();
    let mut rest = &bytes[..];
    let mut decoded = Vec::new();
    while !rest.is_empty() {
        let len = usize::from(parse_header(rest).unwrap().length);
        decoded.push(decode_one(&rest[..len]));
        rest = &rest[len..];
    }
    let expected: Vec<Message> = flows
        .into_iter()
        .enumerate()
        .map(|(index, flow)| Message::BundleAdd {
            bundle_id: 1,
            flags: BUNDLE_ATOMIC | BUNDLE_ORDERED,
            message: Box::new(Decoded {
                version: OFP14,
                xid: index as u32 + 1,
                message: Message::FlowMod(Box::new(FlowMod::Add(flow))),
            }),
        })
        .collect();
    assert_eq!(
        decoded.into_iter().map(|d| d.message).collect::<Vec<_>>(),
        expected
    );
    let key = FlowKey {
        table: 0,
        priority: 0,
        matches: Match::default(),
    };
    assert_eq!(
        FlowMod::DeleteStrict(key).to_string(),
        "delete_strict table=0,priority=0"
    );
}
