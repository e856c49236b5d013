use super::*;
use crate::record::KEY_UPLINK;

fn uplink() -> LinkState {
    let route = |dst: &str, gateway: Option<&str>| RouteSpec {
        dst: dst.parse().unwrap(),
        gateway: gateway.map(|g| g.parse().unwrap()),
        metric: None,
        scope: if gateway.is_some() { 0 } else { 253 },
        protocol: 2,
        src: None,
    };
    LinkState {
        name: "eth0".into(),
        index: 2,
        mac: [2, 0, 0, 0, 0, 1],
        mtu: 1450,
        up: true,
        tx_checksum: true,
        isolation: Isolation::DEFAULT,
        addresses: vec!["10.0.0.2/24".parse().unwrap()],
        without_broadcast: vec![],
        // Listed default first: the plan must not rely on the kernel's order.
        routes: vec![
            route("0.0.0.0/0", Some("10.0.0.1")),
            route("10.0.0.0/24", None),
        ],
    }
}

fn position(steps: &[Step], name: &str) -> usize {
    steps
        .iter()
        .position(|s| s.name == name)
        .unwrap_or_else(|| {
            panic!(
                "no step `{name}` in {:#?}",
                steps.iter().map(|s| &s.name).collect::<Vec<_>>()
            )
        })
}

#[test]
fn the_takeover_renames_while_down_and_moves_routes_around_the_addresses() {
    let steps = takeover(&uplink(), "eth0~", "br0", true);
    let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names[..3],
        [
            "set uplink eth0 down",
            "rename eth0 to eth0~",
            "set eth0~ up"
        ]
    );
    let order = [
        "add eth0~ to bridge br0",
        "add internal port eth0 to bridge br0",
        "set the MTU of internal port eth0 to 1450",
        "turn TX checksum offload off on eth0",
        "set eth0 up",
        "delete route 0.0.0.0/0 from eth0~",
        "delete route 10.0.0.0/24 from eth0~",
        "delete address 10.0.0.2/24 from eth0~",
        "add address 10.0.0.2/24 to eth0",
        "add route 10.0.0.0/24 to eth0",
        "add route 0.0.0.0/0 to eth0",
        "keep the VM's stack off eth0~",
        "announce the addresses of eth0",
    ];
    let positions: Vec<usize> = order.iter().map(|name| position(&steps, name)).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{names:#?}");
    assert_eq!(positions.last(), Some(&(steps.len() - 1)));
    // The uplink port carries the record; the internal port the MAC.
    let Op::AddPort { port, .. } = &steps[position(&steps, order[0])].op else {
        panic!()
    };
    assert_eq!(port.external_ids[KEY_UPLINK], "eth0");
    let Op::AddPort { port, .. } = &steps[position(&steps, order[1])].op else {
        panic!()
    };
    assert_eq!(port.mac.as_deref(), Some("02:00:00:00:00:01"));
}

#[test]
fn the_kernel_datapath_needs_neither_the_checksum_nor_the_isolation_step() {
    let steps = takeover(&uplink(), "eth0~", "br0", false);
    assert!(!steps
        .iter()
        .any(|s| matches!(s.op, Op::TxChecksumOff { .. } | Op::SetIsolation { .. })));
}

#[test]
fn undoing_down_puts_back_what_the_kernel_drops() {
    let steps = takeover(&uplink(), "eth0~", "br0", true);
    let undo = &steps[0].undo;
    assert_eq!(
        undo[0],
        Op::LinkUp {
            link: "eth0".into()
        }
    );
    assert!(matches!(
        &undo[1],
        Op::AddAddress {
            broadcast: true,
            ..
        }
    ));
    // Connected route before the default route that needs it.
    assert!(matches!(&undo[2], Op::AddRoute { route, .. } if route.gateway.is_none()));
    assert!(matches!(&undo[3], Op::AddRoute { route, .. } if route.gateway.is_some()));
}

#[test]
fn restore_gives_the_sysctls_back_first_and_renames_after_unbridging() {
    let state = uplink();
    let record = UplinkRecord::of(&state, "eth0~");
    let renamed = LinkState {
        name: "eth0~".into(),
        isolation: Isolation::ISOLATED,
        addresses: vec![],
        routes: vec![],
        ..state
    };
    let steps = restore(&record, &renamed, "br0", true);
    assert_eq!(steps[0].name, "give eth0~ its sysctls back");
    assert_eq!(
        steps[0].undo,
        [Op::SetIsolation {
            link: "eth0~".into(),
            isolation: Isolation::ISOLATED
        }]
    );
    let unbridge = position(&steps, "delete eth0~ from bridge br0");
    assert!(position(&steps, "delete internal port eth0 from bridge br0") < unbridge);
    assert!(unbridge < position(&steps, "rename eth0~ to eth0"));
    let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names[names.len() - 2..],
        [
            "add route 0.0.0.0/0 to eth0",
            "announce the addresses of eth0"
        ]
    );
}

#[test]
fn the_announcement_names_every_moved_address_and_undoes_nothing() {
    let mut state = uplink();
    state.addresses.push("2001:db8::2/64".parse().unwrap());
    let steps = takeover(&state, "eth0~", "br0", false);
    let last = steps.last().unwrap();
    let addresses = ["10.0.0.2", "2001:db8::2"].map(|a| a.parse().unwrap());
    assert_eq!(
        last.op,
        Op::Announce {
            link: "eth0".into(),
            mac: [2, 0, 0, 0, 0, 1],
            addresses: addresses.to_vec(),
        }
    );
    assert!(last.op.is_best_effort() && last.undo.is_empty());
    // Nothing to announce without addresses.
    state.addresses.clear();
    let steps = takeover(&state, "eth0~", "br0", false);
    assert!(!steps.iter().any(|s| s.op.is_best_effort()));
}
