//! The fan-out part's sizes taken from `SLUICE_PERF_FANOUT`, for runs smaller than issue 36's
//! (a before/after comparison that has to finish in minutes on a busy machine), e.g.
//! `SLUICE_PERF_FANOUT=watchers=2000,rates=50,stores=embedded,window=20 perf/run.sh scale
//! --only fanout`. Unset, the plan is the issue's.

use std::time::Duration;

use anyhow::bail;

use super::size_spec;

use serde::Serialize;

use super::fanout::{Plan, Store};

/// The variable read by [`Plan::from_env`].
pub const VARIABLE: &str = "SLUICE_PERF_FANOUT";

/// The harness's watchers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Client {
    /// `sluice-watch-client` as gateways and nodes run it: decoded, mirrored, diffed.
    Product,
    /// A LIST and a WATCH whose event lines are scanned, not decoded (`fanout_raw.rs`).
    Raw,
}

impl Client {
    pub fn describe(self) -> &'static str {
        match self {
            Client::Product => "`sluice-watch-client`",
            Client::Raw => "light watchers (LIST and WATCH, event lines scanned, not decoded)",
        }
    }
}

impl Plan {
    /// The plan for `smoke`, with the sizes `SLUICE_PERF_FANOUT` overrides.
    pub fn from_env(smoke: bool) -> anyhow::Result<Plan> {
        size_spec::from_env(VARIABLE, Plan::new(smoke), Plan::overridden)
    }

    /// The plan with `name=value` pairs, comma-separated, in place of its sizes: `watchers`,
    /// `per_connection`, `objects`, `window` (seconds), `rates` and `stores` (`+`-separated
    /// lists, e.g. `rates=50+200`, `stores=embedded+etcd`), and `client` (`product`, the
    /// default, or `raw`: the light watchers of `fanout_raw.rs`).
    pub fn overridden(mut self, spec: &str) -> anyhow::Result<Plan> {
        for pair in size_spec::pairs(spec) {
            let (name, value) = pair?;
            let count = || size_spec::positive_count(name, value);
            match name {
                "watchers" => self.watchers = count()?,
                "per_connection" => self.per_connection = count()?,
                "objects" => self.objects = count()?,
                "window" => self.window = Duration::from_secs(count()? as u64),
                "rates" => {
                    self.rates = value
                        .split('+')
                        .map(|rate| match rate.parse::<u32>() {
                            Ok(rate) if rate > 0 => Ok(rate),
                            _ => bail!("a rate must be positive writes/s, not {rate:?}"),
                        })
                        .collect::<anyhow::Result<_>>()?
                }
                "stores" => {
                    self.stores = value
                        .split('+')
                        .map(|store| match store {
                            "embedded" => Ok(Store::Embedded),
                            "etcd" => Ok(Store::Etcd),
                            _ => bail!("a store is embedded or etcd, not {store:?}"),
                        })
                        .collect::<anyhow::Result<_>>()?
                }
                "client" => {
                    self.client = match value {
                        "product" => Client::Product,
                        "raw" => Client::Raw,
                        _ => bail!("a client is product or raw, not {value:?}"),
                    }
                }
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
            .overridden("watchers=2000,rates=50+200,stores=embedded,window=10")
            .unwrap();
        assert_eq!(plan.watchers, 2_000);
        assert_eq!(plan.hosts(), 500);
        assert_eq!(plan.rates, vec![50, 200]);
        assert_eq!(plan.stores, vec![Store::Embedded]);
        assert_eq!(plan.window, Duration::from_secs(10));
        assert_eq!(plan.objects, Plan::new(false).objects);
        assert_eq!(Plan::new(true).overridden("").unwrap().watchers, 100);
        assert_eq!(
            Plan::new(true).overridden("").unwrap().client,
            Client::Product
        );
        assert_eq!(
            Plan::new(true).overridden("client=raw").unwrap().client,
            Client::Raw
        );
    }

    #[test]
    fn bad_sizes_are_refused_by_name() {
        for (spec, says) in [
            ("watchers=0", "positive"),
            ("watchers", "name=value"),
            ("rates=50+fast", "\"fast\""),
            ("stores=redis", "\"redis\""),
            ("clients=3", "unknown size"),
            ("client=curl", "\"curl\""),
        ] {
            let error = Plan::new(true).overridden(spec).unwrap_err().to_string();
            assert!(error.contains(says), "{spec}: {error}");
        }
    }
}
