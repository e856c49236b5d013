//! Pure helpers: the [`PolicyChange`]s that turn one policy set into another (a reloaded file),
//! and the net effect of several [`FlowDiff`]s as one list of flow mods for a single bundle.

use std::collections::BTreeMap;

use sluice_openflow::flow::{Flow, FlowKey};
use sluice_openflow::FlowMod;
use sluice_policy::compile::FlowDiff;
use sluice_policy::compile::PolicyChange;
use sluice_policy::model::PolicySet;

/// Changes from `old` to `new`, in an order the compiler accepts at every step: groups are
/// upserted before the policies that may use them, and deleted after the policies that did.
pub fn changes_between(old: &PolicySet, new: &PolicySet) -> Vec<PolicyChange> {
    let mut changes = Vec::new();
    for (name, group) in &new.address_groups {
        if old.address_groups.get(name) != Some(group) {
            changes.push(PolicyChange::UpsertAddressGroup(group.clone()));
        }
    }
    for (name, group) in &new.applied_to_groups {
        if old.applied_to_groups.get(name) != Some(group) {
            changes.push(PolicyChange::UpsertAppliedToGroup(group.clone()));
        }
    }
    for key in old.policies.keys() {
        if !new.policies.contains_key(key) {
            changes.push(PolicyChange::DeletePolicy { key: key.clone() });
        }
    }
    for (key, policy) in &new.policies {
        if old.policies.get(key) != Some(policy) {
            changes.push(PolicyChange::UpsertPolicy(policy.clone()));
        }
    }
    for name in old.address_groups.keys() {
        if !new.address_groups.contains_key(name) {
            changes.push(PolicyChange::DeleteAddressGroup { name: name.clone() });
        }
    }
    for name in old.applied_to_groups.keys() {
        if !new.applied_to_groups.contains_key(name) {
            changes.push(PolicyChange::DeleteAppliedToGroup { name: name.clone() });
        }
    }
    changes
}

/// Accumulates diffs of consecutive changes into their net effect on the switch.
#[derive(Debug, Default)]
pub struct NetDiff {
    /// Per flow key: whether the switch had a flow there before, and the flow it must have after.
    entries: BTreeMap<FlowKey, (bool, Option<Flow>)>,
}

impl NetDiff {
    pub fn push(&mut self, diff: FlowDiff) {
        for flow in diff.delete {
            self.entries.entry(flow.key()).or_insert((true, None)).1 = None;
        }
        for flow in diff.modify {
            let key = flow.key();
            self.entries.entry(key).or_insert((true, None)).1 = Some(flow);
        }
        for flow in diff.add {
            let key = flow.key();
            self.entries.entry(key).or_insert((false, None)).1 = Some(flow);
        }
    }

    /// The flow mods, deletions first (a conjunction id reused by another rule must be gone
    /// before the new one is added; the bundle makes the order invisible to packets anyway).
    pub fn into_flow_mods(self) -> Vec<FlowMod> {
        let mut deletes = Vec::new();
        let mut others = Vec::new();
        for (key, (existed, after)) in self.entries {
            match (existed, after) {
                (true, None) => deletes.push(FlowMod::DeleteStrict(key)),
                // Strict modify keeps the flow's counters; the cookie of a key never changes
                // within a round (it is derived from the rule number, which is in the match or
                // the priority).
                (true, Some(flow)) => others.push(FlowMod::ModifyStrict(flow)),
                (false, Some(flow)) => others.push(FlowMod::Add(flow)),
                (false, None) => {}
            }
        }
        deletes.extend(others);
        deletes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_policy::compile::{CompileOptions, PolicyCompiler};
    use sluice_policy::load::{load_str, Format};

    const BASE: &str = r#"
addressGroups:
  - {name: clients, members: [10.0.0.2]}
appliedToGroups:
  - name: web
    members: [{name: vm1, ofport: 1, ips: [10.0.0.1]}]
policies:
  - name: web
    priority: 10
    appliedTo: [web]
    rules:
      - {direction: Ingress, action: Allow, peers: {addressGroups: [clients]}, services: [{protocol: TCP, port: 80}]}
"#;

    fn set(text: &str) -> PolicySet {
        load_str(text, "test", Format::Yaml).unwrap()
    }

    /// Applying the changes and the net diff to the old flows gives exactly the new compile.
    fn check_transition(old_text: &str, new_text: &str) -> usize {
        let (old, new) = (set(old_text), set(new_text));
        let options = CompileOptions {
            round: 3,
            control_plane: vec![],
        };
        let mut compiler = PolicyCompiler::from_policy_set(old.clone(), options.clone()).unwrap();
        let mut switch: BTreeMap<FlowKey, Flow> =
            compiler.flows().map(|f| (f.key(), f.clone())).collect();
        let mut net = NetDiff::default();
        for change in changes_between(&old, &new) {
            net.push(compiler.apply(change).unwrap());
        }
        let mods = net.into_flow_mods();
        for flow_mod in &mods {
            match flow_mod {
                FlowMod::Add(flow) => assert!(switch.insert(flow.key(), flow.clone()).is_none()),
                FlowMod::ModifyStrict(flow) => {
                    assert!(switch.insert(flow.key(), flow.clone()).is_some())
                }
                FlowMod::DeleteStrict(key) => assert!(switch.remove(key).is_some()),
                FlowMod::DeleteByCookie { .. } => panic!("not produced"),
            }
        }
        let expected: Vec<Flow> = PolicyCompiler::from_policy_set(new, options)
            .unwrap()
            .flows()
            .cloned()
            .collect();
        assert_eq!(switch.into_values().collect::<Vec<_>>(), expected);
        mods.len()
    }

    #[test]
    fn adding_a_member_is_a_small_diff_and_reaches_the_full_compile() {
        let grown = BASE.replace("members: [10.0.0.2]", "members: [10.0.0.2, 10.0.0.3]");
        let mods = check_transition(BASE, &grown);
        assert!(mods <= 2, "one peer flow per added address, got {mods}");
    }

    #[test]
    fn deleting_and_restoring_everything_reaches_the_full_compile() {
        let empty = "policies: []\n";
        check_transition(BASE, empty);
        check_transition(empty, BASE);
        let dropped = BASE.replace("action: Allow", "action: Drop");
        check_transition(BASE, &dropped);
    }

    #[test]
    fn identical_sets_need_no_change() {
        assert!(changes_between(&set(BASE), &set(BASE)).is_empty());
    }
}
