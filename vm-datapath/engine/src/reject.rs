//! Replies to packets a Reject rule sent to the agent: a TCP RST for TCP; otherwise an ICMP
//! destination unreachable (IPv4: port unreachable for UDP, host unreachable for anything else)
//! or an ICMPv6 destination unreachable (port unreachable for UDP, administratively prohibited
//! for anything else).
//!
//! Hand-written on purpose: the replies have fixed layouts (Ethernet + IPv4/IPv6 + TCP/ICMP) and
//! need only the Internet checksum; a packet crate would add a dependency for ~200 lines, and
//! parsing here must never panic on whatever the network sent (every access is checked).

const ETH_HEADER: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_VLAN: u16 = 0x8100;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ICMPV6: u8 = 58;
// IPv6 extension headers walked to find the transport header (RFC 8200 section 4).
const IPV6_HOP_BY_HOP: u8 = 0;
const IPV6_ROUTING: u8 = 43;
const IPV6_FRAGMENT: u8 = 44;
const IPV6_AUTH: u8 = 51;
const IPV6_DEST_OPTIONS: u8 = 60;
/// More extension headers than this is not a packet worth answering.
const IPV6_MAX_EXTENSIONS: usize = 8;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;
const TCP_SYN: u8 = 0x02;
const TCP_FIN: u8 = 0x01;
const ICMP_DEST_UNREACHABLE: u8 = 3;
const ICMP_HOST_UNREACHABLE: u8 = 1;
const ICMP_PORT_UNREACHABLE: u8 = 3;
const ICMPV6_DEST_UNREACHABLE: u8 = 1;
const ICMPV6_ADMIN_PROHIBITED: u8 = 1;
const ICMPV6_PORT_UNREACHABLE: u8 = 4;
/// ICMPv6 types 0..=127 are errors (never answered, RFC 4443 section 2.4 e.1).
const ICMPV6_FIRST_INFORMATIONAL: u8 = 128;
/// RFC 1812: the original IP header plus at least 8 bytes; Linux quotes up to 576 bytes total.
const ICMP_QUOTE_MAX: usize = 548;
/// RFC 4443 section 3.1: as much of the packet as fits without the error exceeding the minimum
/// IPv6 MTU (1280 = 40 IPv6 + 8 ICMPv6 + 1232).
const ICMPV6_QUOTE_MAX: usize = 1232;
const REPLY_TTL: u8 = 64;

/// What kind of reply was built (for logs and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReply {
    TcpReset,
    IcmpUnreachable,
}

/// Builds the reply to `frame` (an Ethernet frame as the rejected VM sent it), addressed back to
/// its sender. `None` when nothing should be sent: not IP, truncated, a fragment other than the
/// first, an ICMP/ICMPv6 error or a TCP RST itself (never answer those: RFC 1122 / RFC 793 /
/// RFC 4443), or an IPv6 packet from or to an address that names no single node.
pub fn build_reject_reply(frame: &[u8]) -> Option<(RejectReply, Vec<u8>)> {
    let (eth_dst, eth_src) = (frame.get(0..6)?, frame.get(6..12)?);
    let mut offset = 12;
    let mut ethertype = read_u16(frame, offset)?;
    if ethertype == ETHERTYPE_VLAN {
        // The reply goes out untagged on the access port the packet came from.
        offset += 4;
        ethertype = read_u16(frame, offset)?;
    }
    let ip = frame.get(offset + 2..)?;
    let mut reply = Vec::with_capacity(ETH_HEADER + 40 + 8 + ICMPV6_QUOTE_MAX);
    reply.extend_from_slice(eth_src);
    reply.extend_from_slice(eth_dst);
    reply.extend_from_slice(&ethertype.to_be_bytes());
    let kind = match ethertype {
        ETHERTYPE_IPV4 => ipv4_reply(ip, &mut reply)?,
        ETHERTYPE_IPV6 => ipv6_reply(ip, &mut reply)?,
        _ => return None,
    };
    Some((kind, reply))
}

fn ipv4_reply(ip: &[u8], reply: &mut Vec<u8>) -> Option<RejectReply> {
    let version_ihl = *ip.first()?;
    if version_ihl >> 4 != 4 {
        return None;
    }
    let header_len = usize::from(version_ihl & 0x0f) * 4;
    let total_len = usize::from(read_u16(ip, 2)?);
    if header_len < 20 || total_len < header_len || ip.len() < header_len {
        return None;
    }
    let ip = &ip[..total_len.min(ip.len())];
    let fragment_offset = read_u16(ip, 6)? & 0x1fff;
    if fragment_offset != 0 {
        return None;
    }
    let protocol = ip[9];
    let (src, dst) = (&ip[12..16], &ip[16..20]);
    let payload = &ip[header_len..];
    match protocol {
        IPPROTO_TCP => {
            let segment = tcp_reset(payload)?;
            push_ipv4_header(reply, IPPROTO_TCP, segment.len(), dst, src);
            let mut pseudo = [0u8; 12];
            pseudo[0..4].copy_from_slice(dst);
            pseudo[4..8].copy_from_slice(src);
            pseudo[8..12].copy_from_slice(&[0, IPPROTO_TCP, 0, 20]);
            push_with_checksum(reply, &pseudo, &segment, 16);
            Some(RejectReply::TcpReset)
        }
        _ => {
            if protocol == IPPROTO_ICMP {
                let icmp_type = *payload.first()?;
                // Only queries (echo, timestamp, ...) get an error back, never errors.
                if matches!(icmp_type, 3 | 4 | 5 | 11 | 12) {
                    return None;
                }
            }
            let code = if protocol == IPPROTO_UDP {
                ICMP_PORT_UNREACHABLE
            } else {
                ICMP_HOST_UNREACHABLE
            };
            let quote = &ip[..ip.len().min(ICMP_QUOTE_MAX)];
            push_ipv4_header(reply, IPPROTO_ICMP, 8 + quote.len(), dst, src);
            let mut icmp = Vec::with_capacity(8 + quote.len());
            icmp.extend_from_slice(&[ICMP_DEST_UNREACHABLE, code, 0, 0, 0, 0, 0, 0]);
            icmp.extend_from_slice(quote);
            push_with_checksum(reply, &[], &icmp, 2);
            Some(RejectReply::IcmpUnreachable)
        }
    }
}

fn ipv6_reply(ip: &[u8], reply: &mut Vec<u8>) -> Option<RejectReply> {
    let header = ip.get(..40)?;
    if header[0] >> 4 != 6 {
        return None;
    }
    let payload_len = usize::from(read_u16(header, 4)?);
    // Ethernet padding after a short packet is not part of it.
    let ip = &ip[..(40 + payload_len).min(ip.len())];
    let (src, dst) = (&header[8..24], &header[24..40]);
    // RFC 4443 section 2.4 e: no error to or about packets whose source names no single node
    // (unspecified, multicast) or that went to a multicast group; the same holds for RSTs.
    if src.iter().all(|&byte| byte == 0) || src[0] == 0xff || dst[0] == 0xff {
        return None;
    }
    let (protocol, transport) = ipv6_transport(header[6], &ip[40..])?;
    match protocol {
        IPPROTO_TCP => {
            let segment = tcp_reset(transport)?;
            push_ipv6_header(reply, IPPROTO_TCP, segment.len(), dst, src);
            push_with_checksum(
                reply,
                &ipv6_pseudo_header(dst, src, IPPROTO_TCP, segment.len()),
                &segment,
                16,
            );
            Some(RejectReply::TcpReset)
        }
        _ => {
            if protocol == IPPROTO_ICMPV6 {
                let icmp_type = *transport.first()?;
                if icmp_type < ICMPV6_FIRST_INFORMATIONAL {
                    return None;
                }
            }
            let code = if protocol == IPPROTO_UDP {
                ICMPV6_PORT_UNREACHABLE
            } else {
                ICMPV6_ADMIN_PROHIBITED
            };
            let quote = &ip[..ip.len().min(ICMPV6_QUOTE_MAX)];
            let mut icmp = Vec::with_capacity(8 + quote.len());
            icmp.extend_from_slice(&[ICMPV6_DEST_UNREACHABLE, code, 0, 0, 0, 0, 0, 0]);
            icmp.extend_from_slice(quote);
            push_ipv6_header(reply, IPPROTO_ICMPV6, icmp.len(), dst, src);
            push_with_checksum(
                reply,
                &ipv6_pseudo_header(dst, src, IPPROTO_ICMPV6, icmp.len()),
                &icmp,
                2,
            );
            Some(RejectReply::IcmpUnreachable)
        }
    }
}

/// Walks the IPv6 extension headers after the fixed header: the upper-layer protocol and its
/// bytes. `None` for a fragment other than the first (no transport header to answer from) or
/// a chain that runs past the packet.
fn ipv6_transport(mut next: u8, mut rest: &[u8]) -> Option<(u8, &[u8])> {
    for _ in 0..IPV6_MAX_EXTENSIONS {
        let length = match next {
            IPV6_HOP_BY_HOP | IPV6_ROUTING | IPV6_DEST_OPTIONS => {
                (usize::from(*rest.get(1)?) + 1) * 8
            }
            IPV6_AUTH => (usize::from(*rest.get(1)?) + 2) * 4,
            IPV6_FRAGMENT => {
                if read_u16(rest, 2)? & 0xfff8 != 0 {
                    return None;
                }
                8
            }
            _ => return Some((next, rest)),
        };
        next = *rest.first()?;
        rest = rest.get(length..)?;
    }
    None
}

/// The 20-byte TCP RST answering `tcp` (a segment as sent, options and data included), with
/// ports swapped and the checksum left zero. `None` for a truncated header or a RST.
fn tcp_reset(tcp: &[u8]) -> Option<[u8; 20]> {
    let header = tcp.get(..20)?;
    let flags = header[13];
    if flags & TCP_RST != 0 {
        return None;
    }
    let seq = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    let ack = u32::from_be_bytes([header[8], header[9], header[10], header[11]]);
    let data_offset = usize::from(header[12] >> 4) * 4;
    let data_len = tcp.len().saturating_sub(data_offset);
    // RFC 793 "reset generation": answer an ACK with seq = its ack; otherwise seq 0 and ack
    // everything the segment occupied (SYN and FIN count one each).
    let (reply_seq, reply_ack, reply_flags) = if flags & TCP_ACK != 0 {
        (ack, 0, TCP_RST)
    } else {
        let occupied = (data_len as u32)
            .wrapping_add(u32::from(flags & TCP_SYN != 0))
            .wrapping_add(u32::from(flags & TCP_FIN != 0));
        (0, seq.wrapping_add(occupied), TCP_RST | TCP_ACK)
    };
    let mut segment = [0u8; 20];
    segment[0..2].copy_from_slice(&header[2..4]); // source port: the port the packet went to
    segment[2..4].copy_from_slice(&header[0..2]);
    segment[4..8].copy_from_slice(&reply_seq.to_be_bytes());
    segment[8..12].copy_from_slice(&reply_ack.to_be_bytes());
    segment[12] = 5 << 4;
    segment[13] = reply_flags;
    Some(segment)
}

/// Appends `body` with its checksum (over `pseudo` and `body`) written at `checksum_at`.
fn push_with_checksum(out: &mut Vec<u8>, pseudo: &[u8], body: &[u8], checksum_at: usize) {
    let start = out.len();
    out.extend_from_slice(body);
    let checksum = internet_checksum(&[pseudo, &out[start..]]);
    out[start + checksum_at..start + checksum_at + 2].copy_from_slice(&checksum.to_be_bytes());
}

/// RFC 8200 section 8.1: source, destination, upper-layer length (32 bits), zeros, next header.
fn ipv6_pseudo_header(src: &[u8], dst: &[u8], protocol: u8, length: usize) -> [u8; 40] {
    let mut pseudo = [0u8; 40];
    pseudo[0..16].copy_from_slice(src);
    pseudo[16..32].copy_from_slice(dst);
    pseudo[32..36].copy_from_slice(&(length as u32).to_be_bytes());
    pseudo[39] = protocol;
    pseudo
}

/// A 40-byte IPv6 header (traffic class and flow label zero).
fn push_ipv6_header(out: &mut Vec<u8>, protocol: u8, payload_len: usize, src: &[u8], dst: &[u8]) {
    // At most 8 + 1232 bytes: always fits in u16.
    let length = u16::try_from(payload_len).unwrap_or(u16::MAX);
    out.extend_from_slice(&[0x60, 0, 0, 0]);
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(&[protocol, REPLY_TTL]);
    out.extend_from_slice(src);
    out.extend_from_slice(dst);
}

fn read_u16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]))
}

/// A 20-byte IPv4 header with its checksum.
fn push_ipv4_header(out: &mut Vec<u8>, protocol: u8, payload_len: usize, src: &[u8], dst: &[u8]) {
    let start = out.len();
    // At most 20 + 548 + 8 bytes: always fits in u16.
    let total = u16::try_from(20 + payload_len).unwrap_or(u16::MAX);
    out.extend_from_slice(&[0x45, 0]);
    out.extend_from_slice(&total.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0x40, 0, REPLY_TTL, protocol, 0, 0]); // DF, no checksum yet
    out.extend_from_slice(src);
    out.extend_from_slice(dst);
    let checksum = internet_checksum(&[&out[start..start + 20]]);
    out[start + 10..start + 12].copy_from_slice(&checksum.to_be_bytes());
}

/// RFC 1071 one's-complement sum over the concatenation of `parts` (each of even length except
/// possibly the last).
fn internet_checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    for part in parts {
        let mut chunks = part.chunks_exact(2);
        for pair in &mut chunks {
            sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
        }
        if let [last] = chunks.remainder() {
            sum += u32::from(*last) << 8;
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const VM3_MAC: [u8; 6] = [2, 0, 0, 0, 0, 3];
    const VM1_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];

    fn ipv4_frame(protocol: u8, payload: &[u8]) -> Vec<u8> {
        let mut frame = Vec::new();
        frame.extend_from_slice(&VM1_MAC);
        frame.extend_from_slice(&VM3_MAC);
        frame.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        push_ipv4_header(
            &mut frame,
            protocol,
            payload.len(),
            &[10, 0, 0, 3],
            &[10, 0, 0, 1],
        );
        frame.extend_from_slice(payload);
        frame
    }

    fn syn(seq: u32) -> Vec<u8> {
        let mut tcp = vec![0xc3, 0x50, 0, 22]; // 50000 -> 22
        tcp.extend_from_slice(&seq.to_be_bytes());
        tcp.extend_from_slice(&[0, 0, 0, 0, 5 << 4, TCP_SYN, 0xff, 0xff, 0, 0, 0, 0]);
        tcp
    }

    #[test]
    fn syn_gets_a_reset_acknowledging_it_from_the_target_port() {
        let (kind, reply) = build_reject_reply(&ipv4_frame(IPPROTO_TCP, &syn(1000))).unwrap();
        assert_eq!(kind, RejectReply::TcpReset);
        assert_eq!(reply[0..6], VM3_MAC, "back to the sender");
        assert_eq!(reply[6..12], VM1_MAC);
        let ip = &reply[14..34];
        assert_eq!(
            ip[12..16],
            [10, 0, 0, 1],
            "from the address the SYN went to"
        );
        assert_eq!(ip[16..20], [10, 0, 0, 3]);
        assert_eq!(internet_checksum(&[ip]), 0, "IPv4 header checksum verifies");
        let tcp = &reply[34..54];
        assert_eq!(tcp[0..4], [0, 22, 0xc3, 0x50], "ports swapped");
        assert_eq!(tcp[8..12], 1001u32.to_be_bytes(), "acks the SYN");
        assert_eq!(tcp[13], TCP_RST | TCP_ACK);
        let mut pseudo = vec![10, 0, 0, 1, 10, 0, 0, 3, 0, IPPROTO_TCP, 0, 20];
        pseudo.extend_from_slice(tcp);
        assert_eq!(internet_checksum(&[&pseudo]), 0, "TCP checksum verifies");
    }

    #[test]
    fn udp_gets_port_unreachable_quoting_the_datagram() {
        let frame = ipv4_frame(
            IPPROTO_UDP,
            &[0x13, 0x88, 0x13, 0x88, 0, 12, 0, 0, 1, 2, 3, 4],
        );
        let (kind, reply) = build_reject_reply(&frame).unwrap();
        assert_eq!(kind, RejectReply::IcmpUnreachable);
        let icmp = &reply[34..];
        assert_eq!(icmp[0..2], [ICMP_DEST_UNREACHABLE, ICMP_PORT_UNREACHABLE]);
        assert_eq!(internet_checksum(&[icmp]), 0);
        assert_eq!(&icmp[8..], &frame[14..], "whole original datagram quoted");
    }

    #[test]
    fn errors_resets_and_other_families_get_no_reply() {
        assert!(build_reject_reply(&ipv4_frame(IPPROTO_ICMP, &[3, 3, 0, 0, 0, 0, 0, 0])).is_none());
        let mut rst = syn(5);
        rst[13] = TCP_RST;
        assert!(build_reject_reply(&ipv4_frame(IPPROTO_TCP, &rst)).is_none());
        let mut ipv6 = ipv4_frame(IPPROTO_TCP, &syn(5));
        ipv6[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        assert!(build_reject_reply(&ipv6).is_none());
        let echo = ipv4_frame(IPPROTO_ICMP, &[8, 0, 0, 0, 0, 1, 0, 1]);
        assert_eq!(
            build_reject_reply(&echo).unwrap().0,
            RejectReply::IcmpUnreachable
        );
    }

    const VM3_V6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3];
    const VM1_V6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

    /// vm3 -> vm1 over IPv6; `extensions` (already chained) sit between the header and payload.
    fn ipv6_frame(next_header: u8, extensions: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut frame = Vec::new();
        frame.extend_from_slice(&VM1_MAC);
        frame.extend_from_slice(&VM3_MAC);
        frame.extend_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
        push_ipv6_header(
            &mut frame,
            next_header,
            extensions.len() + payload.len(),
            &VM3_V6,
            &VM1_V6,
        );
        frame.extend_from_slice(extensions);
        frame.extend_from_slice(payload);
        frame
    }

    fn udp_datagram(data_len: usize) -> Vec<u8> {
        let mut udp = vec![0x13, 0x88, 0x13, 0x88];
        udp.extend_from_slice(&((8 + data_len) as u16).to_be_bytes());
        udp.extend_from_slice(&[0, 0]);
        udp.extend(std::iter::repeat_n(0xab, data_len));
        udp
    }

    /// The reply's IPv6 header and its upper-layer checksum verified with the pseudo-header.
    fn check_ipv6_reply(reply: &[u8], protocol: u8) -> &[u8] {
        assert_eq!(reply[0..6], VM3_MAC, "back to the sender");
        assert_eq!(reply[6..12], VM1_MAC);
        assert_eq!(reply[12..14], ETHERTYPE_IPV6.to_be_bytes());
        let ip = &reply[14..];
        assert_eq!(ip[0] >> 4, 6);
        assert_eq!(usize::from(read_u16(ip, 4).unwrap()), ip.len() - 40);
        assert_eq!(ip[6], protocol);
        assert_eq!(ip[8..24], VM1_V6, "from the address the packet went to");
        assert_eq!(ip[24..40], VM3_V6);
        let upper = &ip[40..];
        let pseudo = ipv6_pseudo_header(&VM1_V6, &VM3_V6, protocol, upper.len());
        assert_eq!(internet_checksum(&[&pseudo, upper]), 0, "checksum verifies");
        upper
    }

    #[test]
    fn ipv6_syn_gets_a_reset_acknowledging_it() {
        let (kind, reply) = build_reject_reply(&ipv6_frame(IPPROTO_TCP, &[], &syn(41))).unwrap();
        assert_eq!(kind, RejectReply::TcpReset);
        let tcp = check_ipv6_reply(&reply, IPPROTO_TCP);
        assert_eq!(tcp.len(), 20);
        assert_eq!(tcp[0..4], [0, 22, 0xc3, 0x50], "ports swapped");
        assert_eq!(tcp[8..12], 42u32.to_be_bytes(), "acks the SYN");
        assert_eq!(tcp[13], TCP_RST | TCP_ACK);
    }

    #[test]
    fn ipv6_udp_gets_port_unreachable_and_other_protocols_admin_prohibited() {
        let frame = ipv6_frame(IPPROTO_UDP, &[], &udp_datagram(4));
        let (kind, reply) = build_reject_reply(&frame).unwrap();
        assert_eq!(kind, RejectReply::IcmpUnreachable);
        let icmp = check_ipv6_reply(&reply, IPPROTO_ICMPV6);
        assert_eq!(
            icmp[0..2],
            [ICMPV6_DEST_UNREACHABLE, ICMPV6_PORT_UNREACHABLE]
        );
        assert_eq!(&icmp[8..], &frame[14..], "whole original packet quoted");

        let echo = ipv6_frame(IPPROTO_ICMPV6, &[], &[128, 0, 0, 0, 0, 1, 0, 1]);
        let (_, reply) = build_reject_reply(&echo).unwrap();
        let icmp = check_ipv6_reply(&reply, IPPROTO_ICMPV6);
        assert_eq!(
            icmp[0..2],
            [ICMPV6_DEST_UNREACHABLE, ICMPV6_ADMIN_PROHIBITED]
        );
    }

    #[test]
    fn ipv6_quotes_stay_within_the_minimum_mtu() {
        let frame = ipv6_frame(IPPROTO_UDP, &[], &udp_datagram(1400));
        let (_, reply) = build_reject_reply(&frame).unwrap();
        assert_eq!(reply.len(), ETH_HEADER + 1280);
        let icmp = check_ipv6_reply(&reply, IPPROTO_ICMPV6);
        assert_eq!(&icmp[8..], &frame[14..14 + ICMPV6_QUOTE_MAX]);
    }

    #[test]
    fn ipv6_extension_headers_are_walked_to_the_transport_header() {
        // Hop-by-hop (8 bytes, PadN) -> first fragment (offset 0, more fragments) -> TCP.
        let mut extensions = vec![IPV6_FRAGMENT, 0, 1, 4, 0, 0, 0, 0];
        extensions.extend_from_slice(&[IPPROTO_TCP, 0, 0, 1, 0, 0, 0, 7]);
        let frame = ipv6_frame(IPV6_HOP_BY_HOP, &extensions, &syn(9));
        let (kind, reply) = build_reject_reply(&frame).unwrap();
        assert_eq!(kind, RejectReply::TcpReset);
        let tcp = check_ipv6_reply(&reply, IPPROTO_TCP);
        assert_eq!(tcp[8..12], 10u32.to_be_bytes());

        // A later fragment carries no transport header: no reply.
        let later = [IPPROTO_TCP, 0, 0x05, 0x01, 0, 0, 0, 7];
        assert!(build_reject_reply(&ipv6_frame(IPV6_FRAGMENT, &later, &syn(9))).is_none());
        // A chain running past the packet: no reply.
        let runaway = [IPPROTO_TCP, 200, 0, 0, 0, 0, 0, 0];
        assert!(build_reject_reply(&ipv6_frame(IPV6_DEST_OPTIONS, &runaway, &[])).is_none());
    }

    #[test]
    fn ipv6_errors_resets_and_multicast_get_no_reply() {
        let error = ipv6_frame(IPPROTO_ICMPV6, &[], &[1, 4, 0, 0, 0, 0, 0, 0]);
        assert!(build_reject_reply(&error).is_none(), "ICMPv6 error");
        let mut rst = syn(5);
        rst[13] = TCP_RST | TCP_ACK;
        assert!(build_reject_reply(&ipv6_frame(IPPROTO_TCP, &[], &rst)).is_none());
        let mut multicast = ipv6_frame(IPPROTO_UDP, &[], &udp_datagram(4));
        multicast[14 + 24] = 0xff;
        assert!(build_reject_reply(&multicast).is_none(), "to a group");
        let mut unspecified = ipv6_frame(IPPROTO_UDP, &[], &udp_datagram(4));
        unspecified[14 + 8..14 + 24].fill(0);
        assert!(build_reject_reply(&unspecified).is_none(), "from ::");
    }

    proptest! {
        #[test]
        fn arbitrary_frames_never_panic(frame in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = build_reject_reply(&frame);
        }

        #[test]
        fn arbitrary_ipv6_packets_never_panic(
            vlan: bool,
            ip in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let mut frame = [VM1_MAC, VM3_MAC].concat();
            if vlan {
                frame.extend_from_slice(&[0x81, 0x00, 0, 5]);
            }
            frame.extend_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
            frame.extend_from_slice(&ip);
            let _ = build_reject_reply(&frame);
        }

        /// Real packets with arbitrary extension-header chains and transport bytes: no panic,
        /// and any reply is well formed (lengths and checksum) and within the minimum MTU.
        #[test]
        fn ipv6_replies_are_well_formed(
            next_header in prop_oneof![
                Just(IPPROTO_TCP), Just(IPPROTO_UDP), Just(IPPROTO_ICMPV6),
                Just(IPV6_HOP_BY_HOP), Just(IPV6_ROUTING), Just(IPV6_FRAGMENT),
                Just(IPV6_AUTH), Just(IPV6_DEST_OPTIONS), any::<u8>()
            ],
            body in proptest::collection::vec(any::<u8>(), 0..1600),
            cut in any::<proptest::sample::Index>(),
        ) {
            let frame = ipv6_frame(next_header, &[], &body);
            if let Some((kind, reply)) = build_reject_reply(&frame) {
                let protocol = match kind {
                    RejectReply::TcpReset => IPPROTO_TCP,
                    RejectReply::IcmpUnreachable => IPPROTO_ICMPV6,
                };
                check_ipv6_reply(&reply, protocol);
                prop_assert!(reply.len() <= ETH_HEADER + 1280);
            }
            let _ = build_reject_reply(&frame[..cut.index(frame.len() + 1)]);
        }

        #[test]
        fn truncated_real_frames_never_panic(cut in 0usize..60) {
            let frame = ipv4_frame(IPPROTO_TCP, &syn(7));
            let _ = build_reject_reply(&frame[..cut.min(frame.len())]);
        }
    }
}
