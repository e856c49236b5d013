//! The VMManager's view of the store: the VMs, their runtime infos and the policy objects,
//! kept current by three store watches, and what a change makes it re-evaluate. Pure: events
//! in, dirty sets out.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use sluice_apimachinery::meta::set_resource_version;
use sluice_store::{Event, KeyValue};

/// The three resources the VMManager follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Followed {
    Vms,
    RuntimeInfos,
    /// Every `policy.sluice.dev` object (groups and policies make the spans).
    Policies,
}

/// What the VMManager knows, by name (VMs, runtime infos) or key (policy objects).
#[derive(Debug, Default)]
pub struct Cache {
    pub vms: BTreeMap<String, Value>,
    pub runtime_infos: BTreeMap<String, Value>,
    pub policy_objects: BTreeMap<String, Value>,
    /// VMs to evaluate again.
    pub dirty_vms: BTreeSet<String>,
    /// Whether policy statuses must be computed again.
    pub policies_dirty: bool,
    /// Whether some VM's state may have changed since the states gauge was counted (a count
    /// reads every VM: at 5,000 VMs, counting after every heartbeat was a tenth of the
    /// control plane's steady CPU, issue 36).
    pub states_dirty: bool,
}

/// A stored row as an object with its resourceVersion; `None` (logged) when it does not parse.
pub fn decode(row: &KeyValue) -> Option<Value> {
    match serde_json::from_slice::<Value>(&row.value) {
        Ok(mut object) => {
            set_resource_version(&mut object, row.mod_revision);
            Some(object)
        }
        Err(error) => {
            tracing::warn!(key = %row.key, %error, "a stored object does not parse: skipped");
            None
        }
    }
}

/// The last segment of a key: a cluster-scoped object's name.
pub fn name_of(key: &str) -> &str {
    key.rsplit('/').next().unwrap_or(key)
}

/// Whether a change from `old` to `new` can change some NetworkPolicy's status: a VM's state
/// (who is desired), a runtime info's realized policies, a policy object's name, generation or
/// spec (spans and wanted generations). Not a heartbeat's time, not a status.
fn moves_policy_status(followed: Followed, old: Option<&Value>, new: Option<&Value>) -> bool {
    let pointers: &[&str] = match followed {
        Followed::Vms => &["/status/state"],
        Followed::RuntimeInfos => &["/networkPolicies"],
        Followed::Policies => &["/metadata/name", "/metadata/generation", "/spec"],
    };
    match (old, new) {
        (Some(old), Some(new)) => pointers
            .iter()
            .any(|pointer| old.pointer(pointer) != new.pointer(pointer)),
        (None, None) => false,
        _ => true,
    }
}

impl Cache {
    /// Replaces one resource's objects with a fresh list; everything is re-evaluated.
    pub fn replace(&mut self, followed: Followed, rows: &[KeyValue]) {
        let objects = rows
            .iter()
            .filter_map(|row| Some((self.slot(followed, &row.key), decode(row)?)))
            .collect();
        *self.map(followed) = objects;
        self.dirty_vms.extend(self.vms.keys().cloned());
        self.policies_dirty = true;
        self.states_dirty = true;
    }

    /// Applies a change; returns the name of a runtime info that was written (a heartbeat).
    pub fn apply(&mut self, followed: Followed, event: &Event) -> Option<String> {
        let slot = self.slot(followed, event.key());
        let old = match event {
            Event::Put { kv, .. } => match decode(kv) {
                Some(object) => self.map(followed).insert(slot.clone(), object),
                None => None,
            },
            Event::Delete { .. } => self.map(followed).remove(&slot),
        };
        let new = self.map(followed).get(&slot);
        // Only what a policy status is computed from: a heartbeat, or a status this manager
        // wrote itself, would otherwise make every write recompute every policy (issue 36:
        // thousands of VMs heartbeating).
        if moves_policy_status(followed, old.as_ref(), new) {
            self.policies_dirty = true;
            // For a VM, what moves a policy status is its state (or its coming and going).
            self.states_dirty |= followed == Followed::Vms;
        }
        match followed {
            Followed::Vms => {
                self.dirty_vms.insert(slot);
                None
            }
            Followed::RuntimeInfos => {
                self.dirty_vms.insert(slot.clone());
                matches!(event, Event::Put { .. }).then_some(slot)
            }
            Followed::Policies => None,
        }
    }

    fn slot(&self, followed: Followed, key: &str) -> String {
        match followed {
            Followed::Policies => key.to_string(),
            Followed::Vms | Followed::RuntimeInfos => name_of(key).to_string(),
        }
    }

    fn map(&mut self, followed: Followed) -> &mut BTreeMap<String, Value> {
        match followed {
            Followed::Vms => &mut self.vms,
            Followed::RuntimeInfos => &mut self.runtime_infos,
            Followed::Policies => &mut self.policy_objects,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use serde_json::json;

    fn row(key: &str, value: Value, revision: u64) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Bytes::from(value.to_string()),
            create_revision: revision,
            mod_revision: revision,
            version: 1,
        }
    }

    #[test]
    fn a_runtime_info_write_is_a_heartbeat_and_a_deletion_is_not() {
        let mut cache = Cache::default();
        let key = "/registry/vm.sluice.dev/virtualmachineruntimeinfos/vm1";
        let put = Event::Put {
            kv: row(key, json!({"metadata": {"name": "vm1"}}), 5),
            prev: None,
        };
        assert_eq!(
            cache.apply(Followed::RuntimeInfos, &put),
            Some("vm1".into())
        );
        assert_eq!(
            cache.runtime_infos["vm1"]["metadata"]["resourceVersion"],
            json!("5")
        );
        assert!(cache.dirty_vms.contains("vm1"));
        let delete = Event::Delete {
            prev: row(key, json!({}), 5),
            revision: 6,
        };
        assert_eq!(cache.apply(Followed::RuntimeInfos, &delete), None);
        assert!(cache.runtime_infos.is_empty());
    }

    #[test]
    fn only_what_a_policy_status_reads_makes_policies_dirty() {
        let mut cache = Cache::default();
        let put = |key: &str, value: Value, revision: u64| Event::Put {
            kv: row(key, value, revision),
            prev: None,
        };
        let info = "/registry/vm.sluice.dev/virtualmachineruntimeinfos/vm1";
        let vm = "/registry/vm.sluice.dev/virtualmachines/vm1";
        let policy = "/registry/policy.sluice.dev/networkpolicies/p";
        let steps = [
            (
                Followed::RuntimeInfos,
                put(
                    info,
                    json!({"heartbeat": 1, "networkPolicies": {"p": "1"}}),
                    2,
                ),
                true,
            ),
            (
                Followed::RuntimeInfos,
                put(
                    info,
                    json!({"heartbeat": 2, "networkPolicies": {"p": "1"}}),
                    3,
                ),
                false,
            ),
            (
                Followed::RuntimeInfos,
                put(
                    info,
                    json!({"heartbeat": 3, "networkPolicies": {"p": "2"}}),
                    4,
                ),
                true,
            ),
            (
                Followed::Vms,
                put(
                    vm,
                    json!({"status": {"state": "AgentedConnected", "heartbeat": 1}}),
                    5,
                ),
                true,
            ),
            (
                Followed::Vms,
                put(
                    vm,
                    json!({"status": {"state": "AgentedConnected", "heartbeat": 2}}),
                    6,
                ),
                false,
            ),
            (
                Followed::Vms,
                put(vm, json!({"status": {"state": "AgentedBootstrap"}}), 7),
                true,
            ),
            (
                Followed::Policies,
                put(
                    policy,
                    json!({"metadata": {"name": "p", "generation": 1}, "spec": {}}),
                    8,
                ),
                true,
            ),
            (
                Followed::Policies,
                put(
                    policy,
                    json!({"metadata": {"name": "p", "generation": 1}, "spec": {}, "status": {"realizedVMs": 1}}),
                    9,
                ),
                false,
            ),
            (
                Followed::Policies,
                put(
                    policy,
                    json!({"metadata": {"name": "p", "generation": 2}, "spec": {"priority": 2}}),
                    10,
                ),
                true,
            ),
            (
                Followed::Policies,
                Event::Delete {
                    prev: row(policy, json!({}), 10),
                    revision: 11,
                },
                true,
            ),
        ];
        for (n, (followed, event, dirty)) in steps.into_iter().enumerate() {
            cache.policies_dirty = false;
            cache.states_dirty = false;
            cache.apply(followed, &event);
            assert_eq!(cache.policies_dirty, dirty, "step {n}");
            // Only a VM's state (not its heartbeat, not a report) asks for a new count.
            assert_eq!(
                cache.states_dirty,
                dirty && followed == Followed::Vms,
                "step {n}"
            );
        }
    }

    #[test]
    fn a_fresh_list_makes_everything_dirty_and_skips_garbage() {
        let mut cache = Cache::default();
        let rows = [
            row("/registry/vm.sluice.dev/virtualmachines/vm1", json!({}), 3),
            KeyValue {
                value: Bytes::from_static(b"{not json"),
                ..row("/registry/vm.sluice.dev/virtualmachines/vm2", json!({}), 4)
            },
        ];
        cache.replace(Followed::Vms, &rows);
        assert_eq!(cache.vms.len(), 1);
        assert!(cache.dirty_vms.contains("vm1"));
        assert!(cache.policies_dirty);
        assert!(cache.states_dirty);
    }
}
