//! Keeping the VM's own stack off the renamed uplink, on the userspace datapath.
//!
//! Why: the kernel datapath steals an attached device's frames (an rx handler), but the
//! userspace (`netdev`) datapath reads them from a packet socket, which is a tap: the kernel
//! still delivers every frame arriving on `U~` to the VM's own stack too. A Linux host accepts a
//! packet for any of its addresses on any device, so each packet from the wire reached the VM
//! twice (once on `U~`, once through the bridge on the internal port) and was answered twice.
//! Strict reverse-path filtering on `U~` drops the IPv4 copies (the way back to any source is
//! through the internal port), `arp_ignore=8` keeps `U~` from answering ARP, and IPv6 is
//! turned off on `U~` altogether. The uplink's own values are recorded and put back by restore.

use std::path::PathBuf;

/// The per-device sysctls involved, as numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Isolation {
    pub rp_filter: u32,
    pub arp_ignore: u32,
    pub disable_ipv6: u32,
}

const NAMES: [&str; 3] = ["rp_filter", "arp_ignore", "disable_ipv6"];

impl Isolation {
    /// What the renamed uplink gets on the userspace datapath.
    pub const ISOLATED: Isolation = Isolation {
        rp_filter: 1,
        arp_ignore: 8,
        disable_ipv6: 1,
    };

    /// The kernel's defaults for a new device (and what a record without the key means).
    pub const DEFAULT: Isolation = Isolation {
        rp_filter: 0,
        arp_ignore: 0,
        disable_ipv6: 0,
    };

    fn values(&self) -> [u32; 3] {
        [self.rp_filter, self.arp_ignore, self.disable_ipv6]
    }

    fn from_values([rp_filter, arp_ignore, disable_ipv6]: [u32; 3]) -> Self {
        Isolation {
            rp_filter,
            arp_ignore,
            disable_ipv6,
        }
    }

    /// `rp_filter=0,arp_ignore=0,disable_ipv6=0`, for an `external_ids` value.
    pub fn to_external_id(&self) -> String {
        NAMES
            .iter()
            .zip(self.values())
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn from_external_id(text: &str) -> Option<Self> {
        let mut values = [0u32; 3];
        let mut parts = text.split(',');
        for (name, value) in NAMES.iter().zip(&mut values) {
            let (key, number) = parts.next()?.split_once('=')?;
            if key != *name {
                return None;
            }
            *value = number.parse().ok()?;
        }
        parts.next().is_none().then(|| Self::from_values(values))
    }

    /// The sysctl files of `link` in the calling thread's network namespace (`/proc/sys/net`
    /// shows the namespace of the thread that opens it).
    fn paths(link: &str) -> [PathBuf; 3] {
        let conf = |family: &str, name: &str| {
            PathBuf::from(format!("/proc/sys/net/{family}/conf/{link}/{name}"))
        };
        [
            conf("ipv4", NAMES[0]),
            conf("ipv4", NAMES[1]),
            conf("ipv6", NAMES[2]),
        ]
    }

    /// Reads `link`'s values; a missing file (IPv6 off in the whole kernel) reads as 0.
    pub fn read(link: &str) -> std::io::Result<Self> {
        let mut values = [0u32; 3];
        for (path, value) in Self::paths(link).iter().zip(&mut values) {
            match std::fs::read_to_string(path) {
                Ok(text) => {
                    *value = text.trim().parse().map_err(|_| {
                        std::io::Error::other(format!("{}: `{}`", path.display(), text.trim()))
                    })?
                }
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(error),
            }
        }
        Ok(Self::from_values(values))
    }

    /// Writes `link`'s values (small writes to procfs: they do not block on I/O).
    pub fn write(&self, link: &str) -> std::io::Result<()> {
        for (path, value) in Self::paths(link).iter().zip(self.values()) {
            match std::fs::write(path, value.to_string()) {
                Err(error) if error.kind() == std::io::ErrorKind::NotFound && value == 0 => {}
                result => result.map_err(|e| {
                    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
                })?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Isolation;

    #[test]
    fn external_id_round_trip() {
        let text = Isolation::ISOLATED.to_external_id();
        assert_eq!(text, "rp_filter=1,arp_ignore=8,disable_ipv6=1");
        assert_eq!(
            Isolation::from_external_id(&text),
            Some(Isolation::ISOLATED)
        );
        assert_eq!(
            Isolation::from_external_id("rp_filter=1,arp_ignore=8"),
            None
        );
        assert_eq!(
            Isolation::from_external_id("arp_ignore=8,rp_filter=1,disable_ipv6=1"),
            None
        );
    }
}
