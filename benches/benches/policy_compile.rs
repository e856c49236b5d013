//! Policy compiler benchmarks (issue 6): a full compile of 1,000 policies whose address groups
//! hold up to 5,000 VM addresses, and the incremental diff for one address added to a group.
//!
//! Workload: 5,000 VM addresses split into 50 "tier" groups of 100, plus one "all-vms" group
//! holding all 5,000. Policy i (priority i) applies to one of 4 local interfaces and has an
//! ingress Allow from tier i%50 on a TCP port and a port range, an egress Drop to tier
//! (i+1)%50 over UDP, and every 100th policy an ingress ICMP Allow from all-vms.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use ipnet::IpNet;
use sluice_policy::compile::{CompileOptions, PolicyChange, PolicyCompiler};
use sluice_policy::model::{
    AddressGroup, AddressGroupPatch, AppliedToGroup, Direction, NetworkPolicy, Peers, PolicySet,
    Protocol, Rule, RuleAction, Service, VmInterface,
};

const POLICIES: u16 = 1_000;
const VM_ADDRESSES: u32 = 5_000;
const TIERS: u32 = 50;
const LOCAL_INTERFACES: u32 = 4;

fn vm_address(index: u32) -> IpNet {
    IpNet::from(IpAddr::V4(Ipv4Addr::from(
        u32::from(Ipv4Addr::new(10, 0, 0, 0)) + index + 1,
    )))
}

fn policy_set() -> PolicySet {
    let mut set = PolicySet::default();
    let per_tier = VM_ADDRESSES / TIERS;
    for tier in 0..TIERS {
        let members: BTreeSet<IpNet> = (tier * per_tier..(tier + 1) * per_tier)
            .map(vm_address)
            .collect();
        let name = format!("tier-{tier}");
        set.address_groups
            .insert(name.clone(), AddressGroup { name, members });
    }
    set.address_groups.insert(
        "all-vms".into(),
        AddressGroup {
            name: "all-vms".into(),
            members: (0..VM_ADDRESSES).map(vm_address).collect(),
        },
    );
    for interface in 0..LOCAL_INTERFACES {
        let name = format!("local-{interface}");
        let member = VmInterface {
            name: format!("eth{interface}"),
            ofport: interface + 1,
            ips: vec![IpAddr::V4(Ipv4Addr::new(192, 168, 0, interface as u8 + 1))],
            mac: None,
        };
        set.applied_to_groups.insert(
            name.clone(),
            AppliedToGroup {
                name,
                members: BTreeMap::from([(member.name.clone(), member)]),
            },
        );
    }
    for index in 0..POLICIES {
        let tier = u32::from(index) % TIERS;
        let group_peers = |group: String| Peers {
            address_groups: vec![group],
            ip_blocks: vec![],
        };
        let mut rules = vec![
            Rule {
                name: Some("app".into()),
                direction: Direction::Ingress,
                peers: group_peers(format!("tier-{tier}")),
                services: vec![
                    Service::port(Protocol::Tcp, 8_000 + index % 100),
                    Service::port_range(Protocol::Tcp, 9_000, 9_100),
                ],
                action: RuleAction::Allow,
            },
            Rule {
                name: Some("no-udp-out".into()),
                direction: Direction::Egress,
                peers: group_peers(format!("tier-{}", (tier + 1) % TIERS)),
                services: vec![Service::any_of(Protocol::Udp)],
                action: RuleAction::Drop,
            },
        ];
        if index % 100 == 0 {
            rules.push(Rule {
                name: Some("ping".into()),
                direction: Direction::Ingress,
                peers: group_peers("all-vms".into()),
                services: vec![Service::any_of(Protocol::Icmp)],
                action: RuleAction::Allow,
            });
        }
        set.upsert_policy(NetworkPolicy {
            name: format!("policy-{index}"),
            namespace: Some("bench".into()),
            priority: index,
            applied_to_groups: vec![format!("local-{}", u32::from(index) % LOCAL_INTERFACES)],
            isolation: [Direction::Ingress, Direction::Egress].into(),
            rules,
        });
    }
    set
}

fn add_address(group: &str, index: u32) -> PolicyChange {
    PolicyChange::PatchAddressGroup(AddressGroupPatch {
        group: group.into(),
        added: vec![vm_address(VM_ADDRESSES + index)],
        removed: vec![],
    })
}

fn remove_address(group: &str, index: u32) -> PolicyChange {
    PolicyChange::PatchAddressGroup(AddressGroupPatch {
        group: group.into(),
        added: vec![],
        removed: vec![vm_address(VM_ADDRESSES + index)],
    })
}

/// Resident set size of this process (Linux), to show what the compiled state costs.
fn resident_mib() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some((kib / 1024).to_string())
        })
        .unwrap_or_else(|| "?".into())
}

fn benches(c: &mut Criterion) {
    let set = policy_set();
    let options = CompileOptions::default();
    let started = Instant::now();
    let mut compiler = PolicyCompiler::from_policy_set(set.clone(), options.clone()).unwrap();
    println!(
        "policy_compile: {} policies, {} VM addresses -> {} flows (one compile: {:?}, resident memory {} MiB)",
        set.policies.len(),
        VM_ADDRESSES,
        compiler.flow_count(),
        started.elapsed(),
        resident_mib()
    );
    for group in ["tier-7", "all-vms"] {
        let diff = compiler.apply(add_address(group, 0)).unwrap();
        println!(
            "policy_compile: one address added to {group} -> diff of {} flows ({} add, {} modify, {} delete)",
            diff.len(),
            diff.add.len(),
            diff.modify.len(),
            diff.delete.len()
        );
        compiler.apply(remove_address(group, 0)).unwrap();
    }

    let mut full = c.benchmark_group("policy_compile");
    full.sample_size(10)
        .measurement_time(Duration::from_secs(20));
    full.bench_function("full_compile_1000_policies_5000_addresses", |b| {
        b.iter_batched(
            || set.clone(),
            |set| PolicyCompiler::from_policy_set(set, options.clone()).unwrap(),
            BatchSize::PerIteration,
        )
    });
    full.finish();

    let mut incremental = c.benchmark_group("policy_incremental");
    for group in ["tier-7", "all-vms"] {
        incremental.bench_function(format!("add_one_address_to_{group}"), |b| {
            // Each timed add is followed by an untimed removal, so the state does not grow.
            b.iter_custom(|iterations| {
                let mut total = Duration::ZERO;
                for iteration in 0..iterations {
                    let index = (iteration % 1_000) as u32 + 1;
                    let started = Instant::now();
                    let diff = compiler.apply(add_address(group, index)).unwrap();
                    total += started.elapsed();
                    black_box(diff);
                    compiler.apply(remove_address(group, index)).unwrap();
                }
                total
            })
        });
    }
    incremental.finish();
}

criterion_group!(policy_compile, benches);
criterion_main!(policy_compile);
