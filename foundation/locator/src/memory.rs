//! An in-memory locator for tests: one shared map standing in for the cluster's store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{
    AgentId, AgentLocator, Answer, Arrivals, ConnectionKey, ConnectionRecord, EventListener,
    LocatorError, NodeEntry,
};

/// What every [`MemoryLocator`] of one test cluster sees.
#[derive(Debug, Default)]
pub struct MemoryCluster {
    state: Mutex<ClusterState>,
    arrivals: Arrivals,
}

#[derive(Debug, Default)]
struct ClusterState {
    /// Per agent, the nodes holding it.
    agents: HashMap<AgentId, Vec<NodeEntry>>,
    connections: Vec<ConnectionRecord>,
    /// When set, every question fails with this store error.
    failing: Option<String>,
}

impl MemoryCluster {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// A node's locator in this cluster.
    pub fn locator(self: &Arc<Self>, node: &str, private_address: &str) -> Arc<MemoryLocator> {
        Arc::new(MemoryLocator {
            cluster: self.clone(),
            node: node.to_string(),
            private_address: private_address.to_string(),
        })
    }

    /// Makes every question fail (Redis away) until `None`.
    pub fn set_failing(&self, why: Option<&str>) {
        self.lock().failing = why.map(str::to_string);
    }

    /// Arrival messages delivered so far.
    pub fn arrivals_heard(&self) -> u64 {
        self.arrivals.heard()
    }

    fn lock(&self) -> MutexGuard<'_, ClusterState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One node's view of a [`MemoryCluster`].
#[derive(Debug)]
pub struct MemoryLocator {
    cluster: Arc<MemoryCluster>,
    node: String,
    private_address: String,
}

impl AgentLocator for MemoryLocator {
    fn register(&self, agent: AgentId) {
        {
            let mut state = self.cluster.lock();
            let nodes = state.agents.entry(agent).or_default();
            if !nodes.iter().any(|entry| entry.node == self.node) {
                nodes.push(NodeEntry {
                    node: self.node.clone(),
                    private_address: self.private_address.clone(),
                    expires_at_unix_ms: u64::MAX,
                });
            }
        }
        self.cluster.arrivals.notify(agent);
    }

    fn unregister(&self, agent: AgentId) {
        let mut state = self.cluster.lock();
        if let Some(nodes) = state.agents.get_mut(&agent) {
            nodes.retain(|entry| entry.node != self.node);
        }
    }

    fn connection_up(&self, record: ConnectionRecord) {
        self.cluster.lock().connections.push(record);
    }

    fn connection_down(&self, agent: AgentId, connection_id: i64) {
        self.cluster.lock().connections.retain(|record| {
            (record.agent, record.connection_id, record.node.as_str())
                != (agent, connection_id, self.node.as_str())
        });
    }

    fn lookup(&self, agent: AgentId) -> Answer<Vec<NodeEntry>> {
        let state = self.cluster.lock();
        Answer::ready(match &state.failing {
            Some(why) => Err(LocatorError::Store(why.clone())),
            None => Ok(state.agents.get(&agent).cloned().unwrap_or_default()),
        })
    }

    fn list_connections(
        &self,
        after: Option<ConnectionKey>,
        limit: usize,
    ) -> Answer<Vec<ConnectionRecord>> {
        let state = self.cluster.lock();
        Answer::ready(match &state.failing {
            Some(why) => Err(LocatorError::Store(why.clone())),
            None => {
                let mut records: Vec<ConnectionRecord> = state
                    .connections
                    .iter()
                    .filter(|record| record.is_after(after.as_ref()))
                    .cloned()
                    .collect();
                records.sort_by_key(ConnectionRecord::key);
                records.truncate(limit);
                Ok(records)
            }
        })
    }

    fn listen(&self, agent: AgentId) -> EventListener {
        self.cluster.arrivals.listen(agent)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut future = std::pin::pin!(future);
        loop {
            if let std::task::Poll::Ready(value) = future.as_mut().poll(&mut cx) {
                return value;
            }
        }
    }

    #[test]
    fn a_registration_is_seen_by_other_nodes_and_wakes_listeners() {
        let cluster = MemoryCluster::new();
        let (a, b) = (
            cluster.locator("a", "10.0.0.1:1"),
            cluster.locator("b", "10.0.0.2:1"),
        );
        let listener = b.listen(5);
        a.register(5);
        block_on(listener);
        let nodes = block_on(b.lookup(5)).unwrap();
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].node, "a");
        a.unregister(5);
        assert!(block_on(b.lookup(5)).unwrap().is_empty());
        cluster.set_failing(Some("down"));
        assert_eq!(
            block_on(b.lookup(5)),
            Err(LocatorError::Store("down".into()))
        );
    }

    #[test]
    fn a_dropped_answerer_reads_as_stopped() {
        let (reply, answer) = Answer::<()>::channel();
        drop(reply);
        assert_eq!(block_on(answer), Err(LocatorError::Stopped));
    }
}
