use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use super::fake::{FakeHost, FakeLink, World};
use super::*;
use crate::record::{RouteSpec, KEY_INTERNAL, KEY_UPLINK};

const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];

fn run<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(future)
}

fn route(dst: &str, gateway: &str, metric: Option<u32>, src: Option<&str>) -> RouteSpec {
    RouteSpec {
        dst: dst.parse().unwrap(),
        gateway: Some(gateway.parse().unwrap()),
        metric,
        scope: 0,
        protocol: 4,
        src: src.map(|s| s.parse().unwrap()),
    }
}

/// A VM: `eth0` (MTU 9000) with an IPv4 and an IPv6 address, their connected routes, two
/// default routes and one more route via a gateway; bridge `br0` on the userspace datapath.
fn vm() -> World {
    let mut world = World::default();
    world.bridges.insert("br0".into(), "netdev".into());
    let eth0 = FakeLink {
        index: 2,
        mac: MAC,
        mtu: 9000,
        up: false,
        tx_checksum: true,
        isolation: crate::Isolation {
            rp_filter: 2,
            arp_ignore: 0,
            disable_ipv6: 0,
        },
        addresses: BTreeSet::new(),
        routes: BTreeMap::new(),
    };
    world.links.insert("eth0".into(), eth0);
    let mut host = FakeHost::new(world);
    run(async {
        for op in [
            Op::AddAddress {
                link: "eth0".into(),
                address: "10.0.0.2/24".parse().unwrap(),
                broadcast: true,
            },
            Op::AddAddress {
                link: "eth0".into(),
                address: "2001:db8::2/64".parse().unwrap(),
                broadcast: false,
            },
            Op::LinkUp {
                link: "eth0".into(),
            },
            Op::AddRoute {
                link: "eth0".into(),
                route: route("0.0.0.0/0", "10.0.0.1", None, None),
            },
            Op::AddRoute {
                link: "eth0".into(),
                route: route("::/0", "2001:db8::1", Some(1024), None),
            },
            Op::AddRoute {
                link: "eth0".into(),
                route: route("10.9.0.0/16", "10.0.0.254", Some(100), Some("10.0.0.2")),
            },
        ] {
            host.apply(&op).await.unwrap();
        }
    });
    assert_eq!(host.world.links["eth0"].routes.len(), 5);
    host.world
}

fn taken_over_world() -> (World, TakenOver) {
    let mut host = FakeHost::new(vm());
    let taken = run(take_over_on(&mut host, "br0", "eth0")).unwrap();
    (host.world, taken)
}

#[test]
fn the_takeover_moves_name_mac_mtu_addresses_and_routes_to_the_internal_port() {
    let before = vm();
    let (world, taken) = taken_over_world();
    let renamed = &world.links["eth0~"];
    assert_eq!(renamed.index, 2, "the uplink device itself is renamed");
    assert!(renamed.addresses.is_empty() && renamed.routes.is_empty());
    assert!(renamed.up);
    let internal = &world.links["eth0"];
    assert_ne!(internal.index, 2);
    assert_eq!((internal.mac, internal.mtu, internal.up), (MAC, 9000, true));
    assert!(
        !internal.tx_checksum,
        "netdev datapath: checksum offload must be off"
    );
    assert_eq!(internal.addresses, before.links["eth0"].addresses);
    assert_eq!(internal.routes, before.links["eth0"].routes);
    let (bridge, port) = &world.ports["eth0~"];
    assert_eq!(
        (bridge.as_str(), port.external_ids[KEY_UPLINK].as_str()),
        ("br0", "eth0")
    );
    assert_eq!(world.ports["eth0"].1.external_ids[KEY_INTERNAL], "eth0");
    assert_eq!(taken.uplink, "eth0");
    assert_eq!(taken.renamed, "eth0~");
    assert_eq!((taken.mac, taken.mtu), (MAC, 9000));
    assert_eq!(
        (taken.uplink_ofport, taken.internal_ofport),
        (2, internal.index)
    );
    assert_eq!(taken.addresses.len(), 2);
    assert_eq!(taken.routes.len(), 5);
}

#[test]
fn a_failure_at_any_operation_leaves_the_host_as_it_was() {
    let mut host = FakeHost::new(vm());
    run(take_over_on(&mut host, "br0", "eth0")).unwrap();
    let operations = host.applied.len();
    assert!(operations > 20, "{:#?}", host.applied);
    for fail_at in 0..operations {
        if host.applied[fail_at].is_best_effort() {
            continue; // a_failed_announcement_keeps_the_takeover
        }
        let mut host = FakeHost::new(vm());
        host.fail_at = Some(fail_at);
        let error = run(take_over_on(&mut host, "br0", "eth0")).unwrap_err();
        let UplinkError::Step { step, rollback, .. } = &error else {
            panic!("failing operation {fail_at}: {error}");
        };
        assert_eq!(
            *rollback,
            Rollback::Complete,
            "operation {fail_at}, step {step}"
        );
        assert_eq!(
            host.world,
            vm(),
            "failing operation {fail_at} ({step}): not rolled back"
        );
        assert!(error.to_string().contains(step.as_str()));
    }
}

#[test]
fn a_second_takeover_changes_nothing_and_recover_rebuilds_the_same_value() {
    let (world, taken) = taken_over_world();
    let mut host = FakeHost::new(world.clone());
    let again = run(take_over_on(&mut host, "br0", "eth0")).unwrap();
    assert_eq!(again, taken);
    assert!(host.applied.is_empty(), "{:?}", host.applied);
    assert_eq!(host.world, world);
    // As after an agent restart: only OVSDB and the links to go by.
    let recovered = run(recover_on(&mut host, "br0")).unwrap();
    assert_eq!(recovered, Some(taken));
    let mut fresh = FakeHost::new(vm());
    assert_eq!(run(recover_on(&mut fresh, "br0")).unwrap(), None);
}

#[test]
fn a_half_done_takeover_is_repaired() {
    let (world, taken) = taken_over_world();
    // The internal port lost its addresses (and with them its routes).
    let mut host = FakeHost::new(world.clone());
    run(async {
        for address in &taken.addresses {
            let op = Op::DelAddress {
                link: "eth0".into(),
                address: *address,
            };
            host.apply(&op).await.unwrap();
        }
    });
    assert!(host.world.links["eth0"].addresses.is_empty());
    host.applied.clear();
    assert_eq!(run(take_over_on(&mut host, "br0", "eth0")).unwrap(), taken);
    assert_eq!(host.world, world);

    // The internal port is gone altogether (e.g. deleted by hand): it is re-created.
    let mut host = FakeHost::new(world.clone());
    run(host.apply(&Op::DelPort {
        bridge: "br0".into(),
        name: "eth0".into(),
        kind: sluice_ovs::PortKind::Internal,
    }))
    .unwrap();
    let repaired = run(take_over_on(&mut host, "br0", "eth0")).unwrap();
    let internal = &host.world.links["eth0"];
    assert_eq!(
        (
            internal.mac,
            internal.mtu,
            internal.up,
            internal.tx_checksum
        ),
        (MAC, 9000, true, false)
    );
    assert_eq!(internal.routes, world.links["eth0"].routes);
    assert_eq!(repaired.internal_ofport, internal.index);
}

#[test]
fn an_uplink_renamed_but_not_recorded_is_taken_over_from_scratch() {
    // The agent died right after the rename: eth0~ exists (up again, routes gone), no Port.
    let mut host = FakeHost::new(vm());
    run(async {
        for op in [
            Op::LinkDown {
                link: "eth0".into(),
            },
            Op::Rename {
                from: "eth0".into(),
                to: "eth0~".into(),
            },
            Op::LinkUp {
                link: "eth0~".into(),
            },
        ] {
            host.apply(&op).await.unwrap();
        }
    });
    let taken = run(take_over_on(&mut host, "br0", "eth0")).unwrap();
    assert_eq!(
        (taken.uplink.as_str(), taken.renamed.as_str()),
        ("eth0", "eth0~")
    );
    let internal = &host.world.links["eth0"];
    assert_eq!(
        internal.addresses,
        vm().links["eth0"]
            .addresses
            .iter()
            .filter(|a| a.addr().is_ipv4())
            .copied()
            .collect()
    );
    assert!(host.world.ports.contains_key("eth0~"));
}

#[test]
fn restore_is_the_exact_reverse_and_rolls_back_at_any_operation() {
    let (world, _) = taken_over_world();
    let mut host = FakeHost::new(world.clone());
    run(restore_on(&mut host, "br0", "eth0")).unwrap();
    assert_eq!(host.world, vm(), "restore must give back the VM as it was");
    for (fail_at, op) in host.applied.clone().iter().enumerate() {
        if op.is_best_effort() {
            continue; // a_failed_announcement_keeps_the_takeover
        }
        let mut host = FakeHost::new(world.clone());
        host.fail_at = Some(fail_at);
        let error = run(restore_on(&mut host, "br0", "eth0")).unwrap_err();
        assert!(
            matches!(
                &error,
                UplinkError::Step {
                    rollback: Rollback::Complete,
                    ..
                }
            ),
            "{error}"
        );
        assert_eq!(host.world, world, "failing operation {fail_at}: {error}");
    }
    // Nothing taken over: nothing to do.
    let mut host = FakeHost::new(vm());
    run(restore_on(&mut host, "br0", "eth0")).unwrap();
    assert!(host.applied.is_empty());
}

/// The operations announcing the addresses in `applied`, by position.
fn announcements_in(applied: &[Op]) -> Vec<(usize, Op)> {
    let ops = applied.iter().cloned().enumerate();
    ops.filter(|(_, op)| op.is_best_effort()).collect()
}

#[test]
fn the_moves_are_announced_last_from_the_uplinks_mac() {
    let addresses = || {
        let links = vm().links;
        let addresses = links["eth0"].addresses.iter().map(|a| a.addr()).collect();
        Op::Announce {
            link: "eth0".into(),
            mac: MAC,
            addresses,
        }
    };
    let mut host = FakeHost::new(vm());
    run(take_over_on(&mut host, "br0", "eth0")).unwrap();
    let last = host.applied.len() - 1;
    assert_eq!(announcements_in(&host.applied), [(last, addresses())]);
    let taken = host.world.clone();
    // The restore drops carrier too (the renamed uplink goes down): announced again.
    host.applied.clear();
    run(restore_on(&mut host, "br0", "eth0")).unwrap();
    let last = host.applied.len() - 1;
    assert_eq!(announcements_in(&host.applied), [(last, addresses())]);
    // A repair that moves the addresses back announces them; one with nothing to do does not.
    let mut host = FakeHost::new(taken.clone());
    run(host.apply(&Op::DelPort {
        bridge: "br0".into(),
        name: "eth0".into(),
        kind: sluice_ovs::PortKind::Internal,
    }))
    .unwrap();
    host.applied.clear();
    run(take_over_on(&mut host, "br0", "eth0")).unwrap();
    assert_eq!(announcements_in(&host.applied).len(), 1);
    assert_eq!(host.world, taken);
    host.applied.clear();
    run(take_over_on(&mut host, "br0", "eth0")).unwrap();
    assert_eq!(host.applied, []);
}

#[test]
fn a_failed_announcement_keeps_the_takeover_and_is_counted() {
    let mut host = FakeHost::new(vm());
    let taken = run(take_over_on(&mut host, "br0", "eth0")).unwrap();
    let world = host.world.clone();
    let [(announce_at, _)] = announcements_in(&host.applied)[..] else {
        panic!("one announcement: {:#?}", host.applied);
    };
    let before = crate::announcements();
    let mut host = FakeHost::new(vm());
    host.fail_at = Some(announce_at);
    assert_eq!(run(take_over_on(&mut host, "br0", "eth0")).unwrap(), taken);
    assert_eq!(host.world, world, "taken over, nothing rolled back");
    // Other tests may count at the same time: only ever up.
    assert!(crate::announcements().failed > before.failed);
    // The same in a restore.
    let mut host = FakeHost::new(world.clone());
    run(restore_on(&mut host, "br0", "eth0")).unwrap();
    let [(announce_at, _)] = announcements_in(&host.applied)[..] else {
        panic!("one announcement: {:#?}", host.applied);
    };
    let mut host = FakeHost::new(world);
    host.fail_at = Some(announce_at);
    let before = crate::announcements();
    run(restore_on(&mut host, "br0", "eth0")).unwrap();
    assert_eq!(host.world, vm(), "restored, nothing rolled back");
    assert!(crate::announcements().failed > before.failed);
}

#[test]
fn refusals_happen_before_any_change() {
    let mut host = FakeHost::new(vm());
    let error = run(take_over_on(&mut host, "br0", "enp0s31f6abcdef")).unwrap_err();
    assert!(
        matches!(error, UplinkError::NameTooLong { max: 15, .. }),
        "{error}"
    );
    let error = run(take_over_on(&mut host, "nobridge", "eth0")).unwrap_err();
    assert!(matches!(error, UplinkError::Observe { .. }), "{error}");
    let error = run(take_over_on(&mut host, "br0", "eth9")).unwrap_err();
    assert!(matches!(error, UplinkError::NoSuchUplink(_)), "{error}");
    assert!(host.applied.is_empty());
    assert_eq!(host.world, vm());
}

#[test]
fn an_undo_that_fails_is_reported_as_an_incomplete_rollback() {
    let mut host = FakeHost::new(vm());
    run(take_over_on(&mut host, "br0", "eth0")).unwrap();
    let add_internal = host
        .applied
        .iter()
        .position(|op| matches!(op, Op::AddPort { port, .. } if port.name == "eth0"))
        .unwrap();
    let mut host = FakeHost::new(vm());
    // Fail the internal port's creation, then the first undo after it (deleting eth0~'s port
    // is idempotent in the fake, so the rename back is the one that fails next... any undo).
    host.fail_at = Some(add_internal);
    let error = run(take_over_on(&mut host, "br0", "eth0")).unwrap_err();
    assert_eq!(error.step(), Some("add internal port eth0 to bridge br0"));
    let mut host = FakeHost::new(vm());
    host.fail_at = Some(add_internal);
    // A second failure: wrap the host so the operation right after fails too.
    struct Twice(FakeHost, usize);
    impl Host for Twice {
        async fn link(&mut self, name: &str) -> Result<Option<LinkState>, HostError> {
            self.0.link(name).await
        }
        async fn bridge_ports(&mut self, bridge: &str) -> Result<Vec<PortRecord>, HostError> {
            self.0.bridge_ports(bridge).await
        }
        async fn datapath_type(&mut self, bridge: &str) -> Result<String, HostError> {
            self.0.datapath_type(bridge).await
        }
        async fn ofport(&mut self, name: &str) -> Result<u32, HostError> {
            self.0.ofport(name).await
        }
        async fn apply(&mut self, op: &Op) -> Result<(), HostError> {
            if self.0.applied.len() == self.1 {
                self.0.applied.push(op.clone());
                return Err(HostError::Invalid("second failure".into()));
            }
            self.0.apply(op).await
        }
    }
    let mut twice = Twice(host, add_internal + 1);
    let error = run(take_over_on(&mut twice, "br0", "eth0")).unwrap_err();
    let UplinkError::Step {
        rollback: Rollback::Incomplete(failures),
        ..
    } = &error
    else {
        panic!("{error}");
    };
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(error.to_string().contains("rollback incomplete"), "{error}");
}
