//! Announcing a move: a gratuitous ARP for each IPv4 address and an unsolicited neighbour
//! advertisement (override set) for each IPv6 address, from the link's MAC, sent as raw frames
//! over an AF_PACKET socket on the link.
//!
//! Why: setting the uplink down drops carrier on the other end of its cable (a veth's peer, a
//! switch port), and Linux flushes a device's neighbour entries when its carrier goes
//! (`neigh_carrier_down`). A neighbour that sends to the VM in that moment starts resolving
//! again while the uplink is down: its ARP request or neighbour solicitation is lost, and it
//! retries only after `retrans_time` (1 s), holding everything it sends to the VM until then.
//! An announcement updates such an entry (incomplete or stale) at once: the kernel accepts a
//! gratuitous ARP or an unsolicited advertisement for an entry it has, and sends what it held.
//! A neighbour without an entry ignores it (`arp_accept=0`), which costs nothing: it has
//! nothing held and resolves when it next sends.
//!
//! Sent once, unlike keepalived's repeated GARPs: there an address moves to another MAC and a
//! neighbour's old entry keeps sending to the wrong machine until replaced; here the MAC stays,
//! so any entry a neighbour still has is right, and a lost announcement only leaves the
//! neighbour its own 1 s retry, the behaviour without announcing (as Linux's `arp_notify` and
//! `ndisc_notify` also send one).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

const BROADCAST: [u8; 6] = [0xff; 6];
/// `ff02::1` on Ethernet (RFC 2464: 33:33 and the address's last 32 bits).
const ALL_NODES_MAC: [u8; 6] = [0x33, 0x33, 0, 0, 0, 1];
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IPV6: u16 = 0x86dd;
const ARP_REQUEST: u16 = 1;
const IPPROTO_ICMPV6: u8 = 58;
const NEIGHBOUR_ADVERTISEMENT: u8 = 136;
/// RFC 4861 4.4: R = 0x80, S = 0x40, O = 0x20. Unsolicited, not a router: only O, so that a
/// neighbour replaces what its entry holds.
const OVERRIDE: u8 = 0x20;
const TARGET_LINK_LAYER_ADDRESS: u8 = 2;

/// An Ethernet frame of a gratuitous ARP: 14 header + 28 ARP bytes.
pub const GARP_LEN: usize = 42;
/// An Ethernet frame of an unsolicited NA: 14 + 40 IPv6 + 24 NA + 8 option bytes.
pub const NA_LEN: usize = 86;

/// Announcements sent and failed by this process, for the agent's metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announcements {
    pub sent: u64,
    pub failed: u64,
}

static SENT: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);

/// How many announcements (one per announce step: all of a link's addresses) this process
/// sent and how many failed (the takeover stands either way).
pub fn announcements() -> Announcements {
    Announcements {
        sent: SENT.load(Ordering::Relaxed),
        failed: FAILED.load(Ordering::Relaxed),
    }
}

pub(crate) fn count(ok: bool) {
    let counter = if ok { &SENT } else { &FAILED };
    counter.fetch_add(1, Ordering::Relaxed);
}

fn ethernet(frame: &mut [u8], dst: [u8; 6], src: [u8; 6], ethertype: u16) {
    frame[..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
    frame[12..14].copy_from_slice(&ethertype.to_be_bytes());
}

/// A gratuitous ARP request for `ip` from `mac`, broadcast: sender and target IP both `ip`,
/// target MAC zero (what Linux's `arp_notify` sends, RFC 5227's ARP announcement).
pub fn gratuitous_arp(mac: [u8; 6], ip: Ipv4Addr) -> [u8; GARP_LEN] {
    let mut frame = [0u8; GARP_LEN];
    ethernet(&mut frame, BROADCAST, mac, ETH_P_ARP);
    let arp = &mut frame[14..];
    arp[..2].copy_from_slice(&1u16.to_be_bytes()); // Ethernet
    arp[2..4].copy_from_slice(&0x0800u16.to_be_bytes()); // IPv4
    arp[4] = 6;
    arp[5] = 4;
    arp[6..8].copy_from_slice(&ARP_REQUEST.to_be_bytes());
    arp[8..14].copy_from_slice(&mac);
    arp[14..18].copy_from_slice(&ip.octets());
    arp[24..28].copy_from_slice(&ip.octets());
    frame
}

/// The one's complement sum of `bytes` as 16-bit big-endian words, folded.
fn ones_complement_sum(mut sum: u32, bytes: &[u8]) -> u32 {
    for pair in bytes.chunks(2) {
        let high = u32::from(pair[0]) << 8;
        sum += high | pair.get(1).copied().map_or(0, u32::from);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

/// The ICMPv6 checksum of `message` (its checksum field zero) from `src` to `dst`.
fn icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, message: &[u8]) -> u16 {
    let mut pseudo = [0u8; 40];
    pseudo[..16].copy_from_slice(&src.octets());
    pseudo[16..32].copy_from_slice(&dst.octets());
    pseudo[32..36].copy_from_slice(&(message.len() as u32).to_be_bytes());
    pseudo[39] = IPPROTO_ICMPV6;
    let sum = ones_complement_sum(ones_complement_sum(0, &pseudo), message);
    !(sum as u16)
}

/// An unsolicited neighbour advertisement of `ip` at `mac` to all nodes: override set, the
/// target's link-layer address as option, from `ip` itself, hop limit 255 (RFC 4861 7.2.6).
pub fn unsolicited_na(mac: [u8; 6], ip: Ipv6Addr) -> [u8; NA_LEN] {
    let mut frame = [0u8; NA_LEN];
    ethernet(&mut frame, ALL_NODES_MAC, mac, ETH_P_IPV6);
    let (header, message) = frame[14..].split_at_mut(40);
    header[0] = 0x60; // version 6, traffic class and flow label 0
    header[4..6].copy_from_slice(&(message.len() as u16).to_be_bytes());
    header[6] = IPPROTO_ICMPV6;
    header[7] = 255;
    header[8..24].copy_from_slice(&ip.octets());
    header[24..40].copy_from_slice(&ALL_NODES.octets());
    message[0] = NEIGHBOUR_ADVERTISEMENT;
    message[4] = OVERRIDE;
    message[8..24].copy_from_slice(&ip.octets());
    message[24] = TARGET_LINK_LAYER_ADDRESS;
    message[25] = 1; // in units of 8 bytes
    message[26..32].copy_from_slice(&mac);
    let checksum = icmpv6_checksum(ip, ALL_NODES, message);
    message[2..4].copy_from_slice(&checksum.to_be_bytes());
    frame
}

/// Sends the announcements of `addresses` at `mac` out of link `index` (in the calling
/// thread's network namespace); stops at the first failure.
pub fn send(index: u32, mac: [u8; 6], addresses: &[IpAddr]) -> std::io::Result<()> {
    // SAFETY: socket(2) with constant arguments; the result is checked before use. Protocol 0:
    // the socket only sends, it receives nothing.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns; OwnedFd closes it.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let index = i32::try_from(index).map_err(std::io::Error::other)?;
    for address in addresses {
        match address {
            IpAddr::V4(ip) => send_frame(&socket, index, &gratuitous_arp(mac, *ip))?,
            IpAddr::V6(ip) => send_frame(&socket, index, &unsolicited_na(mac, *ip))?,
        }
    }
    Ok(())
}

fn send_frame(socket: &OwnedFd, index: i32, frame: &[u8]) -> std::io::Result<()> {
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value before the fields are set.
    let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    to.sll_family = libc::AF_PACKET as u16;
    to.sll_protocol = u16::from_be_bytes([frame[12], frame[13]]).to_be();
    to.sll_ifindex = index;
    to.sll_halen = 6;
    to.sll_addr[..6].copy_from_slice(&frame[..6]);
    // SAFETY: `frame` and `to` outlive the call; the length passed is `to`'s own size.
    let sent = unsafe {
        libc::sendto(
            socket.as_raw_fd(),
            frame.as_ptr().cast(),
            frame.len(),
            0,
            std::ptr::addr_of!(to).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    match usize::try_from(sent) {
        Ok(n) if n == frame.len() => Ok(()),
        Ok(n) => Err(std::io::Error::other(format!(
            "sent {n} of {} bytes",
            frame.len()
        ))),
        Err(_) => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];

    #[test]
    fn a_gratuitous_arp_is_a_broadcast_request_for_the_address_itself() {
        let frame = gratuitous_arp(MAC, Ipv4Addr::new(10, 1, 2, 3));
        #[rustfmt::skip]
        let expected: [u8; GARP_LEN] = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0x11, 0x22, 0x33, 0x44, 0x55, 0x08, 0x06,
            0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x01,
            0x02, 0x11, 0x22, 0x33, 0x44, 0x55, 10, 1, 2, 3,
            0, 0, 0, 0, 0, 0, 10, 1, 2, 3,
        ];
        assert_eq!(frame, expected);
    }

    #[test]
    fn an_unsolicited_advertisement_overrides_from_the_address_to_all_nodes() {
        let ip: Ipv6Addr = "2001:db8::2".parse().unwrap();
        let frame = unsolicited_na(MAC, ip);
        assert_eq!(frame[..6], [0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!(frame[6..12], MAC);
        assert_eq!(frame[12..14], [0x86, 0xdd]);
        let header = &frame[14..54];
        assert_eq!(header[..8], [0x60, 0, 0, 0, 0, 32, 58, 255]);
        assert_eq!(header[8..24], ip.octets());
        assert_eq!(header[24..40], ALL_NODES.octets());
        let message = &frame[54..];
        assert_eq!(message[..2], [136, 0]);
        assert_eq!(message[4..8], [0x20, 0, 0, 0], "override only");
        assert_eq!(message[8..24], ip.octets());
        assert_eq!(message[24..32], [2, 1, 0x02, 0x11, 0x22, 0x33, 0x44, 0x55]);
        // A receiver's check: the sum over pseudo-header and message, checksum included.
        let mut pseudo = Vec::from(ip.octets());
        pseudo.extend(ALL_NODES.octets());
        pseudo.extend([0, 0, 0, 32, 0, 0, 0, 58]);
        let sum = ones_complement_sum(ones_complement_sum(0, &pseudo), message);
        assert_eq!(sum, 0xffff, "checksum {:02x?}", &message[2..4]);
    }

    #[test]
    fn the_checksum_matches_a_worked_example() {
        // RFC 1071's example: 0001 f203 f4f5 f6f7 sums to ddf2 (folded).
        let bytes = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(ones_complement_sum(0, &bytes), 0xddf2);
        // An odd length pads with a zero byte.
        assert_eq!(ones_complement_sum(0, &[0x12, 0x34, 0x56]), 0x1234 + 0x5600);
    }

    #[test]
    fn sending_on_a_link_that_does_not_exist_fails() {
        let result = send(u32::MAX >> 1, MAC, &["10.0.0.1".parse().unwrap()]);
        assert!(result.is_err(), "{result:?}");
    }
}
