//! Compiler tests. Besides checking flow text, they run packets through a small model of OVS
//! classification (priorities and conjunctions) over the compiled rule tables, so the tests
//! check what the flows *do*, not only what they look like.

use std::collections::BTreeSet;
use std::net::IpAddr;

use sluice_openflow::flow::{eth_type, ip_proto, Action, Flow, Match};

use super::pipeline::{COMMIT_TABLE, EGRESS_TABLE, INGRESS_TABLE, REJECT_METER_ID};
use super::*;
use crate::load::{load_str, Format};
use crate::model::{AddressGroupPatch, Direction, Rule, RuleAction, Service};

const GROUPS: &str = r#"
addressGroups:
  - name: vm2
    members: [10.0.0.2]
  - name: vm3
    members: [10.0.0.3]
  - name: clients
    members: [10.0.0.2, 10.0.0.3]
appliedToGroups:
  - name: vm1
    members: [{name: vm1-eth0, ofport: 1, ips: [10.0.0.1], mac: "02:00:00:00:00:01"}]
  - name: vm2
    members: [{name: vm2-eth0, ofport: 2, ips: [10.0.0.2]}]
"#;

fn policy_set(policies: &str) -> PolicySet {
    let text = format!("{GROUPS}policies:\n{policies}");
    match load_str(&text, "test.yaml", Format::Yaml) {
        Ok(set) => set,
        Err(error) => panic!("{error}"),
    }
}

fn options() -> CompileOptions {
    CompileOptions {
        round: 7,
        control_plane: vec![],
    }
}

fn compiled(set: &PolicySet) -> Vec<Flow> {
    compile(set, &options()).expect("compiles")
}

#[derive(Debug, Clone, Copy)]
struct Packet {
    in_port: u32,
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
    dst_port: u16,
    icmp_type: u8,
}

fn tcp(in_port: u32, src: &str, dst: &str, dst_port: u16) -> Packet {
    Packet {
        in_port,
        src: src.parse().expect("ip"),
        dst: dst.parse().expect("ip"),
        proto: ip_proto::TCP,
        dst_port,
        icmp_type: 0,
    }
}

fn icmp(in_port: u32, src: &str, dst: &str, icmp_type: u8) -> Packet {
    Packet {
        proto: ip_proto::ICMP,
        dst_port: 0,
        icmp_type,
        ..tcp(in_port, src, dst, 0)
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Allowed,
    Dropped,
    Rejected(RejectTag),
}

/// Whether a packet matches a flow's fields (conj_id excluded). Only the fields the rule tables
/// use are modelled; any other field set fails the test.
fn packet_matches(m: &Match, p: &Packet) -> bool {
    let eth = match p.src {
        IpAddr::V4(_) => eth_type::IPV4,
        IpAddr::V6(_) => eth_type::IPV6,
    };
    let addr_ok = |field: Option<IpAddr>, net: Option<(IpAddr, u8)>| match (field, net) {
        (_, None) => true,
        (Some(addr), Some((net_addr, len))) => ipnet::IpNet::new(net_addr, len)
            .map(|net| net.contains(&addr))
            .unwrap_or(false),
        (None, Some(_)) => false,
    };
    let v4 = |a: IpAddr| match a {
        IpAddr::V4(_) => Some(a),
        IpAddr::V6(_) => None,
    };
    let port_ok = |proto: u8, field: &Option<sluice_openflow::flow::Masked<u16>>| match field {
        None => true,
        Some(m) => p.proto == proto && p.dst_port & m.mask == m.value & m.mask,
    };
    assert!(
        m.ct_state.is_none() && m.eth_src.is_none() && m.tcp_src.is_none(),
        "{m:?}"
    );
    m.in_port.is_none_or(|port| port == p.in_port)
        && m.eth_type.is_none_or(|t| t == eth)
        && m.ip_proto.is_none_or(|proto| proto == p.proto)
        && addr_ok(
            v4(p.src),
            m.ipv4_src
                .map(|f| (IpAddr::V4(f.value), f.prefix_len().expect("prefix"))),
        )
        && addr_ok(
            v4(p.dst),
            m.ipv4_dst
                .map(|f| (IpAddr::V4(f.value), f.prefix_len().expect("prefix"))),
        )
        && m.ipv6_src.is_none()
        && m.ipv6_dst.is_none()
        && port_ok(ip_proto::TCP, &m.tcp_dst)
        && port_ok(ip_proto::UDP, &m.udp_dst)
        && port_ok(ip_proto::SCTP, &m.sctp_dst)
        && m.icmpv4_type.is_none_or(|t| t == p.icmp_type)
        && m.icmpv4_code.is_none_or(|c| c == 0)
}

/// OVS lookup in one table: the highest priority with a plain match or a completed conjunction.
fn lookup<'a>(flows: &'a [Flow], table: u8, p: &Packet) -> Option<&'a Flow> {
    let mut in_table: Vec<&Flow> = flows.iter().filter(|f| f.table == table).collect();
    in_table.sort_by_key(|f| std::cmp::Reverse(f.priority));
    let priorities: BTreeSet<u16> = in_table.iter().map(|f| f.priority).collect();
    for priority in priorities.into_iter().rev() {
        let level: Vec<&Flow> = in_table
            .iter()
            .copied()
            .filter(|f| f.priority == priority)
            .collect();
        let mut clauses: std::collections::BTreeMap<u32, (u8, BTreeSet<u8>)> = Default::default();
        for flow in &level {
            if flow.matches.conj_id.is_some() || !packet_matches(&flow.matches, p) {
                continue;
            }
            let conjunctions: Vec<_> = flow
                .actions
                .iter()
                .filter_map(|a| match a {
                    Action::Conjunction {
                        id,
                        clause,
                        n_clauses,
                    } => Some((*id, *clause, *n_clauses)),
                    _ => None,
                })
                .collect();
            if conjunctions.is_empty() {
                return Some(flow);
            }
            for (id, clause, n) in conjunctions {
                let entry = clauses.entry(id).or_insert((n, BTreeSet::new()));
                entry.1.insert(clause);
            }
        }
        for (id, (n, seen)) in clauses {
            if seen.len() == usize::from(n) {
                if let Some(flow) = in_table.iter().find(|f| f.matches.conj_id == Some(id)) {
                    return Some(flow);
                }
            }
        }
    }
    None
}

/// Policy verdict for the first packet of a connection (tables 2 and 3).
fn verdict(flows: &[Flow], p: &Packet) -> Verdict {
    let mut table = EGRESS_TABLE;
    loop {
        let Some(flow) = lookup(flows, table, p) else {
            panic!("no flow in table {table} for {p:?}");
        };
        match flow.actions.as_slice() {
            [] => return Verdict::Dropped,
            [Action::GotoTable(COMMIT_TABLE)] => return Verdict::Allowed,
            [Action::GotoTable(next)] if *next == INGRESS_TABLE => table = *next,
            [Action::Meter(REJECT_METER_ID), Action::Controller { userdata, .. }] => {
                return Verdict::Rejected(RejectTag::decode(userdata).expect("reject tag"))
            }
            other => panic!("unexpected actions {other:?}"),
        }
    }
}

const ALLOW_WEB_FROM_VM2: &str = r#"
  - name: web
    priority: 10
    appliedTo: [vm1]
    rules:
      - name: http
        direction: Ingress
        action: Allow
        peers: {addressGroups: [vm2]}
        services: [{protocol: TCP, port: 80}]
"#;

#[test]
fn allow_tcp_80_from_vm2_to_vm1_only() {
    let flows = compiled(&policy_set(ALLOW_WEB_FROM_VM2));
    let text = render_flows(&flows);
    let rule_lines: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("table=3") && !line.contains("priority=0"))
        .collect();
    assert_eq!(
        rule_lines.len(),
        5,
        "peer, applied-to, service, conj_id, default drop:\n{text}"
    );
    assert!(
        text.contains("nw_src=10.0.0.2 actions=conjunction(641,1/3)"),
        "{text}"
    );
    assert!(
        text.contains("nw_dst=10.0.0.1 actions=conjunction(641,2/3)"),
        "{text}"
    );
    assert!(
        text.contains("tcp_dst=80 actions=conjunction(641,3/3)"),
        "{text}"
    );
    assert!(text.contains("conj_id=641 actions=goto_table:4"), "{text}");

    let vm1 = "10.0.0.1";
    assert_eq!(
        verdict(&flows, &tcp(2, "10.0.0.2", vm1, 80)),
        Verdict::Allowed
    );
    assert_eq!(
        verdict(&flows, &tcp(2, "10.0.0.2", vm1, 81)),
        Verdict::Dropped
    );
    assert_eq!(
        verdict(&flows, &tcp(3, "10.0.0.3", vm1, 80)),
        Verdict::Dropped
    );
    assert_eq!(
        verdict(&flows, &icmp(2, "10.0.0.2", vm1, 8)),
        Verdict::Dropped
    );
    // vm1's egress is not isolated by an ingress-only policy; traffic not to vm1 is untouched.
    assert_eq!(
        verdict(&flows, &tcp(1, vm1, "10.0.0.3", 22)),
        Verdict::Allowed
    );
    assert_eq!(
        verdict(&flows, &tcp(2, "10.0.0.2", "10.0.0.3", 81)),
        Verdict::Allowed
    );
}

#[test]
fn pipeline_keeps_arp_conntrack_and_control_traffic() {
    let set = policy_set(ALLOW_WEB_FROM_VM2);
    let options = CompileOptions {
        round: 1,
        control_plane: vec!["192.168.1.10:6443".parse().expect("addr")],
    };
    let text = compile_to_text(&set, &options).expect("compiles");
    for expected in [
        "table=0,priority=200,cookie=0x1010000000000,arp actions=NORMAL",
        "table=0,priority=190,cookie=0x1040000000000,tcp,nw_dst=192.168.1.10,tcp_dst=6443 actions=NORMAL",
        "table=0,priority=190,cookie=0x1040000000000,tcp,nw_src=192.168.1.10,tcp_src=6443 actions=NORMAL",
        "table=1,priority=200,cookie=0x1010000000000,ct_state=+inv+trk actions=drop",
        "table=1,priority=190,cookie=0x1010000000000,ct_state=-new+est+trk actions=NORMAL",
        "table=4,priority=100,cookie=0x1010000000000,ip actions=ct(commit),NORMAL",
    ] {
        assert!(text.lines().any(|line| line == expected), "missing {expected}\n{text}");
    }
    assert!(text.contains("ip actions=ct(table=1)"), "{text}");
}

#[test]
fn higher_priority_drop_overrides_lower_allow() {
    let drop_policy = |priority: u16| {
        format!(
            r#"
  - name: block-vm2
    priority: {priority}
    appliedTo: [vm1]
    rules:
      - direction: Ingress
        action: Drop
        peers: {{addressGroups: [vm2]}}
"#
        )
    };
    let packet = tcp(2, "10.0.0.2", "10.0.0.1", 80);
    let set = policy_set(&format!("{ALLOW_WEB_FROM_VM2}{}", drop_policy(5)));
    assert_eq!(verdict(&compiled(&set), &packet), Verdict::Dropped);
    let set = policy_set(&format!("{ALLOW_WEB_FROM_VM2}{}", drop_policy(20)));
    assert_eq!(verdict(&compiled(&set), &packet), Verdict::Allowed);
}

#[test]
fn earlier_rule_wins_within_a_policy() {
    let set = policy_set(
        r#"
  - name: ordered
    priority: 3
    appliedTo: [vm1]
    rules:
      - {direction: Ingress, action: Drop, peers: {addressGroups: [vm2]}, services: [{protocol: TCP, port: 22}]}
      - {direction: Ingress, action: Allow, peers: {addressGroups: [clients]}}
"#,
    );
    let flows = compiled(&set);
    assert_eq!(
        verdict(&flows, &tcp(2, "10.0.0.2", "10.0.0.1", 22)),
        Verdict::Dropped
    );
    assert_eq!(
        verdict(&flows, &tcp(2, "10.0.0.2", "10.0.0.1", 80)),
        Verdict::Allowed
    );
    assert_eq!(
        verdict(&flows, &tcp(3, "10.0.0.3", "10.0.0.1", 22)),
        Verdict::Allowed
    );
}

#[test]
fn except_carves_addresses_out_of_an_ip_block() {
    let set = policy_set(
        r#"
  - name: subnet
    priority: 1
    appliedTo: [vm1]
    rules:
      - direction: Ingress
        action: Allow
        peers: {ipBlocks: [{cidr: 10.0.0.0/24, except: [10.0.0.3/32]}]}
"#,
    );
    let flows = compiled(&set);
    assert_eq!(
        verdict(&flows, &tcp(2, "10.0.0.2", "10.0.0.1", 443)),
        Verdict::Allowed
    );
    assert_eq!(
        verdict(&flows, &tcp(3, "10.0.0.3", "10.0.0.1", 443)),
        Verdict::Dropped
    );
    assert_eq!(
        verdict(&flows, &tcp(9, "10.0.1.2", "10.0.0.1", 443)),
        Verdict::Dropped
    );
}

#[test]
fn port_ranges_match_exactly_their_ports() {
    let set = policy_set(
        r#"
  - name: range
    priority: 1
    appliedTo: [vm1]
    rules:
      - direction: Ingress
        action: Allow
        services: [{protocol: TCP, port: 8000, endPort: 8080}]
"#,
    );
    let flows = compiled(&set);
    let service_flows = flows.iter().filter(|f| f.matches.tcp_dst.is_some()).count();
    // 8000/6 bits (8000-8063), 8064/4 bits (8064-8079), 8080 exact.
    assert_eq!(service_flows, 3);
    for (port, expected) in [
        (7999, Verdict::Dropped),
        (8000, Verdict::Allowed),
        (8063, Verdict::Allowed),
        (8080, Verdict::Allowed),
        (8081, Verdict::Dropped),
    ] {
        assert_eq!(
            verdict(&flows, &tcp(3, "10.0.0.3", "10.0.0.1", port)),
            expected,
            "port {port}"
        );
    }
}

#[test]
fn icmp_type_is_matched() {
    let set = policy_set(
        r#"
  - name: ping
    priority: 1
    appliedTo: [vm1]
    rules:
      - direction: Ingress
        action: Allow
        peers: {addressGroups: [clients]}
        services: [{protocol: ICMP, icmpType: 8}]
"#,
    );
    let flows = compiled(&set);
    assert_eq!(
        verdict(&flows, &icmp(2, "10.0.0.2", "10.0.0.1", 8)),
        Verdict::Allowed
    );
    assert_eq!(
        verdict(&flows, &icmp(2, "10.0.0.2", "10.0.0.1", 13)),
        Verdict::Dropped
    );
    assert_eq!(
        verdict(&flows, &tcp(2, "10.0.0.2", "10.0.0.1", 8)),
        Verdict::Dropped
    );
    assert!(render_flows(&flows).contains("icmp,icmp_type=8 actions=conjunction"));
}

#[test]
fn reject_carries_the_rule_in_userdata() {
    let set = policy_set(
        r#"
  - name: no-ssh-out
    priority: 2
    appliedTo: [vm1]
    rules:
      - {direction: Egress, action: Allow, peers: {addressGroups: [vm2]}}
      - name: refuse-vm3
        direction: Egress
        action: Reject
        peers: {addressGroups: [vm3]}
        services: [{protocol: TCP, port: 22}]
"#,
    );
    let compiler = PolicyCompiler::from_policy_set(set, options()).expect("compiles");
    let flows: Vec<Flow> = compiler.flows().cloned().collect();
    let Verdict::Rejected(tag) = verdict(&flows, &tcp(1, "10.0.0.1", "10.0.0.3", 22)) else {
        panic!("expected a reject");
    };
    assert_eq!(tag.direction, Direction::Egress);
    let rule = compiler
        .rule_for_number(tag.rule_number)
        .expect("known rule");
    assert_eq!(rule.policy, "no-ssh-out");
    assert_eq!(rule.rule_index, 1);
    assert_eq!(rule.rule_name.as_deref(), Some("refuse-vm3"));
    // The conj_id flow's cookie leads to the same rule (for counters).
    let conj = flows
        .iter()
        .find(|f| f.matches.conj_id == Some(tag.rule_number))
        .expect("conj flow");
    assert_eq!(compiler.rule_for_cookie(conj.cookie), Some(rule));
    // Egress isolation: other destinations and ports are dropped.
    assert_eq!(
        verdict(&flows, &tcp(1, "10.0.0.1", "10.0.0.3", 23)),
        Verdict::Dropped
    );
    assert_eq!(
        verdict(&flows, &tcp(1, "10.0.0.1", "10.0.0.2", 23)),
        Verdict::Allowed
    );
}

#[test]
fn address_group_patch_yields_a_handful_of_flows() {
    let set = policy_set(ALLOW_WEB_FROM_VM2);
    let mut compiler = PolicyCompiler::from_policy_set(set, options()).expect("compiles");
    let vm4: ipnet::IpNet = "10.0.0.4/32".parse().expect("net");
    let diff = compiler
        .apply(PolicyChange::PatchAddressGroup(AddressGroupPatch {
            group: "vm2".into(),
            added: vec![vm4],
            removed: vec![],
        }))
        .expect("applies");
    assert_eq!(
        (diff.add.len(), diff.modify.len(), diff.delete.len()),
        (1, 0, 0)
    );
    assert!(
        diff.add[0].to_string().contains("nw_src=10.0.0.4"),
        "{diff:?}"
    );
    let flows: Vec<Flow> = compiler.flows().cloned().collect();
    assert_eq!(
        verdict(&flows, &tcp(4, "10.0.0.4", "10.0.0.1", 80)),
        Verdict::Allowed
    );

    let diff = compiler
        .apply(PolicyChange::PatchAddressGroup(AddressGroupPatch {
            group: "vm2".into(),
            added: vec![],
            removed: vec![vm4],
        }))
        .expect("applies");
    assert_eq!(
        (diff.add.len(), diff.modify.len(), diff.delete.len()),
        (0, 0, 1)
    );

    // Emptying the group removes the whole conjunction; refilling brings it back.
    let vm2: ipnet::IpNet = "10.0.0.2/32".parse().expect("net");
    let patch = |added: Vec<ipnet::IpNet>, removed: Vec<ipnet::IpNet>| {
        PolicyChange::PatchAddressGroup(AddressGroupPatch {
            group: "vm2".into(),
            added,
            removed,
        })
    };
    let diff = compiler.apply(patch(vec![], vec![vm2])).expect("applies");
    assert_eq!(diff.delete.len(), 4, "{diff:?}");
    let diff = compiler.apply(patch(vec![vm2], vec![])).expect("applies");
    assert_eq!(diff.add.len(), 4, "{diff:?}");
    // A no-op patch changes nothing.
    assert!(compiler
        .apply(patch(vec![vm2], vec![]))
        .expect("applies")
        .is_empty());
}

#[test]
fn delete_policy_removes_exactly_its_flows() {
    let block_policy = r#"
  - name: block
    priority: 4
    appliedTo: [vm1, vm2]
    rules:
      - {direction: Egress, action: Drop, peers: {ipBlocks: [{cidr: 10.9.0.0/16}]}}
      - {direction: Ingress, action: Allow, peers: {addressGroups: [clients]}, services: [{protocol: UDP, port: 53}]}
"#;
    let both = policy_set(&format!("{ALLOW_WEB_FROM_VM2}{block_policy}"));
    let only_web = policy_set(ALLOW_WEB_FROM_VM2);
    let mut compiler = PolicyCompiler::from_policy_set(both.clone(), options()).expect("compiles");
    let before: BTreeSet<Flow> = compiled(&both).into_iter().collect();
    let after: BTreeSet<Flow> = compiled(&only_web).into_iter().collect();
    let diff = compiler
        .apply(PolicyChange::DeletePolicy {
            key: "block".into(),
        })
        .expect("applies");
    let expected: Vec<Flow> = before.difference(&after).cloned().collect();
    assert_eq!(diff.delete, expected);
    assert!(diff.add.is_empty() && diff.modify.is_empty());
    // vm1's ingress default drop is shared with the web policy and stays.
    assert!(compiler.flows().any(|f| f
        .to_string()
        .contains("priority=100,cookie=0x7030000000000,ip,nw_dst=10.0.0.1")));
    assert_eq!(compiler.flows().cloned().collect::<BTreeSet<_>>(), after);
}

#[test]
fn appended_rule_and_changed_action_give_small_diffs() {
    let mut compiler = PolicyCompiler::from_policy_set(policy_set(ALLOW_WEB_FROM_VM2), options())
        .expect("compiles");
    let mut policy = compiler.policy_set().policies["web"].clone();
    policy.rules.push(Rule {
        name: Some("dns".into()),
        direction: Direction::Ingress,
        peers: Default::default(),
        services: vec![Service::port(crate::model::Protocol::Udp, 53)],
        action: RuleAction::Allow,
    });
    let diff = compiler
        .apply(PolicyChange::UpsertPolicy(policy.clone()))
        .expect("applies");
    // applied-to clause, service clause (IPv4 only: vm1 has no IPv6 address), conj_id flow.
    assert_eq!(
        (diff.add.len(), diff.modify.len(), diff.delete.len()),
        (3, 0, 0),
        "{diff:?}"
    );

    policy.rules[1].action = RuleAction::Drop;
    let diff = compiler
        .apply(PolicyChange::UpsertPolicy(policy))
        .expect("applies");
    assert_eq!(
        (diff.add.len(), diff.modify.len(), diff.delete.len()),
        (0, 1, 0),
        "{diff:?}"
    );
    assert!(diff.modify[0].actions.is_empty());
}

#[test]
fn output_is_deterministic_and_sorted() {
    let text = format!(
        "{ALLOW_WEB_FROM_VM2}{}",
        r#"
  - name: other
    priority: 11
    appliedTo: [vm2]
    rules: [{direction: Egress, action: Allow, peers: {addressGroups: [clients]}}]
"#
    );
    let first = compiled(&policy_set(&text));
    let second = compiled(&policy_set(&text));
    assert_eq!(first, second);
    let mut sorted = first.clone();
    sorted.sort();
    assert_eq!(first, sorted);
}

#[test]
fn priority_space_violations_are_errors() {
    let mut set = policy_set(ALLOW_WEB_FROM_VM2);
    let mut clash = set.policies["web"].clone();
    clash.name = "clash".into();
    let mut compiler = PolicyCompiler::from_policy_set(set.clone(), options()).expect("compiles");
    let before: Vec<Flow> = compiler.flows().cloned().collect();
    assert!(matches!(
        compiler.apply(PolicyChange::UpsertPolicy(clash.clone())),
        Err(CompileError::PriorityTaken { .. })
    ));
    assert_eq!(compiler.flows().cloned().collect::<Vec<_>>(), before);
    set.upsert_policy(clash.clone());
    assert!(matches!(
        compile(&set, &options()),
        Err(CompileError::PriorityTaken { .. })
    ));
    clash.priority = priority::MAX_POLICY_PRIORITY + 1;
    assert!(matches!(
        compiler.apply(PolicyChange::UpsertPolicy(clash.clone())),
        Err(CompileError::PriorityOutOfRange { .. })
    ));
    clash.priority = 50;
    clash.rules = vec![clash.rules[0].clone(); 65];
    assert!(matches!(
        compiler.apply(PolicyChange::UpsertPolicy(clash)),
        Err(CompileError::TooManyRules { rules: 65, .. })
    ));
}

#[test]
fn ipnet_orders_v4_before_v6() {
    // CompiledRule::families relies on it.
    let v4: ipnet::IpNet = "255.255.255.255/32".parse().expect("net");
    let v6: ipnet::IpNet = "::/0".parse().expect("net");
    assert!(v4 < v6);
}

mod incremental;
