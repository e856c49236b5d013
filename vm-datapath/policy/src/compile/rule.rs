//! One rule's conjunction: the dimension values it was compiled from and the flows they yield.
//!
//! Clauses, in this order and numbered from 1 over the dimensions present: peers (one flow per
//! distinct address/CIDR), applied-to (one per input port for egress, one per interface address
//! for ingress), services (one per protocol/port-mask/ICMP match and family). A dimension left
//! empty in the policy means "any" and has no clause; a referenced group that is empty means
//! "nothing" and the rule yields no flows. With only the applied-to dimension left the flows carry
//! the action directly, since OVS requires at least two clauses in a conjunction.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use sluice_openflow::flow::{Action, Flow, Match};

use super::matches::{ip_block_nets, match_net, service_matches, End, Families};
use super::pipeline::{COMMIT_TABLE, EGRESS_TABLE, INGRESS_TABLE, REJECT_METER_ID};
use super::priority::{cookie, rule_flow_priority, CookieKind, RejectTag};
use crate::model::{Direction, NetworkPolicy, PolicySet, Rule, RuleAction, Service};

/// Packet bytes sent to the agent with a Reject packet-in: everything, so it can build the reply.
const REJECT_MAX_LEN: u16 = u16::MAX;

/// What the rule needs to know to build any of its flows.
#[derive(Debug, Clone)]
pub(crate) struct RuleContext {
    pub number: u32,
    pub direction: Direction,
    pub action: RuleAction,
    pub table: u8,
    pub priority: u16,
    pub cookie: u64,
}

/// Where the rule's applied-to interfaces are matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum AppliedTo {
    InPort(u32),
    Destination(IpAddr),
}

#[derive(Debug, Clone)]
pub(crate) struct CompiledRule {
    pub context: RuleContext,
    /// `None` = any peer. Values count how many sources (address groups, IP blocks) provide the
    /// network, so a network shared by two groups survives the removal from one of them.
    pub peers: Option<BTreeMap<IpNet, u32>>,
    pub applied_to: BTreeSet<AppliedTo>,
    /// Empty = any service.
    pub services: BTreeSet<Service>,
    /// Address groups the peers came from (for patch routing).
    pub peer_groups: Vec<String>,
}

impl CompiledRule {
    /// `number` must have been range-checked by the caller.
    pub fn build(
        set: &PolicySet,
        policy: &NetworkPolicy,
        rule: &Rule,
        number: u32,
        round: u16,
    ) -> Self {
        let table = match rule.direction {
            Direction::Egress => EGRESS_TABLE,
            Direction::Ingress => INGRESS_TABLE,
        };
        let context = RuleContext {
            number,
            direction: rule.direction,
            action: rule.action,
            table,
            priority: rule_flow_priority(number),
            cookie: cookie(round, CookieKind::Rule, number),
        };
        let peers = (!rule.peers.is_any()).then(|| {
            let mut counts = BTreeMap::new();
            for name in &rule.peers.address_groups {
                if let Some(group) = set.address_groups.get(name) {
                    for net in &group.members {
                        *counts.entry(*net).or_insert(0) += 1;
                    }
                }
            }
            for block in &rule.peers.ip_blocks {
                for net in ip_block_nets(block) {
                    *counts.entry(net).or_insert(0) += 1;
                }
            }
            counts
        });
        let mut applied_to = BTreeSet::new();
        for name in &policy.applied_to_groups {
            let Some(group) = set.applied_to_groups.get(name) else {
                continue;
            };
            for interface in group.members.values() {
                match rule.direction {
                    Direction::Egress => {
                        applied_to.insert(AppliedTo::InPort(interface.ofport));
                    }
                    Direction::Ingress => {
                        applied_to.extend(interface.ips.iter().copied().map(AppliedTo::Destination))
                    }
                }
            }
        }
        Self {
            context,
            peers,
            applied_to,
            services: rule.services.iter().copied().collect(),
            peer_groups: rule.peers.address_groups.clone(),
        }
    }

    /// Families the rule can match: those of its peers and (ingress) applied-to addresses.
    pub fn families(&self) -> Families {
        let mut families = Families::BOTH;
        if let Some(peers) = &self.peers {
            // IpNet orders every V4 network before every V6 one, so the ends tell the families.
            let mut peer_families = Families::default();
            for net in [peers.keys().next(), peers.keys().next_back()]
                .into_iter()
                .flatten()
            {
                peer_families.add_addr(net.addr());
            }
            families = families.intersect(peer_families);
        }
        if self.context.direction == Direction::Ingress {
            let mut applied = Families::default();
            for entry in &self.applied_to {
                if let AppliedTo::Destination(ip) = entry {
                    applied.add_addr(*ip);
                }
            }
            families = families.intersect(applied);
        }
        families
    }

    /// Number of conjunction clauses, or `None` when the rule cannot match anything.
    pub fn clause_count(&self) -> Option<u8> {
        if self.applied_to.is_empty() || self.families().is_empty() {
            return None;
        }
        Some(1 + u8::from(self.peers.is_some()) + u8::from(!self.services.is_empty()))
    }

    /// Everything that decides the shape of the flows other than the individual peers: if it is
    /// unchanged, a peer change only adds or removes that peer's clause flow.
    pub fn shape(&self) -> (Option<u8>, Families) {
        (self.clause_count(), self.families())
    }

    fn action(&self) -> Vec<Action> {
        let context = &self.context;
        match context.action {
            RuleAction::Allow => vec![Action::GotoTable(match context.direction {
                Direction::Egress => INGRESS_TABLE,
                Direction::Ingress => COMMIT_TABLE,
            })],
            RuleAction::Drop => vec![],
            // Through the meter first: every packet-in costs ovs-vswitchd's slow path and the
            // agent a reply, so a VM flooding a Reject rule is cut to the meter's rate in the
            // datapath instead.
            RuleAction::Reject => vec![
                Action::Meter(REJECT_METER_ID),
                Action::Controller {
                    max_len: REJECT_MAX_LEN,
                    userdata: RejectTag {
                        direction: context.direction,
                        rule_number: context.number,
                    }
                    .encode(),
                },
            ],
        }
    }

    fn flow(&self, matches: Match, actions: Vec<Action>) -> Flow {
        Flow {
            table: self.context.table,
            priority: self.context.priority,
            cookie: self.context.cookie,
            matches,
            actions,
        }
    }

    fn clause(&self, clause: u8, n_clauses: u8) -> Vec<Action> {
        vec![Action::Conjunction {
            id: self.context.number,
            clause,
            n_clauses,
        }]
    }

    fn peer_end(&self) -> End {
        match self.context.direction {
            Direction::Egress => End::Destination,
            Direction::Ingress => End::Source,
        }
    }

    /// The clause-1 flow of one peer network, or `None` when the rule has no flow for it.
    pub fn peer_flow(&self, net: IpNet) -> Option<Flow> {
        let n_clauses = self.clause_count()?;
        self.peer_flow_shaped(net, n_clauses, self.families())
    }

    fn peer_flow_shaped(&self, net: IpNet, n_clauses: u8, families: Families) -> Option<Flow> {
        if self.peers.is_none() || !families.contains_addr(net.addr()) {
            return None;
        }
        let mut matches = Match::default();
        match_net(&mut matches, self.peer_end(), net);
        Some(self.flow(matches, self.clause(1, n_clauses)))
    }

    /// Updates the peer counts for networks added to / removed from one of the rule's address
    /// groups and collects the flows to release and retain. Only the changed peers' clause flows
    /// move unless the rule's shape (clause count, families) changes, which rebuilds it whole.
    pub fn apply_peer_change(
        &mut self,
        added: &[IpNet],
        removed: &[IpNet],
        to_release: &mut Vec<Flow>,
        to_retain: &mut Vec<Flow>,
    ) {
        let shape_before = self.shape();
        let Some(peers) = &mut self.peers else {
            return;
        };
        let mut appeared = Vec::new();
        let mut vanished = Vec::new();
        for net in removed {
            if let Some(count) = peers.get_mut(net) {
                *count -= 1;
                if *count == 0 {
                    peers.remove(net);
                    vanished.push(*net);
                }
            }
        }
        for net in added {
            let count = peers.entry(*net).or_insert(0);
            *count += 1;
            if *count == 1 {
                appeared.push(*net);
            }
        }
        if self.shape() == shape_before {
            // A peer's flow does not depend on the other peers.
            to_release.extend(vanished.iter().filter_map(|net| self.peer_flow(*net)));
            to_retain.extend(appeared.iter().filter_map(|net| self.peer_flow(*net)));
            return;
        }
        let mut before = self.clone();
        if let Some(peers) = &mut before.peers {
            for net in &appeared {
                peers.remove(net);
            }
            for net in &vanished {
                peers.insert(*net, 1);
            }
        }
        before.for_each_flow(|flow| to_release.push(flow));
        self.for_each_flow(|flow| to_retain.push(flow));
    }

    /// Calls `emit` for every flow of the rule.
    pub fn for_each_flow(&self, mut emit: impl FnMut(Flow)) {
        let Some(n_clauses) = self.clause_count() else {
            return;
        };
        let families = self.families();
        let mut next_clause = 1;
        if let Some(peers) = &self.peers {
            for net in peers.keys() {
                if let Some(flow) = self.peer_flow_shaped(*net, n_clauses, families) {
                    emit(flow);
                }
            }
            next_clause += 1;
        }
        let applied_actions = if n_clauses == 1 {
            self.action()
        } else {
            self.clause(next_clause, n_clauses)
        };
        next_clause += 1;
        for entry in &self.applied_to {
            let mut matches = Match::default();
            match entry {
                AppliedTo::InPort(port) => matches.in_port = Some(*port),
                AppliedTo::Destination(ip) => {
                    if !families.contains_addr(*ip) {
                        continue;
                    }
                    match_net(&mut matches, End::Destination, IpNet::from(*ip));
                }
            }
            emit(self.flow(matches, applied_actions.clone()));
        }
        if !self.services.is_empty() {
            // Two services may share fragments (e.g. overlapping ranges); emit each once.
            let mut seen = BTreeSet::new();
            for service in &self.services {
                for eth in families.eth_types() {
                    for matches in service_matches(service, eth) {
                        if seen.insert(matches.clone()) {
                            emit(self.flow(matches, self.clause(next_clause, n_clauses)));
                        }
                    }
                }
            }
        }
        if n_clauses > 1 {
            let matches = Match {
                conj_id: Some(self.context.number),
                ..Match::default()
            };
            emit(self.flow(matches, self.action()));
        }
    }
}
