use serde_json::json;

use super::*;

fn group(name: &str, vms: &[&str]) -> Value {
    let members: Vec<Value> = vms
        .iter()
        .enumerate()
        .map(|(i, vm)| json!({"name": format!("{vm}-eth{i}"), "ofport": i + 1, "vm": vm}))
        .collect();
    json!({"metadata": {"name": name}, "spec": {"members": members}})
}

fn policy(name: &str, applied_to: &[&str], peers: &[&str]) -> Value {
    json!({"metadata": {"name": name}, "spec": {"priority": 1, "appliedTo": applied_to,
        "rules": [{"direction": "Ingress", "action": "Allow",
                   "peers": {"addressGroups": peers}},
                  {"direction": "Egress", "action": "Drop"}]}})
}

fn address_group(name: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"members": ["10.0.0.2"]}})
}

fn names(vms: BTreeSet<String>) -> Vec<String> {
    vms.into_iter().collect()
}

#[test]
fn spans_follow_members_applied_to_groups_and_references() {
    let groups = [group("web", &["vm-a", "vm-b"]), group("db", &["vm-c"])];
    let policies = [
        policy("web-in", &["web"], &["clients"]),
        policy("db-in", &["db"], &["clients", "admins"]),
        policy("orphan", &["missing"], &["unused"]),
    ];
    let index = SpanIndex::new(&groups, &policies);
    use PolicyResource::*;
    assert_eq!(
        names(index.span(AppliedToGroup, &groups[0])),
        ["vm-a", "vm-b"]
    );
    assert_eq!(names(index.span(NetworkPolicy, &policies[1])), ["vm-c"]);
    assert_eq!(
        names(index.span(AddressGroup, &address_group("clients"))),
        ["vm-a", "vm-b", "vm-c"]
    );
    assert_eq!(
        names(index.span(AddressGroup, &address_group("admins"))),
        ["vm-c"]
    );
    // A policy whose groups do not exist yet, and the groups only it names, go nowhere.
    assert!(index.span(NetworkPolicy, &policies[2]).is_empty());
    assert!(index
        .span(AddressGroup, &address_group("unused"))
        .is_empty());
    assert!(index
        .span(AddressGroup, &address_group("nobody"))
        .is_empty());

    assert!(index.in_span(NetworkPolicy, &policies[0], "vm-b"));
    assert!(!index.in_span(NetworkPolicy, &policies[0], "vm-c"));
    assert!(index.in_span(AddressGroup, &address_group("admins"), "vm-c"));
    assert!(!index.in_span(AddressGroup, &address_group("admins"), "vm-a"));
    assert!(index.in_span(AppliedToGroup, &groups[1], "vm-c"));
    assert!(!index.in_span(AppliedToGroup, &groups[1], "vm-a"));
}

#[test]
fn a_span_changes_with_the_stored_groups_without_rewriting_the_policy() {
    let web_in = policy("web-in", &["web"], &["clients"]);
    let before = [group("web", &["vm-a"])];
    let after = [group("web", &["vm-a", "vm-d"])];
    let policies = [web_in.clone()];
    use PolicyResource::*;
    assert!(!in_span(NetworkPolicy, &web_in, "vm-d", &before, &policies));
    assert!(in_span(NetworkPolicy, &web_in, "vm-d", &after, &policies));
    assert!(in_span(
        AddressGroup,
        &address_group("clients"),
        "vm-d",
        &after,
        &policies
    ));
}

#[test]
fn malformed_objects_span_nothing() {
    let broken = json!({"metadata": {"name": "x"}, "spec": {"members": "vm-a", "appliedTo": 7}});
    let index = SpanIndex::new([&broken], [&broken]);
    use PolicyResource::*;
    for resource in [NetworkPolicy, AddressGroup, AppliedToGroup] {
        assert!(index.span(resource, &broken).is_empty(), "{resource:?}");
    }
    assert_eq!(
        PolicyResource::from_plural("addressgroups"),
        Some(AddressGroup)
    );
    assert_eq!(PolicyResource::from_plural("agents"), None);
}

#[test]
fn the_examples_span_the_vms_of_their_applied_to_group() {
    use crate::kinds::policy::tests::example;
    use test_support::examples::{ADDRESS_GROUP, APPLIED_TO_GROUP, NETWORK_POLICY};
    let (policy, addresses, group) = (
        example(NETWORK_POLICY),
        example(ADDRESS_GROUP),
        example(APPLIED_TO_GROUP),
    );
    let index = SpanIndex::new([&group], [&policy]);
    use PolicyResource::*;
    for (resource, object) in [
        (NetworkPolicy, &policy),
        (AddressGroup, &addresses),
        (AppliedToGroup, &group),
    ] {
        assert_eq!(
            names(index.span(resource, object)),
            ["vm1", "vm4"],
            "{resource:?}"
        );
        assert!(!index.in_span(resource, object, "vm2"), "{resource:?}");
    }
}

#[test]
fn only_a_connected_vm_receives_policies() {
    let vm = |state: Value| {
        json!({"metadata": {"name": "vm-a"}, "spec": {"management": "Agented"},
                                   "status": {"state": state}})
    };
    assert!(receives_policies(Some(&vm(json!("AgentedConnected")))));
    for state in [
        json!("AgentedBootstrap"),
        json!("Agentless"),
        json!("Unmanaged"),
        json!(null),
        json!(["AgentedConnected"]),
    ] {
        assert!(!receives_policies(Some(&vm(state.clone()))), "{state}");
    }
    assert!(!receives_policies(None));
    let no_status = json!({"metadata": {"name": "vm-a"}, "spec": {"management": "Agented"}});
    assert!(!receives_policies(Some(&no_status)));
}
