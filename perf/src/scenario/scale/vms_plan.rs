//! The VM part's sizes taken from `SLUICE_PERF_VMS`, for runs smaller than issue 36's 5,000
//! VMs (the largest that fits in the time a busy machine leaves), e.g.
//! `SLUICE_PERF_VMS=vms=2000,policies=200,steady=60 perf/run.sh scale --only vms`. Unset, the
//! plan is the issue's.

use std::time::Duration;

use anyhow::bail;

use super::size_spec;

use super::vms::Plan;

/// The variable read by [`Plan::from_env`].
pub const VARIABLE: &str = "SLUICE_PERF_VMS";

impl Plan {
    /// The plan for `smoke`, with the sizes `SLUICE_PERF_VMS` overrides.
    pub fn from_env(smoke: bool) -> anyhow::Result<Plan> {
        size_spec::from_env(VARIABLE, Plan::new(smoke), Plan::overridden)
    }

    /// The plan with `name=value` pairs, comma-separated, in place of its sizes: `vms`,
    /// `policies`, `writes`, `heartbeat` and `steady` (seconds), and `store` (`embedded` or
    /// `etcd`).
    pub fn overridden(mut self, spec: &str) -> anyhow::Result<Plan> {
        for pair in size_spec::pairs(spec) {
            let (name, value) = pair?;
            if name == "store" {
                self.etcd = match value {
                    "etcd" => true,
                    "embedded" => false,
                    other => bail!("store {other:?}: embedded or etcd"),
                };
                continue;
            }
            let count = size_spec::positive_count(name, value)?;
            match name {
                "vms" => self.vms = count,
                "policies" => self.policies = count,
                "writes" => self.writes = count,
                "heartbeat" => self.heartbeat = Duration::from_secs(count as u64),
                "steady" => self.steady = Duration::from_secs(count as u64),
                _ => bail!("unknown size {name:?}"),
            }
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_sizes_replace_the_plans_and_the_rest_stay() {
        let plan = Plan::new(false)
            .overridden("vms=2000,policies=200,steady=60")
            .unwrap();
        assert_eq!(plan.vms, 2_000);
        assert_eq!(plan.policies, 200);
        assert_eq!(plan.steady, Duration::from_secs(60));
        assert_eq!(plan.heartbeat, Plan::new(false).heartbeat);
        assert_eq!(plan.writes, Plan::new(false).writes);
        assert_eq!(Plan::new(true).overridden("").unwrap().vms, 20);
        assert!(!Plan::new(false).etcd);
        assert!(Plan::new(true).overridden("store=etcd").unwrap().etcd);
    }

    #[test]
    fn bad_sizes_are_refused_by_name() {
        for (spec, says) in [
            ("vms=0", "positive"),
            ("policies", "name=value"),
            ("steady=1m", "\"1m\""),
            ("nodes=3", "unknown size"),
            ("store=redis", "embedded or etcd"),
        ] {
            let error = Plan::new(true).overridden(spec).unwrap_err().to_string();
            assert!(error.contains(says), "{spec}: {error}");
        }
    }
}
