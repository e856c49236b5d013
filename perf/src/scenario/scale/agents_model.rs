//! The paper model of issue 36: 100 nodes, 100,000 agents with 3 replicas each (300,000 agent
//! connections, 3,000 per node), and one node of 100,000 agents (the goal's figure), computed
//! from one measured layout's per-agent figures. Linear in the agents, which the 1-node
//! layout's points (5,000, 10,000, 15,000 agents) check.

use serde::Serialize;

use super::agents::{Point, Restart};

pub const NODES: f64 = 100.0;
pub const AGENTS: f64 = 100_000.0;
pub const REPLICAS: f64 = 3.0;
/// The tracker's default `redis.refresh`.
pub const REFRESH_S: f64 = 240.0;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PaperModel {
    /// Inputs, as measured.
    pub node_kib_per_agent: f64,
    pub redis_bytes_per_agent: f64,
    pub redis_commands_per_agent: f64,
    /// Agents of the restarted node listed again per second (node start and back-off included).
    pub reregistered_per_s: f64,
    /// 300,000 agent connections over 100 nodes.
    pub connections: f64,
    pub connections_per_node: f64,
    pub node_mib_for_agents_per_node: f64,
    /// One node holding 100,000 agents (the goal: < 300 MiB).
    pub node_mib_for_100k_agents: f64,
    pub redis_gib: f64,
    /// Refresh: every connection's writes again every 4 minutes.
    pub refresh_ops_per_s: f64,
    /// A restarted node's 3,000 connections listed again, and 100,000's.
    pub storm_seconds_per_node: f64,
    pub storm_seconds_100k: f64,
    pub storm_ops_per_s: f64,
}

/// The model from the largest point of a layout and its restart; `None` without agents.
pub fn paper_model(point: &Point, restart: &Restart) -> Option<PaperModel> {
    if point.agents_total == 0 || restart.seconds_to_all_listed <= 0.0 {
        return None;
    }
    let connections = AGENTS * REPLICAS;
    let per_node = connections / NODES;
    let rate = restart.agents_on_node as f64 / restart.seconds_to_all_listed;
    let storm = per_node / rate;
    Some(PaperModel {
        node_kib_per_agent: point.node_rss_kib_per_agent,
        redis_bytes_per_agent: point.redis_bytes_per_agent,
        redis_commands_per_agent: point.redis_commands_per_agent,
        reregistered_per_s: rate,
        connections,
        connections_per_node: per_node,
        node_mib_for_agents_per_node: per_node * point.node_rss_kib_per_agent / 1024.0,
        node_mib_for_100k_agents: AGENTS * point.node_rss_kib_per_agent / 1024.0,
        redis_gib: connections * point.redis_bytes_per_agent / f64::from(1u32 << 30),
        refresh_ops_per_s: connections * point.redis_commands_per_agent / REFRESH_S,
        storm_seconds_per_node: storm,
        storm_seconds_100k: AGENTS / rate,
        storm_ops_per_s: per_node * point.redis_commands_per_agent / storm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_scales_the_measured_figures() {
        let point = Point {
            agents_total: 15_000,
            node_rss_kib_per_agent: 4.0,
            redis_bytes_per_agent: 400.0,
            redis_commands_per_agent: 10.0,
            ..Point::default()
        };
        let restart = Restart {
            agents_on_node: 15_000,
            seconds_to_all_listed: 5.0,
            ..Restart::default()
        };
        let model = paper_model(&point, &restart).unwrap_or_else(|| panic!("a model"));
        assert_eq!(model.connections_per_node, 3_000.0);
        assert!((model.node_mib_for_100k_agents - 390.625).abs() < 1e-9);
        assert!((model.redis_gib - 300_000.0 * 400.0 / 1_073_741_824.0).abs() < 1e-12);
        assert_eq!(model.refresh_ops_per_s, 12_500.0);
        assert_eq!(model.reregistered_per_s, 3_000.0);
        assert_eq!(model.storm_seconds_per_node, 1.0);
        assert_eq!(model.storm_ops_per_s, 30_000.0);
        assert!(paper_model(&Point::default(), &restart).is_none());
    }
}
