//! The pure policy compiler: [`PolicySet`] in, OpenFlow [`Flow`]s and minimal [`FlowDiff`]s out.
//! No I/O; the agent sends the result to OVS in one bundle.
//!
//! # Pipeline
//! | table | name | what happens |
//! |---|---|---|
//! | 0 | classifier | ARP and IPv6 neighbour discovery -> NORMAL (200); the agent's control-plane TCP endpoints, both directions -> NORMAL (190); IPv4/IPv6 -> `ct(table=1)` (zone 0) (100); anything else (non-IP) -> NORMAL (0) |
//! | 1 | conntrack | `+inv+trk` -> drop (200); `-new+est+trk` and `-new+rel+trk` -> NORMAL (190): replies and later packets of admitted connections skip the rules; miss -> table 2 |
//! | 2 | egress rules | rule conjunctions matched on the input port of the VM (1,001..=65,000); per applied-to port default drop `in_port=N` (100) when a policy isolates its egress; miss -> table 3 |
//! | 3 | ingress rules | rule conjunctions matched on the destination address of the VM; per applied-to address default drop (100) when a policy isolates its ingress; miss -> table 4 |
//! | 4 | commit | `ct(commit),NORMAL` (zone 0) for IPv4 and IPv6 |
//!
//! Rule actions: Allow -> continue (egress to table 3, so a destination VM's ingress rules still
//! apply; ingress to table 4 and commit), Drop -> no actions, Reject -> `meter:1` (the Reject
//! meter the engine installs, [`pipeline::REJECT_METER_ID`]) then `controller` with
//! `userdata` = [`RejectTag`] so the agent answers with TCP RST / ICMP unreachable.
//!
//! Ingress rules and drops match the VM's addresses because the output port is only known after
//! NORMAL forwarding. Only the first packet of a connection is checked: changing a policy does
//! not cut connections it admitted earlier (as upstream; flushing conntrack is the agent's call).
//!
//! Priorities, rule numbers and cookies: see [`priority`]. Conjunction layout: see `rule`.

mod compiler;
mod matches;
pub mod pipeline;
pub mod priority;
mod rule;

use std::fmt::Write as _;

use sluice_openflow::flow::Flow;

pub use compiler::{CompileOptions, FlowDiff, PolicyChange, PolicyCompiler, RuleRef};
pub use priority::RejectTag;

use crate::model::PolicySet;

/// Why a policy set cannot be compiled: it does not fit the priority space.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    #[error(
        "policy {policy:?}: priority {priority} is above the maximum {}",
        priority::MAX_POLICY_PRIORITY
    )]
    PriorityOutOfRange { policy: String, priority: u16 },
    #[error(
        "policy {policy:?}: {rules} rules exceed the limit of {} per policy",
        priority::MAX_RULES_PER_POLICY
    )]
    TooManyRules { policy: String, rules: usize },
    #[error("policy {policy:?}: priority {priority} is already used by policy {owner:?}")]
    PriorityTaken {
        policy: String,
        priority: u16,
        owner: String,
    },
}

/// Compiles a whole policy set into its sorted flows.
pub fn compile(set: &PolicySet, options: &CompileOptions) -> Result<Vec<Flow>, CompileError> {
    let compiler = PolicyCompiler::from_policy_set(set.clone(), options.clone())?;
    Ok(compiler.flows().cloned().collect())
}

/// Flows as `ovs-ofctl add-flow` lines, one per flow, in the given order.
pub fn render_flows<'a>(flows: impl IntoIterator<Item = &'a Flow>) -> String {
    let mut text = String::new();
    for flow in flows {
        // Writing into a String cannot fail.
        let _ = writeln!(text, "{flow}");
    }
    text
}

/// `sluice policy compile`: the flows of a policy set as text.
pub fn compile_to_text(set: &PolicySet, options: &CompileOptions) -> Result<String, CompileError> {
    Ok(render_flows(&compile(set, options)?))
}

#[cfg(test)]
mod tests;
