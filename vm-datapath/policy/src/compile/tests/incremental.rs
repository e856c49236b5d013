//! Property: applying random change sequences incrementally gives exactly the flows of a full
//! recompile of the final state, and every diff is exactly the difference between the full
//! compiles before and after it (so it is minimal: nothing deleted and re-added unchanged).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use proptest::prelude::*;
use sluice_openflow::flow::{Flow, FlowKey};

use super::super::*;
use crate::model::{
    AddressGroup, AddressGroupPatch, AppliedToGroup, Direction, IpBlock, NetworkPolicy, Peers,
    Protocol, Rule, RuleAction, Service, VmInterface,
};

const GROUP_NAMES: [&str; 3] = ["g0", "g1", "g2"];
const APPLIED_NAMES: [&str; 2] = ["a0", "a1"];

fn net_pool() -> Vec<IpNet> {
    [
        "10.0.0.1/32",
        "10.0.0.2/32",
        "10.0.0.3/32",
        "10.0.1.0/24",
        "10.0.0.0/16",
        "fd00::2/128",
        "fd00::/64",
    ]
    .iter()
    .map(|text| text.parse().expect("net"))
    .collect()
}

fn interface_pool() -> Vec<VmInterface> {
    let ip = |text: &str| -> IpAddr { text.parse().expect("ip") };
    vec![
        VmInterface {
            name: "vm1".into(),
            ofport: 1,
            ips: vec![ip("10.0.0.1")],
            mac: None,
        },
        VmInterface {
            name: "vm2".into(),
            ofport: 2,
            ips: vec![ip("10.0.0.2"), ip("fd00::2")],
            mac: None,
        },
        VmInterface {
            name: "vm3".into(),
            ofport: 3,
            ips: vec![],
            mac: None,
        },
    ]
}

fn service_pool() -> Vec<Service> {
    vec![
        Service::port(Protocol::Tcp, 80),
        Service::port_range(Protocol::Tcp, 8000, 8010),
        Service::any_of(Protocol::Udp),
        Service {
            icmp_type: Some(8),
            ..Service::any_of(Protocol::Icmp)
        },
    ]
}

fn subset<T: Clone>(pool: Vec<T>, mask: u8) -> Vec<T> {
    pool.into_iter()
        .enumerate()
        .filter(|(index, _)| mask & (1 << index) != 0)
        .map(|(_, item)| item)
        .collect()
}

fn rule_strategy() -> impl Strategy<Value = Rule> {
    (any::<bool>(), 0u8..8, 0u8..4, 0u8..16, 0u8..3).prop_map(
        |(egress, groups, blocks, services, action)| {
            let mut ip_blocks = Vec::new();
            if blocks & 1 != 0 {
                ip_blocks.push(IpBlock {
                    cidr: "10.0.0.0/16".parse().expect("net"),
                    except: vec!["10.0.0.3/32".parse().expect("net")],
                });
            }
            if blocks & 2 != 0 {
                ip_blocks.push(IpBlock {
                    cidr: "fd00::/64".parse().expect("net"),
                    except: vec![],
                });
            }
            Rule {
                name: None,
                direction: if egress {
                    Direction::Egress
                } else {
                    Direction::Ingress
                },
                peers: Peers {
                    address_groups: subset(GROUP_NAMES.to_vec(), groups)
                        .into_iter()
                        .map(String::from)
                        .collect(),
                    ip_blocks,
                },
                services: subset(service_pool(), services),
                action: [RuleAction::Allow, RuleAction::Drop, RuleAction::Reject]
                    [usize::from(action)],
            }
        },
    )
}

fn policy_strategy() -> impl Strategy<Value = NetworkPolicy> {
    (
        0usize..4,
        0u16..6,
        1u8..4,
        proptest::collection::vec(rule_strategy(), 0..4),
        0u8..4,
    )
        .prop_map(|(name, priority, applied, rules, isolation)| {
            let mut policy = NetworkPolicy {
                name: format!("p{name}"),
                namespace: None,
                priority,
                applied_to_groups: subset(APPLIED_NAMES.to_vec(), applied)
                    .into_iter()
                    .map(String::from)
                    .collect(),
                isolation: BTreeSet::new(),
                rules,
            };
            policy.isolation = match isolation {
                0 => policy.rule_directions(),
                1 => [Direction::Ingress].into(),
                2 => [Direction::Egress].into(),
                _ => BTreeSet::new(),
            };
            policy
        })
}

fn change_strategy() -> impl Strategy<Value = PolicyChange> {
    let group = 0usize..GROUP_NAMES.len();
    let applied = 0usize..APPLIED_NAMES.len();
    prop_oneof![
        3 => policy_strategy().prop_map(PolicyChange::UpsertPolicy),
        1 => (0usize..4).prop_map(|n| PolicyChange::DeletePolicy { key: format!("p{n}") }),
        4 => (group.clone(), 0u8..128, 0u8..128).prop_map(|(g, added, removed)| {
            PolicyChange::PatchAddressGroup(AddressGroupPatch {
                group: GROUP_NAMES[g].into(),
                added: subset(net_pool(), added),
                removed: subset(net_pool(), removed),
            })
        }),
        1 => (group.clone(), 0u8..128).prop_map(|(g, members)| {
            PolicyChange::UpsertAddressGroup(AddressGroup {
                name: GROUP_NAMES[g].into(),
                members: subset(net_pool(), members).into_iter().collect(),
            })
        }),
        1 => group.prop_map(|g| PolicyChange::DeleteAddressGroup { name: GROUP_NAMES[g].into() }),
        2 => (applied.clone(), 0usize..3).prop_map(|(a, m)| PolicyChange::AddAppliedToMember {
            group: APPLIED_NAMES[a].into(),
            member: interface_pool()[m].clone(),
        }),
        1 => (applied.clone(), 0usize..3).prop_map(|(a, m)| PolicyChange::RemoveAppliedToMember {
            group: APPLIED_NAMES[a].into(),
            member: format!("vm{}", m + 1),
        }),
        1 => (applied.clone(), 0u8..8).prop_map(|(a, members)| {
            let mut group = AppliedToGroup::new(APPLIED_NAMES[a]);
            for member in subset(interface_pool(), members) {
                group.members.insert(member.name.clone(), member);
            }
            PolicyChange::UpsertAppliedToGroup(group)
        }),
        1 => applied.prop_map(|a| PolicyChange::DeleteAppliedToGroup { name: APPLIED_NAMES[a].into() }),
    ]
}

fn full(set: &crate::model::PolicySet, options: &CompileOptions) -> BTreeSet<Flow> {
    compile(set, options)
        .expect("a state the compiler accepted recompiles")
        .into_iter()
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn incremental_equals_full_recompile_and_diffs_are_minimal(
        changes in proptest::collection::vec(change_strategy(), 1..25),
    ) {
        let options = CompileOptions { round: 3, control_plane: vec![] };
        let mut compiler = PolicyCompiler::new(options.clone());
        let mut installed: BTreeSet<Flow> = compiler.flows().cloned().collect();
        for change in changes {
            let before = full(compiler.policy_set(), &options);
            prop_assert_eq!(&before, &installed);
            let Ok(diff) = compiler.apply(change.clone()) else {
                // Rejected changes (priority clashes) leave everything as it was.
                prop_assert_eq!(full(compiler.policy_set(), &options), before);
                continue;
            };
            let after = full(compiler.policy_set(), &options);
            let gone: BTreeMap<FlowKey, Flow> =
                before.difference(&after).map(|f| (f.key(), f.clone())).collect();
            let new: BTreeMap<FlowKey, Flow> =
                after.difference(&before).map(|f| (f.key(), f.clone())).collect();
            let expected_modify: Vec<Flow> =
                new.iter().filter(|(k, _)| gone.contains_key(*k)).map(|(_, f)| f.clone()).collect();
            let expected_add: Vec<Flow> =
                new.iter().filter(|(k, _)| !gone.contains_key(*k)).map(|(_, f)| f.clone()).collect();
            let expected_delete: Vec<Flow> =
                gone.iter().filter(|(k, _)| !new.contains_key(*k)).map(|(_, f)| f.clone()).collect();
            prop_assert_eq!(&diff.add, &expected_add, "change {:?}", change);
            prop_assert_eq!(&diff.modify, &expected_modify, "change {:?}", change);
            prop_assert_eq!(&diff.delete, &expected_delete, "change {:?}", change);
            // Apply the diff the way a switch would: by key.
            let mut by_key: BTreeMap<FlowKey, Flow> =
                installed.into_iter().map(|f| (f.key(), f)).collect();
            for flow in &diff.delete {
                prop_assert!(by_key.remove(&flow.key()).is_some());
            }
            for flow in diff.add.iter().chain(&diff.modify) {
                by_key.insert(flow.key(), flow.clone());
            }
            installed = by_key.into_values().collect();
            prop_assert_eq!(&installed, &after);
            let state: BTreeSet<Flow> = compiler.flows().cloned().collect();
            prop_assert_eq!(&state, &after);
        }
    }
}
