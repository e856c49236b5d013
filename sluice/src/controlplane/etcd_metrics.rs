//! `/metrics` for the etcd store's failovers and retries: read from its counters at scrape time.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use sluice_store::{EtcdOp, EtcdStats};

/// Registers with `Registry::register_collector`.
#[derive(Debug)]
pub struct EtcdCollector(pub Arc<EtcdStats>);

impl Collector for EtcdCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = &self.0;
        let failovers = encoder.encode_descriptor(
            "sluice_controlplane_etcd_failovers",
            "Requests to etcd moved from a failing member to the next",
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        ConstCounter::new(stats.failovers()).encode(failovers)?;
        let mut retries = encoder.encode_descriptor(
            "sluice_controlplane_etcd_retries",
            "etcd requests tried again after a transient failure, by operation (read, write, watch)",
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        for op in EtcdOp::ALL {
            let labels = [("op", op.label())];
            ConstCounter::new(stats.retries(op))
                .encode(retries.encode_family(&labels.as_slice())?)?;
        }
        let applied = encoder.encode_descriptor(
            "sluice_controlplane_etcd_writes_found_applied",
            "Writes whose attempt failed with an unknown outcome and which the next attempt found applied (reported done, not repeated)",
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        ConstCounter::new(stats.found_applied()).encode(applied)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_is_exported_with_bounded_labels() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(EtcdCollector(Arc::new(EtcdStats::default()))));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry)
            .unwrap_or_else(|error| panic!("{error}"));
        for line in [
            "sluice_controlplane_etcd_failovers_total 0",
            "sluice_controlplane_etcd_retries_total{op=\"read\"} 0",
            "sluice_controlplane_etcd_retries_total{op=\"write\"} 0",
            "sluice_controlplane_etcd_retries_total{op=\"watch\"} 0",
            "sluice_controlplane_etcd_writes_found_applied_total 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing in:\n{text}"
            );
        }
    }
}
