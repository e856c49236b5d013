//! An in-memory host that behaves like the kernel and OVSDB where the takeover relies on it
//! (renames need the link down, down drops routes and IPv6 addresses, removing the last IPv4
//! address drops the IPv4 routes, gateway routes need an on-link route, ports and devices are
//! unique) and fails the N-th operation on request.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;
use sluice_ovs::{NewPort, OvsdbError, PortKind, PortRecord};

use crate::error::HostError;
use crate::isolation::Isolation;
use crate::plan::Op;
use crate::record::{LinkState, RouteSpec};
use crate::takeover::Host;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeLink {
    pub index: u32,
    pub mac: [u8; 6],
    pub mtu: u32,
    pub up: bool,
    pub tx_checksum: bool,
    pub isolation: Isolation,
    pub addresses: BTreeSet<IpNet>,
    /// Keyed by what makes a route unique to the kernel (dst, gateway, metric).
    pub routes: BTreeMap<String, RouteSpec>,
}

/// Everything observable: compared whole by the tests.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct World {
    pub links: BTreeMap<String, FakeLink>,
    /// Port name -> (bridge, port).
    pub ports: BTreeMap<String, (String, NewPort)>,
    /// Bridge -> datapath type.
    pub bridges: BTreeMap<String, String>,
}

pub struct FakeHost {
    pub world: World,
    /// Fail the operation with this number (0-based, counted over all `apply` calls).
    pub fail_at: Option<usize>,
    pub applied: Vec<Op>,
    next_index: u32,
}

fn route_key(route: &RouteSpec) -> String {
    format!(
        "{} {:?} {}",
        route.dst,
        route.gateway,
        route.metric.unwrap_or(0)
    )
}

/// The route the kernel adds for an address on an up link.
pub fn connected(address: IpNet) -> RouteSpec {
    let v4 = address.addr().is_ipv4();
    RouteSpec {
        dst: address.trunc(),
        gateway: None,
        metric: if v4 { None } else { Some(256) },
        scope: if v4 { 253 } else { 0 },
        protocol: 2,
        src: v4.then_some(address.addr()),
    }
}

fn failed(what: String) -> HostError {
    HostError::Invalid(what)
}

impl FakeHost {
    pub fn new(world: World) -> Self {
        FakeHost {
            world,
            fail_at: None,
            applied: Vec::new(),
            next_index: 100,
        }
    }

    fn link_mut(&mut self, name: &str) -> Result<&mut FakeLink, HostError> {
        self.world
            .links
            .get_mut(name)
            .ok_or_else(|| HostError::NoSuchLink(name.to_string()))
    }

    fn add_route(&mut self, link: &str, route: &RouteSpec) -> Result<(), HostError> {
        let target = self.link_mut(link)?;
        if !target.up {
            return Err(failed(format!("ENETDOWN adding a route on {link}")));
        }
        if let Some(gateway) = route.gateway {
            let reachable = target
                .routes
                .values()
                .any(|r| r.gateway.is_none() && r.dst.contains(&gateway));
            if !reachable {
                return Err(failed(format!("ENETUNREACH: {gateway} from {link}")));
            }
        }
        target
            .routes
            .entry(route_key(route))
            .or_insert_with(|| route.clone());
        Ok(())
    }

    fn add_address(&mut self, link: &str, address: IpNet) -> Result<(), HostError> {
        let target = self.link_mut(link)?;
        if address.addr().is_ipv6() && target.isolation.disable_ipv6 == 1 {
            return Err(failed(format!("EACCES: IPv6 is off on {link}")));
        }
        target.addresses.insert(address);
        if target.up {
            let route = connected(address);
            target.routes.entry(route_key(&route)).or_insert(route);
        }
        Ok(())
    }

    fn del_address(&mut self, link: &str, address: IpNet) {
        let Some(target) = self.world.links.get_mut(link) else {
            return;
        };
        target.addresses.remove(&address);
        let route = connected(address);
        target.routes.remove(&route_key(&route));
        target.routes.retain(|_, r| r.src != Some(address.addr()));
        if !target.addresses.iter().any(|a| a.addr().is_ipv4()) {
            target.routes.retain(|_, r| !r.dst.addr().is_ipv4());
        }
    }

    fn set_up(&mut self, link: &str, up: bool) -> Result<(), HostError> {
        let target = self.link_mut(link)?;
        target.up = up;
        if up {
            let addresses: Vec<IpNet> = target.addresses.iter().copied().collect();
            for address in addresses {
                self.add_address(link, address)?;
            }
        } else {
            target.routes.clear();
            target.addresses.retain(|a| a.addr().is_ipv4());
        }
        Ok(())
    }

    fn rename(&mut self, from: &str, to: &str) -> Result<(), HostError> {
        let links = &mut self.world.links;
        if !links.contains_key(from) && links.contains_key(to) {
            return Ok(());
        }
        if links.contains_key(to) {
            return Err(failed(format!("EEXIST renaming {from} to {to}")));
        }
        let link = links
            .remove(from)
            .ok_or_else(|| HostError::NoSuchLink(from.to_string()))?;
        if link.up {
            links.insert(from.to_string(), link);
            return Err(failed(format!("EBUSY renaming {from}: it is up")));
        }
        links.insert(to.to_string(), link);
        Ok(())
    }

    fn add_port(&mut self, bridge: &str, port: &NewPort) -> Result<(), HostError> {
        if !self.world.bridges.contains_key(bridge) {
            return Err(OvsdbError::NotFound {
                table: "Bridge",
                name: bridge.to_string(),
            }
            .into());
        }
        if self.world.ports.contains_key(&port.name) {
            return Err(OvsdbError::AlreadyExists {
                table: "Port",
                name: port.name.clone(),
            }
            .into());
        }
        match port.kind {
            PortKind::System => {
                self.link_mut(&port.name)?;
            }
            PortKind::Internal => {
                if self.world.links.contains_key(&port.name) {
                    return Err(failed(format!("device {} exists", port.name)));
                }
                let mac = port
                    .mac
                    .as_deref()
                    .and_then(crate::record::parse_mac)
                    .unwrap_or([2, 0, 0, 0, 0, 0xee]);
                self.next_index += 1;
                let link = FakeLink {
                    index: self.next_index,
                    mac,
                    mtu: 1500,
                    up: false,
                    tx_checksum: true,
                    isolation: Isolation::DEFAULT,
                    addresses: BTreeSet::new(),
                    routes: BTreeMap::new(),
                };
                self.world.links.insert(port.name.clone(), link);
            }
        }
        self.world
            .ports
            .insert(port.name.clone(), (bridge.to_string(), port.clone()));
        Ok(())
    }

    fn del_port(&mut self, name: &str) {
        if let Some((_, port)) = self.world.ports.remove(name) {
            if port.kind == PortKind::Internal {
                self.world.links.remove(name);
            }
        }
    }
}

impl Host for FakeHost {
    async fn link(&mut self, name: &str) -> Result<Option<LinkState>, HostError> {
        Ok(self.world.links.get(name).map(|link| LinkState {
            name: name.to_string(),
            index: link.index,
            mac: link.mac,
            mtu: link.mtu,
            up: link.up,
            tx_checksum: link.tx_checksum,
            isolation: link.isolation,
            without_broadcast: Vec::new(),
            addresses: link.addresses.iter().copied().collect(),
            routes: link.routes.values().cloned().collect(),
        }))
    }

    async fn bridge_ports(&mut self, bridge: &str) -> Result<Vec<PortRecord>, HostError> {
        if !self.world.bridges.contains_key(bridge) {
            return Err(OvsdbError::NotFound {
                table: "Bridge",
                name: bridge.to_string(),
            }
            .into());
        }
        Ok(self
            .world
            .ports
            .values()
            .filter(|(b, _)| b == bridge)
            .map(|(_, port)| PortRecord {
                name: port.name.clone(),
                external_ids: port.external_ids.clone(),
            })
            .collect())
    }

    async fn datapath_type(&mut self, bridge: &str) -> Result<String, HostError> {
        self.world.bridges.get(bridge).cloned().ok_or_else(|| {
            OvsdbError::NotFound {
                table: "Bridge",
                name: bridge.to_string(),
            }
            .into()
        })
    }

    async fn ofport(&mut self, name: &str) -> Result<u32, HostError> {
        match (self.world.ports.get(name), self.world.links.get(name)) {
            (Some(_), Some(link)) => Ok(link.index),
            _ => Err(OvsdbError::NotFound {
                table: "Interface",
                name: name.to_string(),
            }
            .into()),
        }
    }

    async fn apply(&mut self, op: &Op) -> Result<(), HostError> {
        let number = self.applied.len();
        self.applied.push(op.clone());
        if self.fail_at == Some(number) {
            return Err(failed(format!("injected failure at operation {number}")));
        }
        match op {
            Op::LinkUp { link } => self.set_up(link, true),
            Op::LinkDown { link } => self.set_up(link, false),
            Op::Rename { from, to } => self.rename(from, to),
            Op::SetMtu { link, mtu } => self.link_mut(link).map(|l| l.mtu = *mtu),
            Op::SetMac { link, mac } => self.link_mut(link).map(|l| l.mac = *mac),
            Op::SetIsolation { link, isolation } => {
                self.link_mut(link).map(|l| l.isolation = *isolation)
            }
            Op::TxChecksumOff { link } => self.link_mut(link).map(|l| l.tx_checksum = false),
            Op::AddAddress { link, address, .. } => self.add_address(link, *address),
            Op::DelAddress { link, address } => {
                self.del_address(link, *address);
                Ok(())
            }
            Op::AddRoute { link, route } => self.add_route(link, route),
            Op::DelRoute { link, route } => {
                if let Some(target) = self.world.links.get_mut(link) {
                    target.routes.remove(&route_key(route));
                }
                Ok(())
            }
            Op::AddPort { bridge, port } => self.add_port(bridge, port),
            Op::DelPort { name, .. } => {
                self.del_port(name);
                Ok(())
            }
            // Nothing observable changes; the link must exist.
            Op::Announce { link, .. } => self.link_mut(link).map(|_| ()),
        }
    }
}
