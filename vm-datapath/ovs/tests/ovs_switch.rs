//! The OpenFlow and OVSDB clients against a real Open vSwitch (private ovsdb-server and
//! userspace ovs-vswitchd per test), with network namespaces sending real packets.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::net::Ipv4Addr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use sluice_openflow::flow::{ct_state, ip_proto, port, Action, Flow, FlowKey, Masked, Match};
use sluice_openflow::FlowMod;
use sluice_ovs::{ClientConfig, ClientError, OpenFlowClient, OvsdbError, PortKind};
use test_support::{unique_name, OvsInstance};

mod support;
use support::switch::{
    bridge_with_client, dump_flows, ip_match, ovsdb, runtime, shared_cpu, CPU, TIMEOUT,
};

/// CPU time ovs-vswitchd's main thread (which handles OpenFlow) has used so far
/// (`/proc/PID/schedstat`, nanoseconds on CPU).
fn main_thread_cpu(pid: u32) -> Duration {
    let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).unwrap();
    Duration::from_nanos(text.split(' ').next().unwrap().parse().unwrap())
}

/// User plus system CPU time of this process's reaped children so far.
fn children_cpu() -> Duration {
    // SAFETY: getrusage(2) writes into the zeroed struct we own and reads nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Feeds `flows`' Display text to `ovs-ofctl --bundle add-flows`; returns how long it took and
/// the CPU time ovs-ofctl itself used.
fn ofctl_bundle_add(ovs: &OvsInstance, bridge: &str, flows: &[Flow]) -> (Duration, Duration) {
    let mut text = String::with_capacity(flows.len() * 100);
    for flow in flows {
        text.push_str(&flow.to_string());
        text.push('\n');
    }
    let cpu = children_cpu();
    let started = Instant::now();
    let mut child = ovs
        .ovs_ofctl_command()
        .args(["-O", "OpenFlow14", "--bundle", "add-flows", bridge, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let elapsed = started.elapsed();
    assert!(
        output.status.success(),
        "ovs-ofctl add-flows: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    (elapsed, children_cpu() - cpu)
}

/// Flows shaped like the policy compiler's: conjunction clauses, conj_id rules with ct, default
/// drops, conntrack state, registers, controller for Reject.
fn policy_like_flows(cookie: u64) -> Vec<Flow> {
    let mut flows = Vec::new();
    for i in 0..20u8 {
        flows.push(Flow {
            table: 10,
            priority: 200,
            cookie,
            matches: Match {
                ipv4_src: Some(Masked::exact(Ipv4Addr::new(10, 1, 0, i))),
                ..ip_match()
            },
            actions: vec![Action::Conjunction {
                id: 1,
                clause: 1,
                n_clauses: 2,
            }],
        });
    }
    flows.push(Flow {
        table: 10,
        priority: 200,
        cookie,
        matches: Match {
            ip_proto: Some(ip_proto::TCP),
            tcp_dst: Some(Masked::new(0x1000, 0xff00)),
            ..ip_match()
        },
        actions: vec![Action::Conjunction {
            id: 1,
            clause: 2,
            n_clauses: 2,
        }],
    });
    flows.push(Flow {
        table: 10,
        priority: 200,
        cookie,
        matches: Match {
            conj_id: Some(1),
            ..ip_match()
        },
        actions: vec![
            Action::Ct {
                commit: true,
                zone: 3,
                table: None,
                set_mark: Some(Masked::exact(7)),
                set_label: Some(Masked::new(1u128 << 64, 0xffff_u128 << 64)),
            },
            Action::SetReg {
                reg: 3,
                value: 1,
                mask: 0xff,
            },
            Action::GotoTable(20),
        ],
    });
    flows.push(Flow {
        table: 0,
        priority: 300,
        cookie,
        matches: Match {
            ct_state: Some(Masked::new(
                ct_state::TRK | ct_state::EST,
                ct_state::TRK | ct_state::EST | ct_state::INV,
            )),
            ..ip_match()
        },
        actions: vec![Action::Resubmit { table: 20 }],
    });
    flows.push(Flow {
        table: 0,
        priority: 100,
        cookie,
        matches: ip_match(),
        actions: vec![Action::Ct {
            commit: false,
            zone: 3,
            table: Some(10),
            set_mark: None,
            set_label: None,
        }],
    });
    flows.push(Flow {
        table: 10,
        priority: 150,
        cookie,
        matches: Match {
            ip_proto: Some(ip_proto::TCP),
            regs: {
                let mut regs = [None; 16];
                regs[1] = Some(Masked::exact(5));
                regs
            },
            ..ip_match()
        },
        actions: vec![Action::Controller {
            max_len: 256,
            userdata: vec![0, 0, 0, 9],
        }],
    });
    flows.push(Flow {
        table: 10,
        priority: 1,
        cookie,
        matches: Match::default(),
        actions: vec![],
    });
    flows.push(Flow {
        table: 20,
        priority: 1,
        cookie,
        matches: Match::default(),
        actions: vec![Action::Normal],
    });
    flows
}

#[test]
fn ovsdb_client_creates_bridges_and_ports() {
    let _cpu = shared_cpu();
    let ovs = OvsInstance::start().unwrap();
    runtime().block_on(async {
        let mut db = ovsdb(&ovs).await;
        let bridge = unique_name("br");
        db.create_bridge(&bridge).await.unwrap();
        assert!(ovs.mgmt_socket(&bridge).exists());
        let settings = ovs
            .ovs_vsctl(&[
                "get",
                "Bridge",
                &bridge,
                "datapath_type",
                "protocols",
                "fail_mode",
            ])
            .unwrap();
        assert_eq!(
            settings.lines().collect::<Vec<_>>(),
            ["netdev", "[OpenFlow13, OpenFlow14, OpenFlow15]", "secure"]
        );
        assert!(matches!(
            db.create_bridge(&bridge).await,
            Err(OvsdbError::AlreadyExists { .. })
        ));

        let internal = unique_name("in");
        let internal_ofport = db
            .add_port(&bridge, &internal, PortKind::Internal)
            .await
            .unwrap();
        let veth = unique_name("ve");
        let peer = unique_name("vp");
        ovs.exec_in_netns(&[
            "ip", "link", "add", &veth, "type", "veth", "peer", "name", &peer,
        ])
        .unwrap();
        let veth_ofport = db.add_port(&bridge, &veth, PortKind::System).await.unwrap();
        assert!(internal_ofport >= 1 && veth_ofport >= 1 && internal_ofport != veth_ofport);
        assert_eq!(
            ovs.ovs_vsctl(&["get", "Interface", &veth, "ofport"])
                .unwrap()
                .trim(),
            veth_ofport.to_string()
        );
        assert_eq!(db.ofport(&internal).await.unwrap(), internal_ofport);

        db.delete_port(&bridge, &internal).await.unwrap();
        let ports = ovs.ovs_vsctl(&["list-ports", &bridge]).unwrap();
        assert_eq!(ports.lines().collect::<Vec<_>>(), [veth.as_str()]);
        assert!(matches!(
            db.delete_port(&bridge, &internal).await,
            Err(OvsdbError::NotFound { .. })
        ));
        assert!(matches!(
            db.add_port("no-such-bridge", "x", PortKind::Internal).await,
            Err(OvsdbError::NotFound { .. })
        ));

        db.delete_bridge(&bridge).await.unwrap();
        assert!(ovs.ovs_vsctl(&["br-exists", &bridge]).is_err());
    });
}

#[test]
fn one_bundle_installs_exactly_what_ovs_ofctl_installs_from_the_display_text() {
    let _cpu = shared_cpu();
    let ovs = OvsInstance::start().unwrap();
    runtime().block_on(async {
        let (ours, client) = bridge_with_client(&ovs).await;
        let theirs = unique_name("br");
        ovsdb(&ovs).await.create_bridge(&theirs).await.unwrap();
        let flows = policy_like_flows(0x1_0000_0001);

        let mods: Vec<FlowMod> = flows.iter().cloned().map(FlowMod::Add).collect();
        client.apply_bundle(&mods).await.unwrap();
        ofctl_bundle_add(&ovs, &theirs, &flows);

        let dumped = dump_flows(&ovs, &ours);
        assert_eq!(dumped.len(), flows.len(), "{dumped:#?}");
        assert_eq!(dumped, dump_flows(&ovs, &theirs));

        // Reading back through our own decoder gives the model flows again.
        let mut read_back: Vec<Flow> = client
            .flow_stats(0, 0)
            .await
            .unwrap()
            .iter()
            .map(|stats| {
                stats
                    .flow()
                    .unwrap_or_else(|| panic!("undecodable: {stats:?}"))
            })
            .collect();
        read_back.sort();
        let mut expected = flows.clone();
        expected.sort();
        assert_eq!(read_back, expected);

        // ovs-ofctl encodes some actions differently (reg_load for masked set-field, plain
        // output to CONTROLLER...): our decoder reads those back to the same model too.
        let their_client =
            OpenFlowClient::connect(ovs.mgmt_socket(&theirs), ClientConfig::default())
                .await
                .unwrap();
        let mut theirs_read_back: Vec<Flow> = their_client
            .flow_stats(0, 0)
            .await
            .unwrap()
            .iter()
            .map(|stats| {
                stats
                    .flow()
                    .unwrap_or_else(|| panic!("undecodable: {stats:?}"))
            })
            .collect();
        theirs_read_back.sort();
        assert_eq!(theirs_read_back, expected);
    });
}

#[test]
fn a_rejected_flow_rolls_back_the_whole_bundle_and_is_named() {
    let _cpu = shared_cpu();
    let ovs = OvsInstance::start().unwrap();
    runtime().block_on(async {
        let (bridge, client) = bridge_with_client(&ovs).await;
        let earlier = policy_like_flows(0x5);
        let earlier_mods: Vec<FlowMod> = earlier.iter().cloned().map(FlowMod::Add).collect();
        client.apply_bundle(&earlier_mods).await.unwrap();
        let before = dump_flows(&ovs, &bridge);

        let mut mods: Vec<FlowMod> = policy_like_flows(0x6)
            .into_iter()
            .map(|mut flow| {
                flow.priority += 1;
                FlowMod::Add(flow)
            })
            .collect();
        // A TCP port without its prerequisites (no eth_type/ip_proto): OVS refuses it.
        let bad = Flow {
            table: 0,
            priority: 7,
            cookie: 0x6,
            matches: Match {
                tcp_dst: Some(Masked::exact(80)),
                ..Match::default()
            },
            actions: vec![Action::Normal],
        };
        mods.insert(3, FlowMod::Add(bad.clone()));
        mods.push(FlowMod::DeleteByCookie {
            table: None,
            cookie: 0x5,
            cookie_mask: u64::MAX,
        });
        let error = client.apply_bundle(&mods).await.unwrap_err();
        let ClientError::BundleRejected {
            index,
            flow_mod,
            error: of_error,
        } = &error
        else {
            panic!("expected BundleRejected, got {error}");
        };
        assert_eq!(*index, 3);
        assert_eq!(flow_mod, &format!("add {bad}"));
        assert_eq!(of_error.err_type, 4, "BAD_MATCH: {of_error}");
        let text = error.to_string();
        assert!(
            text.contains("tcp_dst=80") && text.contains("BAD_MATCH"),
            "{text}"
        );

        // Nothing of the refused bundle took effect, not even the deletion at its end.
        assert_eq!(dump_flows(&ovs, &bridge), before);
        // The connection is still usable.
        client.barrier().await.unwrap();
    });
}

#[test]
fn delete_by_cookie_mask_removes_one_round_only() {
    let _cpu = shared_cpu();
    let ovs = OvsInstance::start().unwrap();
    runtime().block_on(async {
        let (bridge, client) = bridge_with_client(&ovs).await;
        let round = |round: u64, priority_offset: u16| -> Vec<FlowMod> {
            policy_like_flows((round << 32) | 0x42)
                .into_iter()
                .map(|mut flow| {
                    flow.priority += priority_offset;
                    FlowMod::Add(flow)
                })
                .collect()
        };
        client.apply_bundle(&round(1, 0)).await.unwrap();
        client.apply_bundle(&round(2, 1)).await.unwrap();
        let per_round = policy_like_flows(0).len();
        assert_eq!(dump_flows(&ovs, &bridge).len(), 2 * per_round);

        let round_mask = 0xffff_ffff_0000_0000;
        client
            .apply_bundle(&[FlowMod::DeleteByCookie {
                table: None,
                cookie: 1 << 32,
                cookie_mask: round_mask,
            }])
            .await
            .unwrap();
        let remaining = client.flow_stats(0, 0).await.unwrap();
        assert_eq!(remaining.len(), per_round);
        assert!(remaining.iter().all(|s| s.cookie >> 32 == 2));
        assert_eq!(
            client.flow_stats(1 << 32, round_mask).await.unwrap().len(),
            0
        );

        // Strict deletion and modification address one flow by its key.
        let victim = policy_like_flows((2 << 32) | 0x42)
            .into_iter()
            .map(|mut f| {
                f.priority += 1;
                f
            })
            .next()
            .unwrap();
        let mut modified = policy_like_flows((2 << 32) | 0x42)[1].clone();
        modified.priority += 1;
        modified.actions = vec![Action::Output(port::LOCAL)];
        client
            .apply_bundle(&[
                FlowMod::DeleteStrict(FlowKey::from(&victim)),
                FlowMod::ModifyStrict(modified.clone()),
            ])
            .await
            .unwrap();
        let now: Vec<Flow> = client
            .flow_stats(0, 0)
            .await
            .unwrap()
            .iter()
            .filter_map(|s| s.flow())
            .collect();
        assert_eq!(now.len(), per_round - 1);
        assert!(!now.iter().any(|f| f.key() == victim.key()));
        assert!(now.contains(&modified));
    });
}

#[test]
fn reconnects_after_vswitchd_restart_and_signals_replay() {
    let _cpu = shared_cpu();
    let mut ovs = OvsInstance::start().unwrap();
    let rt = runtime();
    let (bridge, client) = rt.block_on(bridge_with_client(&ovs));
    let mods: Vec<FlowMod> = policy_like_flows(9).into_iter().map(FlowMod::Add).collect();
    rt.block_on(client.apply_bundle(&mods)).unwrap();
    let mut generation = client.connection_generation();
    assert_eq!(*generation.borrow_and_update(), 1);

    ovs.restart_vswitchd().unwrap();
    assert!(
        dump_flows(&ovs, &bridge).is_empty(),
        "a restarted switch has no flows"
    );

    rt.block_on(async {
        tokio::time::timeout(TIMEOUT, generation.changed())
            .await
            .expect("reconnected in time")
            .unwrap();
        assert_eq!(*generation.borrow(), 2);
        // The owner's replay.
        client.apply_bundle(&mods).await.unwrap();
        client.barrier().await.unwrap();
    });
    assert_eq!(dump_flows(&ovs, &bridge).len(), mods.len());
}

/// 10,000 distinct flows of the compiler's shape.
fn ten_thousand_flows() -> Vec<Flow> {
    (0..10_000u32)
        .map(|i| Flow {
            table: 10,
            priority: 200,
            cookie: 0x3_0000_0000 | u64::from(i),
            matches: Match {
                ipv4_src: Some(Masked::exact(Ipv4Addr::from(0x0a00_0000 | i))),
                in_port: Some(1 + i % 8),
                ..ip_match()
            },
            actions: vec![Action::Conjunction {
                id: 1 + i % 50,
                clause: 1,
                n_clauses: 2,
            }],
        })
        .collect()
}

#[test]
fn ten_thousand_flows_in_one_bundle_beat_ovs_ofctl() {
    let _exclusive = CPU.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    let ovs = OvsInstance::start().unwrap();
    runtime().block_on(async {
        let (ours, client) = bridge_with_client(&ovs).await;
        let theirs = unique_name("br");
        ovsdb(&ovs).await.create_bridge(&theirs).await.unwrap();
        let flows = ten_thousand_flows();

        let vswitchd = ovs.vswitchd_pid().unwrap();
        let encode_started = Instant::now();
        let encoded = sluice_openflow::encode_flow_mods(&flows).unwrap();
        let encode = encode_started.elapsed();
        println!(
            "encoding 10000 bundle-add flow mods ({} bytes): {encode:?}",
            encoded.len()
        );

        // Best of five rounds each (after one warm-up round), alternating who goes first, on a
        // machine shared with compilers: single timings are noisy.
        let (mut native_best, mut ofctl_best) = (Duration::MAX, Duration::MAX);
        for round in 0..6 {
            let native = async {
                let cpu = main_thread_cpu(vswitchd);
                let started = Instant::now();
                client.add_flows(&flows).await.unwrap();
                (started.elapsed(), main_thread_cpu(vswitchd) - cpu)
            };
            let ofctl = || {
                let cpu = main_thread_cpu(vswitchd);
                let (took, own_cpu) = ofctl_bundle_add(&ovs, &theirs, &flows);
                (took, main_thread_cpu(vswitchd) - cpu, own_cpu)
            };
            let ((native, native_switch), (ofctl, ofctl_switch, ofctl_cpu)) = if round % 2 == 0 {
                let native = native.await;
                (native, ofctl())
            } else {
                let ofctl = ofctl();
                (native.await, ofctl)
            };
            println!(
                "round {round}: native {native:?} (ovs-vswitchd main thread on CPU \
                 {native_switch:?}), ovs-ofctl {ofctl:?} (ovs-vswitchd {ofctl_switch:?}, \
                 ovs-ofctl itself {ofctl_cpu:?})"
            );
            if round > 0 {
                native_best = native_best.min(native);
                ofctl_best = ofctl_best.min(ofctl);
            }

            assert_eq!(client.flow_stats(0, 0).await.unwrap().len(), flows.len());
            assert_eq!(dump_flows(&ovs, &theirs).len(), flows.len());
            assert_eq!(dump_flows(&ovs, &ours).len(), flows.len());
            client
                .apply_bundle(&[FlowMod::DeleteByCookie {
                    table: None,
                    cookie: 0,
                    cookie_mask: 0,
                }])
                .await
                .unwrap();
            ovs.ovs_ofctl(&["-O", "OpenFlow14", "del-flows", &theirs])
                .unwrap();
        }
        let ratio = ofctl_best.as_secs_f64() / native_best.as_secs_f64();
        println!(
            "10000 flows in one bundle (best of 5): native client {native_best:?}, \
             ovs-ofctl --bundle add-flows {ofctl_best:?}, ratio {ratio:.2}x"
        );
        assert!(
            native_best <= ofctl_best,
            "native {native_best:?} slower than ovs-ofctl {ofctl_best:?}"
        );
    });
}

#[test]
fn works_over_openflow_1_3_with_the_onf_bundle_extension() {
    let _cpu = shared_cpu();
    let ovs = OvsInstance::start().unwrap();
    runtime().block_on(async {
        let bridge = unique_name("br");
        ovsdb(&ovs).await.create_bridge(&bridge).await.unwrap();
        ovs.ovs_vsctl(&["set", "Bridge", &bridge, "protocols=OpenFlow13"])
            .unwrap();
        let client = OpenFlowClient::connect(ovs.mgmt_socket(&bridge), ClientConfig::default())
            .await
            .unwrap();
        assert_eq!(client.version().unwrap(), sluice_openflow::OFP13);

        let flows = policy_like_flows(0x13);
        client.add_flows(&flows).await.unwrap();
        let mut read_back: Vec<Flow> = client
            .flow_stats(0, 0)
            .await
            .unwrap()
            .iter()
            .filter_map(|stats| stats.flow())
            .collect();
        read_back.sort();
        let mut expected = flows.clone();
        expected.sort();
        assert_eq!(read_back, expected);

        // Rollback works the same through the extension.
        let bad = FlowMod::Add(Flow {
            table: 0,
            priority: 9,
            cookie: 0x14,
            matches: Match {
                tcp_dst: Some(Masked::exact(22)),
                ..Match::default()
            },
            actions: vec![],
        });
        let good = FlowMod::DeleteByCookie {
            table: None,
            cookie: 0,
            cookie_mask: 0,
        };
        let error = client.apply_bundle(&[good, bad]).await.unwrap_err();
        assert!(
            matches!(error, ClientError::BundleRejected { index: 1, .. }),
            "{error}"
        );
        assert_eq!(client.flow_stats(0, 0).await.unwrap().len(), flows.len());
    });
}
