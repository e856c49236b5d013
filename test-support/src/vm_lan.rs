//! A small LAN for VM lifecycle tests: the VM is an [`OvsInstance`]'s namespace (its own
//! ovs-vswitchd runs there, as Open vSwitch runs inside a real VM), with `eth0` carrying its
//! address and a default route via the host; a peer namespace is a second machine; and the
//! test's own namespace is the host, where the control plane listens, joined to both by a
//! Linux bridge. Everything is deleted on drop.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::ovs::{run, unique_name, OvsInstance};
use crate::NetNs;

#[derive(Debug)]
pub struct VmLan {
    /// The Linux bridge on the host.
    bridge: String,
    /// The host ends of the two veth pairs (deleting one deletes the pair).
    host_ends: Vec<String>,
    pub peer: NetNs,
    /// Addresses without prefix; the LAN is a /24.
    pub host_ip: String,
    pub vm_ip: String,
    pub peer_ip: String,
}

impl VmLan {
    /// Builds the LAN around `vm`; the VM's interface is `eth0`. TX checksum offload is off
    /// on every device that originates packets into the VM's userspace datapath (see
    /// [`NetNs::attach_veth`] for why).
    pub fn new(vm: &OvsInstance) -> std::io::Result<Self> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        // A /24 unique to this process and call: tests of other processes run alongside.
        let prefix = format!("10.{}.{}", 200 + n % 50, std::process::id() % 250);
        let mut lan = VmLan {
            bridge: unique_name("lan"),
            host_ends: Vec::new(),
            peer: NetNs::new("peer")?,
            host_ip: format!("{prefix}.1"),
            vm_ip: format!("{prefix}.2"),
            peer_ip: format!("{prefix}.3"),
        };
        host(&["ip", "link", "add", &lan.bridge, "type", "bridge"])?;
        host(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", lan.host_ip),
            "dev",
            &lan.bridge,
        ])?;
        host(&["ip", "link", "set", &lan.bridge, "up"])?;
        host(&["ethtool", "-K", &lan.bridge, "tx", "off"])?;
        let vm_ns = vm.netns().to_string();
        lan.plug(&vm_ns, &lan.vm_ip.clone())?;
        vm.exec_in_netns(&["ip", "route", "add", "default", "via", &lan.host_ip])?;
        let peer_ns = lan.peer.name().to_string();
        lan.plug(&peer_ns, &lan.peer_ip.clone())?;
        Ok(lan)
    }

    /// A veth pair: `eth0` with `ip/24` in `netns`, the other end on the host bridge.
    fn plug(&mut self, netns: &str, ip: &str) -> std::io::Result<()> {
        let host_end = unique_name("lanv");
        host(&[
            "ip", "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns", netns,
        ])?;
        self.host_ends.push(host_end.clone());
        host(&["ip", "link", "set", &host_end, "master", &self.bridge])?;
        host(&["ip", "link", "set", &host_end, "up"])?;
        let inside =
            |args: &[&str]| run(Command::new("ip").args(["netns", "exec", netns]).args(args));
        inside(&["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
        inside(&["ip", "link", "set", "eth0", "up"])?;
        inside(&["ethtool", "-K", "eth0", "tx", "off"])?;
        Ok(())
    }
}

fn host(args: &[&str]) -> std::io::Result<String> {
    run(Command::new(args[0]).args(&args[1..]))
}

impl Drop for VmLan {
    fn drop(&mut self) {
        for end in &self.host_ends {
            let _ = host(&["ip", "link", "del", end]);
        }
        let _ = host(&["ip", "link", "del", &self.bridge]);
    }
}
