//! Which objects a caller may see: everything, or (a VM agent) only the policy objects whose
//! span includes its VM, with an applied-to group's members narrowed to that VM's own
//! interfaces (an agent programs every member it is given, so another VM's must not reach it),
//! and only while its VM is `AgentedConnected`; or (a VM agent on the `vm.sluice.dev` kinds)
//! only the object named as its own VM.

use std::sync::Arc;

use serde_json::Value;
use sluice_apimachinery::KindSpec;

use crate::kinds::{PolicyResource, SpanIndex};

#[derive(Debug, Clone)]
pub enum Visibility {
    All,
    /// The stored groups' and policies' spans, read when the request arrived.
    Span {
        vm: String,
        index: Arc<SpanIndex>,
        /// Whether the VM's `VirtualMachine` was `AgentedConnected` then: if not, nothing.
        receives: bool,
    },
    /// The object of this name only.
    Own {
        name: String,
    },
}

impl Visibility {
    pub fn allows(&self, spec: &KindSpec, object: &Value) -> bool {
        match self {
            Visibility::All => true,
            Visibility::Span {
                vm,
                index,
                receives,
            } => {
                *receives
                    && PolicyResource::from_plural(&spec.plural)
                        .is_some_and(|resource| index.in_span(resource, object, vm))
            }
            Visibility::Own { name } => {
                object.pointer("/metadata/name").and_then(Value::as_str) == Some(name)
            }
        }
    }

    /// The object as this caller is shown it. A VM agent gets policy objects without their
    /// realization status: the VMManager rewrites it as other VMs connect and realize, and
    /// each rewrite would otherwise be a MODIFIED event to every agent of the span.
    pub fn present(&self, spec: &KindSpec, object: Value) -> Value {
        let Visibility::Span { vm, .. } = self else {
            return object;
        };
        let object = present_to_agents(object);
        match PolicyResource::from_plural(&spec.plural) {
            Some(PolicyResource::AppliedToGroup) => own_members(object, vm),
            _ => object,
        }
    }
}

/// What every VM agent is shown of a policy object, before a group's members are narrowed to
/// its own: no realization status, no field managers.
pub(crate) fn present_to_agents(mut object: Value) -> Value {
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
    }
    // Who wrote which field is no agent's business (and would name other VMs' fields).
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    object
}

/// An applied-to group with only `vm`'s members.
pub(crate) fn own_members(mut group: Value, vm: &str) -> Value {
    if let Some(members) = group
        .pointer_mut("/spec/members")
        .and_then(Value::as_array_mut)
    {
        members.retain(|member| is_member_of(member, vm));
    }
    group
}

/// [`own_members`] of a group the caller keeps, copying none of the other VMs' members: a
/// change to a group of M members is shown to each of its M VMs, and copying the whole group
/// for each made that M^2 member copies.
pub(crate) fn own_members_of(group: &Value, vm: &str) -> Value {
    let (Some(object), Some(spec)) = (
        group.as_object(),
        group.get("spec").and_then(Value::as_object),
    ) else {
        return group.clone();
    };
    let mut shown = serde_json::Map::new();
    for (key, value) in object {
        let value = if key == "spec" {
            Value::Object(narrowed(spec, vm))
        } else {
            value.clone()
        };
        shown.insert(key.clone(), value);
    }
    Value::Object(shown)
}

/// A group's spec with only `vm`'s members, the other fields copied in their order.
fn narrowed(spec: &serde_json::Map<String, Value>, vm: &str) -> serde_json::Map<String, Value> {
    let mut kept = serde_json::Map::new();
    for (key, value) in spec {
        let value = match (key.as_str(), value) {
            ("members", Value::Array(members)) => Value::Array(
                members
                    .iter()
                    .filter(|member| is_member_of(member, vm))
                    .cloned()
                    .collect(),
            ),
            _ => value.clone(),
        };
        kept.insert(key.clone(), value);
    }
    kept
}

fn is_member_of(member: &Value, vm: &str) -> bool {
    member.get("vm").and_then(Value::as_str) == Some(vm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The borrowed form shows what the owned one does, key order included.
    #[test]
    fn a_group_narrowed_in_place_or_copied_reads_the_same() {
        let group = json!({"apiVersion": "policy/v1", "metadata": {"name": "web"},
            "spec": {"priority": 3, "members": [
                {"name": "vm1-eth0", "vm": "vm1"}, {"name": "vm4-eth0", "vm": "vm4"},
                {"name": "vm1-eth1", "vm": "vm1"}], "zone": "a"}, "status": {"x": 1}});
        for vm in ["vm1", "vm4", "vm9"] {
            let copied = own_members_of(&group, vm);
            let in_place = own_members(group.clone(), vm);
            assert_eq!(copied, in_place, "{vm}");
            assert_eq!(
                serde_json::to_string(&copied).unwrap(),
                serde_json::to_string(&in_place).unwrap()
            );
        }
        for odd in [
            json!({"metadata": {}}),
            json!({"spec": {"members": "x"}}),
            json!(7),
        ] {
            assert_eq!(own_members_of(&odd, "vm1"), own_members(odd.clone(), "vm1"));
        }
    }

    #[test]
    fn a_vm_agent_sees_only_its_own_members_of_a_group() {
        let group = json!({"metadata": {"name": "web"}, "spec": {"members": [
            {"name": "vm1-eth0", "vm": "vm1"}, {"name": "vm4-eth0", "vm": "vm4"}]}});
        let index = Arc::new(SpanIndex::new([&group], []));
        let spec = crate::kinds::applied_to_group();
        let vm1 = Visibility::Span {
            vm: "vm1".into(),
            index: index.clone(),
            receives: true,
        };
        assert!(vm1.allows(&spec, &group));
        let shown = vm1.present(&spec, group.clone());
        assert_eq!(
            shown["spec"]["members"],
            json!([{"name": "vm1-eth0", "vm": "vm1"}])
        );
        let disconnected = Visibility::Span {
            vm: "vm1".into(),
            index: index.clone(),
            receives: false,
        };
        assert!(!disconnected.allows(&spec, &group));
        let vm9 = Visibility::Span {
            vm: "vm9".into(),
            index,
            receives: true,
        };
        assert!(!vm9.allows(&spec, &group));
        assert!(!vm9.allows(&crate::kinds::agent(), &group));
        assert_eq!(Visibility::All.present(&spec, group.clone()), group);
    }

    #[test]
    fn a_vm_agent_is_not_shown_realization_status() {
        let policy = json!({"metadata": {"name": "web", "managedFields": [{"manager": "m"}]},
                            "spec": {}, "status": {"realizedVMs": 3}});
        let span = Visibility::Span {
            vm: "vm1".into(),
            index: Arc::new(SpanIndex::default()),
            receives: true,
        };
        let shown = span.present(&crate::kinds::network_policy(), policy.clone());
        assert!(shown.get("status").is_none());
        assert!(shown["metadata"].get("managedFields").is_none());
        let admin = Visibility::All.present(&crate::kinds::network_policy(), policy.clone());
        assert_eq!(admin, policy);
    }

    #[test]
    fn own_shows_only_the_object_of_that_name() {
        let spec = crate::kinds::virtual_machine();
        let own = Visibility::Own { name: "vm1".into() };
        assert!(own.allows(&spec, &json!({"metadata": {"name": "vm1"}})));
        assert!(!own.allows(&spec, &json!({"metadata": {"name": "vm10"}})));
        assert!(!own.allows(&spec, &json!({"metadata": {}})));
    }
}
