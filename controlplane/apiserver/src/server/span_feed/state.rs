//! What the span feed knows, without I/O: the presented policy objects and their indexes as one
//! shared set per change, a few past sets (so a watch resuming at a recent resourceVersion
//! finds what its agent was shown then), and each VM's `receives_policies` with the revision
//! it last flipped.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use sluice_apimachinery::meta::set_resource_version;

use crate::kinds::{PolicyResource, SpanByVm, SpanIndex};

/// Past policy sets kept for resuming watches. A resume older than the oldest gets 410 and
/// re-lists (as after a compaction); 32 sets of pointers cost little beside the objects they
/// share.
const HISTORY: usize = 32;

/// The presented policy objects at one revision and their span indexes. Shared by every
/// VM agent's requests and watches until the next change.
#[derive(Debug, Default)]
pub(crate) struct PolicySet {
    /// The revision from which this set is the current one.
    pub since: u64,
    /// Presented objects (no `status`, no `managedFields`) by store key.
    pub objects: BTreeMap<String, Arc<Value>>,
    /// Which resource each key is.
    pub resources: HashMap<String, PolicyResource>,
    /// For one object: is it in a VM's span (lists, which walk the store's rows).
    pub index: Arc<SpanIndex>,
    /// For one VM: the keys in its span (watches).
    pub by_vm: SpanByVm,
}

impl PolicySet {
    fn new(
        since: u64,
        objects: BTreeMap<String, Arc<Value>>,
        resources: HashMap<String, PolicyResource>,
    ) -> Self {
        let (objects_ref, resources_ref) = (&objects, &resources);
        let of = |wanted: PolicyResource| {
            objects_ref
                .iter()
                .filter(move |(key, _)| resources_ref.get(*key) == Some(&wanted))
                .map(|(_, object)| object.as_ref())
        };
        let index = SpanIndex::new(
            of(PolicyResource::AppliedToGroup),
            of(PolicyResource::NetworkPolicy),
        );
        let by_vm = SpanByVm::new(objects.iter().filter_map(|(key, object)| {
            let resource = *resources.get(key)?;
            Some((key.as_str(), resource, object.as_ref()))
        }));
        Self {
            since,
            index: Arc::new(index),
            by_vm,
            objects,
            resources,
        }
    }
}

/// One VM's `receives_policies` and when it last changed.
#[derive(Debug, Clone, Copy)]
struct VmSeen {
    receives: bool,
    /// The revision at which `receives` took its value (the feed's origin when it had it
    /// already then).
    since: u64,
    /// The revision at which the value before took its own (`None`: unknown).
    before: Option<u64>,
}

/// A change the follower decoded from the store, applied under the feed's lock.
#[derive(Debug)]
pub(crate) enum Update {
    /// A policy object as presented to agents, or `None` when deleted or unreadable.
    Policy {
        key: String,
        resource: PolicyResource,
        presented: Option<Value>,
    },
    /// A VM's state: whether its agent receives policies.
    Vm {
        name: String,
        receives: bool,
        revision: u64,
    },
}

#[derive(Debug)]
pub(crate) struct FeedState {
    /// Complete up to this revision (`None` before the first load).
    pub revision: Option<u64>,
    pub set: Arc<PolicySet>,
    history: VecDeque<Arc<PolicySet>>,
    vms: HashMap<String, VmSeen>,
    /// Where the current load started: no VM state is known before it.
    origin: u64,
}

impl Default for FeedState {
    fn default() -> Self {
        Self {
            revision: None,
            set: Arc::default(),
            history: VecDeque::new(),
            vms: HashMap::new(),
            origin: u64::MAX,
        }
    }
}

impl FeedState {
    /// Replaces everything with a complete read at `revision`.
    pub fn load(&mut self, revision: u64, updates: Vec<Update>) {
        *self = Self {
            origin: revision,
            ..Self::default()
        };
        let mut objects = BTreeMap::new();
        let mut resources = HashMap::new();
        for update in updates {
            match update {
                Update::Policy {
                    key,
                    resource,
                    presented: Some(object),
                } => {
                    resources.insert(key.clone(), resource);
                    objects.insert(key, Arc::new(object));
                }
                Update::Policy { .. } => {}
                Update::Vm { name, receives, .. } => {
                    let seen = VmSeen {
                        receives,
                        since: revision,
                        before: None,
                    };
                    self.vms.insert(name, seen);
                }
            }
        }
        self.set = Arc::new(PolicySet::new(revision, objects, resources));
        self.revision = Some(revision);
    }

    /// Applies one store batch's changes; returns the VMs whose agents' view may have moved:
    /// those written (whatever their state became), and those a changed policy object was or
    /// is now sent to. Other VMs' agents see nothing new and are not woken.
    pub fn apply(&mut self, revision: u64, updates: Vec<Update>) -> BTreeSet<String> {
        let mut objects: Option<(BTreeMap<_, _>, HashMap<_, _>)> = None;
        let mut changes = Vec::new();
        let mut wake = BTreeSet::new();
        for update in updates {
            match update {
                Update::Policy {
                    key,
                    resource,
                    presented,
                } => {
                    let current = self.set.objects.get(&key);
                    if !differs(current.map(Arc::as_ref), presented.as_ref()) {
                        continue;
                    }
                    changes.push((resource, current.cloned(), key.clone()));
                    let (objects, resources) = objects.get_or_insert_with(|| {
                        (self.set.objects.clone(), self.set.resources.clone())
                    });
                    match presented {
                        Some(object) => {
                            resources.insert(key.clone(), resource);
                            objects.insert(key, Arc::new(object));
                        }
                        None => {
                            resources.remove(&key);
                            objects.remove(&key);
                        }
                    }
                }
                Update::Vm {
                    name,
                    receives,
                    revision,
                } => {
                    self.vm_state(&name, receives, revision);
                    wake.insert(name);
                }
            }
        }
        self.revision = Some(revision);
        if let Some((objects, resources)) = objects {
            let set = Arc::new(PolicySet::new(revision, objects, resources));
            for (resource, old, key) in changes {
                if let Some(old) = old {
                    wake.extend(self.set.index.span(resource, &old));
                }
                if let Some(new) = set.objects.get(&key) {
                    wake.extend(set.index.span(resource, new));
                }
            }
            self.history
                .push_back(std::mem::replace(&mut self.set, set));
            while self.history.len() > HISTORY {
                self.history.pop_front();
            }
        }
        wake
    }

    fn vm_state(&mut self, name: &str, receives: bool, revision: u64) {
        let origin = self.origin;
        let seen = self.vms.entry(name.to_string()).or_insert(VmSeen {
            receives: false,
            since: origin,
            before: None,
        });
        if seen.receives != receives {
            *seen = VmSeen {
                receives,
                since: revision,
                before: Some(seen.since),
            };
        }
    }

    /// Whether `vm`'s agent receives policies now.
    pub fn receives(&self, vm: &str) -> bool {
        self.vms.get(vm).is_some_and(|seen| seen.receives)
    }

    /// The policy set and `vm`'s state as they were at `revision`, if still known.
    pub fn at(&self, vm: &str, revision: u64) -> Option<(Arc<PolicySet>, bool)> {
        if revision < self.origin || self.revision.is_none_or(|now| revision > now) {
            return None;
        }
        let set = std::iter::once(&self.set)
            .chain(self.history.iter().rev())
            .find(|set| set.since <= revision)?;
        let receives = match self.vms.get(vm) {
            None => false,
            Some(seen) if seen.since <= revision => seen.receives,
            Some(seen) if seen.before.is_some_and(|before| before <= revision) => !seen.receives,
            Some(_) => return None,
        };
        Some((set.clone(), receives))
    }
}

/// Whether `new` differs from `old` in more than its resourceVersion (a status-only write is
/// no change once presented).
fn differs(old: Option<&Value>, new: Option<&Value>) -> bool {
    match (old, new) {
        (None, None) => false,
        (Some(old), Some(new)) => {
            let version = |object: &Value| {
                object
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .and_then(|text| text.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let mut probe = new.clone();
            set_resource_version(&mut probe, version(old));
            probe != *old
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn group(rv: u64, vms: &[&str]) -> Update {
        let members: Vec<Value> = vms.iter().map(|vm| json!({"vm": vm})).collect();
        Update::Policy {
            key: "/g/web".into(),
            resource: PolicyResource::AppliedToGroup,
            presented: Some(
                json!({"metadata": {"name": "web", "resourceVersion": rv.to_string()},
                                   "spec": {"members": members}}),
            ),
        }
    }

    fn vm(name: &str, receives: bool, revision: u64) -> Update {
        Update::Vm {
            name: name.into(),
            receives,
            revision,
        }
    }

    #[test]
    fn a_write_that_changes_only_the_version_keeps_the_set() {
        let mut state = FeedState::default();
        state.load(5, vec![group(4, &["vm1"]), vm("vm1", true, 3)]);
        let before = state.set.clone();
        let woken = state.apply(6, vec![group(6, &["vm1"])]);
        assert!(woken.is_empty());
        assert!(Arc::ptr_eq(&before, &state.set));
        let woken = state.apply(7, vec![group(7, &["vm1", "vm2"])]);
        assert_eq!(woken, BTreeSet::from(["vm1".into(), "vm2".into()]));
        assert_eq!(state.set.since, 7);
        let woken = state.apply(8, vec![group(8, &["vm3"])]);
        let left_and_joined = ["vm1", "vm2", "vm3"].map(String::from);
        assert_eq!(
            woken,
            BTreeSet::from(left_and_joined),
            "old and new members"
        );
        assert_eq!(
            state.apply(9, vec![vm("vm7", false, 9)]),
            BTreeSet::from(["vm7".into()])
        );
        let keys = state.set.by_vm.keys(PolicyResource::AppliedToGroup, "vm3");
        assert_eq!(keys.into_iter().collect::<Vec<_>>(), ["/g/web"]);
        assert!(state
            .set
            .by_vm
            .keys(PolicyResource::AppliedToGroup, "vm2")
            .is_empty());
    }

    #[test]
    fn the_past_is_known_back_to_the_load_and_one_flip_per_vm() {
        let mut state = FeedState::default();
        state.load(10, vec![group(4, &["vm1"]), vm("vm1", true, 3)]);
        state.apply(12, vec![group(12, &["vm1", "vm2"])]);
        state.apply(14, vec![vm("vm1", false, 14)]);
        assert!(state.at("vm1", 9).is_none(), "before the load");
        assert!(state.at("vm1", 15).is_none(), "not reached yet");
        let (set, receives) = state.at("vm1", 11).expect("known");
        assert!(receives);
        assert_eq!(set.since, 10);
        let (set, receives) = state.at("vm1", 14).expect("known");
        assert!(!receives);
        assert_eq!(set.since, 12);
        state.apply(16, vec![vm("vm1", true, 16)]);
        assert!(state.at("vm1", 13).is_none(), "two flips back is forgotten");
        assert!(!state.at("vm1", 15).expect("one flip back").1);
        assert!(!state.at("vm9", 15).expect("never seen").1);
    }

    #[test]
    fn history_is_bounded() {
        let mut state = FeedState::default();
        state.load(1, vec![]);
        for n in 0..(HISTORY as u64 + 5) {
            let vms = if n % 2 == 0 { &["a"][..] } else { &["b"][..] };
            state.apply(2 + n, vec![group(2 + n, vms)]);
        }
        assert_eq!(state.history.len(), HISTORY);
        assert!(state.at("a", 2).is_none());
    }

    mod woken {
        use super::*;
        use crate::server::visibility::own_members;
        use proptest::prelude::*;

        const RESOURCES: [PolicyResource; 3] = [
            PolicyResource::AppliedToGroup,
            PolicyResource::NetworkPolicy,
            PolicyResource::AddressGroup,
        ];

        fn name() -> impl Strategy<Value = String> {
            (0u8..3).prop_map(|n| format!("n{n}"))
        }

        fn vms() -> impl Strategy<Value = Vec<String>> {
            prop::collection::vec((0u8..5).prop_map(|n| format!("vm{n}")), 0..3)
        }

        /// One policy object: its resource, key and presented value.
        fn object() -> impl Strategy<Value = (PolicyResource, String, Value)> {
            (
                0usize..3,
                name(),
                vms(),
                prop::collection::vec(name(), 0..2),
                any::<bool>(),
            )
                .prop_map(|(kind, name, vms, names, flag)| {
                    let resource = RESOURCES[kind];
                    let spec = match resource {
                        PolicyResource::AppliedToGroup => {
                            let members: Vec<Value> =
                                vms.iter().map(|vm| json!({"vm": vm, "up": flag})).collect();
                            json!({"members": members})
                        }
                        PolicyResource::NetworkPolicy => json!({"appliedTo": names.clone(),
                            "rules": [{"peers": {"addressGroups": names}}], "flag": flag}),
                        PolicyResource::AddressGroup => json!({"flag": flag}),
                    };
                    let object = json!({"metadata": {"name": name}, "spec": spec});
                    (resource, format!("/{kind}/{name}"), object)
                })
        }

        fn visible(state: &FeedState, vm: &str) -> BTreeMap<String, Value> {
            let mut seen = BTreeMap::new();
            for resource in RESOURCES {
                for key in state.set.by_vm.keys(resource, vm) {
                    let object = state.set.objects[key].as_ref().clone();
                    let shown = match resource {
                        PolicyResource::AppliedToGroup => own_members(object, vm),
                        _ => object,
                    };
                    seen.insert(key.to_string(), shown);
                }
            }
            seen
        }

        proptest! {
            /// Every VM whose agent would be shown something else after a change is woken.
            #[test]
            fn every_vm_whose_view_moves_is_woken(
                before in prop::collection::vec(object(), 0..8),
                change in object(),
                delete in any::<bool>(),
            ) {
                let update = |(resource, key, object): (PolicyResource, String, Value)| {
                    Update::Policy { key, resource, presented: Some(object) }
                };
                let mut state = FeedState::default();
                state.load(1, before.into_iter().map(update).collect());
                let vms: Vec<String> = (0..5).map(|n| format!("vm{n}")).collect();
                let was: Vec<_> = vms.iter().map(|vm| visible(&state, vm)).collect();
                let (resource, key, object) = change;
                let presented = (!delete).then_some(object);
                let woken = state.apply(2, vec![Update::Policy { key, resource, presented }]);
                for (vm, was) in vms.iter().zip(was) {
                    if visible(&state, vm) != was {
                        prop_assert!(woken.contains(vm), "{} not woken", vm);
                    }
                }
            }
        }
    }
}
