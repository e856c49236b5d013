//! The connection records this node keeps in Redis, at most `max_per_agent` per agent. The node
//! refuses an agent's connections over `tunnel.max_connections_per_agent` before they get here;
//! the tracker holds the same bound itself, so the Redis hash of one agent can never grow past
//! (nodes x bound) fields whatever the node sends it.

use std::collections::HashMap;

use crate::{AgentId, ConnectionRecord};

#[derive(Debug)]
pub(crate) struct Records {
    by_key: HashMap<(AgentId, i64), ConnectionRecord>,
    per_agent: HashMap<AgentId, usize>,
    max_per_agent: usize,
}

impl Records {
    pub(crate) fn new(max_per_agent: usize) -> Self {
        Self {
            by_key: HashMap::new(),
            per_agent: HashMap::new(),
            max_per_agent,
        }
    }

    /// Keeps `record` (replacing the one of the same connection); false, keeping nothing, when
    /// it would be one record too many for its agent.
    pub(crate) fn insert(&mut self, record: ConnectionRecord) -> bool {
        let key = (record.agent, record.connection_id);
        if let Some(kept) = self.by_key.get_mut(&key) {
            *kept = record;
            return true;
        }
        let count = self.per_agent.entry(record.agent).or_insert(0);
        if *count >= self.max_per_agent {
            return false;
        }
        *count += 1;
        self.by_key.insert(key, record);
        true
    }

    /// Forgets one connection; whether it was kept.
    pub(crate) fn remove(&mut self, agent: AgentId, connection_id: i64) -> bool {
        if self.by_key.remove(&(agent, connection_id)).is_none() {
            return false;
        }
        if let Some(count) = self.per_agent.get_mut(&agent) {
            *count -= 1;
            if *count == 0 {
                self.per_agent.remove(&agent);
            }
        }
        true
    }

    /// Every kept record's key, forgetting them all.
    pub(crate) fn drain(&mut self) -> Vec<(AgentId, i64)> {
        self.per_agent.clear();
        self.by_key.drain().map(|(key, _)| key).collect()
    }

    pub(crate) fn all(&self) -> Vec<ConnectionRecord> {
        self.by_key.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(agent: AgentId, connection_id: i64) -> ConnectionRecord {
        ConnectionRecord {
            agent,
            connection_id,
            version: "v".into(),
            node: "n".into(),
            since_unix_ms: 1,
        }
    }

    #[test]
    fn each_agent_keeps_at_most_its_bound() {
        let mut records = Records::new(2);
        assert!(records.insert(record(7, 1)));
        assert!(records.insert(record(7, 2)));
        assert!(
            !records.insert(record(7, 3)),
            "a third connection of agent 7"
        );
        assert!(
            records.insert(record(7, 2)),
            "a known connection is replaced"
        );
        assert!(records.insert(record(8, 3)), "agent 8 has its own bound");
        assert_eq!(records.all().len(), 3);
        assert!(records.remove(7, 1));
        assert!(!records.remove(7, 1));
        assert!(records.insert(record(7, 3)));
        let mut drained = records.drain();
        drained.sort_unstable();
        assert_eq!(drained, vec![(7, 2), (7, 3), (8, 3)]);
        assert!(records.insert(record(7, 9)));
    }
}
