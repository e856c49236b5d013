//! The flow model: plain data describing an OpenFlow flow the way the policy compiler produces
//! it, independent of the wire encoding. `Display` prints `ovs-ofctl add-flow` syntax so the same
//! text can be fed to `ovs-ofctl --bundle add-flows` and compared with what the native client
//! installs.
//!
//! Stability: other crates build on these types. Only additive changes (new optional match
//! fields, new action variants) are made here.

use std::net::{Ipv4Addr, Ipv6Addr};

mod display;

/// Bits of the conntrack state (`ct_state`) as OVS numbers them.
pub mod ct_state {
    /// Start of a new connection.
    pub const NEW: u32 = 0x01;
    /// Part of an established connection.
    pub const EST: u32 = 0x02;
    /// Related to an established connection (e.g. ICMP errors).
    pub const REL: u32 = 0x04;
    /// In the reply direction.
    pub const RPL: u32 = 0x08;
    /// Invalid, could not be tracked.
    pub const INV: u32 = 0x10;
    /// The packet went through conntrack (`ct` action) already.
    pub const TRK: u32 = 0x20;
    /// Source NAT applied.
    pub const SNAT: u32 = 0x40;
    /// Destination NAT applied.
    pub const DNAT: u32 = 0x80;

    /// Names in the order `ovs-ofctl` uses for `ct_state=+new-est...`.
    pub(crate) const NAMES: [(u32, &str); 8] = [
        (NEW, "new"),
        (EST, "est"),
        (REL, "rel"),
        (RPL, "rpl"),
        (INV, "inv"),
        (TRK, "trk"),
        (SNAT, "snat"),
        (DNAT, "dnat"),
    ];
}

/// Well-known Ethernet types.
pub mod eth_type {
    pub const IPV4: u16 = 0x0800;
    pub const ARP: u16 = 0x0806;
    pub const IPV6: u16 = 0x86dd;
}

/// Well-known IP protocol numbers.
pub mod ip_proto {
    pub const ICMP: u8 = 1;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const ICMPV6: u8 = 58;
    pub const SCTP: u8 = 132;
}

/// Reserved OpenFlow port numbers (OpenFlow 1.3 `ofp_port_no`).
pub mod port {
    /// Send the packet out of the port it came in on.
    pub const IN_PORT: u32 = 0xffff_fff8;
    /// The bridge's local (internal) port.
    pub const LOCAL: u32 = 0xffff_fffe;
    /// The controller connection.
    pub const CONTROLLER: u32 = 0xffff_fffd;
    /// "Any port" wildcard in requests.
    pub const ANY: u32 = 0xffff_ffff;
}

/// A value whose type has an all-ones mask ("match exactly").
pub trait FullMask: Copy + Eq {
    /// The mask that matches every bit.
    fn full_mask() -> Self;
    /// `self & mask`, used to normalise masked values.
    fn and(self, mask: Self) -> Self;
}

macro_rules! full_mask_int {
    ($($t:ty),*) => {$(
        impl FullMask for $t {
            fn full_mask() -> Self { <$t>::MAX }
            fn and(self, mask: Self) -> Self { self & mask }
        }
    )*};
}
full_mask_int!(u8, u16, u32, u64, u128);

impl FullMask for Ipv4Addr {
    fn full_mask() -> Self {
        Ipv4Addr::from(u32::MAX)
    }
    fn and(self, mask: Self) -> Self {
        Ipv4Addr::from(u32::from(self) & u32::from(mask))
    }
}

impl FullMask for Ipv6Addr {
    fn full_mask() -> Self {
        Ipv6Addr::from(u128::MAX)
    }
    fn and(self, mask: Self) -> Self {
        Ipv6Addr::from(u128::from(self) & u128::from(mask))
    }
}

impl FullMask for [u8; 6] {
    fn full_mask() -> Self {
        [0xff; 6]
    }
    fn and(self, mask: Self) -> Self {
        std::array::from_fn(|i| self[i] & mask[i])
    }
}

/// A value matched under a mask: a packet matches when `packet & mask == value & mask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Masked<T> {
    pub value: T,
    pub mask: T,
}

impl<T: FullMask> Masked<T> {
    /// Matches exactly `value`.
    pub fn exact(value: T) -> Self {
        Masked {
            value,
            mask: T::full_mask(),
        }
    }

    /// Matches `value` under `mask`; bits of `value` outside the mask are cleared so that equal
    /// matches compare equal (OVS stores them the same way).
    pub fn new(value: T, mask: T) -> Self {
        Masked {
            value: value.and(mask),
            mask,
        }
    }

    /// True when every bit is matched.
    pub fn is_exact(&self) -> bool {
        self.mask == T::full_mask()
    }

    /// The value with bits outside the mask cleared.
    pub fn normalized_value(&self) -> T {
        self.value.and(self.mask)
    }
}

impl Masked<Ipv4Addr> {
    /// `addr/prefix_len` (a prefix length above 32 is treated as 32).
    pub fn ipv4_cidr(addr: Ipv4Addr, prefix_len: u8) -> Self {
        let bits = u32::from(prefix_len.min(32));
        let mask = if bits == 0 {
            0
        } else {
            u32::MAX << (32 - bits)
        };
        Masked::new(addr, Ipv4Addr::from(mask))
    }

    /// The prefix length when the mask is a CIDR prefix.
    pub fn prefix_len(&self) -> Option<u8> {
        prefix_len_of(u128::from(u32::from(self.mask)) << 96)
    }
}

impl Masked<Ipv6Addr> {
    /// `addr/prefix_len` (a prefix length above 128 is treated as 128).
    pub fn ipv6_cidr(addr: Ipv6Addr, prefix_len: u8) -> Self {
        let bits = u32::from(prefix_len.min(128));
        let mask = if bits == 0 {
            0
        } else {
            u128::MAX << (128 - bits)
        };
        Masked::new(addr, Ipv6Addr::from(mask))
    }

    /// The prefix length when the mask is a CIDR prefix.
    pub fn prefix_len(&self) -> Option<u8> {
        prefix_len_of(u128::from(self.mask))
    }
}

fn prefix_len_of(mask: u128) -> Option<u8> {
    let ones = mask.leading_ones();
    // A prefix mask has no set bit after its leading ones.
    (mask.checked_shl(ones).unwrap_or(0) == 0).then_some(ones as u8)
}

/// What a flow matches. Every field is optional; `None` is a wildcard. Prerequisites (an
/// `eth_type` for IP fields, an `ip_proto` for ports) are the caller's job, as in `ovs-ofctl`.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Match {
    pub in_port: Option<u32>,
    pub eth_src: Option<Masked<[u8; 6]>>,
    pub eth_dst: Option<Masked<[u8; 6]>>,
    pub eth_type: Option<u16>,
    pub arp_op: Option<u16>,
    pub arp_spa: Option<Masked<Ipv4Addr>>,
    pub arp_tpa: Option<Masked<Ipv4Addr>>,
    pub ipv4_src: Option<Masked<Ipv4Addr>>,
    pub ipv4_dst: Option<Masked<Ipv4Addr>>,
    pub ipv6_src: Option<Masked<Ipv6Addr>>,
    pub ipv6_dst: Option<Masked<Ipv6Addr>>,
    pub ip_proto: Option<u8>,
    pub tcp_src: Option<Masked<u16>>,
    pub tcp_dst: Option<Masked<u16>>,
    pub udp_src: Option<Masked<u16>>,
    pub udp_dst: Option<Masked<u16>>,
    pub sctp_src: Option<Masked<u16>>,
    pub sctp_dst: Option<Masked<u16>>,
    pub icmpv4_type: Option<u8>,
    pub icmpv4_code: Option<u8>,
    pub icmpv6_type: Option<u8>,
    pub icmpv6_code: Option<u8>,
    /// Bits from [`ct_state`].
    pub ct_state: Option<Masked<u32>>,
    pub ct_mark: Option<Masked<u32>>,
    pub ct_label: Option<Masked<u128>>,
    /// `regs[n]` matches Nicira register `reg<n>`.
    pub regs: [Option<Masked<u32>>; 16],
    pub conj_id: Option<u32>,
}

/// What a flow does with a packet. A flow with no actions drops.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    /// Send out of an OpenFlow port (see [`port`] for reserved numbers).
    Output(u32),
    /// Behave like a normal L2 switch.
    Normal,
    /// Send to the controller with `userdata` (Nicira `controller2`), so the agent can tell
    /// which rule sent the packet-in.
    Controller { max_len: u16, userdata: Vec<u8> },
    /// Clause `clause` (1-based) of `n_clauses` of conjunction `id`.
    Conjunction { id: u32, clause: u8, n_clauses: u8 },
    /// Send through conntrack; with `table`, the packet continues there afterwards (recirculated).
    Ct {
        commit: bool,
        zone: u16,
        table: Option<u8>,
        set_mark: Option<Masked<u32>>,
        set_label: Option<Masked<u128>>,
    },
    /// Continue in a later table (OpenFlow instruction).
    GotoTable(u8),
    /// Pass the packet through meter `id` before any other action (OpenFlow 1.3/1.4 meter
    /// instruction): packets over the meter's rate are dropped in the datapath, before they
    /// cost the slow path anything.
    Meter(u32),
    /// Run the flows of `table` as a subroutine (Nicira resubmit).
    Resubmit { table: u8 },
    /// `reg<reg> = (reg & !mask) | (value & mask)`.
    SetReg { reg: u8, value: u32, mask: u32 },
}

/// An OpenFlow flow.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Flow {
    pub table: u8,
    pub priority: u16,
    pub cookie: u64,
    pub matches: Match,
    pub actions: Vec<Action>,
}

/// OpenFlow flow identity: two flows with the same key replace each other in the switch
/// (cookie and actions are not part of it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FlowKey {
    pub table: u8,
    pub priority: u16,
    pub matches: Match,
}

impl Flow {
    /// The flow's OpenFlow identity.
    pub fn key(&self) -> FlowKey {
        FlowKey {
            table: self.table,
            priority: self.priority,
            matches: self.matches.clone(),
        }
    }
}

impl From<&Flow> for FlowKey {
    fn from(flow: &Flow) -> Self {
        flow.key()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// A TCP flow with a masked source and a conjunction, shared with the display tests.
    pub(super) fn tcp_flow() -> Flow {
        Flow {
            table: 0,
            priority: 100,
            cookie: 0x1234,
            matches: Match {
                eth_type: Some(eth_type::IPV4),
                ip_proto: Some(ip_proto::TCP),
                ipv4_src: Some(Masked::ipv4_cidr(Ipv4Addr::new(10, 0, 0, 7), 24)),
                tcp_dst: Some(Masked::exact(80)),
                ..Match::default()
            },
            actions: vec![Action::Conjunction {
                id: 1,
                clause: 1,
                n_clauses: 2,
            }],
        }
    }

    #[test]
    fn masked_values_are_normalised_so_equal_matches_compare_equal() {
        assert_eq!(
            Masked::ipv4_cidr(Ipv4Addr::new(10, 0, 0, 7), 24),
            Masked::ipv4_cidr(Ipv4Addr::new(10, 0, 0, 9), 24)
        );
        assert_eq!(
            Masked::ipv4_cidr(Ipv4Addr::new(1, 2, 3, 4), 0).prefix_len(),
            Some(0)
        );
        assert_eq!(
            Masked::ipv4_cidr(Ipv4Addr::new(1, 2, 3, 4), 40).prefix_len(),
            Some(32)
        );
        assert_eq!(
            Masked::ipv6_cidr(Ipv6Addr::LOCALHOST, 128).prefix_len(),
            Some(128)
        );
        let odd = Masked::new(Ipv4Addr::new(1, 2, 3, 4), Ipv4Addr::new(255, 0, 255, 0));
        assert_eq!(odd.prefix_len(), None);
    }

    #[test]
    fn flow_key_ignores_cookie_and_actions() {
        let a = tcp_flow();
        let mut b = tcp_flow();
        b.cookie = 99;
        b.actions = vec![Action::Normal];
        assert_eq!(a.key(), b.key());
        assert_ne!(a, b);
        let mut c = tcp_flow();
        c.priority = 101;
        assert_ne!(a.key(), c.key());
        let set: BTreeSet<Flow> = [a.clone(), b, a].into_iter().collect();
        assert_eq!(set.len(), 2);
    }
}
