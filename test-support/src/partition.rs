//! A small routed network of namespaces for partition tests: one namespace per host (a node,
//! redis, the clients), each joined by a veth pair to a hub namespace that routes between them.
//! Links are cut with policy-routing `blackhole` rules in the hub (packets vanish silently in the
//! middle: no RST, no ICMP, neither end is told) and slowed by [`DelayRelay`], a userspace netem
//! on a TUN device in the hub (this project's kernels have no `sch_netem`).
//!
//! Everything lives in namespaces made for one test (the hub too), so the fixed addresses
//! (`10.200.<host>.2`) never clash between tests running at once; dropping the network ends the
//! relay and deletes every namespace, which removes the veths and the hub's rules with them.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::netns_thread::in_netns;
use crate::ovs::run;
use crate::NetNs;

pub use crate::delay_relay::DelayRelay;

/// The routing table the hub sends slowed traffic to (its default route is the relay's TUN).
const SLOW_TABLE: &str = "100";

/// One host of the network: a namespace with `eth0` at `ip`, its default route via the hub.
#[derive(Debug)]
pub struct Host {
    pub name: String,
    pub ip: Ipv4Addr,
    /// The hub's end of this host's veth pair.
    hub_dev: String,
    ns: NetNs,
}

impl Host {
    /// The namespace's name (for `ip netns exec`).
    pub fn netns(&self) -> &str {
        self.ns.name()
    }

    /// Runs `body` on a thread inside this host's namespace: sockets it opens and processes it
    /// spawns live there.
    pub fn run<T, F>(&self, body: F) -> T
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        in_netns(self.ns.name(), body)
            .unwrap_or_else(|error| panic!("in namespace of {}: {error}", self.name))
    }

    /// Runs a command inside; stdout on success.
    pub fn exec(&self, args: &[&str]) -> std::io::Result<String> {
        self.ns.run(args)
    }
}

/// The hosts, the hub and (once a link is slowed) the relay.
#[derive(Debug)]
pub struct Network {
    hosts: Vec<Host>,
    // Dropped last (fields drop in order): the relay's TUN lives in the hub.
    relay: Option<DelayRelay>,
    hub: NetNs,
}

impl Network {
    /// A hub and one host per name, host `i` at `10.200.<i+1>.2/24`.
    pub fn new(names: &[&str]) -> std::io::Result<Self> {
        let hub = NetNs::new("hub")?;
        for setting in [
            "net.ipv4.ip_forward=1",
            // Packets the relay writes back arrive on its TUN although their source is routed
            // via a veth: strict reverse-path filtering would drop every one of them.
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        ] {
            hub.run(&["sysctl", "-qw", setting])?;
        }
        let mut network = Self {
            hosts: Vec::new(),
            relay: None,
            hub,
        };
        for (index, name) in names.iter().enumerate() {
            let host = network.attach(index + 1, name)?;
            network.hosts.push(host);
        }
        Ok(network)
    }

    fn attach(&self, index: usize, name: &str) -> std::io::Result<Host> {
        let ns = NetNs::new(&name.replace('-', ""))?;
        let hub_dev = format!("h{index}");
        let hub = self.hub.name();
        run(std::process::Command::new("ip").args([
            "-n",
            hub,
            "link",
            "add",
            &hub_dev,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            ns.name(),
        ]))?;
        let gateway = format!("10.200.{index}.1");
        self.hub.run(&[
            "ip",
            "addr",
            "add",
            &format!("{gateway}/24"),
            "dev",
            &hub_dev,
        ])?;
        self.hub.run(&["ip", "link", "set", &hub_dev, "up"])?;
        let ip = Ipv4Addr::new(10, 200, index as u8, 2);
        ns.run(&["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
        ns.run(&["ip", "link", "set", "eth0", "up"])?;
        ns.run(&["ip", "route", "add", "default", "via", &gateway])?;
        Ok(Host {
            name: name.to_string(),
            ip,
            hub_dev,
            ns,
        })
    }

    /// The host called `name`; panics on an unknown name (a test bug).
    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|host| host.name == name)
            .unwrap_or_else(|| panic!("no host {name} in the network"))
    }

    /// Black-holes all traffic between `a` and `b`, both ways: the hub discards it silently.
    pub fn cut(&self, a: &str, b: &str) -> std::io::Result<()> {
        self.blackhole("add", a, b)
    }

    /// Undoes [`Network::cut`].
    pub fn heal(&self, a: &str, b: &str) -> std::io::Result<()> {
        self.blackhole("del", a, b)
    }

    fn blackhole(&self, verb: &str, a: &str, b: &str) -> std::io::Result<()> {
        let (a, b) = (self.host(a).ip.to_string(), self.host(b).ip.to_string());
        for (from, to) in [(&a, &b), (&b, &a)] {
            self.hub
                .run(&["ip", "rule", verb, "from", from, "to", to, "blackhole"])?;
        }
        Ok(())
    }

    /// Sends all traffic between `a` and `b` (both ways) through the delay relay: each packet is
    /// held `delay` and dropped with probability `loss` (0.0..1.0). One relay serves every
    /// slowed link of the network, so the first call's figures hold for all.
    pub fn slow(&mut self, a: &str, b: &str, delay: Duration, loss: f64) -> std::io::Result<()> {
        if self.relay.is_none() {
            let relay = DelayRelay::start(self.hub.name(), "slow0", delay, loss)?;
            self.hub.run(&["ip", "link", "set", "slow0", "up"])?;
            self.hub
                .run(&["sysctl", "-qw", "net.ipv4.conf.slow0.rp_filter=0"])?;
            self.hub.run(&[
                "ip", "route", "add", "default", "dev", "slow0", "table", SLOW_TABLE,
            ])?;
            self.relay = Some(relay);
        }
        let (a, b) = (self.host(a), self.host(b));
        // Matched on the arriving veth: what the relay writes back arrives on its TUN, misses
        // these rules and takes the main table to its destination.
        for (from, to) in [(a, b), (b, a)] {
            self.hub.run(&[
                "ip",
                "rule",
                "add",
                "iif",
                &from.hub_dev,
                "to",
                &to.ip.to_string(),
                "lookup",
                SLOW_TABLE,
            ])?;
        }
        Ok(())
    }

    /// The relay, once a link was slowed (its counters).
    pub fn relay(&self) -> Option<&DelayRelay> {
        self.relay.as_ref()
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Hosts first (their namespaces' veths go with them), then the relay, then the hub.
        self.hosts.clear();
        self.relay.take();
    }
}
