//! The maps' keys and values as `#[repr(C)]` twins of `bpf/counters.h`, and the pure mapping
//! from their raw fields to labels. Tests assert the sizes and offsets against the C structs.

use aya::Pod;

/// Map names in the object (the kernel keeps 15 characters: `bpftool map dump name ...`).
pub(crate) const COUNTERS_MAP: &str = "sluice_counters";
pub(crate) const PORTS_MAP: &str = "sluice_ports";
pub(crate) const LISTENER_MAP: &str = "sluice_listen";
pub(crate) const ERRORS_MAP: &str = "sluice_errors";
/// Slot of `sluice_errors` counting packets not counted because `sluice_counters` was full.
pub(crate) const ERR_COUNTERS_FULL: u32 = 0;

/// `SLUICE_MAX_COUNTER_KEYS`: (interface, direction, protocol) keys the counters map holds.
pub const MAX_COUNTER_KEYS: u32 = 16_384;
/// `SLUICE_MAX_LISTENERS`: listener ports the programs count.
pub const MAX_LISTENERS: usize = 64;

const DIR_INGRESS: u8 = 0;
const DIR_EGRESS: u8 = 1;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ICMPV6: u8 = 58;

/// `struct sluice_key`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct CounterKey {
    pub ifindex: u32,
    pub direction: u8,
    pub protocol: u8,
    pub pad: u16,
}

/// `struct sluice_counts`: one CPU's share, or (summed) the whole.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub packets: u64,
    /// `skb->len`: whole frames, from the Ethernet header on.
    pub bytes: u64,
    /// TCP segments with SYN and without ACK: connection attempts.
    pub tcp_syn: u64,
    /// Frames whose headers were cut short or inconsistent (docs/EBPF.md).
    pub malformed: u64,
}

/// `struct sluice_port_key`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct PortKey {
    /// Host byte order.
    pub port: u16,
    pub protocol: u8,
    pub pad: u8,
}

/// `struct sluice_listener_counts`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ListenerCounts {
    pub packets: u64,
    pub bytes: u64,
    pub syns: u64,
}

// SAFETY: all four are #[repr(C)], made only of integers, with explicit padding fields and no
// implicit padding (sizes asserted in the tests), so every bit pattern is a valid value.
unsafe impl Pod for CounterKey {}
// SAFETY: as above.
unsafe impl Pod for Counts {}
// SAFETY: as above.
unsafe impl Pod for PortKey {}
// SAFETY: as above.
unsafe impl Pod for ListenerCounts {}

impl Counts {
    /// Adds another CPU's share.
    pub fn add(&mut self, other: &Counts) {
        self.packets += other.packets;
        self.bytes += other.bytes;
        self.tcp_syn += other.tcp_syn;
        self.malformed += other.malformed;
    }

    /// The sum over every CPU's share.
    pub fn sum<'a>(per_cpu: impl IntoIterator<Item = &'a Counts>) -> Counts {
        let mut total = Counts::default();
        for share in per_cpu {
            total.add(share);
        }
        total
    }
}

impl ListenerCounts {
    pub(crate) fn sum<'a>(per_cpu: impl IntoIterator<Item = &'a ListenerCounts>) -> Self {
        per_cpu
            .into_iter()
            .fold(Self::default(), |total, share| Self {
                packets: total.packets + share.packets,
                bytes: total.bytes + share.bytes,
                syns: total.syns + share.syns,
            })
    }
}

/// Which hook saw the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    pub const ALL: [Direction; 2] = [Direction::Ingress, Direction::Egress];

    pub fn label(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }

    /// The program attached on this hook.
    pub fn program(self) -> &'static str {
        match self {
            Direction::Ingress => "sluice_ingress",
            Direction::Egress => "sluice_egress",
        }
    }

    pub(crate) fn from_raw(raw: u8) -> Option<Self> {
        match raw {
            DIR_INGRESS => Some(Direction::Ingress),
            DIR_EGRESS => Some(Direction::Egress),
            _ => None,
        }
    }
}

/// The L4 protocol label: a fixed list, so the label set stays bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Icmp,
    Icmpv6,
    /// Non-IP frames (ARP, ...), other IP protocols, IPv6 past six extension headers.
    Other,
}

impl Protocol {
    pub const ALL: [Protocol; 5] = [
        Protocol::Tcp,
        Protocol::Udp,
        Protocol::Icmp,
        Protocol::Icmpv6,
        Protocol::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Icmp => "icmp",
            Protocol::Icmpv6 => "icmpv6",
            Protocol::Other => "other",
        }
    }

    /// Any byte maps to a label: a value the C never writes lands in `other`, not in a new label.
    pub(crate) fn from_raw(raw: u8) -> Self {
        match raw {
            IPPROTO_TCP => Protocol::Tcp,
            IPPROTO_UDP => Protocol::Udp,
            IPPROTO_ICMP => Protocol::Icmp,
            IPPROTO_ICMPV6 => Protocol::Icmpv6,
            _ => Protocol::Other,
        }
    }
}

/// A listener's transport, as registered in the port map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum L4 {
    Tcp,
    Udp,
}

impl L4 {
    pub(crate) fn raw(self) -> u8 {
        match self {
            L4::Tcp => IPPROTO_TCP,
            L4::Udp => IPPROTO_UDP,
        }
    }
}

/// A data-plane listener whose destination port the ingress program counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub name: String,
    pub port: u16,
    pub protocol: L4,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// `SLUICE_PROTO_OTHER`.
    const PROTO_OTHER: u8 = 255;

    #[test]
    fn layouts_match_the_c_structs() {
        // struct sluice_key { __u32 ifindex; __u8 direction; __u8 protocol; __u16 pad; }
        assert_eq!(size_of::<CounterKey>(), 8);
        assert_eq!(offset_of!(CounterKey, direction), 4);
        assert_eq!(offset_of!(CounterKey, protocol), 5);
        // struct sluice_counts: four __u64
        assert_eq!(size_of::<Counts>(), 32);
        assert_eq!(offset_of!(Counts, tcp_syn), 16);
        assert_eq!(offset_of!(Counts, malformed), 24);
        // struct sluice_port_key { __u16 port; __u8 protocol; __u8 pad; }
        assert_eq!(size_of::<PortKey>(), 4);
        assert_eq!(offset_of!(PortKey, protocol), 2);
        // struct sluice_listener_counts: three __u64
        assert_eq!(size_of::<ListenerCounts>(), 24);
    }

    #[test]
    fn the_header_defines_what_the_rust_side_assumes() {
        let header = include_str!("../bpf/counters.h");
        for line in [
            "#define SLUICE_MAX_COUNTER_KEYS 16384",
            "#define SLUICE_MAX_LISTENERS 64",
            "#define SLUICE_DIR_INGRESS 0",
            "#define SLUICE_DIR_EGRESS 1",
            "#define SLUICE_PROTO_OTHER 255",
            "#define SLUICE_ERR_COUNTERS_FULL 0",
        ] {
            assert!(header.contains(line), "counters.h lost `{line}`");
        }
        assert_eq!(MAX_COUNTER_KEYS, 16_384);
        assert_eq!(MAX_LISTENERS, 64);
        assert_eq!(ERR_COUNTERS_FULL, 0);
    }

    #[test]
    fn raw_values_map_to_bounded_labels() {
        assert_eq!(Protocol::from_raw(6).label(), "tcp");
        assert_eq!(Protocol::from_raw(17).label(), "udp");
        assert_eq!(Protocol::from_raw(1).label(), "icmp");
        assert_eq!(Protocol::from_raw(58).label(), "icmpv6");
        assert_eq!(Protocol::from_raw(PROTO_OTHER), Protocol::Other);
        // Every byte lands in the fixed list.
        for raw in 0..=u8::MAX {
            assert!(Protocol::ALL.contains(&Protocol::from_raw(raw)));
        }
        assert_eq!(Direction::from_raw(0), Some(Direction::Ingress));
        assert_eq!(Direction::from_raw(1), Some(Direction::Egress));
        assert_eq!(Direction::from_raw(2), None);
        assert_eq!(L4::Tcp.raw(), 6);
        assert_eq!(L4::Udp.raw(), 17);
    }

    #[test]
    fn per_cpu_shares_sum() {
        let shares = [
            Counts {
                packets: 1,
                bytes: 100,
                tcp_syn: 1,
                malformed: 0,
            },
            Counts::default(),
            Counts {
                packets: 2,
                bytes: 60,
                tcp_syn: 0,
                malformed: 1,
            },
        ];
        assert_eq!(
            Counts::sum(&shares),
            Counts {
                packets: 3,
                bytes: 160,
                tcp_syn: 1,
                malformed: 1
            }
        );
        let listeners = [
            ListenerCounts {
                packets: 4,
                bytes: 296,
                syns: 4,
            },
            ListenerCounts {
                packets: 1,
                bytes: 74,
                syns: 1,
            },
        ];
        assert_eq!(
            ListenerCounts::sum(&listeners),
            ListenerCounts {
                packets: 5,
                bytes: 370,
                syns: 5
            }
        );
    }
}
