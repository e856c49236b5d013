//! Replies to packets a Reject rule sent to the agent: a TCP RST for TCP, an ICMP destination
//! unreachable (port unreachable for UDP, host unreachable for anything else) otherwise.
//!
//! Hand-written on purpose: the two replies have fixed layouts (Ethernet + IPv4 + TCP/ICMP) and
//! need only the Internet checksum; a packet crate would add a dependency for ~100 lines, and
//! parsing here must never panic on whatever the network sent (every access is checked).
//! IPv6 is not answered yet: the packet is dropped as by a Drop rule (see docs/VM-POLICY.md).

const ETH_HEADER: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_VLAN: u16 = 0x8100;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;
const TCP_SYN: u8 = 0x02;
const TCP_FIN: u8 = 0x01;
const ICMP_DEST_UNREACHABLE: u8 = 3;
const ICMP_HOST_UNREACHABLE: u8 = 1;
const ICMP_PORT_UNREACHABLE: u8 = 3;
/// RFC 1812: the original IP header plus at least 8 bytes; Linux quotes up to 576 bytes total.
const ICMP_QUOTE_MAX: usize = 548;
const REPLY_TTL: u8 = 64;

/// What kind of reply was built (for logs and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReply {
    TcpReset,
    IcmpUnreachable,
}

/// Builds the reply to `frame` (an Ethernet frame as the rejected VM sent it), addressed back to
/// its sender. `None` when nothing should be sent: not IPv4, truncated, a fragment other than
/// the first, an ICMP error or a TCP RST itself (never answer those: RFC 1122 / RFC 793).
pub fn build_reject_reply(frame: &[u8]) -> Option<(RejectReply, Vec<u8>)> {
    let (eth_dst, eth_src) = (frame.get(0..6)?, frame.get(6..12)?);
    let mut offset = 12;
    let mut ethertype = read_u16(frame, offset)?;
    if ethertype == ETHERTYPE_VLAN {
        // The reply goes out untagged on the access port the packet came from.
        offset += 4;
        ethertype = read_u16(frame, offset)?;
    }
    if ethertype != ETHERTYPE_IPV4 {
        return None;
    }
    let ip = frame.get(offset + 2..)?;
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
    let mut reply = Vec::with_capacity(ETH_HEADER + 20 + 20 + ICMP_QUOTE_MAX);
    reply.extend_from_slice(eth_src);
    reply.extend_from_slice(eth_dst);
    reply.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    match protocol {
        IPPROTO_TCP => {
            let tcp = payload.get(..20)?;
            let flags = tcp[13];
            if flags & TCP_RST != 0 {
                return None;
            }
            let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
            let ack = u32::from_be_bytes([tcp[8], tcp[9], tcp[10], tcp[11]]);
            let data_offset = usize::from(tcp[12] >> 4) * 4;
            let data_len = payload.len().saturating_sub(data_offset);
            // RFC 793 "reset generation": answer an ACK with seq = its ack; otherwise seq 0 and
            // ack everything the segment occupied (SYN and FIN count one each).
            let (reply_seq, reply_ack, reply_flags) = if flags & TCP_ACK != 0 {
                (ack, 0, TCP_RST)
            } else {
                let occupied = data_len as u32
                    + u32::from(flags & TCP_SYN != 0)
                    + u32::from(flags & TCP_FIN != 0);
                (0, seq.wrapping_add(occupied), TCP_RST | TCP_ACK)
            };
            push_ipv4_header(&mut reply, IPPROTO_TCP, 20, dst, src);
            let tcp_start = reply.len();
            reply.extend_from_slice(&tcp[2..4]); // source port: the port the packet went to
            reply.extend_from_slice(&tcp[0..2]);
            reply.extend_from_slice(&reply_seq.to_be_bytes());
            reply.extend_from_slice(&reply_ack.to_be_bytes());
            reply.extend_from_slice(&[5 << 4, reply_flags, 0, 0, 0, 0, 0, 0]);
            let mut pseudo = Vec::with_capacity(12);
            pseudo.extend_from_slice(dst);
            pseudo.extend_from_slice(src);
            pseudo.extend_from_slice(&[0, IPPROTO_TCP, 0, 20]);
            let checksum = internet_checksum(&[&pseudo, &reply[tcp_start..]]);
            reply[tcp_start + 16..tcp_start + 18].copy_from_slice(&checksum.to_be_bytes());
            Some((RejectReply::TcpReset, reply))
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
            let icmp_len = 8 + quote.len();
            push_ipv4_header(&mut reply, IPPROTO_ICMP, icmp_len, dst, src);
            let icmp_start = reply.len();
            reply.extend_from_slice(&[ICMP_DEST_UNREACHABLE, code, 0, 0, 0, 0, 0, 0]);
            reply.extend_from_slice(quote);
            let checksum = internet_checksum(&[&reply[icmp_start..]]);
            reply[icmp_start + 2..icmp_start + 4].copy_from_slice(&checksum.to_be_bytes());
            Some((RejectReply::IcmpUnreachable, reply))
        }
    }
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

    proptest! {
        #[test]
        fn arbitrary_frames_never_panic(frame in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = build_reject_reply(&frame);
        }

        #[test]
        fn truncated_real_frames_never_panic(cut in 0usize..60) {
            let frame = ipv4_frame(IPPROTO_TCP, &syn(7));
            let _ = build_reject_reply(&frame[..cut.min(frame.len())]);
        }
    }
}
