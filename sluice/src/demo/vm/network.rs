//! The demo's two "VMs": network namespaces joined by one veth pair (`eth0` in each), on a /24
//! picked from the process id that no route of the host uses.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

/// How many /24s after the pid's own are tried when the host routes some of them.
const SUBNET_TRIES: u32 = 16;
/// The demo's /24s are `10.<64..128>.<0..256>.0`: below the `10.200-249` range the
/// `vm_lifecycle` tests use, so a demo and those tests never share a subnet.
const FIRST_SECOND_OCTET: u32 = 64;
const SUBNETS: u32 = 64 * 256;

/// The two namespaces and their addresses; both namespaces (and with them the veth pair and
/// everything inside) are deleted on drop.
#[derive(Debug)]
pub struct DemoVms {
    pub vm1: String,
    pub vm2: String,
    pub vm1_ip: Ipv4Addr,
    pub vm2_ip: Ipv4Addr,
    created: Vec<String>,
}

/// The n-th candidate /24 for process `pid`: `10.a.b.0`, as the first three octets.
pub fn candidate_subnet(pid: u32, n: u32) -> [u8; 3] {
    let index = (pid.wrapping_add(n)) % SUBNETS;
    // Both fit a byte: FIRST_SECOND_OCTET + 63 < 256 and index % 256 < 256.
    let second = (FIRST_SECOND_OCTET + index / 256) as u8;
    let third = (index % 256) as u8;
    [10, second, third]
}

/// The demo addresses of a /24: vm1 is .11, vm2 .12.
pub fn vm_addresses(subnet: [u8; 3]) -> (Ipv4Addr, Ipv4Addr) {
    let [a, b, c] = subnet;
    (Ipv4Addr::new(a, b, c, 11), Ipv4Addr::new(a, b, c, 12))
}

/// Whether a route destination of `ip -j route` (`default`, `10.0.0.0/8`, `10.1.2.3`)
/// overlaps the /24 `subnet`. `default` does not count: it covers everything by design.
pub fn route_overlaps(destination: &str, subnet: [u8; 3]) -> bool {
    let (address, prefix) = match destination.split_once('/') {
        Some((address, prefix)) => (address, prefix.parse::<u32>().ok()),
        None => (destination, Some(32)),
    };
    let (Ok(address), Some(prefix)) = (address.parse::<Ipv4Addr>(), prefix) else {
        return false;
    };
    let [a, b, c] = subnet;
    let ours = u32::from(Ipv4Addr::new(a, b, c, 0));
    let theirs = u32::from(address);
    let shorter = prefix.min(24);
    let mask = if shorter == 0 {
        0
    } else {
        u32::MAX << (32 - shorter)
    };
    ours & mask == theirs & mask
}

/// The first candidate /24 of this process that no IPv4 route of the host overlaps.
fn free_subnet(pid: u32) -> anyhow::Result<[u8; 3]> {
    let text = run(Command::new("ip").args(["-j", "-4", "route", "show", "table", "all"]))?;
    let routes: serde_json::Value =
        serde_json::from_str(&text).context("reading `ip -j route` output")?;
    let destinations: Vec<&str> = routes
        .as_array()
        .map(|routes| {
            routes
                .iter()
                .filter_map(|route| route["dst"].as_str())
                .collect()
        })
        .unwrap_or_default();
    (0..SUBNET_TRIES)
        .map(|n| candidate_subnet(pid, n))
        .find(|subnet| {
            !destinations
                .iter()
                .any(|destination| route_overlaps(destination, *subnet))
        })
        .with_context(|| format!("the host routes all of {SUBNET_TRIES} candidate /24s"))
}

/// The process id in a demo namespace's name (`sluice-up-vm1-<pid>`), if it is one.
pub fn demo_namespace_pid(name: &str) -> Option<u32> {
    name.strip_prefix("sluice-up-vm1-")
        .or_else(|| name.strip_prefix("sluice-up-vm2-"))?
        .parse()
        .ok()
}

/// Deletes the namespaces of demos whose process is gone: one killed outright (SIGKILL) never
/// ran its cleanup, and its namespaces would otherwise stay until reboot. Its daemons died
/// with it (they are started with a parent-death signal).
pub fn remove_stale_namespaces() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = demo_namespace_pid(&name) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run(Command::new("ip").args(["netns", "del", &name]));
        }
    }
}

impl DemoVms {
    /// Creates `sluice-up-vm1-<pid>` and `sluice-up-vm2-<pid>` with `eth0` in each, addressed,
    /// up, with TX checksum offload off: in the userspace (netdev) datapath nothing fills in a
    /// checksum the kernel left to the "hardware", so TCP and UDP would die while ping works.
    pub fn create() -> anyhow::Result<Self> {
        let pid = std::process::id();
        let subnet = free_subnet(pid)?;
        let (vm1_ip, vm2_ip) = vm_addresses(subnet);
        let mut vms = DemoVms {
            vm1: format!("sluice-up-vm1-{pid}"),
            vm2: format!("sluice-up-vm2-{pid}"),
            vm1_ip,
            vm2_ip,
            created: Vec::new(),
        };
        for name in [vms.vm1.clone(), vms.vm2.clone()] {
            run(Command::new("ip").args(["netns", "add", &name]))?;
            vms.created.push(name);
        }
        // Created inside vm1 with its peer inside vm2: nothing appears in the host's namespace,
        // so two demos (same names inside different namespaces) cannot collide.
        run(Command::new("ip").args([
            "-n", &vms.vm1, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns",
            &vms.vm2,
        ]))?;
        for (netns, ip) in [(&vms.vm1, vm1_ip), (&vms.vm2, vm2_ip)] {
            let address = format!("{ip}/24");
            run(Command::new("ip").args(["-n", netns, "link", "set", "lo", "up"]))?;
            run(Command::new("ip").args(["-n", netns, "addr", "add", &address, "dev", "eth0"]))?;
            run(Command::new("ip").args(["-n", netns, "link", "set", "eth0", "up"]))?;
            run(Command::new("ip")
                .args(["netns", "exec", netns])
                .args(["ethtool", "-K", "eth0", "tx", "off"]))?;
        }
        Ok(vms)
    }
}

impl Drop for DemoVms {
    fn drop(&mut self) {
        for name in self.created.drain(..).rev() {
            let _ = Command::new("ip")
                .args(["netns", "del", &name])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Runs a command to completion: its stdout, or an error naming it with its stderr.
pub fn run(command: &mut Command) -> anyhow::Result<String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_follow_the_pid_and_stay_in_the_demo_range() {
        assert_eq!(candidate_subnet(0, 0), [10, 64, 0]);
        assert_eq!(candidate_subnet(257, 0), [10, 65, 1]);
        assert_eq!(candidate_subnet(257, 1), [10, 65, 2]);
        assert_eq!(candidate_subnet(SUBNETS - 1, 1), [10, 64, 0]);
        for pid in [1, 4_194_303, u32::MAX] {
            let [_, second, _] = candidate_subnet(pid, 3);
            assert!((64..128).contains(&second));
        }
        let (vm1, vm2) = vm_addresses([10, 70, 3]);
        assert_eq!(
            (vm1.to_string(), vm2.to_string()),
            ("10.70.3.11".into(), "10.70.3.12".into())
        );
    }

    #[test]
    fn only_demo_namespaces_name_a_pid() {
        assert_eq!(demo_namespace_pid("sluice-up-vm1-42"), Some(42));
        assert_eq!(demo_namespace_pid("sluice-up-vm2-7"), Some(7));
        assert_eq!(demo_namespace_pid("sluice-up-vm3-7"), None);
        assert_eq!(demo_namespace_pid("ovs00002a001"), None);
        assert_eq!(demo_namespace_pid("sluice-up-vm1-x"), None);
    }

    #[test]
    fn routes_overlap_when_either_prefix_covers_the_other() {
        let subnet = [10, 70, 3];
        assert!(route_overlaps("10.0.0.0/8", subnet));
        assert!(route_overlaps("10.70.3.0/24", subnet));
        assert!(route_overlaps("10.70.3.128/25", subnet));
        assert!(route_overlaps("10.70.3.9", subnet));
        assert!(!route_overlaps("10.70.4.0/24", subnet));
        assert!(!route_overlaps("192.0.2.0/24", subnet));
        assert!(!route_overlaps("default", subnet));
        assert!(!route_overlaps("fe80::/64", subnet));
    }
}
