//! The `ovs-ofctl add-flow` text of flows, matches and actions.

use std::fmt::{self, Display, Formatter, Write as _};
use std::net::{Ipv4Addr, Ipv6Addr};

use super::{ct_state, eth_type, ip_proto, port, Action, Flow, FullMask, Masked, Match};

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
    use super::super::tests::tcp_flow;
    use super::super::*;

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
}
