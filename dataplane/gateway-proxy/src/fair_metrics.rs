//! Metrics of the fair shares of upstream streams (see `sluice_gateway::fair_share`), per
//! priority level. Labels come from the config only: the cluster's name and the flow-control
//! schema's name (or [`NO_LEVEL`]), plus a fixed refusal reason; never a user name.
//!
//! A core looks a level's metrics up once and caches them (`pool.rs`); they are touched only
//! when a request queues or is refused, never on the uncontended path.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use sluice_gateway::fair_share::FairShareRefusal;
use sluice_metrics::{Cores, PerCoreCounter, PerCoreGauge, PerCoreHistogram};

/// The `level` label of requests no flow-control schema admitted (not a valid schema name, so
/// it cannot collide with one).
pub const NO_LEVEL: &str = "(none)";

/// Queue-wait buckets: from 1 ms to past the longest sensible `maxQueueWait`.
const WAIT_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LevelLabels {
    cluster: String,
    level: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    cluster: String,
    level: String,
    reason: &'static str,
}

/// The families, shared by every core.
#[derive(Debug, Clone)]
pub struct FairShareMetrics {
    waiting: Family<LevelLabels, PerCoreGauge, Cores>,
    wait: Family<LevelLabels, PerCoreHistogram, Cores>,
    refused: Family<RefusalLabels, PerCoreCounter, Cores>,
}

/// One level's metrics, as a core caches them.
#[derive(Debug)]
pub struct LevelMetrics {
    /// Requests waiting for a stream now.
    pub waiting: PerCoreGauge,
    /// How long queued requests waited, granted or not.
    pub wait: PerCoreHistogram,
    /// Refusals, indexed by [`FairShareRefusal::index`].
    pub refused: Box<[PerCoreCounter]>,
}

impl FairShareMetrics {
    pub fn register(registry: &mut Registry, workers: usize) -> Self {
        let metrics = Self {
            waiting: Family::new_with_constructor(Cores {
                cores: workers,
                bounds: WAIT_BOUNDS,
            }),
            wait: Family::new_with_constructor(Cores {
                cores: workers,
                bounds: WAIT_BOUNDS,
            }),
            refused: Family::new_with_constructor(Cores {
                cores: workers,
                bounds: WAIT_BOUNDS,
            }),
        };
        registry.register(
            "sluice_gateway_fair_queue_waiting",
            "Requests waiting for an upstream stream, by cluster and priority level (flow-control schema)",
            metrics.waiting.clone(),
        );
        registry.register(
            "sluice_gateway_fair_queue_wait_seconds",
            "How long queued requests waited for an upstream stream, by cluster and priority level",
            metrics.wait.clone(),
        );
        registry.register(
            "sluice_gateway_fair_share_rejected",
            "Requests refused over a fair share (429), by cluster, priority level and reason",
            metrics.refused.clone(),
        );
        metrics
    }

    /// The metrics of one (cluster, level); `None` is [`NO_LEVEL`].
    pub fn level(&self, cluster: &str, level: Option<&str>) -> LevelMetrics {
        let labels = LevelLabels {
            cluster: cluster.to_string(),
            level: level.unwrap_or(NO_LEVEL).to_string(),
        };
        // One statement per lookup: a family's guard must be gone before the next.
        let waiting = self.waiting.get_or_create(&labels).clone();
        let wait = self.wait.get_or_create(&labels).clone();
        let refused = FairShareRefusal::ALL
            .iter()
            .map(|refusal| {
                self.refused
                    .get_or_create(&RefusalLabels {
                        cluster: labels.cluster.clone(),
                        level: labels.level.clone(),
                        reason: refusal.as_str(),
                    })
                    .clone()
            })
            .collect();
        LevelMetrics {
            waiting,
            wait,
            refused,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_labelled_by_config_names_and_fixed_reasons() {
        let mut registry = Registry::default();
        let metrics = FairShareMetrics::register(&mut registry, 2);
        let level = metrics.level("c", Some("workloads"));
        level.refused[FairShareRefusal::UserLongRunning.index()].inc(1);
        level.waiting.inc(0);
        level.wait.observe(0, 0.02);
        let unnamed = metrics.level("c", None);
        unnamed.refused[FairShareRefusal::QueueWait.index()].inc(0);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"sluice_gateway_fair_share_rejected_total{cluster="c",level="workloads",reason="user_long_running"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"level="(none)",reason="queue_wait"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"sluice_gateway_fair_queue_waiting{cluster="c",level="workloads"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                "sluice_gateway_fair_queue_wait_seconds_count{cluster=\"c\",level=\"workloads\"} 1"
            ),
            "{text}"
        );
    }
}
