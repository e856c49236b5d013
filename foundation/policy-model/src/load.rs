//! Policy documents (YAML or JSON) into a validated [`PolicySet`].
//!
//! Document shape (camelCase keys, unknown keys rejected):
//! ```yaml
//! addressGroups:
//!   - name: web-clients
//!     members: [10.0.0.2, 10.0.1.0/24]
//! appliedToGroups:
//!   - name: vm1
//!     members: [{name: vm1-eth0, ofport: 1, ips: [10.0.0.1], mac: "02:00:0a:00:00:01"}]
//! policies:
//!   - name: web
//!     namespace: default        # optional
//!     priority: 10              # lower number = higher precedence, 0..=999
//!     appliedTo: [vm1]
//!     policyTypes: [Ingress]    # optional, defaults to the directions of the rules
//!     rules:                    # ordered, at most 64
//!       - direction: Ingress    # Ingress | Egress
//!         action: Allow         # Allow | Drop | Reject
//!         peers:                # omitted = any peer
//!           addressGroups: [web-clients]
//!           ipBlocks: [{cidr: 10.2.0.0/16, except: [10.2.3.0/24]}]
//!         services:             # omitted = any service
//!           - {protocol: TCP, port: 80, endPort: 90}
//!           - {protocol: ICMP, icmpType: 8}
//! ```
//! Validation returns every problem with its path, e.g.
//! `policies.yaml: policies[2].rules[0].services[1].port: 70000 is not a valid port`.

mod dir;
mod raw;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;

use ipnet::IpNet;

use crate::limits::{MAX_POLICY_PRIORITY, MAX_RULES_PER_POLICY};
use crate::model::{
    AddressGroup, AppliedToGroup, Direction, IpBlock, MacAddr, NetworkPolicy, Peers, PolicySet,
    Protocol, Rule, RuleAction, Service, VmInterface,
};
use raw::{RawDocument, RawPolicy, RawRule, RawService};

pub use dir::{is_policy_file_name, load_dir, load_path, policy_files};
use sluice_config_error::ErrorList as Errors;
pub use sluice_config_error::{FieldError, InvalidConfig, InvalidSources};

/// Input syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

impl Format {
    /// `.json` files are JSON, everything else YAML.
    pub fn from_path(path: &Path) -> Self {
        match path.extension().and_then(|ext| ext.to_str()) {
            Some(ext) if ext.eq_ignore_ascii_case("json") => Format::Json,
            _ => Format::Yaml,
        }
    }
}

/// Reads and validates a policy file; the format follows the extension.
pub fn load_file(path: &Path) -> Result<PolicySet, InvalidConfig> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| {
        InvalidConfig::one(origin.clone(), "", format!("cannot read file: {error}"))
    })?;
    load_str(&text, &origin, Format::from_path(path))
}

/// Parses and validates a document; `origin` names it in errors.
pub fn load_str(text: &str, origin: &str, format: Format) -> Result<PolicySet, InvalidConfig> {
    let mut errors = Errors::default();
    let raw = match parse(text, format, &mut errors) {
        Some(raw) => raw,
        None => return Err(errors.into_invalid(origin)),
    };
    let set = validate(&raw, &mut errors);
    if errors.list.is_empty() {
        Ok(set)
    } else {
        Err(errors.into_invalid(origin))
    }
}

/// Deserializes, recording unknown fields as errors. A type error stops parsing (serde cannot go
/// on), so it is reported alone.
fn parse(text: &str, format: Format, errors: &mut Errors) -> Option<RawDocument> {
    if text.trim().is_empty() {
        return Some(RawDocument::default());
    }
    let mut unknown = Vec::new();
    let mut record_unknown = |path: serde_ignored::Path<'_>| unknown.push(ignored_path(&path));
    let result = match format {
        Format::Yaml => {
            let deserializer = serde_norway::Deserializer::from_str(text);
            let tracked = serde_ignored::Deserializer::new(deserializer, &mut record_unknown);
            serde_path_to_error::deserialize(tracked).map_err(|error| {
                let path = error.path().to_string();
                (path, error.into_inner().to_string())
            })
        }
        Format::Json => {
            let mut deserializer = serde_json::Deserializer::from_str(text);
            let tracked = serde_ignored::Deserializer::new(&mut deserializer, &mut record_unknown);
            let result = serde_path_to_error::deserialize(tracked).map_err(|error| {
                let path = error.path().to_string();
                (path, error.into_inner().to_string())
            });
            // Trailing garbage after the document is an error too.
            result.and_then(|raw| {
                deserializer
                    .end()
                    .map(|()| raw)
                    .map_err(|error| (String::new(), error.to_string()))
            })
        }
    };
    for path in unknown {
        errors.push(path, "unknown field");
    }
    match result {
        Ok(raw) => Some(raw),
        Err((path, message)) => {
            let path = if path == "." { String::new() } else { path };
            errors.push(path.clone(), clean_serde_message(&message, &path));
            None
        }
    }
}

/// Renders serde_ignored's path in the same `a.b[0].c` style as serde_path_to_error.
fn ignored_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path as P;
    match path {
        P::Root => String::new(),
        P::Seq { parent, index } => format!("{}[{index}]", ignored_path(parent)),
        P::Map { parent, key } => {
            let parent = ignored_path(parent);
            if parent.is_empty() {
                key.clone()
            } else {
                format!("{parent}.{key}")
            }
        }
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
            ignored_path(parent)
        }
    }
}

/// serde_norway prefixes messages with the path (printed already) and names internal `Raw*`
/// structs, which mean nothing to the author of the file.
fn clean_serde_message(message: &str, path: &str) -> String {
    let message = message
        .strip_prefix(path)
        .and_then(|rest| rest.strip_prefix(": "))
        .unwrap_or(message);
    let mut cleaned = message.to_string();
    while let Some(start) = cleaned.find("struct Raw") {
        let name_end = cleaned[start + "struct ".len()..]
            .find(|c: char| !c.is_alphanumeric())
            .map_or(cleaned.len(), |offset| start + "struct ".len() + offset);
        cleaned.replace_range(start..name_end, "a mapping");
    }
    cleaned
}

fn validate(raw: &RawDocument, errors: &mut Errors) -> PolicySet {
    let mut set = PolicySet::default();
    for (index, group) in raw.address_groups.iter().enumerate() {
        let path = format!("addressGroups[{index}]");
        check_name(&group.name, &format!("{path}.name"), errors);
        let mut members = BTreeSet::new();
        for (member_index, member) in group.members.iter().enumerate() {
            if let Some(net) = parse_net(member, &format!("{path}.members[{member_index}]"), errors)
            {
                members.insert(net);
            }
        }
        if set.address_groups.contains_key(&group.name) {
            errors.push(
                format!("{path}.name"),
                format!("duplicate address group name {:?}", group.name),
            );
            continue;
        }
        set.address_groups.insert(
            group.name.clone(),
            AddressGroup {
                name: group.name.clone(),
                members,
            },
        );
    }
    for (index, group) in raw.applied_to_groups.iter().enumerate() {
        let path = format!("appliedToGroups[{index}]");
        check_name(&group.name, &format!("{path}.name"), errors);
        let mut members = BTreeMap::new();
        for (member_index, member) in group.members.iter().enumerate() {
            let member_path = format!("{path}.members[{member_index}]");
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
        if set.applied_to_groups.contains_key(&group.name) {
            errors.push(
                format!("{path}.name"),
                format!("duplicate applied-to group name {:?}", group.name),
            );
            continue;
        }
        set.applied_to_groups.insert(
            group.name.clone(),
            AppliedToGroup {
                name: group.name.clone(),
                members,
            },
        );
    }
    check_interfaces_consistent(raw, errors);
    let mut priority_owner: BTreeMap<u16, String> = BTreeMap::new();
    for (index, raw_policy) in raw.policies.iter().enumerate() {
        let path = format!("policies[{index}]");
        let Some(policy) = validate_policy(raw_policy, &path, &set, errors) else {
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

/// An interface may appear in several applied-to groups, but an OpenFlow port belongs to one
/// interface: two names on one port would make the egress rules of one apply to the other.
fn check_interfaces_consistent(raw: &RawDocument, errors: &mut Errors) {
    let mut port_owner: BTreeMap<i64, &str> = BTreeMap::new();
    for (group_index, group) in raw.applied_to_groups.iter().enumerate() {
        for (member_index, member) in group.members.iter().enumerate() {
            match port_owner.get(&member.ofport) {
                Some(owner) if *owner != member.name => errors.push(
                    format!("appliedToGroups[{group_index}].members[{member_index}].ofport"),
                    format!(
                        "OpenFlow port {} already belongs to interface {owner:?}",
                        member.ofport
                    ),
                ),
                Some(_) => {}
                None => {
                    port_owner.insert(member.ofport, &member.name);
                }
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
    // 0xffffff00 and above are reserved port numbers (LOCAL, CONTROLLER, ...).
    let ofport = match u32::try_from(raw.ofport) {
        Ok(port) if (1..0xffff_ff00).contains(&port) => port,
        _ => {
            errors.push(
                format!("{path}.ofport"),
                format!("{} is not a valid OpenFlow port number", raw.ofport),
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

fn validate_policy(
    raw: &RawPolicy,
    path: &str,
    set: &PolicySet,
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
        if !set.applied_to_groups.contains_key(name) {
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
        if let Some(rule) = validate_rule(raw_rule, &rule_path, set, errors) {
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

fn validate_rule(raw: &RawRule, path: &str, set: &PolicySet, errors: &mut Errors) -> Option<Rule> {
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
        if !set.address_groups.contains_key(name) {
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

#[cfg(test)]
mod tests;
