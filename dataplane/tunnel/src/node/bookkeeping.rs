//! Which agent connections this node holds: for ListConnectedAgents, the connected-agents gauge,
//! and the agent locator (told once per agent, not per tunnel).

use std::collections::HashMap;
use std::sync::MutexGuard;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_locator::ConnectionRecord;
use sluice_proto::agents::v1::{ConnectedAgent, ListConnectedAgentsResponse};

use super::NodeShared;
use crate::error::{ErrorKind, TunnelError};
use crate::registry::AgentId;

/// One agent process's connection to this node, for ListConnectedAgents.
#[derive(Debug, Clone)]
pub(super) struct ConnectionInfo {
    version: String,
    since_unix_ms: i64,
}

/// Agent connections by agent, then by the agent-chosen connection id: indexed, so an agent
/// with many connections costs a lookup under the shared lock, not a scan of every connection.
pub(super) type Connections = HashMap<AgentId, HashMap<i64, ConnectionInfo>>;

/// How long ListConnectedAgents waits for the locator's cluster-wide listing.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);

impl NodeShared {
    /// Records an agent connection; the agent's first one on this node is announced to the
    /// locator (one Redis write per agent, not per tunnel).
    pub(super) fn remember_connection(&self, agent: AgentId, connection_id: i64, version: &str) {
        let since_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_millis() as i64);
        let first = {
            let mut connections = self.lock_connections();
            let of_agent = connections.entry(agent).or_default();
            let first = of_agent.is_empty();
            of_agent.entry(connection_id).or_insert(ConnectionInfo {
                version: version.to_string(),
                since_unix_ms,
            });
            first
        };
        if let Some(locator) = &self.locator {
            if first {
                locator.register(agent);
            }
            locator.connection_up(ConnectionRecord {
                agent,
                connection_id,
                version: version.to_string(),
                node: self.node_name.clone(),
                since_unix_ms,
            });
        }
    }

    /// Forgets an agent connection; when the agent's last one leaves, the locator is told (it
    /// removes the entry after a delay unless the agent reconnects).
    pub(super) fn forget_connection(&self, key: (AgentId, i64)) {
        let last = {
            let mut connections = self.lock_connections();
            match connections.get_mut(&key.0) {
                Some(of_agent) => {
                    of_agent.remove(&key.1);
                    let last = of_agent.is_empty();
                    if last {
                        connections.remove(&key.0);
                    }
                    last
                }
                None => true,
            }
        };
        if let Some(locator) = &self.locator {
            locator.connection_down(key.0, key.1);
            if last {
                locator.unregister(key.0);
            }
        }
    }

    fn lock_connections(&self) -> MutexGuard<'_, Connections> {
        self.connections
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Agents with at least one connection to this node.
    pub fn connected_agents(&self) -> usize {
        self.lock_connections().len()
    }

    /// The ids of the agents with at least one connection to this node, sorted.
    pub fn held_agents(&self) -> Vec<AgentId> {
        let mut agents: Vec<AgentId> = self.lock_connections().keys().copied().collect();
        agents.sort_unstable();
        agents
    }

    /// What ListConnectedAgents answers for this node.
    pub fn list_connected_agents(&self) -> ListConnectedAgentsResponse {
        let idle = self.registry.idle_by_connection();
        let mut agents: Vec<ConnectedAgent> = self
            .lock_connections()
            .iter()
            .flat_map(|(agent, of_agent)| {
                of_agent
                    .iter()
                    .map(move |(connection, info)| (agent, connection, info))
            })
            .map(|(agent, connection, info)| ConnectedAgent {
                agent_id: *agent,
                connection_id: *connection,
                agent_version: info.version.clone(),
                node: self.node_name.clone(),
                connected_since_unix_ms: info.since_unix_ms,
                idle_tunnels: idle.get(&(*agent, *connection)).copied().unwrap_or(0),
            })
            .collect();
        agents.sort_by_key(|agent| (agent.agent_id, agent.connection_id));
        ListConnectedAgentsResponse { agents }
    }

    /// This node's connections, or with a locator every node's (the locator marks the node
    /// holding each connection; idle tunnel counts are known for this node only).
    pub(super) async fn list_cluster_agents(
        &self,
    ) -> Result<ListConnectedAgentsResponse, TunnelError> {
        let Some(locator) = &self.locator else {
            return Ok(self.list_connected_agents());
        };
        let records = match monoio::time::timeout(LIST_TIMEOUT, locator.list_connections()).await {
            Ok(Ok(records)) => records,
            Ok(Err(error)) => {
                return Err(TunnelError::new(
                    ErrorKind::LocatorUnavailable,
                    format!("cannot list the cluster's agents: {error}"),
                ))
            }
            Err(_) => {
                return Err(TunnelError::new(
                    ErrorKind::LocatorUnavailable,
                    "cannot list the cluster's agents: redis did not answer in 5s",
                ))
            }
        };
        Ok(self.with_idle_counts(records))
    }

    fn with_idle_counts(&self, records: Vec<ConnectionRecord>) -> ListConnectedAgentsResponse {
        let idle = self.registry.idle_by_connection();
        let agents = records
            .into_iter()
            .map(|record| ConnectedAgent {
                idle_tunnels: if record.node == self.node_name {
                    idle.get(&(record.agent, record.connection_id))
                        .copied()
                        .unwrap_or(0)
                } else {
                    0
                },
                agent_id: record.agent,
                connection_id: record.connection_id,
                agent_version: record.version,
                node: record.node,
                connected_since_unix_ms: record.since_unix_ms,
            })
            .collect();
        ListConnectedAgentsResponse { agents }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use sluice_locator::memory::MemoryCluster;
    use sluice_locator::AgentLocator;

    use super::super::test_node::node;

    #[test]
    fn the_first_and_last_connection_of_an_agent_reach_the_locator() {
        let cluster = MemoryCluster::new();
        let locator = cluster.locator("n", "10.0.0.1:1");
        let node = node(Some(locator.clone() as Arc<dyn AgentLocator>));
        node.remember_connection(4, 1, "v1");
        node.remember_connection(4, 2, "v1");
        assert_eq!(node.connected_agents(), 1);
        let listed =
            super::super::test_node::run(async { node.list_cluster_agents().await.unwrap() });
        assert_eq!(listed.agents.len(), 2);
        node.forget_connection((4, 1));
        let remaining = futures_executor_lite(locator.lookup(4));
        assert_eq!(remaining.unwrap().len(), 1, "one connection is left");
        node.forget_connection((4, 2));
        assert!(futures_executor_lite(locator.lookup(4)).unwrap().is_empty());
        assert_eq!(node.connected_agents(), 0);
    }

    fn futures_executor_lite<F: std::future::Future>(future: F) -> F::Output {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let mut future = std::pin::pin!(future);
        loop {
            if let std::task::Poll::Ready(value) = future.as_mut().poll(&mut cx) {
                return value;
            }
        }
    }
}
