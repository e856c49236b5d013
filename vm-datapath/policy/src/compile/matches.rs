//! Building blocks that turn model values into OpenFlow match fields: address families, peer
//! networks, IP-block exceptions, services and port ranges.

use std::net::IpAddr;

use ipnet::IpNet;
use sluice_openflow::flow::{eth_type, ip_proto, Masked, Match};

use crate::model::{IpBlock, Protocol, Service};

/// Which IP families a rule's flows are built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Families {
    pub v4: bool,
    pub v6: bool,
}

impl Families {
    pub const BOTH: Families = Families { v4: true, v6: true };

    pub fn is_empty(self) -> bool {
        !self.v4 && !self.v6
    }

    pub fn intersect(self, other: Families) -> Families {
        Families {
            v4: self.v4 && other.v4,
            v6: self.v6 && other.v6,
        }
    }

    pub fn add_addr(&mut self, addr: IpAddr) {
        match addr {
            IpAddr::V4(_) => self.v4 = true,
            IpAddr::V6(_) => self.v6 = true,
        }
    }

    pub fn contains_addr(self, addr: IpAddr) -> bool {
        match addr {
            IpAddr::V4(_) => self.v4,
            IpAddr::V6(_) => self.v6,
        }
    }

    pub fn eth_types(self) -> impl Iterator<Item = u16> {
        [(self.v4, eth_type::IPV4), (self.v6, eth_type::IPV6)]
            .into_iter()
            .filter_map(|(present, eth_type)| present.then_some(eth_type))
    }
}

/// Which end of the packet an address is matched against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Source,
    Destination,
}

/// Adds `eth_type` and the address field for `net` on the given end.
pub(crate) fn match_net(matches: &mut Match, end: End, net: IpNet) {
    match net {
        IpNet::V4(net) => {
            matches.eth_type = Some(eth_type::IPV4);
            let field = Some(Masked::ipv4_cidr(net.network(), net.prefix_len()));
            match end {
                End::Source => matches.ipv4_src = field,
                End::Destination => matches.ipv4_dst = field,
            }
        }
        IpNet::V6(net) => {
            matches.eth_type = Some(eth_type::IPV6);
            let field = Some(Masked::ipv6_cidr(net.network(), net.prefix_len()));
            match end {
                End::Source => matches.ipv6_src = field,
                End::Destination => matches.ipv6_dst = field,
            }
        }
    }
}

/// `block.cidr` minus its exceptions, as the smallest set of disjoint CIDRs, sorted.
///
/// Conjunction clause flows of one rule must share one priority, so "except" cannot be a
/// higher-priority exclusion inside the conjunction (Antrea's controller subtracts too). Each
/// exception costs at most one CIDR per prefix bit between it and the block (32 for IPv4, 128
/// for IPv6), so the flow count stays small.
pub(crate) fn ip_block_nets(block: &IpBlock) -> Vec<IpNet> {
    let mut remaining = vec![block.cidr.trunc()];
    for except in &block.except {
        let except = except.trunc();
        let mut next = Vec::with_capacity(remaining.len() + 1);
        for net in remaining {
            if except.contains(&net) {
                continue;
            }
            if !net.contains(&except) {
                next.push(net);
                continue;
            }
            // Walk down from `net` to `except`, keeping the sibling half at every step.
            let mut current = net;
            while current.prefix_len() < except.prefix_len() {
                let Ok(mut halves) = current.subnets(current.prefix_len() + 1) else {
                    break;
                };
                let (Some(low), Some(high)) = (halves.next(), halves.next()) else {
                    break;
                };
                let (towards, sibling) = if low.contains(&except) {
                    (low, high)
                } else {
                    (high, low)
                };
                next.push(sibling);
                current = towards;
            }
        }
        remaining = next;
    }
    remaining.sort();
    remaining
}

/// The fewest value/mask pairs whose union is exactly `start..=end` (OVS matches ports under a
/// bit mask, not as ranges): aligned power-of-two blocks, greedy from the low end.
pub(crate) fn port_range_masks(start: u16, end: u16) -> Vec<Masked<u16>> {
    let mut masks = Vec::new();
    let (mut low, high) = (u32::from(start), u32::from(end));
    while low <= high {
        let mut size: u32 = if low == 0 {
            1 << 16
        } else {
            1 << low.trailing_zeros()
        };
        while low + size - 1 > high {
            size >>= 1;
        }
        let mask = (!(size - 1) & 0xffff) as u16;
        masks.push(Masked::new(low as u16, mask));
        low += size;
    }
    masks
}

/// The match fragments (protocol, ports or ICMP type/code) of one service for one family.
pub(crate) fn service_matches(service: &Service, ip_eth_type: u16) -> Vec<Match> {
    let v6 = ip_eth_type == eth_type::IPV6;
    let mut base = Match {
        eth_type: Some(ip_eth_type),
        ..Match::default()
    };
    if service.protocol == Protocol::Icmp {
        if v6 {
            base.ip_proto = Some(ip_proto::ICMPV6);
            base.icmpv6_type = service.icmp_type;
            base.icmpv6_code = service.icmp_code;
        } else {
            base.ip_proto = Some(ip_proto::ICMP);
            base.icmpv4_type = service.icmp_type;
            base.icmpv4_code = service.icmp_code;
        }
        return vec![base];
    }
    base.ip_proto = Some(match service.protocol {
        Protocol::Tcp => ip_proto::TCP,
        Protocol::Udp => ip_proto::UDP,
        Protocol::Sctp => ip_proto::SCTP,
        Protocol::Icmp => ip_proto::ICMP,
    });
    let Some(port) = service.port else {
        return vec![base];
    };
    let ranges = port_range_masks(port, service.end_port.unwrap_or(port).max(port));
    ranges
        .into_iter()
        .map(|range| {
            let mut matches = base.clone();
            let field = Some(range);
            match service.protocol {
                Protocol::Tcp => matches.tcp_dst = field,
                Protocol::Udp => matches.udp_dst = field,
                Protocol::Sctp => matches.sctp_dst = field,
                Protocol::Icmp => {}
            }
            matches
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn covers(masks: &[Masked<u16>], port: u16) -> usize {
        masks
            .iter()
            .filter(|m| port & m.mask == m.value & m.mask)
            .count()
    }

    #[test]
    fn port_ranges_decompose_into_aligned_blocks() {
        let text = |start, end| -> Vec<String> {
            port_range_masks(start, end)
                .iter()
                .map(|m| format!("{:#x}/{:#x}", m.value, m.mask))
                .collect()
        };
        assert_eq!(text(80, 80), ["0x50/0xffff"]);
        assert_eq!(text(1024, 2047), ["0x400/0xfc00"]);
        assert_eq!(text(0, 65535), ["0x0/0x0"]);
        // 1000-1999: blocks of 8, 16, 512, 256, 128, 64, 16 ports.
        assert_eq!(port_range_masks(1000, 1999).len(), 7);
        assert_eq!(port_range_masks(1, 65535).len(), 16);
    }

    #[test]
    fn except_is_subtracted_exactly() {
        let block = IpBlock {
            cidr: "10.0.0.0/8".parse().expect("net"),
            except: vec![
                "10.1.0.0/16".parse().expect("net"),
                "10.200.3.4/32".parse().expect("net"),
            ],
        };
        let nets = ip_block_nets(&block);
        // 8 siblings for the /16, then the /9 holding the /32 becomes 23 siblings.
        assert_eq!(nets.len(), 8 - 1 + 23);
        let inside = |addr: &str| {
            let addr: IpAddr = addr.parse().expect("addr");
            nets.iter().filter(|net| net.contains(&addr)).count()
        };
        assert_eq!(inside("10.0.0.1"), 1);
        assert_eq!(inside("10.1.2.3"), 0);
        assert_eq!(inside("10.200.3.4"), 0);
        assert_eq!(inside("10.200.3.5"), 1);
        assert_eq!(inside("11.0.0.1"), 0);
    }

    #[test]
    fn except_covering_everything_leaves_nothing() {
        let block = IpBlock {
            cidr: "fd00::/64".parse().expect("net"),
            except: vec!["fd00::/64".parse().expect("net")],
        };
        assert!(ip_block_nets(&block).is_empty());
    }

    #[test]
    fn icmp_service_uses_the_family_protocol() {
        let service = Service {
            icmp_type: Some(8),
            ..Service::any_of(Protocol::Icmp)
        };
        let v4 = service_matches(&service, eth_type::IPV4);
        assert_eq!(v4[0].ip_proto, Some(ip_proto::ICMP));
        assert_eq!(v4[0].icmpv4_type, Some(8));
        let v6 = service_matches(&service, eth_type::IPV6);
        assert_eq!(v6[0].ip_proto, Some(ip_proto::ICMPV6));
        assert_eq!(v6[0].icmpv6_type, Some(8));
    }

    proptest! {
        #[test]
        fn port_range_masks_cover_exactly_the_range(a: u16, b: u16, probe: u16) {
            let (start, end) = (a.min(b), a.max(b));
            let masks = port_range_masks(start, end);
            prop_assert!(masks.len() <= 32);
            let expected = usize::from((start..=end).contains(&probe));
            prop_assert_eq!(covers(&masks, probe), expected);
            prop_assert_eq!(covers(&masks, start), 1);
            prop_assert_eq!(covers(&masks, end), 1);
        }

        #[test]
        fn ip_block_nets_are_cidr_minus_excepts(
            prefix in 8u8..=24,
            excepts in proptest::collection::vec((0u32..=0xffff, 8u8..=32), 0..4),
            probe in 0u32..=0xffff,
        ) {
            let base = u32::from(std::net::Ipv4Addr::new(10, 0, 0, 0));
            let cidr: IpNet = ipnet::Ipv4Net::new(base.into(), prefix).expect("net").trunc().into();
            let except: Vec<IpNet> = excepts
                .iter()
                .filter_map(|&(offset, len)| ipnet::Ipv4Net::new((base + (offset << 8)).into(), len.max(prefix)).ok())
                .map(|net| IpNet::from(net.trunc()))
                .filter(|net| cidr.contains(net))
                .collect();
            let nets = ip_block_nets(&IpBlock { cidr, except: except.clone() });
            let addr = IpAddr::from(std::net::Ipv4Addr::from(base + (probe << 8) + (probe & 0xff)));
            let expected = cidr.contains(&addr) && !except.iter().any(|net| net.contains(&addr));
            let hits = nets.iter().filter(|net| net.contains(&addr)).count();
            prop_assert_eq!(hits, usize::from(expected));
        }
    }
}
