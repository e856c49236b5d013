use serde_json::json;

use super::*;
use crate::load::{load_str, Format};

fn paths(errors: &[FieldError]) -> Vec<&str> {
    errors.iter().map(|error| error.path.as_str()).collect()
}

/// The errors the file loader reports for `entry` as the first item of `list` in `document`,
/// with that item's prefix replaced by `spec`, as an object would carry them.
fn file_errors(mut document: Value, list: &str, entry: &Value) -> Vec<(String, String)> {
    document[list] = json!([entry]);
    let document = document.to_string();
    let error = load_str(&document, "f.json", Format::Json).expect_err("invalid entry");
    let prefix = format!("{list}[0]");
    error
        .errors
        .into_iter()
        .map(|error| (error.path.replacen(&prefix, "spec", 1), error.reason))
        .collect()
}

fn pairs(errors: Vec<FieldError>) -> Vec<(String, String)> {
    errors.into_iter().map(|e| (e.path, e.reason)).collect()
}

#[test]
fn a_policys_mistakes_get_the_file_loaders_reasons_at_the_objects_paths() {
    let spec = json!({
        "priority": 1000,
        "appliedTo": ["vm1", "vm1"],
        "policyTypes": ["Sideways"],
        "rules": [{"direction": "Ingress", "action": "Permit",
                   "peers": {"ipBlocks": [{"cidr": "10.0.0.0/24", "except": ["10.1.0.0/24"]}]},
                   "services": [{"protocol": "TCP", "port": 70000}, {"protocol": "ICMP", "port": 8}]}]
    });
    let object = pairs(validate_network_policy("web", &spec));
    let mut entry = spec.clone();
    entry["name"] = json!("web");
    let groups = json!({"appliedToGroups": [{"name": "vm1"}]});
    assert_eq!(object, file_errors(groups, "policies", &entry));
    assert_eq!(
        object
            .iter()
            .map(|(path, _)| path.as_str())
            .collect::<Vec<_>>(),
        [
            "spec.priority",
            "spec.appliedTo[1]",
            "spec.rules[0].action",
            "spec.rules[0].peers.ipBlocks[0].except[0]",
            "spec.rules[0].services[0].port",
            "spec.rules[0].services[1].port",
            "spec.policyTypes[0]",
        ]
    );
}

#[test]
fn a_valid_policy_may_name_groups_created_later() {
    let spec = json!({"namespace": "default", "priority": 10, "appliedTo": ["vm1"],
        "rules": [{"direction": "Ingress", "action": "Allow",
                   "peers": {"addressGroups": ["clients"]}}]});
    assert_eq!(validate_network_policy("web", &spec), []);
    assert_eq!(
        paths(&validate_network_policy("web", &json!({"priority": 1}))),
        ["spec.appliedTo"],
        "a policy applies to something"
    );
}

#[test]
fn address_group_mistakes_match_the_file() {
    let spec = json!({"members": ["10.0.0.2", "not-an-ip", "10.0.0.1/8"]});
    let object = pairs(validate_address_group("clients", &spec));
    let mut entry = spec.clone();
    entry["name"] = json!("clients");
    assert_eq!(object, file_errors(json!({}), "addressGroups", &entry));
    assert_eq!(
        paths(&validate_address_group("clients", &spec)),
        ["spec.members[1]", "spec.members[2]"]
    );
    assert_eq!(
        validate_address_group("clients", &json!({"members": []})),
        []
    );
}

#[test]
fn applied_to_members_name_their_vm_and_ports_are_per_vm() {
    let spec = json!({"members": [
        {"name": "a-eth0", "ofport": 1, "vm": "vm-a"},
        {"name": "b-eth0", "ofport": 1, "vm": "vm-b"},
        {"name": "b-eth1", "ofport": 1, "vm": "vm-b"},
        {"name": "c-eth0", "ofport": 0, "ips": ["10.0.0.300"]},
        {"name": "d-eth0", "ofport": 4, "vm": " "},
    ]});
    let errors = validate_applied_to_group("web-vms", &spec);
    assert_eq!(
        paths(&errors),
        [
            "spec.members[3].ofport",
            "spec.members[3].ips[0]",
            "spec.members[4].vm",
            "spec.members[3].vm",
            "spec.members[2].ofport",
        ],
        "{errors:?}"
    );
    assert_eq!(
        errors[4].reason,
        "OpenFlow port 1 already belongs to interface \"b-eth0\""
    );
    let valid = json!({"members": [{"name": "a-eth0", "ofport": 1, "vm": "vm-a",
        "ips": ["10.0.0.1"], "mac": "02:00:0a:00:00:01"}]});
    assert_eq!(validate_applied_to_group("web-vms", &valid), []);
}

#[test]
fn structure_mistakes_name_their_path() {
    let errors = validate_address_group("g", &json!({"name": "g", "members": [], "colour": 1}));
    assert_eq!(paths(&errors), ["spec.name", "spec.colour"]);
    assert!(errors.iter().all(|error| error.reason == "unknown field"));
    let errors = validate_network_policy("p", &json!({"priority": "high"}));
    assert_eq!(paths(&errors), ["spec.priority"], "{errors:?}");
    assert!(!errors[0].reason.contains("Raw"), "{errors:?}");
    assert_eq!(paths(&validate_address_group("g", &json!("x"))), ["spec"]);
    assert_eq!(
        paths(&validate_network_policy(" ", &json!({"appliedTo": ["a"]}))),
        ["metadata.name"]
    );
}

#[test]
fn objects_load_as_the_policy_file_they_amount_to() {
    let group = json!({"metadata": {"name": "web-vms"}, "spec": {"members": [
        {"name": "vm1-eth0", "vm": "vm1", "ofport": 1, "ips": ["10.0.0.1"]}]}});
    let clients = json!({"metadata": {"name": "clients"}, "spec": {"members": ["10.0.0.2"]}});
    let policy = json!({"metadata": {"name": "web"}, "spec": {
        "priority": 10, "appliedTo": ["web-vms"],
        "rules": [{"direction": "Ingress", "action": "Allow", "peers": {"addressGroups": ["clients"]}}]}});
    let loaded = load_objects([&clients], [&group], [&policy], "controlplane").unwrap();
    assert!(loaded.set.address_groups.contains_key("clients"));
    assert!(loaded.set.applied_to_groups.contains_key("web-vms"));
    assert_eq!(loaded.set.policies.len(), 1);
    assert!(loaded.waiting.is_empty());
    // A policy naming a group the agent does not hold waits for it instead of failing the set.
    let loaded = load_objects([], [&group], [&policy], "controlplane").unwrap();
    assert!(loaded.set.policies.is_empty());
    assert_eq!(loaded.waiting, ["web"]);
    // What a file refuses is refused here too: two policies with one priority.
    let twin = json!({"metadata": {"name": "web-2"}, "spec": policy["spec"].clone()});
    let error = load_objects([&clients], [&group], [&policy, &twin], "controlplane").unwrap_err();
    assert!(error.to_string().contains("priority"), "{error}");
}
