//! The span of a policy object: the VMs (named as their vm-agents' identities) it is sent to.
//! A vm-agent reads these kinds with `Decision::AllowWithinSpan { vm }`; the server shows it
//! only the objects for which [`SpanIndex::in_span`] (or [`in_span`]) says yes.
//!
//! - an `AppliedToGroup` spans the `vm`s of its members;
//! - a `NetworkPolicy` spans the union of its `spec.appliedTo` groups' spans;
//! - an `AddressGroup` spans the union of the spans of the policies whose rules name it in
//!   `peers.addressGroups`.
//!
//! The span is computed when the objects are read, from the stored applied-to groups and
//! policies, and never stored: a `spec.span` or `status.span` would have to be rewritten on
//! every object whenever one group's members or one policy's references change, and a missed
//! rewrite would send policies to the wrong agents. Computing it costs one pass over the stored
//! groups and policies ([`SpanIndex::new`], linear in their size) and then a few map lookups per
//! object, so a list or watch builds the index once at its revision and checks every object
//! against it. A watch must also re-check objects already sent when a group or policy changes:
//! an object that leaves an agent's span is a DELETED event for that agent.
//!
//! On top of membership, a VM's agent receives policies only while the VMManager has its
//! `VirtualMachine` in state `AgentedConnected` ([`receives_policies`]): a VM that is deleted,
//! switched to agentless or unmanaged, or whose agent stopped reporting, has an empty span, so
//! its agent's watch sees every policy DELETED (a cloud integration would then cover it).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

mod by_vm;
pub use by_vm::SpanByVm;

/// The policy resources a vm-agent may read within its span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyResource {
    NetworkPolicy,
    AddressGroup,
    AppliedToGroup,
}

impl PolicyResource {
    /// The resource behind a plural name of `policy.sluice.dev` (`networkpolicies`, ...).
    pub fn from_plural(plural: &str) -> Option<Self> {
        match plural {
            "networkpolicies" => Some(Self::NetworkPolicy),
            "addressgroups" => Some(Self::AddressGroup),
            "appliedtogroups" => Some(Self::AppliedToGroup),
            _ => None,
        }
    }
}

/// The VMs of every applied-to group and address group, from the stored objects at one
/// revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpanIndex {
    applied_to_groups: BTreeMap<String, BTreeSet<String>>,
    address_groups: BTreeMap<String, BTreeSet<String>>,
}

impl SpanIndex {
    /// Indexes the stored `AppliedToGroup` and `NetworkPolicy` objects (whole objects, as
    /// stored); address groups need no input, their span comes from the policies naming them.
    pub fn new<'a>(
        applied_to_groups: impl IntoIterator<Item = &'a Value>,
        network_policies: impl IntoIterator<Item = &'a Value>,
    ) -> Self {
        let mut index = Self::default();
        for group in applied_to_groups {
            index
                .applied_to_groups
                .entry(name(group).to_string())
                .or_default()
                .extend(member_vms(group).map(str::to_string));
        }
        for policy in network_policies {
            let vms = index.policy_span(policy);
            for group in strings(policy.pointer("/spec/rules"), "/peers/addressGroups") {
                index
                    .address_groups
                    .entry(group.to_string())
                    .or_default()
                    .extend(vms.iter().cloned());
            }
        }
        index
    }

    /// Whether `object` (of `resource`) is sent to `vm`.
    pub fn in_span(&self, resource: PolicyResource, object: &Value, vm: &str) -> bool {
        match resource {
            PolicyResource::AppliedToGroup => member_vms(object).any(|member| member == vm),
            PolicyResource::NetworkPolicy => applied_to(object).any(|group| {
                self.applied_to_groups
                    .get(group)
                    .is_some_and(|vms| vms.contains(vm))
            }),
            PolicyResource::AddressGroup => self
                .address_groups
                .get(name(object))
                .is_some_and(|vms| vms.contains(vm)),
        }
    }

    /// Every VM `object` (of `resource`) is sent to.
    pub fn span(&self, resource: PolicyResource, object: &Value) -> BTreeSet<String> {
        match resource {
            PolicyResource::AppliedToGroup => member_vms(object).map(str::to_string).collect(),
            PolicyResource::NetworkPolicy => self.policy_span(object),
            PolicyResource::AddressGroup => self
                .address_groups
                .get(name(object))
                .cloned()
                .unwrap_or_default(),
        }
    }

    fn policy_span(&self, policy: &Value) -> BTreeSet<String> {
        applied_to(policy)
            .filter_map(|group| self.applied_to_groups.get(group))
            .flatten()
            .cloned()
            .collect()
    }
}

/// Whether a VM's agent receives any policy: its `VirtualMachine` exists and the VMManager
/// has it `AgentedConnected`. Anything else (no object, another state, a malformed status) is
/// no: a span must never widen on doubt.
pub fn receives_policies(virtual_machine: Option<&Value>) -> bool {
    virtual_machine
        .and_then(|vm| vm.pointer("/status/state"))
        .and_then(Value::as_str)
        == Some(super::CONNECTED)
}

/// Whether `object` is sent to `vm`, given every stored applied-to group and policy; for one
/// object. To filter many, build a [`SpanIndex`] once.
pub fn in_span(
    resource: PolicyResource,
    object: &Value,
    vm: &str,
    applied_to_groups: &[Value],
    network_policies: &[Value],
) -> bool {
    SpanIndex::new(applied_to_groups, network_policies).in_span(resource, object, vm)
}

fn name(object: &Value) -> &str {
    object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn member_vms(group: &Value) -> impl Iterator<Item = &str> {
    strings(group.pointer("/spec/members"), "/vm")
}

fn applied_to(policy: &Value) -> impl Iterator<Item = &str> {
    strings(policy.pointer("/spec"), "/appliedTo")
}

/// The strings at `pointer` inside each item of `list` (or inside `list` itself when it is an
/// object): a string, or an array of strings. Anything else counts as nothing: stored objects
/// were validated, and a malformed one must not widen a span.
fn strings<'a>(list: Option<&'a Value>, pointer: &'a str) -> impl Iterator<Item = &'a str> {
    let items: Vec<&Value> = match list {
        Some(Value::Array(items)) => items.iter().collect(),
        Some(object @ Value::Object(_)) => vec![object],
        _ => Vec::new(),
    };
    items
        .into_iter()
        .filter_map(move |item| item.pointer(pointer))
        .flat_map(|found| match found {
            Value::String(text) => vec![text.as_str()],
            Value::Array(texts) => texts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        })
}

#[cfg(test)]
mod tests;
