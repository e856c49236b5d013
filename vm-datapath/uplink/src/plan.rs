//! The takeover, its repair and its reverse as data: the observed state in, an ordered list of
//! named [`Step`]s out, each with the operations that undo it. Pure: the executor
//! (`takeover.rs`) runs the steps on a host and, on a failure, the undos in reverse.
//!
//! Every operation is idempotent on the host (adding what exists or deleting what is gone
//! succeeds), because the kernel itself removes things behind our back: setting a link down
//! drops its routes and its IPv6 addresses, removing a link's last IPv4 address drops its IPv4
//! routes. So the undo of "down" re-adds all of them, and later deletes may find nothing to do.

use std::net::IpAddr;

use ipnet::IpNet;
use sluice_ovs::{NewPort, PortKind};

use crate::isolation::Isolation;
use crate::record::{
    format_mac, routes_in_add_order, LinkState, RouteSpec, UplinkRecord, KEY_INTERNAL,
};

/// One primitive host operation. Links are named, not indexed: renames and re-created ports
/// change what a name's index is, so the host resolves names when it applies an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    LinkUp {
        link: String,
    },
    LinkDown {
        link: String,
    },
    Rename {
        from: String,
        to: String,
    },
    SetMtu {
        link: String,
        mtu: u32,
    },
    SetMac {
        link: String,
        mac: [u8; 6],
    },
    /// Sets the sysctls that keep the VM's stack off a bridged device (see `isolation.rs`).
    SetIsolation {
        link: String,
        isolation: Isolation,
    },
    /// Turns TX checksum offload off (see `ethtool.rs` for why).
    TxChecksumOff {
        link: String,
    },
    /// `broadcast`: with the subnet's broadcast address (IPv4), as the kernel reports it for
    /// most addresses but not for one added without `brd`.
    AddAddress {
        link: String,
        address: IpNet,
        broadcast: bool,
    },
    DelAddress {
        link: String,
        address: IpNet,
    },
    AddRoute {
        link: String,
        route: RouteSpec,
    },
    DelRoute {
        link: String,
        route: RouteSpec,
    },
    /// Adds the port; an internal one is done when its device exists.
    AddPort {
        bridge: String,
        port: NewPort,
    },
    /// Deletes the port; an internal one is done when its device is gone.
    DelPort {
        bridge: String,
        name: String,
        kind: PortKind,
    },
    /// Announces `addresses` at `mac` on `link` (see `announce.rs`). Best effort: a failure
    /// is counted, not rolled back, since the move itself is done.
    Announce {
        link: String,
        mac: [u8; 6],
        addresses: Vec<IpAddr>,
    },
}

impl Op {
    /// Whether a failure of this operation leaves the plan standing (no rollback).
    pub fn is_best_effort(&self) -> bool {
        matches!(self, Op::Announce { .. })
    }
}

/// A named step: what to do and how to undo it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub name: String,
    pub op: Op,
    /// Applied in order when a later step fails; empty when an earlier step's undo makes it
    /// moot (e.g. settings of a port whose undo deletes the port).
    pub undo: Vec<Op>,
}

fn step(name: String, op: Op, undo: Vec<Op>) -> Step {
    Step { name, op, undo }
}

fn add_routes(link: &str, routes: &[RouteSpec]) -> Vec<Op> {
    routes_in_add_order(routes)
        .into_iter()
        .map(|route| Op::AddRoute {
            link: link.to_string(),
            route,
        })
        .collect()
}

fn add_address(link: &str, address: IpNet, record: &UplinkRecord) -> Op {
    Op::AddAddress {
        link: link.to_string(),
        address,
        broadcast: !record.without_broadcast.contains(&address),
    }
}

fn add_addresses(link: &str, record: &UplinkRecord) -> Vec<Op> {
    record
        .addresses
        .iter()
        .map(|address| add_address(link, *address, record))
        .collect()
}

/// The port the takeover adds for the renamed uplink: its `external_ids` carry the record.
pub fn uplink_port(record: &UplinkRecord) -> NewPort {
    NewPort {
        name: record.renamed.clone(),
        kind: PortKind::System,
        mac: None,
        external_ids: record.external_ids(),
    }
}

/// The internal port that takes the uplink's name and MAC.
pub fn internal_port(record: &UplinkRecord) -> NewPort {
    NewPort {
        name: record.uplink.clone(),
        kind: PortKind::Internal,
        mac: Some(format_mac(&record.mac)),
        external_ids: [(KEY_INTERNAL.to_string(), record.uplink.clone())].into(),
    }
}

/// The operations that make a fresh internal port usable: MTU, checksum offload off on the
/// userspace datapath, up.
fn internal_settings(record: &UplinkRecord, netdev: bool) -> Vec<(String, Op)> {
    let link = &record.uplink;
    let mut ops = vec![(
        format!("set the MTU of internal port {link} to {}", record.mtu),
        Op::SetMtu {
            link: link.clone(),
            mtu: record.mtu,
        },
    )];
    if netdev {
        ops.push((
            format!("turn TX checksum offload off on {link}"),
            Op::TxChecksumOff { link: link.clone() },
        ));
    }
    ops.push((format!("set {link} up"), Op::LinkUp { link: link.clone() }));
    ops
}

/// Moves the routes and addresses from `from` to `to`: routes out of `from` (default first),
/// its addresses, then the addresses onto `to` and its routes (default last). Removing before
/// adding is what the kernel needs (one connected route per prefix and metric) and keeps the
/// gap to the few microseconds between two netlink requests.
fn move_addresses(record: &UplinkRecord, from: &str, to: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    for route in routes_in_add_order(&record.routes).into_iter().rev() {
        steps.push(step(
            format!("delete route {} from {from}", route.dst),
            Op::DelRoute {
                link: from.into(),
                route: route.clone(),
            },
            vec![Op::AddRoute {
                link: from.into(),
                route,
            }],
        ));
    }
    for address in &record.addresses {
        steps.push(step(
            format!("delete address {address} from {from}"),
            Op::DelAddress {
                link: from.into(),
                address: *address,
            },
            vec![add_address(from, *address, record)],
        ));
    }
    for address in &record.addresses {
        steps.push(step(
            format!("add address {address} to {to}"),
            add_address(to, *address, record),
            vec![Op::DelAddress {
                link: to.into(),
                address: *address,
            }],
        ));
    }
    for route in routes_in_add_order(&record.routes) {
        steps.push(step(
            format!("add route {} to {to}", route.dst),
            Op::AddRoute {
                link: to.into(),
                route: route.clone(),
            },
            vec![Op::DelRoute {
                link: to.into(),
                route,
            }],
        ));
    }
    steps
}

/// The takeover of the observed uplink `state` onto `bridge` (`netdev`: the bridge is on the
/// userspace datapath).
pub fn takeover(state: &LinkState, renamed: &str, bridge: &str, netdev: bool) -> Vec<Step> {
    let record = UplinkRecord::of(state, renamed);
    let uplink = &record.uplink;
    // Setting the uplink down drops its routes and IPv6 addresses: undoing it puts them back.
    let mut restore_uplink = vec![Op::LinkUp {
        link: uplink.clone(),
    }];
    restore_uplink.extend(add_addresses(uplink, &record));
    restore_uplink.extend(add_routes(uplink, &record.routes));
    let mut steps = vec![
        step(
            format!("set uplink {uplink} down"),
            Op::LinkDown {
                link: uplink.clone(),
            },
            restore_uplink,
        ),
        step(
            format!("rename {uplink} to {renamed}"),
            Op::Rename {
                from: uplink.clone(),
                to: renamed.into(),
            },
            vec![Op::Rename {
                from: renamed.into(),
                to: uplink.clone(),
            }],
        ),
        step(
            format!("set {renamed} up"),
            Op::LinkUp {
                link: renamed.into(),
            },
            vec![Op::LinkDown {
                link: renamed.into(),
            }],
        ),
    ];
    // The VM keeps talking through the renamed uplink (the kernel still owns it) until the
    // addresses move: put back what "down" dropped.
    for address in &record.addresses {
        steps.push(step(
            format!("keep address {address} on {renamed}"),
            add_address(renamed, *address, &record),
            vec![],
        ));
    }
    for route in routes_in_add_order(&record.routes) {
        steps.push(step(
            format!("keep route {} on {renamed}", route.dst),
            Op::AddRoute {
                link: renamed.into(),
                route,
            },
            vec![],
        ));
    }
    steps.push(step(
        format!("add {renamed} to bridge {bridge}"),
        Op::AddPort {
            bridge: bridge.into(),
            port: uplink_port(&record),
        },
        vec![Op::DelPort {
            bridge: bridge.into(),
            name: renamed.into(),
            kind: PortKind::System,
        }],
    ));
    steps.extend(internal_port_steps(&record, bridge, netdev));
    steps.extend(move_addresses(&record, renamed, uplink));
    if netdev {
        steps.push(isolate(renamed, record.isolation));
    }
    steps.extend(announce(&record, uplink));
    steps
}

/// Tells the neighbours where the addresses are now: last, once everything is in place.
/// Nothing to undo (see [`Op::Announce`]); `None` without addresses.
fn announce(record: &UplinkRecord, link: &str) -> Option<Step> {
    let addresses: Vec<IpAddr> = record.addresses.iter().map(IpNet::addr).collect();
    let op = Op::Announce {
        link: link.into(),
        mac: record.mac,
        addresses,
    };
    (!record.addresses.is_empty())
        .then(|| step(format!("announce the addresses of {link}"), op, vec![]))
}

/// Keeps the VM's stack off the bridged uplink (userspace datapath only: see `isolation.rs`);
/// last, because IPv6 addresses cannot stay on a device with IPv6 off.
fn isolate(renamed: &str, current: Isolation) -> Step {
    step(
        format!("keep the VM's stack off {renamed}"),
        Op::SetIsolation {
            link: renamed.into(),
            isolation: Isolation::ISOLATED,
        },
        vec![Op::SetIsolation {
            link: renamed.into(),
            isolation: current,
        }],
    )
}

/// [`isolate`] when a repair finds the renamed uplink without it.
fn isolate_if_needed(renamed: Option<&LinkState>, netdev: bool) -> Option<Step> {
    let renamed = renamed.filter(|link| netdev && link.isolation != Isolation::ISOLATED)?;
    Some(isolate(&renamed.name, renamed.isolation))
}

/// Adds the internal port and makes it usable.
fn internal_port_steps(record: &UplinkRecord, bridge: &str, netdev: bool) -> Vec<Step> {
    let uplink = &record.uplink;
    let mut steps = vec![step(
        format!("add internal port {uplink} to bridge {bridge}"),
        Op::AddPort {
            bridge: bridge.into(),
            port: internal_port(record),
        },
        vec![Op::DelPort {
            bridge: bridge.into(),
            name: uplink.clone(),
            kind: PortKind::Internal,
        }],
    )];
    // Undone by deleting the port.
    steps.extend(
        internal_settings(record, netdev)
            .into_iter()
            .map(|(name, op)| step(name, op, vec![])),
    );
    steps
}

fn up(link: &str) -> Op {
    Op::LinkUp { link: link.into() }
}

fn down(link: &str) -> Op {
    Op::LinkDown { link: link.into() }
}

fn del_port(bridge: &str, name: &str, kind: PortKind) -> Op {
    let (bridge, name) = (bridge.into(), name.into());
    Op::DelPort { bridge, name, kind }
}

fn add_port(bridge: &str, port: NewPort) -> Op {
    let bridge = bridge.into();
    Op::AddPort { bridge, port }
}

/// Renames back an uplink found renamed but not recorded (the agent died between the rename
/// and adding the port that carries the record): the takeover then starts over from it.
pub fn unrename(uplink: &str, renamed: &str) -> Vec<Step> {
    let rename = |from: &str, to: &str| Op::Rename {
        from: from.into(),
        to: to.into(),
    };
    vec![
        step(
            format!("set {renamed} down"),
            down(renamed),
            vec![up(renamed)],
        ),
        step(
            format!("rename {renamed} back to {uplink}"),
            rename(renamed, uplink),
            vec![rename(uplink, renamed)],
        ),
    ]
}

/// Completes a takeover found half-done (e.g. the agent died mid-way): only what is missing.
/// `internal_port` says whether OVSDB has the internal Port, `internal` is its device.
pub fn repair(
    record: &UplinkRecord,
    bridge: &str,
    netdev: bool,
    internal_port: bool,
    internal: Option<&LinkState>,
    renamed: Option<&LinkState>,
) -> Vec<Step> {
    let (uplink, renamed_name) = (&record.uplink, &record.renamed);
    let mut steps = Vec::new();
    match internal.filter(|_| internal_port) {
        Some(internal) => steps.extend(repair_internal(record, netdev, internal, renamed)),
        None => {
            if internal_port {
                // A Port row without its device: re-create both.
                steps.push(step(
                    format!("delete internal port {uplink} without a device"),
                    del_port(bridge, uplink, PortKind::Internal),
                    vec![add_port(bridge, self::internal_port(record))],
                ));
            }
            steps.extend(internal_port_steps(record, bridge, netdev));
            steps.extend(move_addresses(record, renamed_name, uplink));
        }
    }
    steps.extend(isolate_if_needed(renamed, netdev));
    // Addresses moved again (e.g. ovs-vswitchd re-created the internal port): announce them.
    if (steps.iter()).any(|s| matches!(&s.op, Op::AddAddress { link, .. } if link == uplink)) {
        steps.extend(announce(record, uplink));
    }
    steps
}

/// The repair of an internal port that exists: its settings, then the addresses and routes
/// it lacks.
fn repair_internal(
    record: &UplinkRecord,
    netdev: bool,
    internal: &LinkState,
    renamed: Option<&LinkState>,
) -> Vec<Step> {
    let uplink = &record.uplink;
    let mut steps = Vec::new();
    if internal.mtu != record.mtu {
        let (link, mtu) = (uplink.clone(), record.mtu);
        steps.push(step(
            format!("set the MTU of internal port {uplink} to {mtu}"),
            Op::SetMtu { link, mtu },
            vec![Op::SetMtu {
                link: uplink.clone(),
                mtu: internal.mtu,
            }],
        ));
    }
    if netdev && internal.tx_checksum {
        let op = Op::TxChecksumOff {
            link: uplink.clone(),
        };
        steps.push(step(
            format!("turn TX checksum offload off on {uplink}"),
            op,
            vec![],
        ));
    }
    if !internal.up {
        steps.push(step(
            format!("set {uplink} up"),
            up(uplink),
            vec![down(uplink)],
        ));
    }
    let have_route = |r: &RouteSpec| internal.routes.iter().any(|have| have.same_route(r));
    let missing = UplinkRecord {
        addresses: (record.addresses.iter())
            .filter(|a| !internal.addresses.contains(a))
            .copied()
            .collect(),
        routes: (record.routes.iter())
            .filter(|r| !have_route(r))
            .cloned()
            .collect(),
        ..record.clone()
    };
    let mut moves = move_addresses(&missing, &record.renamed, uplink);
    if renamed.is_none() {
        // Nothing to delete from a renamed uplink that is gone.
        moves.retain(|s| !matches!(s.op, Op::DelRoute { .. } | Op::DelAddress { .. }));
    }
    steps.extend(moves);
    steps
}

/// The reverse of a takeover: the addresses and routes back onto the renamed uplink, the
/// internal port deleted, the uplink out of the bridge, renamed back with its MTU and MAC,
/// up, its addresses and routes re-added. `renamed` is the renamed uplink as observed now.
pub fn restore(
    record: &UplinkRecord,
    renamed: &LinkState,
    bridge: &str,
    netdev: bool,
) -> Vec<Step> {
    let (uplink, renamed_name) = (&record.uplink, &record.renamed);
    // The uplink's own sysctls first: its IPv6 addresses need IPv6 back on.
    let sysctls = |isolation| Op::SetIsolation {
        link: renamed_name.clone(),
        isolation,
    };
    let mut steps = vec![step(
        format!("give {renamed_name} its sysctls back"),
        sysctls(record.isolation),
        vec![sysctls(renamed.isolation)],
    )];
    steps.extend(move_addresses(record, uplink, renamed_name));
    // Undoing the delete re-creates a usable internal port (addresses come back from the
    // undos of the moves above).
    let mut recreate = vec![add_port(bridge, internal_port(record))];
    recreate.extend(
        internal_settings(record, netdev)
            .into_iter()
            .map(|(_, op)| op),
    );
    steps.push(step(
        format!("delete internal port {uplink} from bridge {bridge}"),
        del_port(bridge, uplink, PortKind::Internal),
        recreate,
    ));
    steps.push(step(
        format!("delete {renamed_name} from bridge {bridge}"),
        del_port(bridge, renamed_name, PortKind::System),
        vec![add_port(bridge, uplink_port(record))],
    ));
    steps.extend(rename_back(record, renamed));
    // Setting the renamed uplink down dropped carrier on the other end, as the takeover did.
    steps.extend(announce(record, uplink));
    steps
}

/// The renamed uplink, out of the bridge, back to its name, MTU and MAC, up, with its
/// addresses and routes.
fn rename_back(record: &UplinkRecord, renamed: &LinkState) -> Vec<Step> {
    let (uplink, renamed_name) = (&record.uplink, &record.renamed);
    let mut back_up = vec![up(renamed_name)];
    back_up.extend(add_addresses(renamed_name, record));
    back_up.extend(add_routes(renamed_name, &record.routes));
    let rename = |from: &String, to: &String| Op::Rename {
        from: from.clone(),
        to: to.clone(),
    };
    let mtu = |mtu| Op::SetMtu {
        link: uplink.clone(),
        mtu,
    };
    let mac = |mac| Op::SetMac {
        link: uplink.clone(),
        mac,
    };
    let mut steps = vec![
        step(
            format!("set {renamed_name} down"),
            down(renamed_name),
            back_up,
        ),
        step(
            format!("rename {renamed_name} to {uplink}"),
            rename(renamed_name, uplink),
            vec![rename(uplink, renamed_name)],
        ),
        step(
            format!("set the MTU of {uplink} to {}", record.mtu),
            mtu(record.mtu),
            vec![mtu(renamed.mtu)],
        ),
        step(
            format!("set the MAC of {uplink} to {}", format_mac(&record.mac)),
            mac(record.mac),
            vec![mac(renamed.mac)],
        ),
        step(format!("set {uplink} up"), up(uplink), vec![down(uplink)]),
    ];
    // Undone by the undo of "up" (down drops them) and of "down" above (re-adds them).
    for address in &record.addresses {
        let op = add_address(uplink, *address, record);
        steps.push(step(
            format!("add address {address} to {uplink}"),
            op,
            vec![],
        ));
    }
    for route in routes_in_add_order(&record.routes) {
        let name = format!("add route {} to {uplink}", route.dst);
        let op = Op::AddRoute {
            link: uplink.clone(),
            route,
        };
        steps.push(step(name, op, vec![]));
    }
    steps
}

#[cfg(test)]
mod tests;
