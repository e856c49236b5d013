//! Antrea's internal NetworkPolicy shape, as a VM agent receives it from the controller.
//!
//! A [`NetworkPolicy`] selects VM interfaces through [`AppliedToGroup`]s and lists ordered
//! [`Rule`]s whose peers come from [`AddressGroup`]s and inline [`IpBlock`]s. Groups are shared
//! between policies and change independently of them (the controller sends add/remove patches),
//! which is why policies refer to groups by name instead of embedding them.
//!
//! Precedence: a policy with a *lower* `priority` number wins over one with a higher number (as
//! for Antrea-native policies), and within a policy an earlier rule wins over a later one. Two
//! policies may not share a priority number: the compiler needs a strict order to give every rule
//! its own OpenFlow priority (see `sluice_policy::compile::priority`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

/// Every policy object an agent knows, keyed by name. `BTreeMap`s keep iteration (and so the
/// compiler's output) deterministic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicySet {
    pub address_groups: BTreeMap<String, AddressGroup>,
    pub applied_to_groups: BTreeMap<String, AppliedToGroup>,
    /// Keyed by [`NetworkPolicy::key`].
    pub policies: BTreeMap<String, NetworkPolicy>,
}

impl PolicySet {
    /// Replaces (or inserts) a policy under its key.
    pub fn upsert_policy(&mut self, policy: NetworkPolicy) {
        self.policies.insert(policy.key(), policy);
    }

    /// Applies an add/remove patch to an address group, creating the group if it is new.
    pub fn patch_address_group(&mut self, patch: &AddressGroupPatch) {
        let group = self
            .address_groups
            .entry(patch.group.clone())
            .or_insert_with(|| AddressGroup::new(patch.group.clone()));
        patch.apply_to(&mut group.members);
    }
}

/// A named set of peer addresses. Single addresses are stored as host networks (/32, /128).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressGroup {
    pub name: String,
    pub members: BTreeSet<IpNet>,
}

impl AddressGroup {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            members: BTreeSet::new(),
        }
    }
}

/// The controller's incremental update of an address group: members to add and to remove.
/// Removing an absent member or adding a present one is a no-op, as upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressGroupPatch {
    pub group: String,
    pub added: Vec<IpNet>,
    pub removed: Vec<IpNet>,
}

impl AddressGroupPatch {
    /// Removals are applied before additions, so a member both removed and added stays.
    pub fn apply_to(&self, members: &mut BTreeSet<IpNet>) {
        for net in &self.removed {
            members.remove(&net.trunc());
        }
        for net in &self.added {
            members.insert(net.trunc());
        }
    }
}

/// The VM interfaces a policy is enforced on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedToGroup {
    pub name: String,
    /// Keyed by interface name.
    pub members: BTreeMap<String, VmInterface>,
}

impl AppliedToGroup {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            members: BTreeMap::new(),
        }
    }
}

/// The `ofport` of an interface whose document gave none: OpenFlow has no port 0, so it can
/// never be a real port number.
pub const UNRESOLVED_PORT: u32 = 0;

/// One VM network interface as attached to the agent's OVS bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmInterface {
    pub name: String,
    /// OpenFlow port number on the bridge; egress rules match on it. [`UNRESOLVED_PORT`] when
    /// the document left it out: the agent fills it in from its bridge before compiling.
    pub ofport: u32,
    /// Addresses of the interface; ingress rules match on them as destination.
    pub ips: Vec<IpAddr>,
    pub mac: Option<MacAddr>,
}

/// An Ethernet address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl FromStr for MacAddr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut bytes = [0u8; 6];
        let mut parts = text.split(':');
        for byte in &mut bytes {
            let part = parts
                .next()
                .ok_or_else(|| format!("{text:?} is not a MAC address (want aa:bb:cc:dd:ee:ff)"))?;
            if part.len() != 2 {
                return Err(format!(
                    "{text:?} is not a MAC address (want aa:bb:cc:dd:ee:ff)"
                ));
            }
            *byte = u8::from_str_radix(part, 16)
                .map_err(|_| format!("{text:?} is not a MAC address (want aa:bb:cc:dd:ee:ff)"))?;
        }
        if parts.next().is_some() {
            return Err(format!(
                "{text:?} is not a MAC address (want aa:bb:cc:dd:ee:ff)"
            ));
        }
        Ok(Self(bytes))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

/// Traffic direction as seen from the applied-to VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    /// Traffic towards the VM; peers are sources.
    Ingress,
    /// Traffic leaving the VM; peers are destinations.
    Egress,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "Ingress",
            Direction::Egress => "Egress",
        }
    }
}

/// What a matching rule does with a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RuleAction {
    Allow,
    /// Silently discarded.
    Drop,
    /// Discarded and answered (TCP RST or ICMP unreachable) by the agent.
    Reject,
}

/// A network policy. Its identity is [`NetworkPolicy::key`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkPolicy {
    pub name: String,
    pub namespace: Option<String>,
    /// Lower number = higher precedence; unique per agent; bounded by
    /// [`crate::limits::MAX_POLICY_PRIORITY`].
    pub priority: u16,
    /// Names of the applied-to groups whose interfaces this policy is enforced on.
    pub applied_to_groups: Vec<String>,
    /// Directions in which the selected interfaces are isolated (get a default drop below the
    /// rules). Defaults to the directions the rules use, as Kubernetes' `policyTypes`.
    pub isolation: BTreeSet<Direction>,
    /// Ordered: an earlier rule has precedence over a later one.
    pub rules: Vec<Rule>,
}

impl NetworkPolicy {
    /// `namespace/name`, or `name` for a cluster-scoped policy.
    pub fn key(&self) -> String {
        match &self.namespace {
            Some(namespace) => format!("{namespace}/{}", self.name),
            None => self.name.clone(),
        }
    }

    /// The directions of its rules: the isolation a policy gets when none is given.
    pub fn rule_directions(&self) -> BTreeSet<Direction> {
        self.rules.iter().map(|rule| rule.direction).collect()
    }
}

/// One rule. Its priority within the policy is its position in [`NetworkPolicy::rules`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub name: Option<String>,
    pub direction: Direction,
    pub peers: Peers,
    /// Empty = any protocol and port.
    pub services: Vec<Service>,
    pub action: RuleAction,
}

/// Peers of a rule: the union of the address groups' members and the IP blocks. Both empty means
/// "any peer"; a referenced group that is empty matches nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Peers {
    pub address_groups: Vec<String>,
    pub ip_blocks: Vec<IpBlock>,
}

impl Peers {
    pub fn is_any(&self) -> bool {
        self.address_groups.is_empty() && self.ip_blocks.is_empty()
    }
}

/// A CIDR minus some sub-ranges of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpBlock {
    pub cidr: IpNet,
    /// Each one inside `cidr`.
    pub except: Vec<IpNet>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
    Icmp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
            Protocol::Icmp => "ICMP",
        }
    }

    /// Whether the protocol has ports (ICMP has type and code instead).
    pub fn has_ports(self) -> bool {
        !matches!(self, Protocol::Icmp)
    }
}

/// A protocol with an optional destination port or port range (TCP, UDP, SCTP) or an optional
/// ICMP type and code. For ICMP, IPv4 packets match ICMP and IPv6 packets ICMPv6 with the same
/// type and code numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Service {
    pub protocol: Protocol,
    pub port: Option<u16>,
    /// Inclusive end of a range starting at `port`.
    pub end_port: Option<u16>,
    pub icmp_type: Option<u8>,
    pub icmp_code: Option<u8>,
}

impl Service {
    /// The protocol with any port/type.
    pub fn any_of(protocol: Protocol) -> Self {
        Self {
            protocol,
            port: None,
            end_port: None,
            icmp_type: None,
            icmp_code: None,
        }
    }

    pub fn port(protocol: Protocol, port: u16) -> Self {
        Self {
            port: Some(port),
            ..Self::any_of(protocol)
        }
    }

    pub fn port_range(protocol: Protocol, port: u16, end_port: u16) -> Self {
        Self {
            port: Some(port),
            end_port: Some(end_port),
            ..Self::any_of(protocol)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_round_trips_and_rejects_garbage() {
        let mac: MacAddr = "02:00:0a:00:00:01".parse().expect("valid mac");
        assert_eq!(mac.to_string(), "02:00:0a:00:00:01");
        for bad in [
            "",
            "02:00:0a:00:00",
            "02:00:0a:00:00:01:03",
            "zz:00:0a:00:00:01",
            "2:0:a:0:0:1",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn patch_removes_then_adds_and_normalises_host_bits() {
        let mut set = PolicySet::default();
        set.patch_address_group(&AddressGroupPatch {
            group: "g".into(),
            added: vec![
                "10.0.0.1/32".parse().expect("net"),
                "10.1.2.3/16".parse().expect("net"),
            ],
            removed: vec![],
        });
        set.patch_address_group(&AddressGroupPatch {
            group: "g".into(),
            added: vec!["10.0.0.2/32".parse().expect("net")],
            removed: vec!["10.0.0.1/32".parse().expect("net")],
        });
        let members: Vec<String> = set.address_groups["g"]
            .members
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(members, ["10.0.0.2/32", "10.1.0.0/16"]);
    }
}
