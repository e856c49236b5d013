//! `ofp_match` with OXM fields (OpenFlow basic class) and Nicira NXM extension fields
//! (registers, conntrack state/mark/label, conjunction id).

use std::net::{Ipv4Addr, Ipv6Addr};

use super::wire::{Put, Reader};
use super::{DecodeError, EncodeError};
use crate::flow::{Masked, Match};

const CLASS_BASIC: u16 = 0x8000;
const CLASS_NXM1: u16 = 0x0001;
const OFPMT_OXM: u16 = 1;

// OpenFlow basic fields (OpenFlow 1.3 section 7.2.3.7).
const IN_PORT: u8 = 0;
const ETH_DST: u8 = 3;
const ETH_SRC: u8 = 4;
const ETH_TYPE: u8 = 5;
const IP_PROTO: u8 = 10;
const IPV4_SRC: u8 = 11;
const IPV4_DST: u8 = 12;
const TCP_SRC: u8 = 13;
const TCP_DST: u8 = 14;
const UDP_SRC: u8 = 15;
const UDP_DST: u8 = 16;
const SCTP_SRC: u8 = 17;
const SCTP_DST: u8 = 18;
const ICMPV4_TYPE: u8 = 19;
const ICMPV4_CODE: u8 = 20;
const ARP_OP: u8 = 21;
const ARP_SPA: u8 = 22;
const ARP_TPA: u8 = 23;
const IPV6_SRC: u8 = 26;
const IPV6_DST: u8 = 27;
const ICMPV6_TYPE: u8 = 29;
const ICMPV6_CODE: u8 = 30;

// Nicira extension fields (class NXM_1), numbered as in Open vSwitch's meta-flow.
const NX_REG0: u8 = 0;
const NX_CONJ_ID: u8 = 37;
pub(crate) const NX_CT_STATE: u8 = 105;
pub(crate) const NX_CT_MARK: u8 = 107;
pub(crate) const NX_CT_LABEL: u8 = 108;

/// A field value's wire form.
pub(crate) trait WireValue: Sized + Copy {
    const LEN: usize;
    fn put(&self, out: &mut Vec<u8>);
    fn read(reader: &mut Reader<'_>) -> Result<Self, DecodeError>;
}

macro_rules! wire_int {
    ($($t:ty => $read:ident),*) => {$(
        impl WireValue for $t {
            const LEN: usize = std::mem::size_of::<$t>();
            fn put(&self, out: &mut Vec<u8>) { out.extend_from_slice(&self.to_be_bytes()); }
            fn read(reader: &mut Reader<'_>) -> Result<Self, DecodeError> { reader.$read() }
        }
    )*};
}
wire_int!(u8 => u8, u16 => u16, u32 => u32, u128 => u128);

impl WireValue for Ipv4Addr {
    const LEN: usize = 4;
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.octets());
    }
    fn read(reader: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Ipv4Addr::from(reader.array::<4>()?))
    }
}

impl WireValue for Ipv6Addr {
    const LEN: usize = 16;
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.octets());
    }
    fn read(reader: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Ipv6Addr::from(reader.array::<16>()?))
    }
}

impl WireValue for [u8; 6] {
    const LEN: usize = 6;
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn read(reader: &mut Reader<'_>) -> Result<Self, DecodeError> {
        reader.array::<6>()
    }
}

pub(crate) fn oxm_header(class: u16, field: u8, has_mask: bool, len: usize) -> u32 {
    (u32::from(class) << 16) | (u32::from(field) << 9) | (u32::from(has_mask) << 8) | len as u32
}

fn put_exact<T: WireValue>(out: &mut Vec<u8>, class: u16, field: u8, value: T) {
    out.put_u32(oxm_header(class, field, false, T::LEN));
    value.put(out);
}

/// Writes a masked field, or an exact one when the mask is all ones.
pub(crate) fn put_masked<T: WireValue + crate::flow::FullMask>(
    out: &mut Vec<u8>,
    class: u16,
    field: u8,
    m: &Masked<T>,
) {
    if m.is_exact() {
        put_exact(out, class, field, m.value);
    } else {
        out.put_u32(oxm_header(class, field, true, 2 * T::LEN));
        m.normalized_value().put(out);
        m.mask.put(out);
    }
}

pub(crate) fn put_nx_masked<T: WireValue + crate::flow::FullMask>(
    out: &mut Vec<u8>,
    field: u8,
    m: &Masked<T>,
) {
    put_masked(out, CLASS_NXM1, field, m);
}

/// Writes the OXM fields of `m` (no `ofp_match` header), prerequisites first as OVS requires.
pub(crate) fn put_fields(out: &mut Vec<u8>, m: &Match) {
    let basic = CLASS_BASIC;
    if let Some(port) = m.in_port {
        put_exact(out, basic, IN_PORT, port);
    }
    if let Some(mac) = &m.eth_dst {
        put_masked(out, basic, ETH_DST, mac);
    }
    if let Some(mac) = &m.eth_src {
        put_masked(out, basic, ETH_SRC, mac);
    }
    if let Some(eth_type) = m.eth_type {
        put_exact(out, basic, ETH_TYPE, eth_type);
    }
    if let Some(proto) = m.ip_proto {
        put_exact(out, basic, IP_PROTO, proto);
    }
    for (field, addr) in [(IPV4_SRC, &m.ipv4_src), (IPV4_DST, &m.ipv4_dst)] {
        if let Some(addr) = addr {
            put_masked(out, basic, field, addr);
        }
    }
    for (field, addr) in [(IPV6_SRC, &m.ipv6_src), (IPV6_DST, &m.ipv6_dst)] {
        if let Some(addr) = addr {
            put_masked(out, basic, field, addr);
        }
    }
    let ports = [
        (TCP_SRC, &m.tcp_src),
        (TCP_DST, &m.tcp_dst),
        (UDP_SRC, &m.udp_src),
        (UDP_DST, &m.udp_dst),
        (SCTP_SRC, &m.sctp_src),
        (SCTP_DST, &m.sctp_dst),
    ];
    for (field, port) in ports {
        if let Some(port) = port {
            put_masked(out, basic, field, port);
        }
    }
    let icmp = [
        (ICMPV4_TYPE, m.icmpv4_type),
        (ICMPV4_CODE, m.icmpv4_code),
        (ICMPV6_TYPE, m.icmpv6_type),
        (ICMPV6_CODE, m.icmpv6_code),
    ];
    for (field, value) in icmp {
        if let Some(value) = value {
            put_exact(out, basic, field, value);
        }
    }
    if let Some(op) = m.arp_op {
        put_exact(out, basic, ARP_OP, op);
    }
    for (field, addr) in [(ARP_SPA, &m.arp_spa), (ARP_TPA, &m.arp_tpa)] {
        if let Some(addr) = addr {
            put_masked(out, basic, field, addr);
        }
    }
    for (index, reg) in m.regs.iter().enumerate() {
        if let Some(reg) = reg {
            put_nx_masked(out, NX_REG0 + index as u8, reg);
        }
    }
    if let Some(state) = &m.ct_state {
        put_nx_masked(out, NX_CT_STATE, state);
    }
    if let Some(mark) = &m.ct_mark {
        put_nx_masked(out, NX_CT_MARK, mark);
    }
    if let Some(label) = &m.ct_label {
        put_nx_masked(out, NX_CT_LABEL, label);
    }
    if let Some(id) = m.conj_id {
        put_exact(out, CLASS_NXM1, NX_CONJ_ID, id);
    }
}

/// Writes a complete `ofp_match` (header, fields, padding to 8 bytes).
pub(crate) fn put_match(out: &mut Vec<u8>, m: &Match) -> Result<(), EncodeError> {
    let start = out.len();
    out.put_u16(OFPMT_OXM);
    out.put_u16(0);
    put_fields(out, m);
    let len = u16::try_from(out.len() - start).map_err(|_| EncodeError::TooLong("match"))?;
    out.set_u16(start + 2, len);
    out.pad_to_8(start);
    Ok(())
}

/// One decoded OXM TLV.
pub(crate) struct Tlv<'a> {
    pub(crate) class: u16,
    pub(crate) field: u8,
    pub(crate) has_mask: bool,
    pub(crate) payload: &'a [u8],
}

pub(crate) fn read_tlv<'a>(reader: &mut Reader<'a>) -> Result<Tlv<'a>, DecodeError> {
    let header = reader.u32()?;
    let class = (header >> 16) as u16;
    let len = (header & 0xff) as usize;
    Ok(Tlv {
        class,
        field: ((header >> 9) & 0x7f) as u8,
        has_mask: header & 0x100 != 0,
        payload: reader.bytes(len)?,
    })
}

fn exact<T: WireValue>(tlv: &Tlv<'_>) -> Result<T, DecodeError> {
    if tlv.has_mask || tlv.payload.len() != T::LEN {
        return Err(DecodeError::BadLength {
            what: "OXM field",
            length: tlv.payload.len(),
        });
    }
    T::read(&mut Reader::new(tlv.payload, "OXM value"))
}

pub(crate) fn masked<T: WireValue + crate::flow::FullMask>(
    tlv: &Tlv<'_>,
) -> Result<Masked<T>, DecodeError> {
    let expected = if tlv.has_mask { 2 * T::LEN } else { T::LEN };
    if tlv.payload.len() != expected {
        return Err(DecodeError::BadLength {
            what: "OXM field",
            length: tlv.payload.len(),
        });
    }
    let mut reader = Reader::new(tlv.payload, "OXM value");
    let value = T::read(&mut reader)?;
    Ok(if tlv.has_mask {
        Masked::new(value, T::read(&mut reader)?)
    } else {
        Masked::exact(value)
    })
}

fn set_once<T>(slot: &mut Option<T>, value: T, header: &Tlv<'_>) -> Result<(), DecodeError> {
    if slot.is_some() {
        return Err(DecodeError::Unsupported {
            what: "duplicate OXM field",
            value: u64::from(oxm_header(header.class, header.field, false, 0)),
        });
    }
    *slot = Some(value);
    Ok(())
}

/// Decodes the OXM fields filling `reader` into a [`Match`].
pub(crate) fn read_fields(reader: &mut Reader<'_>) -> Result<Match, DecodeError> {
    let mut m = Match::default();
    while !reader.is_empty() {
        let tlv = read_tlv(reader)?;
        let t = &tlv;
        match (tlv.class, tlv.field) {
            (CLASS_BASIC, IN_PORT) => set_once(&mut m.in_port, exact(t)?, t)?,
            (CLASS_BASIC, ETH_DST) => set_once(&mut m.eth_dst, masked(t)?, t)?,
            (CLASS_BASIC, ETH_SRC) => set_once(&mut m.eth_src, masked(t)?, t)?,
            (CLASS_BASIC, ETH_TYPE) => set_once(&mut m.eth_type, exact(t)?, t)?,
            (CLASS_BASIC, IP_PROTO) => set_once(&mut m.ip_proto, exact(t)?, t)?,
            (CLASS_BASIC, IPV4_SRC) => set_once(&mut m.ipv4_src, masked(t)?, t)?,
            (CLASS_BASIC, IPV4_DST) => set_once(&mut m.ipv4_dst, masked(t)?, t)?,
            (CLASS_BASIC, IPV6_SRC) => set_once(&mut m.ipv6_src, masked(t)?, t)?,
            (CLASS_BASIC, IPV6_DST) => set_once(&mut m.ipv6_dst, masked(t)?, t)?,
            (CLASS_BASIC, TCP_SRC) => set_once(&mut m.tcp_src, masked(t)?, t)?,
            (CLASS_BASIC, TCP_DST) => set_once(&mut m.tcp_dst, masked(t)?, t)?,
            (CLASS_BASIC, UDP_SRC) => set_once(&mut m.udp_src, masked(t)?, t)?,
            (CLASS_BASIC, UDP_DST) => set_once(&mut m.udp_dst, masked(t)?, t)?,
            (CLASS_BASIC, SCTP_SRC) => set_once(&mut m.sctp_src, masked(t)?, t)?,
            (CLASS_BASIC, SCTP_DST) => set_once(&mut m.sctp_dst, masked(t)?, t)?,
            (CLASS_BASIC, ICMPV4_TYPE) => set_once(&mut m.icmpv4_type, exact(t)?, t)?,
            (CLASS_BASIC, ICMPV4_CODE) => set_once(&mut m.icmpv4_code, exact(t)?, t)?,
            (CLASS_BASIC, ICMPV6_TYPE) => set_once(&mut m.icmpv6_type, exact(t)?, t)?,
            (CLASS_BASIC, ICMPV6_CODE) => set_once(&mut m.icmpv6_code, exact(t)?, t)?,
            (CLASS_BASIC, ARP_OP) => set_once(&mut m.arp_op, exact(t)?, t)?,
            (CLASS_BASIC, ARP_SPA) => set_once(&mut m.arp_spa, masked(t)?, t)?,
            (CLASS_BASIC, ARP_TPA) => set_once(&mut m.arp_tpa, masked(t)?, t)?,
            (CLASS_NXM1, field) if field < NX_REG0 + 16 => {
                set_once(&mut m.regs[usize::from(field)], masked(t)?, t)?
            }
            (CLASS_NXM1, NX_CT_STATE) => set_once(&mut m.ct_state, masked(t)?, t)?,
            (CLASS_NXM1, NX_CT_MARK) => set_once(&mut m.ct_mark, masked(t)?, t)?,
            (CLASS_NXM1, NX_CT_LABEL) => set_once(&mut m.ct_label, masked(t)?, t)?,
            (CLASS_NXM1, NX_CONJ_ID) => set_once(&mut m.conj_id, exact(t)?, t)?,
            _ => {
                return Err(DecodeError::Unsupported {
                    what: "OXM field",
                    value: u64::from(oxm_header(tlv.class, tlv.field, tlv.has_mask, 0)),
                })
            }
        }
    }
    Ok(m)
}

/// Decodes a complete `ofp_match` including its padding.
pub(crate) fn read_match(reader: &mut Reader<'_>) -> Result<Match, DecodeError> {
    let match_type = reader.u16()?;
    if match_type != OFPMT_OXM {
        return Err(DecodeError::Unsupported {
            what: "match type",
            value: u64::from(match_type),
        });
    }
    let len = usize::from(reader.u16()?);
    if len < 4 {
        return Err(DecodeError::BadLength {
            what: "ofp_match",
            length: len,
        });
    }
    let mut fields = reader.sub(len - 4, "ofp_match fields")?;
    let m = read_fields(&mut fields)?;
    reader.skip(super::wire::round_up_8(len) - len)?;
    Ok(m)
}
