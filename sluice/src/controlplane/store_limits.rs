//! The `sluice controlplane` flags for what may be written to the store: the embedded store's
//! quota and each role's write budget. A flag not given keeps the default (docs/CONFIG.md,
//! "Control plane store and write limits", explains each one).

use sluice_apiserver::auth::Role;
use sluice_apiserver::server::write_budget::{Rate, WriteBudgets};
use sluice_apiserver::server::ServerLimits;

/// One role's write budget: `ROLE=WRITES/BURST,BYTES/BURST` (per second, then the burst).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetArg {
    pub role: Role,
    pub writes: Rate,
    pub bytes: Rate,
}

const EXPECTED: &str = "expected ROLE=WRITES/BURST,BYTES/BURST, e.g. vm-agent=2/20,16384/524288";

fn budget(text: &str) -> Result<BudgetArg, String> {
    let (role, rates) = text.split_once('=').ok_or_else(|| EXPECTED.to_string())?;
    let role: Role = role
        .parse()
        .map_err(|error: sluice_apiserver::auth::AuthError| error.to_string())?;
    let (writes, bytes) = rates.split_once(',').ok_or_else(|| EXPECTED.to_string())?;
    Ok(BudgetArg {
        role,
        writes: rate(writes, "WRITES/BURST")?,
        bytes: rate(bytes, "BYTES/BURST")?,
    })
}

fn rate(text: &str, what: &str) -> Result<Rate, String> {
    let (per_second, burst) = text
        .split_once('/')
        .ok_or_else(|| format!("{what} {text:?}: {EXPECTED}"))?;
    let number = |text: &str| {
        text.parse::<f64>()
            .ok()
            .filter(|value| value.is_finite())
            .ok_or_else(|| format!("{what} {text:?} is not a number ({EXPECTED})"))
    };
    Ok(Rate::new(number(per_second)?, number(burst)?))
}

/// The flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct StoreLimitArgs {
    /// Bytes the embedded store may hold, objects and kept history together, as etcd's
    /// --quota-backend-bytes (default 2 GiB); past it creates and updates get 507 until
    /// deletes and compaction free space. With --etcd-endpoints, etcd's own
    /// --quota-backend-bytes is the limit.
    #[arg(long, value_name = "BYTES")]
    pub store_quota_bytes: Option<u64>,
    /// One identity's write budget, ROLE=WRITES/BURST,BYTES/BURST: writes and bytes per
    /// second, each with its burst (repeatable; default e.g. vm-agent=2/20,16384/524288; the
    /// others are in docs/CONFIG.md).
    #[arg(long, value_name = "ROLE=WRITES/BURST,BYTES/BURST", value_parser = budget)]
    pub write_budget: Vec<BudgetArg>,
    /// All identities of a role together, same form (repeatable; default e.g.
    /// vm-agent=200/2000,2097152/16777216).
    #[arg(long, value_name = "ROLE=WRITES/BURST,BYTES/BURST", value_parser = budget)]
    pub role_write_budget: Vec<BudgetArg>,
}

impl StoreLimitArgs {
    /// Sets the write budgets in `limits`; returns the store quota.
    pub fn apply(&self, limits: &mut ServerLimits) -> Result<u64, String> {
        let budgets: &mut WriteBudgets = &mut limits.write_budgets;
        for arg in &self.write_budget {
            let budget = budgets.role_mut(arg.role);
            budget.writes = arg.writes;
            budget.bytes = arg.bytes;
        }
        for arg in &self.role_write_budget {
            let budget = budgets.role_mut(arg.role);
            budget.role_writes = arg.writes;
            budget.role_bytes = arg.bytes;
        }
        budgets
            .check()
            .map_err(|reason| format!("--write-budget, --role-write-budget: {reason}"))?;
        match self.store_quota_bytes {
            Some(0) => Err("--store-quota-bytes: must be more than 0".into()),
            Some(quota) => Ok(quota),
            None => Ok(sluice_store::DEFAULT_QUOTA_BYTES),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse_and_apply() {
        let args = StoreLimitArgs {
            store_quota_bytes: Some(1 << 20),
            write_budget: vec![budget("vm-agent=2/5,1000/4000").unwrap()],
            role_write_budget: vec![budget("node=50/100,1e6/2e6").unwrap()],
        };
        let mut limits = ServerLimits::default();
        assert_eq!(args.apply(&mut limits), Ok(1 << 20));
        let vm = limits.write_budgets.role(Role::VmAgent);
        assert_eq!(
            (vm.writes, vm.bytes),
            (Rate::new(2.0, 5.0), Rate::new(1000.0, 4000.0))
        );
        let node = limits.write_budgets.role(Role::Node);
        assert_eq!(node.role_bytes, Rate::new(1e6, 2e6));
        assert_eq!(node.writes, WriteBudgets::default().role(Role::Node).writes);
    }

    #[test]
    fn bad_flags_say_what_is_wrong() {
        assert!(budget("root=1/1,1/1").unwrap_err().contains("unknown role"));
        assert!(budget("node=1/1")
            .unwrap_err()
            .contains("ROLE=WRITES/BURST"));
        assert!(budget("node=x/1,1/1")
            .unwrap_err()
            .contains("WRITES/BURST \"x\""));
        let zero = StoreLimitArgs {
            write_budget: vec![budget("node=0/1,1/1").unwrap()],
            ..StoreLimitArgs::default()
        };
        let error = zero.apply(&mut ServerLimits::default()).unwrap_err();
        assert!(
            error.contains("--write-budget") && error.contains("node"),
            "{error}"
        );
        let no_quota = StoreLimitArgs {
            store_quota_bytes: Some(0),
            ..StoreLimitArgs::default()
        };
        let error = no_quota.apply(&mut ServerLimits::default()).unwrap_err();
        assert!(error.contains("--store-quota-bytes"), "{error}");
    }
}
