//! Scrape-time gauges read from the node's shared state.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

use super::NodeShared;

/// Idle tunnels, waiting calls and connected agents, computed when scraped rather than kept up to date.
#[derive(Debug)]
pub struct NodeCollector(pub Arc<NodeShared>);

impl Collector for NodeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let idle = ConstGauge::new(self.0.registry.idle_count() as i64);
        idle.encode(encoder.encode_descriptor(
            "sluice_tunnel_idle_tunnels",
            "Tunnels waiting in the registry for a call",
            None,
            idle.metric_type(),
        )?)?;
        let waiting = ConstGauge::new(self.0.registry.waiting_count() as i64);
        waiting.encode(encoder.encode_descriptor(
            "sluice_tunnel_waiting_calls",
            "Calls waiting on this node for a free tunnel of their agent",
            None,
            waiting.metric_type(),
        )?)?;
        let agents = ConstGauge::new(self.0.connected_agents() as i64);
        agents.encode(encoder.encode_descriptor(
            "sluice_tunnel_connected_agents",
            "Distinct agents with at least one connection to this node",
            None,
            agents.metric_type(),
        )?)?;
        Ok(())
    }
}
