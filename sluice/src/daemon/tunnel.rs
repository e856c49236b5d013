//! The tunnel pillar: the node (agent, external and private endpoints, the Redis tracker) and
//! the agent role.

use std::sync::Arc;

use prometheus_client::registry::Registry;
use sluice_config::{Config, RedisConfig, RedisTargetConfig, TunnelConfig};
use sluice_locator::AgentLocator;
use sluice_runtime::{Placement, ServerBuilder};
use sluice_tracker::{RedisTarget, TrackerHandle, TrackerMetrics, TrackerOptions};
use sluice_tunnel::agent::{AgentMetrics, AgentTask};
use sluice_tunnel::metrics::TunnelMetrics;
use sluice_tunnel::node::{
    AgentEndpoint, ExternalEndpoint, NodeCollector, NodeShared, PrivateEndpoint,
};

/// Binds and serves the node's endpoints when the config has a `tunnel` section; returns the
/// tracker (multi-node) so the daemon can remove this node's entries on stop.
pub fn wire_node(
    config: &Config,
    server: &mut ServerBuilder,
    registry: &mut Registry,
    workers: usize,
) -> anyhow::Result<Option<WiredNode>> {
    let (Some(tunnel), Some(agent_listener), Some(external_listener)) = (
        &config.tunnel,
        &config.listeners.agent,
        &config.listeners.external,
    ) else {
        return Ok(None);
    };
    let agent_id = server.bind("agent", agent_listener, Placement::Workers)?;
    let external_id = server.bind("external", external_listener, Placement::Workers)?;
    let private_id = match &config.listeners.private {
        Some(private) => Some(server.bind("private", private, Placement::Workers)?),
        None => None,
    };
    let metrics = TunnelMetrics::register(registry, workers);
    let tracker = match &config.redis {
        Some(redis) => {
            // Where other nodes reach this node's private endpoint.
            let private_address = tunnel.advertise_address.clone().unwrap_or_else(|| {
                private_id.map_or_else(String::new, |id| server.local_addr(id).to_string())
            });
            Some(spawn_tracker(tunnel, redis, private_address, registry)?)
        }
        None => None,
    };
    let node = NodeShared::new(
        tunnel,
        agent_listener,
        external_listener,
        config.listeners.private.as_ref(),
        metrics,
        tracker
            .clone()
            .map(|tracker| Arc::new(tracker) as Arc<dyn AgentLocator>),
    )?;
    registry.register_collector(Box::new(NodeCollector(node.clone())));
    server.serve(agent_id, AgentEndpoint { node: node.clone() });
    if let Some(private_id) = private_id {
        server.serve(private_id, PrivateEndpoint { node: node.clone() });
    }
    server.serve(external_id, ExternalEndpoint { node: node.clone() });
    Ok(Some(WiredNode {
        node: node.clone(),
        tracker,
        feed: tunnel.agents_from.clone().map(|source| (source, node)),
    }))
}

/// The node as wired: its Redis tracker, and the control plane to take its agents from.
pub struct WiredNode {
    /// What a config reload changes (JWT key, agents, max_wait).
    pub node: Arc<NodeShared>,
    pub tracker: Option<TrackerHandle>,
    pub feed: Option<(sluice_config::ControlPlaneSource, Arc<NodeShared>)>,
}

fn spawn_tracker(
    tunnel: &TunnelConfig,
    redis: &RedisConfig,
    private_address: String,
    registry: &mut Registry,
) -> anyhow::Result<TrackerHandle> {
    let target = match &redis.target {
        RedisTargetConfig::Url(url) => RedisTarget::Single {
            url: url.clone(),
            ca_file: redis.ca_file.clone(),
        },
        RedisTargetConfig::Cluster(urls) => RedisTarget::Cluster { urls: urls.clone() },
    };
    let options = TrackerOptions {
        node_name: tunnel.node_name.clone(),
        private_address,
        key_prefix: redis.key_prefix.clone(),
        ttl: redis.ttl,
        refresh: redis.refresh,
        gc_interval: redis.gc_interval,
        unregister_delay: redis.unregister_delay,
        max_connections_per_agent: tunnel.agent_limits.connections,
    };
    Ok(sluice_tracker::spawn(
        target,
        options,
        TrackerMetrics::register(registry),
    )?)
}

/// Starts the agent role when the config has an `agent` section.
pub fn wire_agent(
    config: &Config,
    server: &mut ServerBuilder,
    registry: &mut Registry,
) -> anyhow::Result<()> {
    if let Some(agent) = config.agent.clone() {
        let metrics = AgentMetrics::register(registry);
        server.spawn_background(AgentTask::new(agent, metrics)?);
    }
    Ok(())
}
