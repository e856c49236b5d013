use std::process::{Child, Command, Output, Stdio};

use crate::ovs::{run, unique_name, OvsInstance};

/// A network namespace standing in for a VM: created with `ip netns add` under a unique name,
/// deleted on drop (which also destroys the veth end inside it, and so its peer).
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

/// A veth pair with one end (`eth0`) inside a namespace and the other attached to a bridge.
#[derive(Debug, Clone)]
pub struct VethPort {
    /// The host-side device name, also the OVS port and interface name.
    pub host_name: String,
    /// The OpenFlow port number OVS assigned.
    pub ofport: u32,
    /// The MAC address of `eth0` inside the namespace.
    pub mac: [u8; 6],
}

impl NetNs {
    /// Creates a namespace named after `prefix` plus a unique suffix, with `lo` up.
    pub fn new(prefix: &str) -> std::io::Result<Self> {
        let name = unique_name(prefix);
        run(Command::new("ip").args(["netns", "add", &name]))?;
        let ns = NetNs { name };
        ns.run(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name]).args(args);
        command
    }

    /// Runs a command inside and returns its output whatever the exit status.
    pub fn exec(&self, args: &[&str]) -> std::io::Result<Output> {
        self.command(args).stdin(Stdio::null()).output()
    }

    /// Runs a command inside; stdout on success, an error with stderr otherwise.
    pub fn run(&self, args: &[&str]) -> std::io::Result<String> {
        run(&mut self.command(args))
    }

    /// Starts a command inside without waiting (e.g. a listener); stdio is null.
    pub fn spawn(&self, args: &[&str]) -> std::io::Result<Child> {
        self.command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    }

    /// Creates a veth pair with one end in this namespace as `eth0` with address `cidr` (e.g.
    /// `10.0.0.1/24`) and the other in `ovs`'s namespace, added to `bridge`. TX checksum offload is
    /// turned off inside: the netdev datapath would otherwise forward TCP/UDP with bad checksums
    /// that the receiver silently drops, while ping works.
    pub fn attach_veth(
        &self,
        ovs: &OvsInstance,
        bridge: &str,
        cidr: &str,
    ) -> std::io::Result<VethPort> {
        let host_name = unique_name("v");
        ovs.exec_in_netns(&[
            "ip", "link", "add", &host_name, "type", "veth", "peer", "name", "eth0", "netns",
            &self.name,
        ])?;
        ovs.exec_in_netns(&["ip", "link", "set", &host_name, "up"])?;
        self.run(&["ip", "addr", "add", cidr, "dev", "eth0"])?;
        self.run(&["ip", "link", "set", "eth0", "up"])?;
        self.run(&["ethtool", "-K", "eth0", "tx", "off"])?;
        ovs.ovs_vsctl(&["add-port", bridge, &host_name])?;
        let ofport = ovs
            .ovs_vsctl(&["get", "Interface", &host_name, "ofport"])?
            .trim()
            .parse()
            .map_err(|e| std::io::Error::other(format!("ofport of {host_name}: {e}")))?;
        let mac_text = self.run(&["cat", "/sys/class/net/eth0/address"])?;
        let mut mac = [0u8; 6];
        for (byte, part) in mac.iter_mut().zip(mac_text.trim().split(':')) {
            *byte = u8::from_str_radix(part, 16)
                .map_err(|e| std::io::Error::other(format!("MAC {mac_text}: {e}")))?;
        }
        Ok(VethPort {
            host_name,
            ofport,
            mac,
        })
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
