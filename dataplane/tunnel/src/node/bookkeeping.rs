//! Which agent connections this node holds: for ListConnectedAgents, the connected-agents gauge,
//! and the agent locator (told once per agent, not per tunnel).

use std::collections::{BTreeMap, HashMap};
use std::sync::MutexGuard;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_locator::{ConnectionKey, ConnectionRecord};
use sluice_proto::agents::v1::ConnectedAgent;

use super::disconnects::Disconnect;
use super::NodeShared;
use crate::error::{ErrorKind, TunnelError};
use crate::registry::AgentId;

/// One agent process's connection to this node, for ListConnectedAgents.
#[derive(Debug, Clone)]
pub(super) struct ConnectionInfo {
    version: String,
    since_unix_ms: i64,
    /// HTTP/2 connections that announced it: an agent moving to a new connection (a drain)
    /// keeps one record until the last of them closes.
    holders: usize,
}

/// Agent connections by agent, then by the agent-chosen connection id: indexed, so an agent
/// with many connections costs a lookup under the shared lock, not a scan of every connection.
/// Ordered by agent, so a ListConnectedAgents page is a range from its token: the lock is held
/// for the page, not for a sort of every connection (issue 36: 100,000 agents make 200 pages).
pub(super) type Connections = BTreeMap<AgentId, HashMap<i64, ConnectionInfo>>;

/// How long ListConnectedAgents waits for the locator's cluster-wide listing.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);

impl NodeShared {
    /// Records an agent connection unless the agent already has
    /// `tunnel.max_connections_per_agent` others on this node (then `OverShare`, and nothing
    /// reaches the locator). The agent's first one is announced to the locator (one Redis write
    /// per agent, not per tunnel).
    pub(super) fn admit_connection(
        &self,
        agent: AgentId,
        connection_id: i64,
        version: &str,
    ) -> Result<(), TunnelError> {
        let since_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_millis() as i64);
        let limit = self.agent_limits.connections;
        let first = {
            let mut connections = self.lock_connections();
            let of_agent = connections.entry(agent).or_default();
            let first = of_agent.is_empty();
            if let Some(known) = of_agent.get_mut(&connection_id) {
                // Known here already (the agent's new HTTP/2 connection): recorded once.
                known.holders += 1;
                return Ok(());
            }
            if of_agent.len() >= limit {
                return Err(TunnelError::new(
                    ErrorKind::OverShare,
                    format!(
                        "the agent has {} connections on this node, the limit (tunnel.max_connections_per_agent is {limit}); reuse a connection id",
                        of_agent.len()
                    ),
                ));
            }
            of_agent.insert(
                connection_id,
                ConnectionInfo {
                    version: version.to_string(),
                    since_unix_ms,
                    holders: 1,
                },
            );
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
        Ok(())
    }

    /// Forgets an agent connection; when the agent's last one leaves, the locator is told (it
    /// removes the entry after a delay unless the agent reconnects) and the operator's log too.
    pub(super) fn forget_connection(&self, key: (AgentId, i64), why: Disconnect) {
        let last = {
            let mut connections = self.lock_connections();
            match connections.get_mut(&key.0) {
                Some(of_agent) => {
                    if let Some(info) = of_agent.get_mut(&key.1) {
                        if info.holders > 1 {
                            // Another HTTP/2 connection still holds it.
                            info.holders -= 1;
                            return;
                        }
                    }
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
        if last {
            self.disconnect_log.record(key.0, key.1, why);
        }
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

    /// Whether `agent` has at least one connection to this node.
    pub fn holds_agent(&self, agent: AgentId) -> bool {
        self.lock_connections()
            .get(&agent)
            .is_some_and(|connections| !connections.is_empty())
    }

    /// The ids of the agents with at least one connection to this node, sorted.
    pub fn held_agents(&self) -> Vec<AgentId> {
        let mut agents: Vec<AgentId> = self.lock_connections().keys().copied().collect();
        agents.sort_unstable();
        agents
    }

    /// Up to `limit` of this node's connections after `after`, in listing order. Only the
    /// agents from `after`'s on are visited, and each one's connections (at most
    /// `tunnel.max_connections_per_agent`) sorted, under the lock.
    fn local_records(&self, after: Option<&ConnectionKey>, limit: usize) -> Vec<ConnectionRecord> {
        let node = self.node_name.as_str();
        let connections = self.lock_connections();
        let first = after.map_or(AgentId::MIN, |after| after.agent);
        let mut records = Vec::new();
        for (agent, of_agent) in connections.range(first..) {
            if records.len() >= limit {
                break;
            }
            let mut ids: Vec<i64> = of_agent
                .keys()
                .copied()
                .filter(|id| {
                    after.is_none_or(|after| {
                        (*agent, node, *id) > (after.agent, &*after.node, after.connection_id)
                    })
                })
                .collect();
            ids.sort_unstable();
            ids.truncate(limit - records.len());
            records.extend(ids.into_iter().filter_map(|connection_id| {
                let info = of_agent.get(&connection_id)?;
                Some(ConnectionRecord {
                    agent: *agent,
                    connection_id,
                    version: info.version.clone(),
                    node: self.node_name.clone(),
                    since_unix_ms: info.since_unix_ms,
                })
            }));
        }
        records
    }

    /// Up to `limit` connections after `after`: this node's, or with a locator every node's.
    pub(super) async fn list_records(
        &self,
        after: Option<ConnectionKey>,
        limit: usize,
    ) -> Result<Vec<ConnectionRecord>, TunnelError> {
        let Some(locator) = &self.locator else {
            return Ok(self.local_records(after.as_ref(), limit));
        };
        let listing = locator.list_connections(after, limit);
        match monoio::time::timeout(LIST_TIMEOUT, listing).await {
            Ok(Ok(records)) => Ok(records),
            Ok(Err(error)) => Err(TunnelError::new(
                ErrorKind::LocatorUnavailable,
                format!("cannot list the cluster's agents: {error}"),
            )),
            Err(_) => Err(TunnelError::new(
                ErrorKind::LocatorUnavailable,
                "cannot list the cluster's agents: redis did not answer in 5s",
            )),
        }
    }

    /// The answer's entries for `records`; idle tunnel counts are known for this node only.
    /// Only the page's own agents are looked up in the registry, whose locks calls take.
    pub(super) fn with_idle_counts(&self, records: Vec<ConnectionRecord>) -> Vec<ConnectedAgent> {
        let mut idle: HashMap<AgentId, HashMap<i64, u32>> = HashMap::new();
        for record in &records {
            if record.node == self.node_name && !idle.contains_key(&record.agent) {
                idle.insert(record.agent, self.registry.idle_by_connection(record.agent));
            }
        }
        records
            .into_iter()
            .map(|record| ConnectedAgent {
                idle_tunnels: if record.node == self.node_name {
                    idle.get(&record.agent)
                        .and_then(|of_agent| of_agent.get(&record.connection_id))
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
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use super::Disconnect;

    use sluice_locator::memory::MemoryCluster;
    use sluice_locator::AgentLocator;

    use super::super::test_node::{node, node_limited};

    #[test]
    fn the_first_and_last_connection_of_an_agent_reach_the_locator() {
        let cluster = MemoryCluster::new();
        let locator = cluster.locator("n", "10.0.0.1:1");
        let node = node(Some(locator.clone() as Arc<dyn AgentLocator>));
        node.admit_connection(4, 1, "v1").unwrap();
        node.admit_connection(4, 2, "v1").unwrap();
        assert_eq!(node.connected_agents(), 1);
        let listed =
            super::super::test_node::run(async { node.list_records(None, 10).await.unwrap() });
        assert_eq!(listed.len(), 2);
        node.forget_connection((4, 1), Disconnect::Closed);
        let remaining = futures_executor_lite(locator.lookup(4));
        assert_eq!(remaining.unwrap().len(), 1, "one connection is left");
        node.forget_connection((4, 2), Disconnect::Closed);
        assert!(futures_executor_lite(locator.lookup(4)).unwrap().is_empty());
        assert_eq!(node.connected_agents(), 0);
    }

    /// Over `tunnel.max_connections_per_agent` a new connection id is refused RESOURCE_EXHAUSTED
    /// and never reaches the locator; a known id and another agent's still pass.
    #[test]
    fn an_agent_over_its_connections_is_refused_before_the_locator() {
        let cluster = MemoryCluster::new();
        let locator = cluster.locator("n", "10.0.0.1:1");
        let limits = sluice_config::AgentLimits {
            connections: 3,
            ..Default::default()
        };
        let node = node_limited(Some(locator.clone() as Arc<dyn AgentLocator>), None, limits);
        for connection in 0..3 {
            node.admit_connection(4, connection, "v1").unwrap();
        }
        for connection in 3..100 {
            let refused = node.admit_connection(4, connection, "v").unwrap_err();
            assert_eq!(refused.code(), sluice_grpc::Code::ResourceExhausted);
            assert!(refused.message().contains("max_connections_per_agent"));
        }
        node.admit_connection(4, 1, "v1").unwrap();
        node.admit_connection(5, 1000, "v1").unwrap();
        let listed =
            super::super::test_node::run(async { node.list_records(None, 1000).await.unwrap() });
        assert_eq!(listed.iter().filter(|record| record.agent == 4).count(), 3);
        node.forget_connection((4, 0), Disconnect::Closed);
        node.admit_connection(4, 3, "v1").unwrap();
    }

    /// An agent that moves to a new HTTP/2 connection announces the same connection id there;
    /// the record stays (and counts once) until the last connection holding it closes.
    #[test]
    fn a_connection_id_held_by_two_http2_connections_is_one_record_until_both_close() {
        let cluster = MemoryCluster::new();
        let locator = cluster.locator("n", "10.0.0.1:1");
        let node = node(Some(locator.clone() as Arc<dyn AgentLocator>));
        node.admit_connection(4, 1, "v1").unwrap();
        node.admit_connection(4, 1, "v1").unwrap();
        let listed =
            || super::super::test_node::run(async { node.list_records(None, 10).await.unwrap() });
        assert_eq!(listed().len(), 1);
        node.forget_connection((4, 1), Disconnect::Closed);
        assert_eq!(listed().len(), 1, "the second connection still holds it");
        assert_eq!(node.connected_agents(), 1);
        node.forget_connection((4, 1), Disconnect::Closed);
        assert!(listed().is_empty());
        assert_eq!(node.connected_agents(), 0);
    }

    /// Pages of a node without a locator list every connection once, in (agent, connection
    /// id) order, each page starting after the last one's final key, also inside one agent.
    #[test]
    fn local_pages_list_every_connection_once_in_order() {
        let node = node(None);
        let mut expected = Vec::new();
        for agent in (1..=40).rev() {
            for connection in [9, 2, 5] {
                node.admit_connection(agent * 7 % 41, connection, "v1")
                    .unwrap();
                expected.push((agent * 7 % 41, connection));
            }
        }
        expected.sort_unstable();
        let mut listed = Vec::new();
        let mut after: Option<sluice_locator::ConnectionKey> = None;
        loop {
            let page = super::super::test_node::run(async {
                node.list_records(after.clone(), 7).await.unwrap()
            });
            assert!(page.len() <= 7);
            let Some(last) = page.last() else { break };
            after = Some(last.key());
            listed.extend(
                page.iter()
                    .map(|record| (record.agent, record.connection_id)),
            );
        }
        assert_eq!(listed, expected);
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
