//! The incremental compiler: keeps the policy set, each rule's compiled dimensions and the
//! reference-counted flow set, and turns a change into the minimal [`FlowDiff`].
//!
//! A change releases the flows of what it affects (computed from the state before), mutates the
//! state, and retains the flows of the new state. Address-group patches touch only the peer
//! clause flows of the added/removed networks unless a rule's shape (clause count, families)
//! changes. Flows released and retained unchanged cancel out, so a diff never deletes and re-adds
//! the same flow; a flow whose key (table, priority, match) stays but whose actions change is a
//! `modify`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use ipnet::IpNet;
use sluice_openflow::flow::{Flow, FlowKey};

use super::pipeline::{default_drops, fixed_flows};
use super::priority::{
    parse_cookie, rule_number, rule_position, CookieKind, MAX_POLICY_PRIORITY, MAX_RULES_PER_POLICY,
};
use super::rule::CompiledRule;
use super::CompileError;
use crate::model::{
    AddressGroup, AddressGroupPatch, AppliedToGroup, Direction, NetworkPolicy, PolicySet,
    VmInterface,
};

/// Inputs of a compile besides the policies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompileOptions {
    /// Agent run number, in every cookie (see `priority`).
    pub round: u16,
    /// TCP endpoints of the agent's own control traffic (API server, controller), allowed in
    /// both directions ahead of conntrack and policy so no policy can cut the agent off.
    pub control_plane: Vec<SocketAddr>,
}

/// One change to the policy state, as the controller's watch delivers them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyChange {
    /// Adds a policy or replaces the one with the same key (rules added, removed, edited).
    UpsertPolicy(NetworkPolicy),
    DeletePolicy {
        key: String,
    },
    /// Replaces a whole address group (treated as the patch between old and new members).
    UpsertAddressGroup(AddressGroup),
    PatchAddressGroup(AddressGroupPatch),
    DeleteAddressGroup {
        name: String,
    },
    UpsertAppliedToGroup(AppliedToGroup),
    AddAppliedToMember {
        group: String,
        member: VmInterface,
    },
    RemoveAppliedToMember {
        group: String,
        member: String,
    },
    DeleteAppliedToGroup {
        name: String,
    },
}

/// Flow changes to send to the switch, each list sorted. `modify` flows keep their key (table,
/// priority, match) and cookie and change their actions (a strict modify). Send the three lists
/// in one bundle: in between, a conjunction could be half installed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowDiff {
    pub add: Vec<Flow>,
    pub modify: Vec<Flow>,
    pub delete: Vec<Flow>,
}

impl FlowDiff {
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.modify.is_empty() && self.delete.is_empty()
    }

    pub fn len(&self) -> usize {
        self.add.len() + self.modify.len() + self.delete.len()
    }
}

/// Where a rule number points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRef {
    /// [`NetworkPolicy::key`].
    pub policy: String,
    pub rule_index: usize,
    pub rule_name: Option<String>,
    pub direction: Direction,
}

/// Keeps the compiled state of one agent run. Pure: no I/O; the caller sends the diffs.
#[derive(Debug, Clone)]
pub struct PolicyCompiler {
    options: CompileOptions,
    set: PolicySet,
    /// Policy key by policy priority (priorities are unique).
    by_priority: BTreeMap<u16, String>,
    /// Compiled rules per policy key, in rule order.
    rules: BTreeMap<String, Vec<CompiledRule>>,
    /// (policy key, rule index) of the rules using each address group, so a patch visits only
    /// those rules instead of all of them.
    group_users: BTreeMap<String, BTreeSet<(String, usize)>>,
    /// Every flow with the number of contributors holding it (default drops are shared).
    flows: BTreeMap<Flow, u32>,
    /// Reference counts (before, now) of the flows the change being applied touched; kept here
    /// so that building the diff needs no lookups in the big flow map.
    touched: Option<BTreeMap<Flow, (u32, u32)>>,
}

impl PolicyCompiler {
    /// An empty policy state: only the fixed pipeline flows.
    pub fn new(options: CompileOptions) -> Self {
        let mut compiler = Self {
            set: PolicySet::default(),
            by_priority: BTreeMap::new(),
            rules: BTreeMap::new(),
            group_users: BTreeMap::new(),
            flows: BTreeMap::new(),
            touched: None,
            options,
        };
        for flow in fixed_flows(compiler.options.round, &compiler.options.control_plane) {
            compiler.retain(flow);
        }
        compiler
    }

    /// Compiles a whole policy set.
    pub fn from_policy_set(set: PolicySet, options: CompileOptions) -> Result<Self, CompileError> {
        let mut compiler = Self::new(options);
        for policy in set.policies.values() {
            compiler.check_policy(policy)?;
            if let Some(owner) = compiler.by_priority.get(&policy.priority) {
                return Err(CompileError::PriorityTaken {
                    policy: policy.key(),
                    priority: policy.priority,
                    owner: owner.clone(),
                });
            }
            compiler.by_priority.insert(policy.priority, policy.key());
        }
        compiler.set = set;
        let keys: Vec<String> = compiler.set.policies.keys().cloned().collect();
        for key in keys {
            compiler.compile_policy(&key);
        }
        Ok(compiler)
    }

    pub fn options(&self) -> &CompileOptions {
        &self.options
    }

    pub fn policy_set(&self) -> &PolicySet {
        &self.set
    }

    /// The current flows, sorted.
    pub fn flows(&self) -> impl ExactSizeIterator<Item = &Flow> {
        self.flows.keys()
    }

    pub fn flow_count(&self) -> usize {
        self.flows.len()
    }

    /// The rule a flow cookie (e.g. from flow stats) belongs to, if it is a rule flow of a
    /// current rule.
    pub fn rule_for_cookie(&self, cookie: u64) -> Option<RuleRef> {
        let parts = parse_cookie(cookie)?;
        if parts.kind != CookieKind::Rule {
            return None;
        }
        self.rule_for_number(parts.rule_number)
    }

    /// The rule behind a rule number (conjunction id, Reject tag).
    pub fn rule_for_number(&self, number: u32) -> Option<RuleRef> {
        let (priority, rule_index) = rule_position(number)?;
        let key = self.by_priority.get(&priority)?;
        let policy = self.set.policies.get(key)?;
        let rule = policy.rules.get(rule_index)?;
        Some(RuleRef {
            policy: key.clone(),
            rule_index,
            rule_name: rule.name.clone(),
            direction: rule.direction,
        })
    }

    /// Applies one change and returns the flows to add, modify and delete. On error nothing
    /// changes.
    pub fn apply(&mut self, change: PolicyChange) -> Result<FlowDiff, CompileError> {
        if let PolicyChange::UpsertPolicy(policy) = &change {
            self.check_policy(policy)?;
            if let Some(owner) = self.by_priority.get(&policy.priority) {
                if *owner != policy.key() {
                    return Err(CompileError::PriorityTaken {
                        policy: policy.key(),
                        priority: policy.priority,
                        owner: owner.clone(),
                    });
                }
            }
        }
        self.touched = Some(BTreeMap::new());
        match change {
            PolicyChange::UpsertPolicy(policy) => {
                let key = policy.key();
                self.release_policy(&key);
                if let Some(old) = self.set.policies.get(&key) {
                    self.by_priority.remove(&old.priority);
                }
                self.by_priority.insert(policy.priority, key.clone());
                self.set.policies.insert(key.clone(), policy);
                self.compile_policy(&key);
            }
            PolicyChange::DeletePolicy { key } => {
                self.release_policy(&key);
                if let Some(old) = self.set.policies.remove(&key) {
                    self.by_priority.remove(&old.priority);
                }
            }
            PolicyChange::UpsertAddressGroup(group) => {
                let old = self
                    .set
                    .address_groups
                    .get(&group.name)
                    .map(|old| old.members.clone())
                    .unwrap_or_default();
                let patch = AddressGroupPatch {
                    group: group.name.clone(),
                    added: group.members.difference(&old).copied().collect(),
                    removed: old.difference(&group.members).copied().collect(),
                };
                self.patch_address_group(&patch);
            }
            PolicyChange::PatchAddressGroup(patch) => self.patch_address_group(&patch),
            PolicyChange::DeleteAddressGroup { name } => {
                if let Some(group) = self.set.address_groups.get(&name) {
                    let patch = AddressGroupPatch {
                        group: name.clone(),
                        added: vec![],
                        removed: group.members.iter().copied().collect(),
                    };
                    self.patch_address_group(&patch);
                    self.set.address_groups.remove(&name);
                }
            }
            PolicyChange::UpsertAppliedToGroup(group) => {
                let name = group.name.clone();
                self.change_applied_to(&name, |groups| {
                    groups.insert(group.name.clone(), group);
                });
            }
            PolicyChange::AddAppliedToMember { group, member } => {
                self.change_applied_to(&group, |groups| {
                    groups
                        .entry(group.clone())
                        .or_insert_with(|| AppliedToGroup::new(group.clone()))
                        .members
                        .insert(member.name.clone(), member);
                });
            }
            PolicyChange::RemoveAppliedToMember { group, member } => {
                self.change_applied_to(&group, |groups| {
                    if let Some(group) = groups.get_mut(&group) {
                        group.members.remove(&member);
                    }
                });
            }
            PolicyChange::DeleteAppliedToGroup { name } => {
                self.change_applied_to(&name, |groups| {
                    groups.remove(&name);
                });
            }
        }
        Ok(self.finish_diff())
    }

    fn check_policy(&self, policy: &NetworkPolicy) -> Result<(), CompileError> {
        if policy.priority > MAX_POLICY_PRIORITY {
            return Err(CompileError::PriorityOutOfRange {
                policy: policy.key(),
                priority: policy.priority,
            });
        }
        if policy.rules.len() > usize::from(MAX_RULES_PER_POLICY) {
            return Err(CompileError::TooManyRules {
                policy: policy.key(),
                rules: policy.rules.len(),
            });
        }
        Ok(())
    }

    fn retain(&mut self, flow: Flow) {
        let Some(touched) = &mut self.touched else {
            *self.flows.entry(flow).or_insert(0) += 1;
            return;
        };
        let count = self.flows.entry(flow.clone()).or_insert(0);
        let counts = touched.entry(flow).or_insert((*count, *count));
        *count += 1;
        counts.1 = *count;
    }

    fn release(&mut self, flow: Flow) {
        let Some(count) = self.flows.get_mut(&flow) else {
            return;
        };
        let before = *count;
        *count -= 1;
        let after = *count;
        if after == 0 {
            self.flows.remove(&flow);
        }
        if let Some(touched) = &mut self.touched {
            touched.entry(flow).or_insert((before, before)).1 = after;
        }
    }

    /// Flows a policy contributes besides its rules: default drops of its interfaces.
    fn policy_level_flows(&self, policy: &NetworkPolicy) -> Vec<Flow> {
        let mut flows = Vec::new();
        let mut interfaces = BTreeMap::new();
        for name in &policy.applied_to_groups {
            if let Some(group) = self.set.applied_to_groups.get(name) {
                for interface in group.members.values() {
                    interfaces.insert(&interface.name, interface);
                }
            }
        }
        for direction in &policy.isolation {
            for interface in interfaces.values() {
                default_drops(self.options.round, *direction, interface, |flow| {
                    flows.push(flow)
                });
            }
        }
        // One interface listed in two groups of the policy still counts once.
        flows.sort();
        flows.dedup();
        flows
    }

    fn release_policy(&mut self, key: &str) {
        let Some(policy) = self.set.policies.get(key) else {
            return;
        };
        let mut flows = self.policy_level_flows(policy);
        for (index, rule) in self
            .rules
            .remove(key)
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            rule.for_each_flow(|flow| flows.push(flow));
            for group in &rule.peer_groups {
                if let Some(users) = self.group_users.get_mut(group) {
                    users.remove(&(key.to_string(), index));
                    if users.is_empty() {
                        self.group_users.remove(group);
                    }
                }
            }
        }
        for flow in flows {
            self.release(flow);
        }
    }

    fn compile_policy(&mut self, key: &str) {
        for flow in self.build_policy(key) {
            self.retain(flow);
        }
    }

    /// Compiles a policy's rules into `self.rules` and returns all flows it contributes.
    fn build_policy(&mut self, key: &str) -> Vec<Flow> {
        let Some(policy) = self.set.policies.get(key) else {
            return Vec::new();
        };
        let mut flows = self.policy_level_flows(policy);
        let mut compiled = Vec::with_capacity(policy.rules.len());
        for (index, rule) in policy.rules.iter().enumerate() {
            // Range-checked in check_policy.
            let Some(number) = rule_number(policy.priority, index) else {
                continue;
            };
            let rule = CompiledRule::build(&self.set, policy, rule, number, self.options.round);
            rule.for_each_flow(|flow| flows.push(flow));
            for group in &rule.peer_groups {
                self.group_users
                    .entry(group.clone())
                    .or_default()
                    .insert((key.to_string(), index));
            }
            compiled.push(rule);
        }
        self.rules.insert(key.to_string(), compiled);
        flows
    }

    fn patch_address_group(&mut self, patch: &AddressGroupPatch) {
        let members = &mut self
            .set
            .address_groups
            .entry(patch.group.clone())
            .or_insert_with(|| AddressGroup::new(patch.group.clone()))
            .members;
        // Same semantics as AddressGroupPatch::apply_to (removals first), but in place: groups
        // can hold thousands of members and a patch usually touches one.
        let mut removed = Vec::new();
        for net in &patch.removed {
            if members.remove(&net.trunc()) {
                removed.push(net.trunc());
            }
        }
        let mut added = Vec::new();
        for net in &patch.added {
            if members.insert(net.trunc()) {
                added.push(net.trunc());
            }
        }
        // A member removed and added back in the same patch was present before and is unchanged.
        let added_set: BTreeSet<IpNet> = added.iter().copied().collect();
        let unchanged: BTreeSet<IpNet> = removed
            .iter()
            .filter(|net| added_set.contains(net))
            .copied()
            .collect();
        removed.retain(|net| !unchanged.contains(net));
        added.retain(|net| !unchanged.contains(net));
        if added.is_empty() && removed.is_empty() {
            return;
        }
        let mut to_release = Vec::new();
        let mut to_retain = Vec::new();
        let users = self
            .group_users
            .get(&patch.group)
            .cloned()
            .unwrap_or_default();
        for (key, index) in users {
            let Some(rule) = self
                .rules
                .get_mut(&key)
                .and_then(|rules| rules.get_mut(index))
            else {
                continue;
            };
            rule.apply_peer_change(&added, &removed, &mut to_release, &mut to_retain);
        }
        for flow in to_release {
            self.release(flow);
        }
        for flow in to_retain {
            self.retain(flow);
        }
    }

    /// Recompiles every policy that uses the applied-to group around `mutate`.
    fn change_applied_to(
        &mut self,
        group: &str,
        mutate: impl FnOnce(&mut BTreeMap<String, AppliedToGroup>),
    ) {
        let affected: Vec<String> = self
            .set
            .policies
            .iter()
            .filter(|(_, policy)| policy.applied_to_groups.iter().any(|name| name == group))
            .map(|(key, _)| key.clone())
            .collect();
        for key in &affected {
            self.release_policy(key);
        }
        mutate(&mut self.set.applied_to_groups);
        for key in &affected {
            self.compile_policy(key);
        }
    }

    fn finish_diff(&mut self) -> FlowDiff {
        let touched = self.touched.take().unwrap_or_default();
        let mut added: BTreeMap<FlowKey, Flow> = BTreeMap::new();
        let mut deleted: BTreeMap<FlowKey, Flow> = BTreeMap::new();
        for (flow, (count_before, count_after)) in touched {
            match (count_before > 0, count_after > 0) {
                (false, true) => {
                    added.insert(flow.key(), flow);
                }
                (true, false) => {
                    deleted.insert(flow.key(), flow);
                }
                _ => {}
            }
        }
        let mut diff = FlowDiff::default();
        for (key, flow) in added {
            if deleted.remove(&key).is_some() {
                diff.modify.push(flow);
            } else {
                diff.add.push(flow);
            }
        }
        diff.delete = deleted.into_values().collect();
        diff.add.sort();
        diff.modify.sort();
        diff.delete.sort();
        diff
    }
}
