//! The scrape-time gauges read from the current generation (upstream server health, the
//! config generation in use): apart from `metrics.rs`, which the generation itself holds, so
//! that the metrics sit below the state they are read from.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;

use crate::state::Gateway;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabels {
    cluster: String,
    server: String,
}

/// Scrape-time gauges read from the current generation: upstream server health.
#[derive(Debug)]
pub struct GatewayCollector(pub Arc<Gateway>);

impl prometheus_client::collector::Collector for GatewayCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::gauge::ConstGauge;
        use prometheus_client::metrics::MetricType;
        let generation = self.0.current();
        {
            let mut healthy = encoder.encode_descriptor(
                "sluice_gateway_upstream_healthy",
                "Whether an apiserver is in rotation (1) or out after failed health checks (0)",
                None,
                MetricType::Gauge,
            )?;
            for (cluster, runtime) in generation
                .snapshot
                .clusters()
                .iter()
                .zip(generation.clusters.iter())
            {
                for (server, health) in cluster.servers.iter().zip(runtime.health.iter()) {
                    let labels = ServerLabels {
                        cluster: cluster.name.to_string(),
                        server: server.endpoint.to_string(),
                    };
                    ConstGauge::new(i64::from(health.is_healthy() && !server.disabled))
                        .encode(healthy.encode_family(&labels)?)?;
                }
            }
        }
        let generation_gauge = ConstGauge::new(generation.number as i64);
        generation_gauge.encode(encoder.encode_descriptor(
            "sluice_gateway_config_generation",
            "Number of the cluster configuration in use (1 at start, +1 per reload attempt)",
            None,
            generation_gauge.metric_type(),
        )?)
    }
}
