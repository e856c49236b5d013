use super::*;

fn identity(role: Role, subject: &str) -> Identity {
    Identity::new(role, subject).unwrap()
}

/// Budgets where vm-agents may make 3 writes of 1000 bytes in a burst, 1 per second after.
fn small() -> WriteBudgets {
    let mut budgets = WriteBudgets::default();
    let vm = budgets.role_mut(Role::VmAgent);
    vm.writes = Rate::new(1.0, 3.0);
    vm.bytes = Rate::new(1000.0, 3000.0);
    vm.role_writes = Rate::new(1.0, 5.0);
    budgets
}

#[test]
fn an_identity_over_its_burst_waits_for_its_refill() {
    let budget = WriteBudget::new(small());
    let vm = identity(Role::VmAgent, "vm-1");
    let start = Instant::now();
    for _ in 0..3 {
        budget.admit(&vm, 10, start).unwrap();
    }
    let refused = budget.admit(&vm, 10, start).unwrap_err();
    assert_eq!(refused.scope, Scope::Identity);
    assert_eq!(refused.retry_after, Duration::from_secs(1));
    let status = refused.status("sluice:vm-agent:vm-1");
    assert_eq!(status.code, 429);
    assert_eq!(status.details.unwrap().retry_after_seconds, Some(1));
    // One second later one more write fits, and only one.
    let later = start + Duration::from_secs(1);
    budget.admit(&vm, 10, later).unwrap();
    assert!(budget.admit(&vm, 10, later).is_err());
}

#[test]
fn bytes_are_budgeted_and_a_write_above_the_burst_needs_a_full_bucket() {
    let budget = WriteBudget::new(small());
    let vm = identity(Role::VmAgent, "vm-1");
    let start = Instant::now();
    // 10 kB is more than the 3000-byte burst: it passes on a full bucket and empties it.
    budget.admit(&vm, 10_000, start).unwrap();
    let refused = budget.admit(&vm, 1, start).unwrap_err();
    assert_eq!(refused.scope, Scope::Identity);
    assert_eq!(refused.retry_after, Duration::from_millis(1));
}

#[test]
fn a_role_shares_one_budget_and_other_roles_keep_theirs() {
    let budget = WriteBudget::new(small());
    let start = Instant::now();
    // Five VMs, one write each, use up the vm-agent role's burst of 5.
    for n in 0..5 {
        budget
            .admit(&identity(Role::VmAgent, &format!("vm-{n}")), 10, start)
            .unwrap();
    }
    let refused = budget
        .admit(&identity(Role::VmAgent, "vm-9"), 10, start)
        .unwrap_err();
    assert_eq!(refused.scope, Scope::Role);
    assert!(refused.status("x").message.contains("vm-agent role"));
    // Nodes, gateways and the admin are not touched by the vm-agents' spending.
    for role in [Role::Node, Role::Gateway, Role::Admin] {
        budget.admit(&identity(role, "n-1"), 10, start).unwrap();
    }
}

#[test]
fn a_refused_write_spends_nothing() {
    let budget = WriteBudget::new(small());
    let start = Instant::now();
    let greedy = identity(Role::VmAgent, "vm-1");
    for _ in 0..3 {
        budget.admit(&greedy, 10, start).unwrap();
    }
    for _ in 0..100 {
        assert!(budget.admit(&greedy, 10, start).is_err());
    }
    // The role's burst of 5 lost only the three admitted writes.
    budget
        .admit(&identity(Role::VmAgent, "vm-2"), 10, start)
        .unwrap();
    budget
        .admit(&identity(Role::VmAgent, "vm-3"), 10, start)
        .unwrap();
}

#[test]
fn budgets_that_cannot_work_are_refused_naming_role_and_field() {
    assert!(WriteBudgets::default().check().is_ok());
    let mut budgets = WriteBudgets::default();
    budgets.role_mut(Role::Node).bytes = Rate::new(0.0, 10.0);
    let error = budgets.check().unwrap_err();
    assert!(error.contains("node") && error.contains("bytes"), "{error}");
}

#[test]
fn vm_agents_stop_short_of_the_reserve_the_other_roles_keep() {
    let usage = Some(StoreUsage {
        used_bytes: 890,
        quota_bytes: 1000,
    });
    // 10 bytes take a vm-agent to 900, the edge of the 10% reserve; 11 go past it.
    assert!(reserve_refusal(Role::VmAgent, usage, 10).is_none());
    let refused = reserve_refusal(Role::VmAgent, usage, 11).unwrap();
    assert_eq!(
        (refused.code, refused.reason),
        (507, StatusReason::StorageQuotaExceeded)
    );
    assert!(refused.message.contains("100 bytes"), "{}", refused.message);
    for role in [Role::Admin, Role::Node, Role::Gateway] {
        assert!(reserve_refusal(role, usage, 100).is_none());
    }
    // A store that does not count its size (etcd) has no reserve here.
    assert!(reserve_refusal(Role::VmAgent, None, 1 << 30).is_none());
}

#[test]
fn the_tracked_identities_are_bounded_and_only_full_buckets_are_forgotten() {
    let mut budget = WriteBudget::new(small());
    budget.max_tracked = 2;
    let start = Instant::now();
    let (a, b, c) = (
        identity(Role::Node, "node-a"),
        identity(Role::VmAgent, "vm-b"),
        identity(Role::VmAgent, "vm-c"),
    );
    for _ in 0..3 {
        budget.admit(&b, 10, start).unwrap();
    }
    budget.admit(&a, 10, start).unwrap();
    // Both tracked and spending: a third identity is held to its role's budget only.
    budget.admit(&c, 10, start).unwrap();
    assert_eq!(budget.state.lock().unwrap().identities.len(), 2);
    // vm-b stays spent however many others come and go.
    assert_eq!(
        budget.admit(&b, 10, start).unwrap_err().scope,
        Scope::Identity
    );
    // A minute later every bucket is full again: they are forgotten for newcomers.
    let later = start + Duration::from_secs(60);
    budget.admit(&c, 10, later).unwrap();
    assert!(budget.state.lock().unwrap().identities.contains_key(&c));
}
