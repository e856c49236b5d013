//! One validation pass over raw documents and objects: every mistake is recorded with its path
//! and reason, and what is valid becomes the typed [`crate::model`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use super::raw::{self, RawDocument, RawPolicy, RawRule, RawService};
use super::Errors;
use crate::limits::{MAX_POLICY_PRIORITY, MAX_RULES_PER_POLICY};
use crate::model::{
    AddressGroup, AppliedToGroup, Direction, IpBlock, MacAddr, NetworkPolicy, Peers, PolicySet,
    Protocol, Rule, RuleAction, Service, VmInterface, UNRESOLVED_PORT,
};

/// The group names a policy may refer to.
#[derive(Clone, Copy)]
pub(crate) enum Known<'a> {
    /// A document's own groups: a reference to any other name is an error.
    Groups(&'a PolicySet),
    /// Any name: a stored object is checked alone, and the groups it names may be created
    /// after it (the agent's compiler ignores a policy whose groups it does not hold yet).
    Anything,
}

impl Known<'_> {
    fn applied_to_group(self, name: &str) -> bool {
        match self {
            Known::Groups(set) => set.applied_to_groups.contains_key(name),
            Known::Anything => true,
        }
    }

    fn address_group(self, name: &str) -> bool {
        match self {
            Known::Groups(set) => set.address_groups.contains_key(name),
            Known::Anything => true,
        }
    }
}

/// Which bridge an OpenFlow port number is unique on.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bridges {
    /// A file is one agent's view: all of its interfaces are on one bridge.
    One,
    /// A stored group may list interfaces of several VMs, each on its own bridge.
    PerVm,
}

pub(crate) fn validate(raw: &RawDocument, errors: &mut Errors) -> PolicySet {
    let mut set = PolicySet::default();
    for (index, raw_group) in raw.address_groups.iter().enumerate() {
        let path = format!("addressGroups[{index}]");
        let group = address_group(raw_group, &path, errors);
        if set.address_groups.contains_key(&group.name) {
            errors.push(
                format!("{path}.name"),
                format!("duplicate address group name {:?}", group.name),
            );
            continue;
        }
        set.address_groups.insert(group.name.clone(), group);
    }
    for (index, raw_group) in raw.applied_to_groups.iter().enumerate() {
        let path = format!("appliedToGroups[{index}]");
        let group = applied_to_group(raw_group, &path, errors);
        if set.applied_to_groups.contains_key(&group.name) {
            errors.push(
                format!("{path}.name"),
                format!("duplicate applied-to group name {:?}", group.name),
            );
            continue;
        }
        set.applied_to_groups.insert(group.name.clone(), group);
    }
    let members = raw
        .applied_to_groups
        .iter()
        .enumerate()
        .flat_map(|(index, group)| {
            let path = format!("appliedToGroups[{index}]");
            group
                .members
                .iter()
                .enumerate()
                .map(move |(member, raw)| (format!("{path}.members[{member}]"), raw))
        });
    check_ports_owned_once(members, Bridges::One, errors);
    let mut priority_owner: BTreeMap<u16, String> = BTreeMap::new();
    for (index, raw_policy) in raw.policies.iter().enumerate() {
        let path = format!("policies[{index}]");
        let Some(policy) = validate_policy(raw_policy, &path, Known::Groups(&set), errors) else {
            continue;
        };
        let key = policy.key();
        if set.policies.contains_key(&key) {
            errors.push(format!("{path}.name"), format!("duplicate policy {key:?}"));
            continue;
        }
        if let Some(owner) = priority_owner.get(&policy.priority) {
            errors.push(
                format!("{path}.priority"),
                format!(
                    "priority {} is already used by policy {owner:?}; policy priorities must be unique",
                    policy.priority
                ),
            );
            continue;
        }
        priority_owner.insert(policy.priority, key.clone());
        set.policies.insert(key, policy);
    }
    set
}

/// An address group at `path`; invalid members are recorded and left out.
pub(crate) fn address_group(
    raw: &raw::RawAddressGroup,
    path: &str,
    errors: &mut Errors,
) -> AddressGroup {
    check_name(&raw.name, &format!("{path}.name"), errors);
    let mut members = BTreeSet::new();
    for (index, member) in raw.members.iter().enumerate() {
        if let Some(net) = parse_net(member, &format!("{path}.members[{index}]"), errors) {
            members.insert(net);
        }
    }
    AddressGroup {
        name: raw.name.clone(),
        members,
    }
}

/// An applied-to group at `path`; invalid members are recorded and left out.
pub(crate) fn applied_to_group(
    raw: &raw::RawAppliedToGroup,
    path: &str,
    errors: &mut Errors,
) -> AppliedToGroup {
    check_name(&raw.name, &format!("{path}.name"), errors);
    let mut members = BTreeMap::new();
    for (index, member) in raw.members.iter().enumerate() {
        let member_path = format!("{path}.members[{index}]");
        if let Some(interface) = validate_interface(member, &member_path, errors) {
            if members.contains_key(&interface.name) {
                errors.push(
                    format!("{member_path}.name"),
                    format!("duplicate interface {:?} in this group", interface.name),
                );
            } else {
                members.insert(interface.name.clone(), interface);
            }
        }
    }
    AppliedToGroup {
        name: raw.name.clone(),
        members,
    }
}

/// An interface may appear in several applied-to groups, but an OpenFlow port belongs to one
/// interface: two names on one port would make the egress rules of one apply to the other.
pub(crate) fn check_ports_owned_once<'a>(
    members: impl Iterator<Item = (String, &'a raw::RawVmInterface)>,
    bridges: Bridges,
    errors: &mut Errors,
) {
    let mut port_owner: BTreeMap<(Option<&str>, i64), &str> = BTreeMap::new();
    for (path, member) in members {
        let Some(ofport) = member.ofport else {
            continue;
        };
        let bridge = match bridges {
            Bridges::One => None,
            Bridges::PerVm => member.vm.as_deref(),
        };
        match port_owner.get(&(bridge, ofport)) {
            Some(owner) if *owner != member.name => errors.push(
                format!("{path}.ofport"),
                format!("OpenFlow port {ofport} already belongs to interface {owner:?}"),
            ),
            Some(_) => {}
            None => {
                port_owner.insert((bridge, ofport), &member.name);
            }
        }
    }
}

fn check_name(name: &str, path: &str, errors: &mut Errors) {
    if name.trim().is_empty() {
        errors.push(path, "must not be empty");
    }
}

fn validate_interface(
    raw: &raw::RawVmInterface,
    path: &str,
    errors: &mut Errors,
) -> Option<VmInterface> {
    let before = errors.list.len();
    check_name(&raw.name, &format!("{path}.name"), errors);
    if let Some(vm) = &raw.vm {
        check_name(vm, &format!("{path}.vm"), errors);
    }
    // 0xffffff00 and above are reserved port numbers (LOCAL, CONTROLLER, ...). Omitted:
    // `UNRESOLVED_PORT`, looked up by name on the agent's bridge.
    let ofport = match raw.ofport.map(u32::try_from) {
        None => UNRESOLVED_PORT,
        Some(Ok(port)) if (1..0xffff_ff00).contains(&port) => port,
        Some(_) => {
            errors.push(
                format!("{path}.ofport"),
                format!(
                    "{} is not a valid OpenFlow port number",
                    raw.ofport.unwrap_or_default()
                ),
            );
            0
        }
    };
    let mut ips = Vec::new();
    for (index, ip) in raw.ips.iter().enumerate() {
        match ip.trim().parse::<IpAddr>() {
            Ok(ip) if !ips.contains(&ip) => ips.push(ip),
            Ok(_) => errors.push(format!("{path}.ips[{index}]"), "duplicate address"),
            Err(_) => errors.push(
                format!("{path}.ips[{index}]"),
                format!("{ip:?} is not an IP address"),
            ),
        }
    }
    let mac = match &raw.mac {
        Some(text) => match text.trim().parse::<MacAddr>() {
            Ok(mac) => Some(mac),
            Err(reason) => {
                errors.push(format!("{path}.mac"), reason);
                None
            }
        },
        None => None,
    };
    (errors.list.len() == before).then(|| VmInterface {
        name: raw.name.clone(),
        ofport,
        ips,
        mac,
    })
}

pub(crate) fn validate_policy(
    raw: &RawPolicy,
    path: &str,
    known: Known<'_>,
    errors: &mut Errors,
) -> Option<NetworkPolicy> {
    let before = errors.list.len();
    check_name(&raw.name, &format!("{path}.name"), errors);
    if let Some(namespace) = &raw.namespace {
        check_name(namespace, &format!("{path}.namespace"), errors);
    }
    let priority = match u16::try_from(raw.priority) {
        Ok(priority) if priority <= MAX_POLICY_PRIORITY => priority,
        _ => {
            errors.push(
                format!("{path}.priority"),
                format!(
                    "{} is out of range 0..={MAX_POLICY_PRIORITY} (lower number = higher precedence)",
                    raw.priority
                ),
            );
            0
        }
    };
    if raw.applied_to.is_empty() {
        errors.push(
            format!("{path}.appliedTo"),
            "must name at least one applied-to group",
        );
    }
    let mut applied_to_groups = Vec::new();
    for (index, name) in raw.applied_to.iter().enumerate() {
        if !known.applied_to_group(name) {
            errors.push(
                format!("{path}.appliedTo[{index}]"),
                format!("applied-to group {name:?} is not defined in appliedToGroups"),
            );
        } else if applied_to_groups.contains(name) {
            errors.push(
                format!("{path}.appliedTo[{index}]"),
                format!("applied-to group {name:?} is listed twice"),
            );
        } else {
            applied_to_groups.push(name.clone());
        }
    }
    if raw.rules.len() > usize::from(MAX_RULES_PER_POLICY) {
        errors.push(
            format!("{path}.rules"),
            format!(
                "{} rules exceed the limit of {MAX_RULES_PER_POLICY} per policy",
                raw.rules.len()
            ),
        );
    }
    let mut rules = Vec::new();
    let mut rule_names = BTreeSet::new();
    for (index, raw_rule) in raw.rules.iter().enumerate() {
        let rule_path = format!("{path}.rules[{index}]");
        if let Some(name) = &raw_rule.name {
            if !rule_names.insert(name.clone()) {
                errors.push(
                    format!("{rule_path}.name"),
                    format!("duplicate rule name {name:?} in this policy"),
                );
            }
        }
        if let Some(rule) = validate_rule(raw_rule, &rule_path, known, errors) {
            rules.push(rule);
        }
    }
    let isolation = match &raw.policy_types {
        Some(types) => {
            let mut isolation = BTreeSet::new();
            for (index, name) in types.iter().enumerate() {
                if let Some(direction) =
                    parse_direction(name, &format!("{path}.policyTypes[{index}]"), errors)
                {
                    isolation.insert(direction);
                }
            }
            isolation
        }
        None => rules.iter().map(|rule: &Rule| rule.direction).collect(),
    };
    (errors.list.len() == before).then(|| NetworkPolicy {
        name: raw.name.clone(),
        namespace: raw.namespace.clone(),
        priority,
        applied_to_groups,
        isolation,
        rules,
    })
}

fn validate_rule(raw: &RawRule, path: &str, known: Known<'_>, errors: &mut Errors) -> Option<Rule> {
    let before = errors.list.len();
    let direction = parse_direction(&raw.direction, &format!("{path}.direction"), errors);
    let action = match raw.action.as_str() {
        "Allow" => Some(RuleAction::Allow),
        "Drop" => Some(RuleAction::Drop),
        "Reject" => Some(RuleAction::Reject),
        other => {
            errors.push(
                format!("{path}.action"),
                format!("{other:?} is not an action (Allow, Drop or Reject)"),
            );
            None
        }
    };
    let mut peers = Peers::default();
    for (index, name) in raw.peers.address_groups.iter().enumerate() {
        let group_path = format!("{path}.peers.addressGroups[{index}]");
        if !known.address_group(name) {
            errors.push(
                group_path,
                format!("address group {name:?} is not defined in addressGroups"),
            );
        } else if peers.address_groups.contains(name) {
            errors.push(
                group_path,
                format!("address group {name:?} is listed twice"),
            );
        } else {
            peers.address_groups.push(name.clone());
        }
    }
    for (index, block) in raw.peers.ip_blocks.iter().enumerate() {
        let block_path = format!("{path}.peers.ipBlocks[{index}]");
        let Some(cidr) = parse_cidr(&block.cidr, &format!("{block_path}.cidr"), errors) else {
            continue;
        };
        let mut except = Vec::new();
        for (except_index, text) in block.except.iter().enumerate() {
            let except_path = format!("{block_path}.except[{except_index}]");
            if let Some(net) = parse_cidr(text, &except_path, errors) {
                if cidr.contains(&net) {
                    except.push(net);
                } else {
                    errors.push(except_path, format!("{net} is not inside the cidr {cidr}"));
                }
            }
        }
        peers.ip_blocks.push(IpBlock { cidr, except });
    }
    let mut services = Vec::new();
    for (index, raw_service) in raw.services.iter().enumerate() {
        if let Some(service) =
            validate_service(raw_service, &format!("{path}.services[{index}]"), errors)
        {
            services.push(service);
        }
    }
    match (direction, action, errors.list.len() == before) {
        (Some(direction), Some(action), true) => Some(Rule {
            name: raw.name.clone(),
            direction,
            peers,
            services,
            action,
        }),
        _ => None,
    }
}

fn validate_service(raw: &RawService, path: &str, errors: &mut Errors) -> Option<Service> {
    let before = errors.list.len();
    let protocol = match raw.protocol.as_str() {
        "TCP" => Some(Protocol::Tcp),
        "UDP" => Some(Protocol::Udp),
        "SCTP" => Some(Protocol::Sctp),
        "ICMP" => Some(Protocol::Icmp),
        other => {
            errors.push(
                format!("{path}.protocol"),
                format!("{other:?} is not a protocol (TCP, UDP, SCTP or ICMP)"),
            );
            None
        }
    };
    let port = raw
        .port
        .and_then(|port| parse_port(port, &format!("{path}.port"), errors));
    let end_port = raw
        .end_port
        .and_then(|port| parse_port(port, &format!("{path}.endPort"), errors));
    match (raw.port, port, end_port) {
        (None, _, Some(_)) => errors.push(format!("{path}.endPort"), "endPort needs a port"),
        (_, Some(start), Some(end)) if end < start => errors.push(
            format!("{path}.endPort"),
            format!("port range {start}-{end} is reversed (endPort must be >= port)"),
        ),
        _ => {}
    }
    let icmp_type = raw
        .icmp_type
        .and_then(|value| parse_byte(value, &format!("{path}.icmpType"), "ICMP type", errors));
    let icmp_code = raw
        .icmp_code
        .and_then(|value| parse_byte(value, &format!("{path}.icmpCode"), "ICMP code", errors));
    if raw.icmp_code.is_some() && raw.icmp_type.is_none() {
        errors.push(format!("{path}.icmpCode"), "icmpCode needs an icmpType");
    }
    if let Some(protocol) = protocol {
        if protocol.has_ports() {
            for (field, present) in [
                ("icmpType", raw.icmp_type.is_some()),
                ("icmpCode", raw.icmp_code.is_some()),
            ] {
                if present {
                    errors.push(
                        format!("{path}.{field}"),
                        format!("{field} only applies to ICMP, not {}", protocol.as_str()),
                    );
                }
            }
        } else {
            for (field, present) in [
                ("port", raw.port.is_some()),
                ("endPort", raw.end_port.is_some()),
            ] {
                if present {
                    errors.push(format!("{path}.{field}"), "ICMP has no ports; use icmpType");
                }
            }
        }
    }
    match protocol {
        Some(protocol) if errors.list.len() == before => Some(Service {
            protocol,
            port,
            end_port,
            icmp_type,
            icmp_code,
        }),
        _ => None,
    }
}

fn parse_port(value: i64, path: &str, errors: &mut Errors) -> Option<u16> {
    match u16::try_from(value) {
        Ok(port) if port != 0 => Some(port),
        _ => {
            errors.push(path, format!("{value} is not a valid port"));
            None
        }
    }
}

fn parse_byte(value: i64, path: &str, what: &str, errors: &mut Errors) -> Option<u8> {
    match u8::try_from(value) {
        Ok(byte) => Some(byte),
        Err(_) => {
            errors.push(path, format!("{value} is not a valid {what} (0..=255)"));
            None
        }
    }
}

fn parse_direction(text: &str, path: &str, errors: &mut Errors) -> Option<Direction> {
    match text {
        "Ingress" => Some(Direction::Ingress),
        "Egress" => Some(Direction::Egress),
        other => {
            errors.push(
                path,
                format!("{other:?} is not a direction (Ingress or Egress)"),
            );
            None
        }
    }
}

/// An address (taken as a host network) or a CIDR without host bits.
fn parse_net(text: &str, path: &str, errors: &mut Errors) -> Option<IpNet> {
    let text = text.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(IpNet::from(ip));
    }
    parse_cidr(text, path, errors)
}

fn parse_cidr(text: &str, path: &str, errors: &mut Errors) -> Option<IpNet> {
    let text = text.trim();
    match text.parse::<IpNet>() {
        Ok(net) if net.trunc() == net => Some(net),
        Ok(net) => {
            errors.push(
                path,
                format!("{text} has host bits set (did you mean {}?)", net.trunc()),
            );
            None
        }
        Err(_) => {
            let reason = if text.parse::<IpAddr>().is_ok() {
                format!("{text:?} is an address, a CIDR (address/prefix) is needed here")
            } else {
                format!("{text:?} is not a valid CIDR")
            };
            errors.push(path, reason);
            None
        }
    }
}
