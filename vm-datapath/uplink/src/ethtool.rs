//! TX checksum offload off, through the SIOCETHTOOL ioctl (what `ethtool -K dev tx off` does).
//!
//! Why: a stack hands TCP and UDP to a device with checksum offload on as "checksum partial"
//! (the device is to finish it). OVS's userspace (`netdev`) datapath reads frames as plain
//! bytes, so such a checksum is never finished and the receiver silently drops every TCP
//! segment and UDP datagram while ping (ICMP checksums are always computed) works: the trap
//! NOTES.md describes for veth ports. The takeover turns it off on the internal port whenever
//! the bridge is `netdev`. With OVS 3.1 (this machine) an internal port's tap comes with TX
//! checksumming off already ("off [requested on]": the tap lacks the feature), so this is a
//! guard for setups that give taps offloads (e.g. OVS's userspace TSO), and a no-op here.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_STXCSUM: u32 = 0x17;

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// `struct ifreq` with the `ifr_data` member of its union, padded to the kernel's 40 bytes.
#[repr(C)]
struct IfreqData {
    name: [u8; libc::IFNAMSIZ],
    data: *mut EthtoolValue,
    _pad: [u8; 16],
}

/// Turns TX checksum offload off on `link` in the calling thread's network namespace.
pub fn tx_checksum_off(link: &str) -> std::io::Result<()> {
    ethtool_value(link, ETHTOOL_STXCSUM, 0).map(|_| ())
}

/// Whether TX checksum offload is on for `link`.
pub fn tx_checksum(link: &str) -> std::io::Result<bool> {
    ethtool_value(link, ETHTOOL_GTXCSUM, 0).map(|data| data != 0)
}

/// One `ethtool_value` command on `link`; returns the value's data after the call.
fn ethtool_value(link: &str, cmd: u32, data: u32) -> std::io::Result<u32> {
    if link.is_empty() || link.len() >= libc::IFNAMSIZ {
        return Err(std::io::Error::other(format!(
            "`{link}` is not a link name"
        )));
    }
    let mut value = EthtoolValue { cmd, data };
    let mut request = IfreqData {
        name: [0; libc::IFNAMSIZ],
        data: &mut value,
        _pad: [0; 16],
    };
    request.name[..link.len()].copy_from_slice(link.as_bytes());
    // SAFETY: socket(2) with constant arguments; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns; OwnedFd closes it.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: SIOCETHTOOL reads an ifreq whose ifr_data points at an ethtool_value; both live
    // on this stack frame for the whole call, and the name is NUL-terminated (zeroed buffer,
    // length checked above).
    let result = unsafe { libc::ioctl(socket.as_raw_fd(), SIOCETHTOOL as _, &mut request) };
    if result < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(value.data)
}

#[cfg(test)]
mod tests {
    #[test]
    fn refuses_names_the_kernel_could_not_hold() {
        assert!(super::tx_checksum_off("").is_err());
        assert!(super::tx_checksum_off("sixteen-bytes-xx").is_err());
    }
}
