use prometheus_client::registry::Registry;
use sluice_metrics::{PerCoreCounter, PerCoreGauge, PerCoreHistogram};

/// Tracker metrics (one thread: slot 0 of each per-core type).
#[derive(Debug, Clone)]
pub struct TrackerMetrics {
    pub writes: PerCoreCounter,
    pub reads: PerCoreCounter,
    pub errors: PerCoreCounter,
    pub round_trip: PerCoreHistogram,
    /// 1 once this node took its entries out of Redis for a drain (peers stop routing here).
    pub withdrawn: PerCoreGauge,
    /// Connection records not written because their agent had its bound in the tracker.
    pub records_refused: PerCoreCounter,
}

impl TrackerMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            writes: PerCoreCounter::new(1),
            reads: PerCoreCounter::new(1),
            errors: PerCoreCounter::new(1),
            round_trip: PerCoreHistogram::new(1, PerCoreHistogram::latency_bounds()),
            withdrawn: PerCoreGauge::new(1),
            records_refused: PerCoreCounter::new(1),
        };
        registry.register(
            "sluice_tracker_redis_writes",
            "Redis write round trips of the agent tracker",
            metrics.writes.clone(),
        );
        registry.register(
            "sluice_tracker_redis_reads",
            "Redis read round trips of the agent tracker",
            metrics.reads.clone(),
        );
        registry.register(
            "sluice_tracker_redis_errors",
            "Failed Redis calls of the agent tracker",
            metrics.errors.clone(),
        );
        registry.register(
            "sluice_tracker_redis_round_trip_seconds",
            "Time of the agent tracker's Redis round trips",
            metrics.round_trip.clone(),
        );
        registry.register(
            "sluice_tracker_withdrawn",
            "1 once this node removed its agents from Redis because it drains",
            metrics.withdrawn.clone(),
        );
        registry.register(
            "sluice_tracker_records_refused",
            "Agent connection records not written to Redis because the agent already had tunnel.max_connections_per_agent of them from this node",
            metrics.records_refused.clone(),
        );
        metrics
    }

    /// Metrics that go nowhere (tests).
    pub fn unregistered() -> Self {
        Self::register(&mut Registry::default())
    }
}
