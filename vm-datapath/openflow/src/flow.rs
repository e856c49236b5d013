//! The flow model: plain data describing an OpenFlow flow the way the policy compiler produces
//! it, independent of the wire encoding. `Display` prints `ovs-ofctl add-flow` syntax so the same
//! text can be fed to `ovs-ofctl --bundle add-flows` and compared with what the native client
//! installs.
//!
//! Stability: other crates build on these types. Only additive changes (new optional match
//! fields, new action variants) are made here.

use std::fmt::{self, Display, Formatter, Write as _};
use std::net::{Ipv4Addr, Ipv6Addr};

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

fn write_mac(out: &mut Formatter<'_>, mac: &[u8; 6]) -> fmt::Result {
    write!(
        out,
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]
    )
}

/// Writes `,` before every item but the first.
struct Fields<'a, 'b> {
    out: &'a mut Formatter<'b>,
    first: bool,
}

impl<'a, 'b> Fields<'a, 'b> {
    fn new(out: &'a mut Formatter<'b>, first: bool) -> Self {
        Fields { out, first }
    }

    fn next(&mut self) -> Result<&mut Formatter<'b>, fmt::Error> {
        if !self.first {
            self.out.write_char(',')?;
        }
        self.first = false;
        Ok(self.out)
    }
}

fn write_ipv4(out: &mut Formatter<'_>, name: &str, m: &Masked<Ipv4Addr>) -> fmt::Result {
    let value = m.normalized_value();
    if m.is_exact() {
        write!(out, "{name}={value}")
    } else if let Some(len) = m.prefix_len() {
        write!(out, "{name}={value}/{len}")
    } else {
        write!(out, "{name}={value}/{}", m.mask)
    }
}

fn write_ipv6(out: &mut Formatter<'_>, name: &str, m: &Masked<Ipv6Addr>) -> fmt::Result {
    let value = m.normalized_value();
    if m.is_exact() {
        write!(out, "{name}={value}")
    } else if let Some(len) = m.prefix_len() {
        write!(out, "{name}={value}/{len}")
    } else {
        write!(out, "{name}={value}/{}", m.mask)
    }
}

fn write_port(out: &mut Formatter<'_>, name: &str, m: &Masked<u16>) -> fmt::Result {
    if m.is_exact() {
        write!(out, "{name}={}", m.value)
    } else {
        write!(out, "{name}={:#x}/{:#x}", m.normalized_value(), m.mask)
    }
}

fn write_hex<T: FullMask + fmt::LowerHex>(
    out: &mut Formatter<'_>,
    name: &str,
    m: &Masked<T>,
) -> fmt::Result {
    if m.is_exact() {
        write!(out, "{name}={:#x}", m.value)
    } else {
        write!(out, "{name}={:#x}/{:#x}", m.normalized_value(), m.mask)
    }
}

/// The `ovs-ofctl` protocol keyword for an (eth_type, ip_proto) pair, when one exists.
fn protocol_keyword(eth_type: Option<u16>, proto: Option<u8>) -> Option<&'static str> {
    Some(match (eth_type?, proto) {
        (eth_type::IPV4, None) => "ip",
        (eth_type::IPV4, Some(ip_proto::TCP)) => "tcp",
        (eth_type::IPV4, Some(ip_proto::UDP)) => "udp",
        (eth_type::IPV4, Some(ip_proto::SCTP)) => "sctp",
        (eth_type::IPV4, Some(ip_proto::ICMP)) => "icmp",
        (eth_type::IPV6, None) => "ipv6",
        (eth_type::IPV6, Some(ip_proto::TCP)) => "tcp6",
        (eth_type::IPV6, Some(ip_proto::UDP)) => "udp6",
        (eth_type::IPV6, Some(ip_proto::SCTP)) => "sctp6",
        (eth_type::IPV6, Some(ip_proto::ICMPV6)) => "icmp6",
        (eth_type::ARP, None) => "arp",
        _ => return None,
    })
}

impl Match {
    /// Writes the match fields in `ovs-ofctl` syntax; `first` says whether nothing precedes them.
    fn write_fields(&self, out: &mut Formatter<'_>, first: bool) -> fmt::Result {
        let mut fields = Fields::new(out, first);
        if let Some(port) = self.in_port {
            write!(fields.next()?, "in_port={port}")?;
        }
        for (name, mac) in [("dl_src", &self.eth_src), ("dl_dst", &self.eth_dst)] {
            if let Some(mac) = mac {
                let out = fields.next()?;
                write!(out, "{name}=")?;
                write_mac(out, &mac.normalized_value())?;
                if !mac.is_exact() {
                    out.write_char('/')?;
                    write_mac(out, &mac.mask)?;
                }
            }
        }
        match protocol_keyword(self.eth_type, self.ip_proto) {
            Some(keyword) => fields.next()?.write_str(keyword)?,
            None => {
                if let Some(eth_type) = self.eth_type {
                    write!(fields.next()?, "dl_type={eth_type:#06x}")?;
                }
                if let Some(proto) = self.ip_proto {
                    write!(fields.next()?, "nw_proto={proto}")?;
                }
            }
        }
        if let Some(op) = self.arp_op {
            write!(fields.next()?, "arp_op={op}")?;
        }
        let ipv4 = [
            ("arp_spa", &self.arp_spa),
            ("arp_tpa", &self.arp_tpa),
            ("nw_src", &self.ipv4_src),
            ("nw_dst", &self.ipv4_dst),
        ];
        for (name, addr) in ipv4 {
            if let Some(addr) = addr {
                write_ipv4(fields.next()?, name, addr)?;
            }
        }
        for (name, addr) in [("ipv6_src", &self.ipv6_src), ("ipv6_dst", &self.ipv6_dst)] {
            if let Some(addr) = addr {
                write_ipv6(fields.next()?, name, addr)?;
            }
        }
        let ports = [
            ("tcp_src", &self.tcp_src),
            ("tcp_dst", &self.tcp_dst),
            ("udp_src", &self.udp_src),
            ("udp_dst", &self.udp_dst),
            ("sctp_src", &self.sctp_src),
            ("sctp_dst", &self.sctp_dst),
        ];
        for (name, port) in ports {
            if let Some(port) = port {
                write_port(fields.next()?, name, port)?;
            }
        }
        let icmp = [
            ("icmp_type", self.icmpv4_type),
            ("icmp_code", self.icmpv4_code),
            ("icmpv6_type", self.icmpv6_type),
            ("icmpv6_code", self.icmpv6_code),
        ];
        for (name, value) in icmp {
            if let Some(value) = value {
                write!(fields.next()?, "{name}={value}")?;
            }
        }
        if let Some(state) = &self.ct_state {
            let out = fields.next()?;
            out.write_str("ct_state=")?;
            let known = ct_state::NAMES.iter().fold(0, |acc, (bit, _)| acc | bit);
            if state.mask & !known != 0 {
                write!(out, "{:#x}/{:#x}", state.normalized_value(), state.mask)?;
            } else {
                for (bit, name) in ct_state::NAMES {
                    if state.mask & bit != 0 {
                        let sign = if state.value & bit != 0 { '+' } else { '-' };
                        write!(out, "{sign}{name}")?;
                    }
                }
            }
        }
        if let Some(mark) = &self.ct_mark {
            write_hex(fields.next()?, "ct_mark", mark)?;
        }
        if let Some(label) = &self.ct_label {
            write_hex(fields.next()?, "ct_label", label)?;
        }
        for (index, reg) in self.regs.iter().enumerate() {
            if let Some(reg) = reg {
                write_hex(fields.next()?, &format!("reg{index}"), reg)?;
            }
        }
        if let Some(id) = self.conj_id {
            write!(fields.next()?, "conj_id={id}")?;
        }
        Ok(())
    }
}

impl Display for Match {
    fn fmt(&self, out: &mut Formatter<'_>) -> fmt::Result {
        self.write_fields(out, true)
    }
}

impl Display for Action {
    fn fmt(&self, out: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Action::Output(port::IN_PORT) => out.write_str("in_port"),
            Action::Output(port::LOCAL) => out.write_str("LOCAL"),
            Action::Output(port) => write!(out, "output:{port}"),
            Action::Normal => out.write_str("NORMAL"),
            Action::Controller { max_len, userdata } => {
                write!(out, "controller(max_len={max_len}")?;
                if !userdata.is_empty() {
                    out.write_str(",userdata=")?;
                    for (index, byte) in userdata.iter().enumerate() {
                        if index > 0 {
                            out.write_char('.')?;
                        }
                        write!(out, "{byte:02x}")?;
                    }
                }
                out.write_char(')')
            }
            Action::Conjunction {
                id,
                clause,
                n_clauses,
            } => write!(out, "conjunction({id},{clause}/{n_clauses})"),
            Action::Ct {
                commit,
                zone,
                table,
                set_mark,
                set_label,
            } => {
                out.write_str("ct(")?;
                let mut fields = Fields::new(out, true);
                if *commit {
                    fields.next()?.write_str("commit")?;
                }
                if *zone != 0 {
                    write!(fields.next()?, "zone={zone}")?;
                }
                if let Some(table) = table {
                    write!(fields.next()?, "table={table}")?;
                }
                if set_mark.is_some() || set_label.is_some() {
                    let out = fields.next()?;
                    out.write_str("exec(")?;
                    let mut exec = Fields::new(out, true);
                    if let Some(mark) = set_mark {
                        write_set_field(exec.next()?, "ct_mark", mark)?;
                    }
                    if let Some(label) = set_label {
                        write_set_field(exec.next()?, "ct_label", label)?;
                    }
                    out.write_char(')')?;
                }
                out.write_char(')')
            }
            Action::GotoTable(table) => write!(out, "goto_table:{table}"),
            Action::Meter(id) => write!(out, "meter:{id}"),
            Action::Resubmit { table } => write!(out, "resubmit(,{table})"),
            Action::SetReg { reg, value, mask } => write_set_field(
                out,
                &format!("reg{reg}"),
                &Masked {
                    value: *value,
                    mask: *mask,
                },
            ),
        }
    }
}

fn write_set_field<T: FullMask + fmt::LowerHex>(
    out: &mut Formatter<'_>,
    field: &str,
    m: &Masked<T>,
) -> fmt::Result {
    if m.is_exact() {
        write!(out, "set_field:{:#x}->{field}", m.value)
    } else {
        write!(
            out,
            "set_field:{:#x}/{:#x}->{field}",
            m.normalized_value(),
            m.mask
        )
    }
}

impl Display for Flow {
    fn fmt(&self, out: &mut Formatter<'_>) -> fmt::Result {
        write!(
            out,
            "table={},priority={},cookie={:#x}",
            self.table, self.priority, self.cookie
        )?;
        self.matches.write_fields(out, false)?;
        out.write_str(" actions=")?;
        if self.actions.is_empty() {
            return out.write_str("drop");
        }
        // ovs-ofctl wants meter first and goto_table last (instruction order), whatever order
        // the caller listed them in.
        let meter = |a: &&Action| matches!(a, Action::Meter(_));
        let goto = |a: &&Action| matches!(a, Action::GotoTable(_));
        let ordered = self
            .actions
            .iter()
            .filter(meter)
            .chain(self.actions.iter().filter(|a| !meter(a) && !goto(a)))
            .chain(self.actions.iter().filter(goto));
        for (index, action) in ordered.enumerate() {
            if index > 0 {
                out.write_char(',')?;
            }
            write!(out, "{action}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn tcp_flow() -> Flow {
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
    fn displays_add_flow_syntax() {
        assert_eq!(
            tcp_flow().to_string(),
            "table=0,priority=100,cookie=0x1234,tcp,nw_src=10.0.0.0/24,tcp_dst=80 \
             actions=conjunction(1,1/2)"
        );
    }

    #[test]
    fn empty_actions_display_as_drop_and_empty_match_has_no_trailing_comma() {
        let flow = Flow {
            table: 3,
            priority: 0,
            cookie: 0,
            matches: Match::default(),
            actions: vec![],
        };
        assert_eq!(
            flow.to_string(),
            "table=3,priority=0,cookie=0x0 actions=drop"
        );
    }

    #[test]
    fn displays_every_match_field() {
        let mut regs = [None; 16];
        regs[3] = Some(Masked::new(0x15, 0xf0));
        regs[15] = Some(Masked::exact(7));
        let matches = Match {
            in_port: Some(4),
            eth_src: Some(Masked::exact([0xaa, 0xbb, 0xcc, 0, 1, 2])),
            eth_dst: Some(Masked::new([1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0])),
            eth_type: Some(eth_type::IPV6),
            ip_proto: Some(ip_proto::UDP),
            ipv6_src: Some(Masked::ipv6_cidr("fd00::1".parse().unwrap(), 64)),
            ipv6_dst: Some(Masked::exact("fd00::2".parse().unwrap())),
            udp_dst: Some(Masked::new(0x1000, 0xf000)),
            ct_state: Some(Masked::new(
                ct_state::TRK | ct_state::NEW,
                ct_state::TRK | ct_state::NEW | ct_state::EST,
            )),
            ct_mark: Some(Masked::new(1, 0xff)),
            ct_label: Some(Masked::exact(1u128 << 64)),
            regs,
            conj_id: Some(9),
            ..Match::default()
        };
        assert_eq!(
            matches.to_string(),
            "in_port=4,dl_src=aa:bb:cc:00:01:02,dl_dst=01:00:00:00:00:00/01:00:00:00:00:00,udp6,\
             ipv6_src=fd00::/64,ipv6_dst=fd00::2,udp_dst=0x1000/0xf000,ct_state=+new-est+trk,\
             ct_mark=0x1/0xff,ct_label=0x10000000000000000,reg3=0x10/0xf0,reg15=0x7,conj_id=9"
        );
    }

    #[test]
    fn falls_back_to_dl_type_and_nw_proto_without_a_keyword() {
        let matches = Match {
            eth_type: Some(eth_type::IPV4),
            ip_proto: Some(47),
            ipv4_dst: Some(Masked::new(
                Ipv4Addr::new(10, 1, 2, 3),
                Ipv4Addr::new(255, 0, 255, 0),
            )),
            ..Match::default()
        };
        assert_eq!(
            matches.to_string(),
            "dl_type=0x0800,nw_proto=47,nw_dst=10.0.2.0/255.0.255.0"
        );
        let arp = Match {
            eth_type: Some(eth_type::ARP),
            arp_op: Some(1),
            arp_tpa: Some(Masked::exact(Ipv4Addr::new(10, 0, 0, 1))),
            ..Match::default()
        };
        assert_eq!(arp.to_string(), "arp,arp_op=1,arp_tpa=10.0.0.1");
        let icmp = Match {
            eth_type: Some(eth_type::IPV4),
            ip_proto: Some(ip_proto::ICMP),
            icmpv4_type: Some(3),
            icmpv4_code: Some(1),
            ..Match::default()
        };
        assert_eq!(icmp.to_string(), "icmp,icmp_type=3,icmp_code=1");
    }

    #[test]
    fn displays_every_action() {
        let flow = Flow {
            table: 1,
            priority: 200,
            cookie: u64::MAX,
            matches: Match {
                eth_type: Some(eth_type::IPV4),
                conj_id: Some(5),
                ..Match::default()
            },
            actions: vec![
                Action::GotoTable(4),
                Action::Ct {
                    commit: true,
                    zone: 7,
                    table: Some(2),
                    set_mark: Some(Masked::exact(3)),
                    set_label: Some(Masked::new(0x500, 0xff00)),
                },
                Action::SetReg {
                    reg: 2,
                    value: 1,
                    mask: 0xff,
                },
                Action::Resubmit { table: 9 },
                Action::Controller {
                    max_len: 128,
                    userdata: vec![1, 0xab],
                },
                Action::Output(2),
                Action::Output(port::IN_PORT),
                Action::Normal,
                Action::Meter(7),
            ],
        };
        assert_eq!(
            flow.to_string(),
            "table=1,priority=200,cookie=0xffffffffffffffff,ip,conj_id=5 actions=meter:7,\
             ct(commit,zone=7,table=2,exec(set_field:0x3->ct_mark,set_field:0x500/0xff00->ct_label)),\
             set_field:0x1/0xff->reg2,resubmit(,9),controller(max_len=128,userdata=01.ab),\
             output:2,in_port,NORMAL,goto_table:4"
        );
        let plain_ct = Action::Ct {
            commit: false,
            zone: 0,
            table: None,
            set_mark: None,
            set_label: None,
        };
        assert_eq!(plain_ct.to_string(), "ct()");
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
