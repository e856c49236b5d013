//! The span turned around: from a VM to the keys of the policy objects it receives. A
//! [`SpanIndex`](super::SpanIndex) answers "is this object in this VM's span" and so costs a
//! pass over every object per VM; the control plane's shared span view (issue 36: 5,000 VMs,
//! three policy watches each) builds this once per policy change instead, and each VM's watch
//! then reads only the few keys of its own span.
//!
//! It answers exactly as [`SpanIndex::in_span`](super::SpanIndex::in_span) over the same
//! objects (a property test holds the two together):
//! - an applied-to group is in a VM's span when its own members name the VM;
//! - a policy, when one of its `appliedTo` names is the name of a group naming the VM;
//! - an address group, when a policy in the VM's span names it in a rule's peers.

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;

use super::{applied_to, member_vms, name, strings, PolicyResource};

/// The keys of the policy objects in each VM's span, from the objects at one revision.
#[derive(Debug, Default)]
pub struct SpanByVm {
    /// VM -> the keys of the applied-to groups whose members name it.
    groups_of_vm: HashMap<String, Vec<String>>,
    /// Group key -> the group's name (several keys may share a name across namespaces).
    group_names: HashMap<String, String>,
    /// Group name -> the keys of the policies applied to it.
    policies_of_group: HashMap<String, Vec<String>>,
    /// Policy key -> the address-group names its rules name.
    address_groups_of_policy: HashMap<String, Vec<String>>,
    /// Address-group name -> the keys of the address groups of that name.
    address_group_keys: HashMap<String, Vec<String>>,
}

impl SpanByVm {
    /// Indexes stored objects, each given with its store key and resource.
    pub fn new<'a>(
        objects: impl IntoIterator<Item = (&'a str, PolicyResource, &'a Value)>,
    ) -> Self {
        let mut index = Self::default();
        for (key, resource, object) in objects {
            match resource {
                PolicyResource::AppliedToGroup => {
                    let vms: BTreeSet<&str> = member_vms(object).collect();
                    for vm in vms {
                        index
                            .groups_of_vm
                            .entry(vm.to_string())
                            .or_default()
                            .push(key.to_string());
                    }
                    index
                        .group_names
                        .insert(key.to_string(), name(object).to_string());
                }
                PolicyResource::NetworkPolicy => {
                    let groups: BTreeSet<&str> = applied_to(object).collect();
                    for group in groups {
                        index
                            .policies_of_group
                            .entry(group.to_string())
                            .or_default()
                            .push(key.to_string());
                    }
                    let named: BTreeSet<&str> =
                        strings(object.pointer("/spec/rules"), "/peers/addressGroups").collect();
                    index.address_groups_of_policy.insert(
                        key.to_string(),
                        named.into_iter().map(str::to_string).collect(),
                    );
                }
                PolicyResource::AddressGroup => index
                    .address_group_keys
                    .entry(name(object).to_string())
                    .or_default()
                    .push(key.to_string()),
            }
        }
        index
    }

    /// The keys of the objects of `resource` in `vm`'s span, in key order.
    pub fn keys(&self, resource: PolicyResource, vm: &str) -> BTreeSet<&str> {
        let groups = self.groups_of_vm.get(vm).map(Vec::as_slice).unwrap_or(&[]);
        if resource == PolicyResource::AppliedToGroup {
            return groups.iter().map(String::as_str).collect();
        }
        let group_names: BTreeSet<&str> = groups
            .iter()
            .filter_map(|key| self.group_names.get(key))
            .map(String::as_str)
            .collect();
        let policies: BTreeSet<&str> = group_names
            .into_iter()
            .filter_map(|group| self.policies_of_group.get(group))
            .flatten()
            .map(String::as_str)
            .collect();
        if resource == PolicyResource::NetworkPolicy {
            return policies;
        }
        policies
            .into_iter()
            .filter_map(|policy| self.address_groups_of_policy.get(policy))
            .flatten()
            .filter_map(|group| self.address_group_keys.get(group))
            .flatten()
            .map(String::as_str)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::SpanIndex;
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const RESOURCES: [PolicyResource; 3] = [
        PolicyResource::AppliedToGroup,
        PolicyResource::NetworkPolicy,
        PolicyResource::AddressGroup,
    ];

    /// Names from a small alphabet, so that references often hit (and sometimes miss).
    fn small_name() -> impl Strategy<Value = String> {
        (0u8..5).prop_map(|n| format!("n{n}"))
    }

    fn vm() -> impl Strategy<Value = String> {
        (0u8..6).prop_map(|n| format!("vm{n}"))
    }

    fn group() -> impl Strategy<Value = Value> {
        (small_name(), prop::collection::vec(vm(), 0..4)).prop_map(|(name, vms)| {
            let members: Vec<Value> = vms.iter().map(|vm| json!({"vm": vm})).collect();
            json!({"metadata": {"name": name}, "spec": {"members": members}})
        })
    }

    fn policy() -> impl Strategy<Value = Value> {
        (
            small_name(),
            prop::collection::vec(small_name(), 0..3),
            prop::collection::vec(prop::collection::vec(small_name(), 0..3), 0..3),
        )
            .prop_map(|(name, applied_to, rules)| {
                let rules: Vec<Value> = rules
                    .iter()
                    .map(|peers| json!({"peers": {"addressGroups": peers}}))
                    .collect();
                json!({"metadata": {"name": name},
                       "spec": {"appliedTo": applied_to, "rules": rules}})
            })
    }

    fn address_group() -> impl Strategy<Value = Value> {
        small_name().prop_map(|name| json!({"metadata": {"name": name}, "spec": {}}))
    }

    proptest! {
        #[test]
        fn agrees_with_the_span_index(
            groups in prop::collection::vec(group(), 0..6),
            policies in prop::collection::vec(policy(), 0..6),
            address_groups in prop::collection::vec(address_group(), 0..6),
        ) {
            // Keys are unique even where names repeat (as across namespaces).
            let keyed: Vec<(String, PolicyResource, &Value)> = groups.iter()
                .map(|o| (PolicyResource::AppliedToGroup, o))
                .chain(policies.iter().map(|o| (PolicyResource::NetworkPolicy, o)))
                .chain(address_groups.iter().map(|o| (PolicyResource::AddressGroup, o)))
                .enumerate()
                .map(|(i, (resource, object))| (format!("k{i:02}"), resource, object))
                .collect();
            let by_vm = SpanByVm::new(keyed.iter().map(|(k, r, o)| (k.as_str(), *r, *o)));
            let index = SpanIndex::new(&groups, &policies);
            for vm in (0..7).map(|n| format!("vm{n}")) {
                for resource in RESOURCES {
                    let expected: BTreeSet<&str> = keyed.iter()
                        .filter(|(_, r, o)| *r == resource && index.in_span(resource, o, &vm))
                        .map(|(k, _, _)| k.as_str())
                        .collect();
                    prop_assert_eq!(by_vm.keys(resource, &vm), expected, "{} {:?}", vm, resource);
                }
            }
        }
    }

    #[test]
    fn a_vm_in_no_group_receives_nothing() {
        let group = json!({"metadata": {"name": "web"}, "spec": {"members": [{"vm": "vm1"}]}});
        let policy = json!({"metadata": {"name": "p"}, "spec": {"appliedTo": ["web"],
            "rules": [{"peers": {"addressGroups": ["clients"]}}]}});
        let clients = json!({"metadata": {"name": "clients"}, "spec": {}});
        let by_vm = SpanByVm::new([
            ("g", PolicyResource::AppliedToGroup, &group),
            ("p", PolicyResource::NetworkPolicy, &policy),
            ("a", PolicyResource::AddressGroup, &clients),
        ]);
        assert_eq!(
            by_vm.keys(PolicyResource::AddressGroup, "vm1"),
            BTreeSet::from(["a"])
        );
        for resource in RESOURCES {
            assert!(by_vm.keys(resource, "vm2").is_empty());
        }
    }
}
