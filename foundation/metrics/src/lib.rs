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
use prometheus_client::metrics::family::MetricConstructor;
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

/// A histogram with fixed bucket bounds and one set of cache-padded bucket counters per core.
///
/// `prometheus-client`'s histogram takes a lock on every observation, which cores would contend
/// for; here an observation is two relaxed adds on the observing core's own cache lines.
#[derive(Clone, Debug)]
pub struct PerCoreHistogram {
    bounds: Arc<[f64]>,
    /// Per core: one counter per bound, one for +Inf, then the sum in nanounits.
    cores: Arc<[CachePadded<Box<[AtomicU64]>>]>,
}

impl PerCoreHistogram {
    /// `bounds` must be increasing; values above the last go to +Inf.
    pub fn new(cores: usize, bounds: &[f64]) -> Self {
        let slots = bounds.len() + 2;
        Self {
            bounds: bounds.into(),
            cores: (0..cores.max(1))
                .map(|_| CachePadded::new((0..slots).map(|_| AtomicU64::new(0)).collect()))
                .collect(),
        }
    }

    /// Bounds for latencies from 100 µs to 30 s.
    pub fn latency_bounds() -> &'static [f64] {
        &[
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
            2.5, 5.0, 10.0, 30.0,
        ]
    }

    #[inline]
    pub fn observe(&self, core: usize, value: f64) {
        let slots = self
            .cores
            .get(core)
            .unwrap_or_else(|| &self.cores[self.cores.len() - 1]);
        let bucket = self.bounds.partition_point(|bound| *bound < value);
        slots[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = (value.max(0.0) * 1e9) as u64;
        slots[self.bounds.len() + 1].fetch_add(nanos, Ordering::Relaxed);
    }

    /// (sum, count, per-bucket counts) over all cores; the encoder makes them cumulative.
    pub fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let mut counts = vec![0u64; self.bounds.len() + 1];
        let mut sum_nanos = 0u64;
        for core in self.cores.iter() {
            for (total, slot) in counts.iter_mut().zip(core.iter()) {
                *total += slot.load(Ordering::Relaxed);
            }
            sum_nanos += core[self.bounds.len() + 1].load(Ordering::Relaxed);
        }
        let buckets = counts
            .iter()
            .enumerate()
            .map(|(index, count)| {
                (
                    self.bounds.get(index).copied().unwrap_or(f64::INFINITY),
                    *count,
                )
            })
            .collect();
        (sum_nanos as f64 / 1e9, counts.iter().sum(), buckets)
    }
}

/// Makes the per-core metrics of a `Family` (`Family::new_with_constructor`): for `cores`
/// cores, histograms with `bounds`.
#[derive(Debug, Clone, Copy)]
pub struct Cores {
    pub cores: usize,
    pub bounds: &'static [f64],
}

impl Cores {
    /// Histograms get [`PerCoreHistogram::latency_bounds`].
    pub fn new(cores: usize) -> Self {
        Self {
            cores,
            bounds: PerCoreHistogram::latency_bounds(),
        }
    }
}

impl MetricConstructor<PerCoreCounter> for Cores {
    fn new_metric(&self) -> PerCoreCounter {
        PerCoreCounter::new(self.cores)
    }
}

impl MetricConstructor<PerCoreGauge> for Cores {
    fn new_metric(&self) -> PerCoreGauge {
        PerCoreGauge::new(self.cores)
    }
}

impl MetricConstructor<PerCoreHistogram> for Cores {
    fn new_metric(&self) -> PerCoreHistogram {
        PerCoreHistogram::new(self.cores, self.bounds)
    }
}

impl TypedMetric for PerCoreHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for PerCoreHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.snapshot();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
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
    fn histogram_buckets_are_cumulative_over_cores() {
        let histogram = PerCoreHistogram::new(2, &[0.1, 1.0]);
        histogram.observe(0, 0.05);
        histogram.observe(1, 0.1);
        histogram.observe(1, 0.5);
        histogram.observe(0, 7.0);
        let (sum, count, buckets) = histogram.snapshot();
        assert_eq!(count, 4);
        assert!((sum - 7.65).abs() < 1e-6, "{sum}");
        assert_eq!(buckets, vec![(0.1, 2), (1.0, 1), (f64::INFINITY, 1)]);
        let mut registry = Registry::default();
        registry.register("demo_seconds", "A latency", histogram);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(text.contains("demo_seconds_bucket{le=\"1.0\"} 3"), "{text}");
        assert!(text.contains("demo_seconds_count 4"), "{text}");
    }

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
