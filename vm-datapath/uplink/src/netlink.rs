//! The real [`Host`]: links, addresses and routes over rtnetlink (tokio) in the calling thread's
//! network namespace, ports through `sluice-ovs`'s OVSDB client, the checksum ioctl.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use ipnet::IpNet;
use rtnetlink::packet_route::address::{AddressAttribute, AddressHeaderFlags};
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};
use sluice_ovs::{OvsdbClient, OvsdbError, PortKind, PortRecord};

use crate::error::{HostError, UplinkError};
use crate::isolation::Isolation;
use crate::plan::Op;
use crate::record::{LinkState, RouteSpec};
use crate::takeover::Host;

/// How long a device may take to appear (a new internal port) or go (a deleted one).
const DEVICE_TIMEOUT: Duration = Duration::from_secs(10);

/// The machine the agent runs on, as the takeover sees it.
pub struct NetlinkHost<'a> {
    handle: Handle,
    ovsdb: &'a mut OvsdbClient,
}

/// The kernel's errno in a netlink error, if it is one.
fn errno(error: &rtnetlink::Error) -> Option<i32> {
    match error {
        rtnetlink::Error::NetlinkError(message) => Some(message.raw_code().abs()),
        _ => None,
    }
}

/// Success, or the errors that mean "already so" for an idempotent operation.
fn tolerate(result: Result<(), rtnetlink::Error>, already: &[i32]) -> Result<(), HostError> {
    match result {
        Err(error) if !errno(&error).is_some_and(|code| already.contains(&code)) => {
            Err(error.into())
        }
        _ => Ok(()),
    }
}

fn is_ipv6_link_local(address: IpAddr) -> bool {
    matches!(address, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

fn route_ip(address: &RouteAddress) -> Option<IpAddr> {
    match address {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// A main-table unicast route out of link `index` as a [`RouteSpec`]; `None` for any other.
fn route_spec(message: &RouteMessage, index: u32, v6: bool) -> Option<RouteSpec> {
    let mut table = u32::from(message.header.table);
    let (mut dst, mut gateway, mut metric, mut src, mut oif) = (None, None, None, None, None);
    for attribute in &message.attributes {
        match attribute {
            RouteAttribute::Table(id) => table = *id,
            RouteAttribute::Destination(a) => dst = route_ip(a),
            RouteAttribute::Gateway(a) => gateway = route_ip(a),
            RouteAttribute::Priority(m) => metric = Some(*m),
            RouteAttribute::PrefSource(a) => src = route_ip(a),
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    let unspecified = if v6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    let dst = IpNet::new(
        dst.unwrap_or(unspecified),
        message.header.destination_prefix_length,
    )
    .ok()?;
    let wanted = table == u32::from(RouteHeader::RT_TABLE_MAIN)
        && message.header.kind == RouteType::Unicast
        && oif == Some(index)
        && !is_ipv6_link_local(dst.addr());
    wanted.then(|| RouteSpec {
        dst,
        gateway,
        metric,
        scope: message.header.scope.into(),
        protocol: message.header.protocol.into(),
        src,
    })
}

fn invalid(error: impl std::fmt::Display) -> HostError {
    HostError::Invalid(error.to_string())
}

fn route_message(route: &RouteSpec, index: u32) -> Result<RouteMessage, HostError> {
    let mut builder = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(route.dst.addr(), route.dst.prefix_len())
        .map_err(invalid)?;
    if let Some(gateway) = route.gateway {
        builder = builder.gateway(gateway).map_err(invalid)?;
    }
    if let Some(src) = route.src {
        builder = builder.pref_source(src).map_err(invalid)?;
    }
    if let Some(metric) = route.metric {
        builder = builder.priority(metric);
    }
    Ok(builder
        .output_interface(index)
        .scope(RouteScope::from(route.scope))
        .protocol(RouteProtocol::from(route.protocol))
        .build())
}

impl<'a> NetlinkHost<'a> {
    /// Opens a netlink socket in the calling thread's network namespace (its connection task
    /// runs on the current tokio runtime and ends when the host is dropped).
    pub fn new(ovsdb: &'a mut OvsdbClient) -> Result<Self, UplinkError> {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(UplinkError::Netlink)?;
        tokio::spawn(connection);
        Ok(NetlinkHost { handle, ovsdb })
    }

    async fn link_message(&self, name: &str) -> Result<Option<LinkMessage>, HostError> {
        let request = self.handle.link().get().match_name(name.to_string());
        match request.execute().try_next().await {
            Ok(message) => Ok(message),
            Err(error) if errno(&error) == Some(libc::ENODEV) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    async fn index(&self, name: &str) -> Result<u32, HostError> {
        self.link_message(name)
            .await?
            .map(|message| message.header.index)
            .ok_or_else(|| HostError::NoSuchLink(name.to_string()))
    }

    /// The link's addresses, and the IPv4 ones among them without a broadcast address.
    async fn addresses(&self, index: u32) -> Result<(Vec<IpNet>, Vec<IpNet>), HostError> {
        let mut stream = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute();
        let (mut addresses, mut without_broadcast) = (Vec::new(), Vec::new());
        while let Some(message) = stream.try_next().await? {
            let (mut local, mut address, mut broadcast) = (None, None, false);
            for attribute in &message.attributes {
                match attribute {
                    AddressAttribute::Local(ip) => local = Some(*ip),
                    AddressAttribute::Address(ip) => address = Some(*ip),
                    AddressAttribute::Broadcast(_) => broadcast = true,
                    _ => {}
                }
            }
            // IFA_LOCAL is the address itself; IFA_ADDRESS is the peer on point-to-point links.
            let Some(ip) = local.or(address) else {
                continue;
            };
            if message.header.index != index || is_ipv6_link_local(ip) {
                continue;
            }
            if let Ok(net) = IpNet::new(ip, message.header.prefix_len) {
                if ip.is_ipv4() && !broadcast {
                    without_broadcast.push(net);
                }
                addresses.push(net);
            }
        }
        Ok((addresses, without_broadcast))
    }

    async fn routes(&self, index: u32) -> Result<Vec<RouteSpec>, HostError> {
        let mut routes = Vec::new();
        let dumps = [
            (RouteMessageBuilder::<Ipv4Addr>::new().build(), false),
            (RouteMessageBuilder::<Ipv6Addr>::new().build(), true),
        ];
        for (request, v6) in dumps {
            let mut stream = self.handle.route().get(request).execute();
            while let Some(message) = stream.try_next().await? {
                routes.extend(route_spec(&message, index, v6));
            }
        }
        Ok(routes)
    }

    async fn set_link(
        &self,
        name: &str,
        change: impl FnOnce(u32) -> LinkMessage,
    ) -> Result<(), HostError> {
        let index = self.index(name).await?;
        Ok(self.handle.link().set(change(index)).execute().await?)
    }

    async fn wait_for_device(&self, name: &str, present: bool) -> Result<(), HostError> {
        let deadline = Instant::now() + DEVICE_TIMEOUT;
        while self.link_message(name).await?.is_some() != present {
            if Instant::now() >= deadline {
                let what = format!(
                    "device {name} {}",
                    if present { "appearing" } else { "going" }
                );
                return Err(HostError::Timeout {
                    what,
                    timeout: DEVICE_TIMEOUT,
                });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// Adds (`Some(broadcast)`) or deletes (`None`) `address` on `link`.
    async fn address(
        &self,
        link: &str,
        address: IpNet,
        add: Option<bool>,
    ) -> Result<(), HostError> {
        let index = match (self.index(link).await, add) {
            (Err(HostError::NoSuchLink(_)), None) => return Ok(()), // nothing left to delete
            (index, _) => index?,
        };
        if let Some(broadcast) = add {
            let mut request =
                self.handle
                    .address()
                    .add(index, address.addr(), address.prefix_len());
            if !broadcast {
                // rtnetlink adds the subnet's broadcast address to every IPv4 address.
                let attributes = &mut request.message_mut().attributes;
                attributes.retain(|a| !matches!(a, AddressAttribute::Broadcast(_)));
            }
            if address.addr().is_ipv6() {
                // The address moves between devices of one host: duplicate detection would only
                // keep it unusable (tentative) for a second.
                request.message_mut().header.flags |= AddressHeaderFlags::Nodad;
            }
            return tolerate(request.execute().await, &[libc::EEXIST]);
        }
        let mut stream = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .set_address_filter(address.addr())
            .set_prefix_length_filter(address.prefix_len())
            .execute();
        while let Some(message) = stream.try_next().await? {
            if message.header.index == index {
                let result = self.handle.address().del(message).execute().await;
                tolerate(result, &[libc::EADDRNOTAVAIL])?;
            }
        }
        Ok(())
    }

    async fn route(&self, link: &str, route: &RouteSpec, add: bool) -> Result<(), HostError> {
        let index = match (self.index(link).await, add) {
            (Err(HostError::NoSuchLink(_)), false) => return Ok(()),
            (index, _) => index?,
        };
        let message = route_message(route, index)?;
        if add {
            tolerate(
                self.handle.route().add(message).execute().await,
                &[libc::EEXIST],
            )
        } else {
            tolerate(
                self.handle.route().del(message).execute().await,
                &[libc::ESRCH],
            )
        }
    }

    async fn rename(&self, from: &str, to: &str) -> Result<(), HostError> {
        if self.link_message(from).await?.is_none() && self.link_message(to).await?.is_some() {
            return Ok(()); // renamed already
        }
        let to = to.to_string();
        self.set_link(from, |index| {
            LinkUnspec::new_with_index(index).name(to).build()
        })
        .await
    }
}

impl Host for NetlinkHost<'_> {
    async fn link(&mut self, name: &str) -> Result<Option<LinkState>, HostError> {
        let Some(message) = self.link_message(name).await? else {
            return Ok(None);
        };
        let index = message.header.index;
        let (mut mac, mut mtu) = ([0u8; 6], 0);
        for attribute in &message.attributes {
            match attribute {
                LinkAttribute::Address(bytes) if bytes.len() == 6 => mac.copy_from_slice(bytes),
                LinkAttribute::Mtu(value) => mtu = *value,
                _ => {}
            }
        }
        let (addresses, without_broadcast) = self.addresses(index).await?;
        Ok(Some(LinkState {
            name: name.to_string(),
            index,
            mac,
            mtu,
            up: message.header.flags.contains(LinkFlags::Up),
            // A device that cannot report it has no offload to turn off.
            tx_checksum: crate::ethtool::tx_checksum(name).unwrap_or(false),
            isolation: Isolation::read(name).map_err(|source| HostError::Io {
                what: format!("reading the sysctls of {name}"),
                source,
            })?,
            addresses,
            without_broadcast,
            routes: self.routes(index).await?,
        }))
    }

    async fn bridge_ports(&mut self, bridge: &str) -> Result<Vec<PortRecord>, HostError> {
        Ok(self.ovsdb.bridge_ports(bridge).await?)
    }

    async fn datapath_type(&mut self, bridge: &str) -> Result<String, HostError> {
        Ok(self.ovsdb.datapath_type(bridge).await?)
    }

    async fn ofport(&mut self, name: &str) -> Result<u32, HostError> {
        Ok(self.ovsdb.ofport(name).await?)
    }

    async fn apply(&mut self, op: &Op) -> Result<(), HostError> {
        match op {
            Op::LinkUp { link } => {
                self.set_link(link, |i| LinkUnspec::new_with_index(i).up().build())
                    .await
            }
            Op::LinkDown { link } => {
                self.set_link(link, |i| LinkUnspec::new_with_index(i).down().build())
                    .await
            }
            Op::Rename { from, to } => self.rename(from, to).await,
            Op::SetMtu { link, mtu } => {
                self.set_link(link, |i| LinkUnspec::new_with_index(i).mtu(*mtu).build())
                    .await
            }
            Op::SetMac { link, mac } => {
                let mac = mac.to_vec();
                self.set_link(link, |i| LinkUnspec::new_with_index(i).address(mac).build())
                    .await
            }
            Op::SetIsolation { link, isolation } => {
                isolation.write(link).map_err(|source| HostError::Io {
                    what: format!("setting the sysctls of {link}"),
                    source,
                })
            }
            Op::TxChecksumOff { link } => {
                crate::ethtool::tx_checksum_off(link).map_err(|source| HostError::Io {
                    what: format!("turning TX checksum offload off on {link}"),
                    source,
                })
            }
            Op::AddAddress {
                link,
                address,
                broadcast,
            } => self.address(link, *address, Some(*broadcast)).await,
            Op::DelAddress { link, address } => self.address(link, *address, None).await,
            Op::AddRoute { link, route } => self.route(link, route, true).await,
            Op::DelRoute { link, route } => self.route(link, route, false).await,
            Op::AddPort { bridge, port } => {
                self.ovsdb.add_port_with(bridge, port).await?;
                if port.kind == PortKind::Internal {
                    // ovs-vswitchd creates the device in its namespace, which is ours.
                    self.wait_for_device(&port.name, true).await?;
                }
                Ok(())
            }
            Op::Announce {
                link,
                mac,
                addresses,
            } => {
                let index = self.index(link).await?;
                crate::announce::send(index, *mac, addresses).map_err(|source| HostError::Io {
                    what: format!("announcing the addresses of {link}"),
                    source,
                })
            }
            Op::DelPort { bridge, name, kind } => {
                match self.ovsdb.delete_port(bridge, name).await {
                    Ok(()) | Err(OvsdbError::NotFound { .. }) => {}
                    Err(error) => return Err(error.into()),
                }
                if *kind == PortKind::Internal {
                    self.wait_for_device(name, false).await?;
                }
                Ok(())
            }
        }
    }
}
