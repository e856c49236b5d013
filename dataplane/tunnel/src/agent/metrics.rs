//! The agent's metrics (the agent runs its tunnels on one worker).

use prometheus_client::registry::Registry;
use sluice_metrics::{PerCoreCounter, PerCoreGauge};

use super::KubeMetrics;

/// Agent metrics.
#[derive(Debug, Clone)]
pub struct AgentMetrics {
    pub tunnels_open: PerCoreGauge,
    pub tunnels_idle: PerCoreGauge,
    pub nodes_connected: PerCoreGauge,
    pub requests: PerCoreCounter,
    pub backend_errors: PerCoreCounter,
    pub connect_failures: PerCoreCounter,
    pub moves: PerCoreCounter,
    /// The Kubernetes API forwarder's (`sluice_agent_kube_*`).
    pub kube: KubeMetrics,
}

impl AgentMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            tunnels_open: PerCoreGauge::new(1),
            tunnels_idle: PerCoreGauge::new(1),
            nodes_connected: PerCoreGauge::new(1),
            requests: PerCoreCounter::new(1),
            backend_errors: PerCoreCounter::new(1),
            connect_failures: PerCoreCounter::new(1),
            moves: PerCoreCounter::new(1),
            kube: KubeMetrics::register(registry),
        };
        registry.register(
            "sluice_agent_tunnels_open",
            "Tunnels open to nodes",
            metrics.tunnels_open.clone(),
        );
        registry.register(
            "sluice_agent_tunnels_idle",
            "Tunnels waiting on nodes for a call",
            metrics.tunnels_idle.clone(),
        );
        registry.register(
            "sluice_agent_nodes_connected",
            "Nodes this agent has a live connection to",
            metrics.nodes_connected.clone(),
        );
        registry.register(
            "sluice_agent_requests",
            "Calls forwarded to the backend",
            metrics.requests.clone(),
        );
        registry.register(
            "sluice_agent_backend_errors",
            "Calls that could not reach the backend",
            metrics.backend_errors.clone(),
        );
        registry.register(
            "sluice_agent_connect_failures",
            "Failed attempts to connect to a node (each followed by a backoff)",
            metrics.connect_failures.clone(),
        );
        registry.register(
            "sluice_agent_node_moves",
            "Node connections left because the node drained or retired them (tunnels reopened on a new connection at once)",
            metrics.moves.clone(),
        );
        metrics
    }
}
