//! Per-core metrics for a thread-per-core data plane.
//!
//! Each worker core owns one cache-padded slot of every counter, so the hot path is a relaxed
//! atomic add on a cache line no other core writes. A Prometheus scrape sums the slots. The types
//! implement `prometheus-client`'s `EncodeMetric`, so they register into a normal `Registry` (or a
//! `Family`) and encode as ordinary counters and gauges.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// A monotonically increasing counter with one slot per core.
///
/// Cloning is cheap and shares the slots, which is how a worker keeps a handle while the
/// registry keeps another for scraping.
#[derive(Clone, Debug)]
pub struct PerCoreCounter {
    slots: Arc<[CachePadded<AtomicU64>]>,
}

impl PerCoreCounter {
    /// A counter with `cores` slots (at least one).
    pub fn new(cores: usize) -> Self {
        Self {
            slots: (0..cores.max(1))
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
        }
    }

    /// Adds one on behalf of `core`.
    #[inline]
    pub fn inc(&self, core: usize) {
        self.add(core, 1);
    }

    /// Adds `n` on behalf of `core`. An out-of-range core is a caller bug; it is folded into the
    /// last slot rather than panicking on the request path.
    #[inline]
    pub fn add(&self, core: usize, n: u64) {
        let slot = self
            .slots
            .get(core)
            .unwrap_or_else(|| &self.slots[self.slots.len() - 1]);
        slot.fetch_add(n, Ordering::Relaxed);
    }

    /// The value one core has added so far.
    pub fn get(&self, core: usize) -> u64 {
        self.slots
            .get(core)
            .map_or(0, |slot| slot.load(Ordering::Relaxed))
    }

    /// The sum over all cores (what a scrape reports).
    pub fn sum(&self) -> u64 {
        self.slots
            .iter()
            .map(|slot| slot.load(Ordering::Relaxed))
            .sum()
    }

    /// Number of per-core slots.
    pub fn cores(&self) -> usize {
        self.slots.len()
    }
}

impl TypedMetric for PerCoreCounter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for PerCoreCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.sum(), None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// A gauge with one slot per core. A core may go negative in its own slot (a connection accepted
/// on one core and closed on another is not possible here, but the type does not assume it); the
/// scrape reports the sum.
#[derive(Clone, Debug)]
pub struct PerCoreGauge {
    slots: Arc<[CachePadded<AtomicI64>]>,
}

impl PerCoreGauge {
    /// A gauge with `cores` slots (at least one).
    pub fn new(cores: usize) -> Self {
        Self {
            slots: (0..cores.max(1))
                .map(|_| CachePadded::new(AtomicI64::new(0)))
                .collect(),
        }
    }

    /// Adds one on behalf of `core`.
    #[inline]
    pub fn inc(&self, core: usize) {
        self.add(core, 1);
    }

    /// Subtracts one on behalf of `core`.
    #[inline]
    pub fn dec(&self, core: usize) {
        self.add(core, -1);
    }

    /// Adds `n` (possibly negative) on behalf of `core`.
    #[inline]
    pub fn add(&self, core: usize, n: i64) {
        let slot = self
            .slots
            .get(core)
            .unwrap_or_else(|| &self.slots[self.slots.len() - 1]);
        slot.fetch_add(n, Ordering::Relaxed);
    }

    /// The value of one core's slot.
    pub fn get(&self, core: usize) -> i64 {
        self.slots
            .get(core)
            .map_or(0, |slot| slot.load(Ordering::Relaxed))
    }

    /// The sum over all cores.
    pub fn sum(&self) -> i64 {
        self.slots
            .iter()
            .map(|slot| slot.load(Ordering::Relaxed))
            .sum()
    }
}

impl TypedMetric for PerCoreGauge {
    const TYPE: MetricType = MetricType::Gauge;
}

impl EncodeMetric for PerCoreGauge {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.sum())
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::Registry;

    #[test]
    fn counter_sums_slots_and_tolerates_bad_core_index() {
        let counter = PerCoreCounter::new(3);
        counter.inc(0);
        counter.add(2, 5);
        counter.inc(99);
        assert_eq!(counter.get(0), 1);
        assert_eq!(counter.get(1), 0);
        assert_eq!(counter.get(2), 6);
        assert_eq!(counter.sum(), 7);
        assert_eq!(counter.cores(), 3);
    }

    #[test]
    fn zero_cores_still_has_one_slot() {
        let counter = PerCoreCounter::new(0);
        counter.inc(0);
        assert_eq!(counter.sum(), 1);
    }

    #[test]
    fn gauge_sums_signed_slots() {
        let gauge = PerCoreGauge::new(2);
        gauge.inc(0);
        gauge.inc(0);
        gauge.dec(1);
        assert_eq!(gauge.get(0), 2);
        assert_eq!(gauge.sum(), 1);
    }

    #[test]
    fn counters_from_many_threads_add_up() {
        let counter = PerCoreCounter::new(4);
        std::thread::scope(|scope| {
            for core in 0..4 {
                let counter = counter.clone();
                scope.spawn(move || {
                    for _ in 0..10_000 {
                        counter.inc(core);
                    }
                });
            }
        });
        assert_eq!(counter.sum(), 40_000);
    }

    #[test]
    fn encodes_as_prometheus_counter_and_gauge() {
        let mut registry = Registry::default();
        let counter = PerCoreCounter::new(2);
        let gauge = PerCoreGauge::new(2);
        registry.register("demo_requests", "Requests served", counter.clone());
        registry.register("demo_connections_active", "Open connections", gauge.clone());
        counter.add(0, 2);
        counter.add(1, 3);
        gauge.inc(1);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(text.contains("# TYPE demo_requests counter"), "{text}");
        assert!(text.contains("demo_requests_total 5"), "{text}");
        assert!(
            text.contains("# TYPE demo_connections_active gauge"),
            "{text}"
        );
        assert!(text.contains("demo_connections_active 1"), "{text}");
    }
}
