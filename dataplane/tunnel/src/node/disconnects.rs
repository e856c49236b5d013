//! The node's log line for an agent leaving it (its last connection here went away), bounded
//! per agent: an agent that flaps gets one line per [`DisconnectLog::EVERY`], and the next line
//! says how many were held back.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::registry::AgentId;

/// Why an agent's last connection to this node went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Disconnect {
    /// The agent closed it (or the peer went away cleanly).
    Closed,
    /// It ended with an error: reset, broken, a protocol or limit violation.
    Reset,
    /// This node drained it (shutting down, or the connection reached its age).
    Drained,
    /// The agent's token was revoked.
    Revoked,
}

impl Disconnect {
    pub(super) fn label(self) -> &'static str {
        match self {
            Disconnect::Closed => "closed",
            Disconnect::Reset => "reset",
            Disconnect::Drained => "drained",
            Disconnect::Revoked => "revoked",
        }
    }
}

/// Agents past this many entries get their stale entries pruned; the entries are at most one
/// per agent with a token, so this only bounds the work of one prune.
const PRUNE_ABOVE: usize = 1024;

/// When each agent's last disconnect line was written, and the lines held back since.
#[derive(Debug, Default)]
pub(super) struct DisconnectLog {
    agents: Mutex<HashMap<AgentId, (Instant, u64)>>,
}

impl DisconnectLog {
    pub(super) const EVERY: Duration = Duration::from_secs(10);

    /// `Some(lines held back since the agent's last one)` when a line may be written now.
    pub(super) fn admit(&self, agent: AgentId, now: Instant) -> Option<u64> {
        let mut agents = self
            .agents
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((last, held_back)) = agents.get_mut(&agent) {
            if now.saturating_duration_since(*last) < Self::EVERY {
                *held_back += 1;
                return None;
            }
            *last = now;
            return Some(std::mem::take(held_back));
        }
        if agents.len() >= PRUNE_ABOVE {
            agents.retain(|_, (last, held_back)| {
                *held_back > 0 || now.saturating_duration_since(*last) < Self::EVERY
            });
        }
        agents.insert(agent, (now, 0));
        Some(0)
    }

    /// Logs that `agent` left this node, within its share of lines.
    pub(super) fn record(&self, agent: AgentId, connection_id: i64, why: Disconnect) {
        if let Some(held_back) = self.admit(agent, Instant::now()) {
            tracing::info!(
                agent,
                connection_id,
                reason = why.label(),
                disconnects_not_logged = held_back,
                "agent disconnected from this node"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_flapping_agent_gets_one_line_per_interval_and_the_next_counts_the_rest() {
        let log = DisconnectLog::default();
        let start = Instant::now();
        assert_eq!(log.admit(4, start), Some(0));
        for flap in 1..=5u64 {
            assert_eq!(log.admit(4, start + Duration::from_millis(flap)), None);
        }
        assert_eq!(
            log.admit(5, start),
            Some(0),
            "another agent has its own share"
        );
        let later = start + DisconnectLog::EVERY;
        assert_eq!(log.admit(4, later), Some(5));
        assert_eq!(log.admit(4, later), None);
    }

    #[test]
    fn the_entries_stay_bounded_by_the_agents_seen_recently() {
        let log = DisconnectLog::default();
        let start = Instant::now();
        for agent in 0..PRUNE_ABOVE as AgentId {
            log.admit(agent, start);
        }
        let later = start + DisconnectLog::EVERY;
        for agent in PRUNE_ABOVE as AgentId..2 * PRUNE_ABOVE as AgentId {
            log.admit(agent, later);
        }
        assert!(log.agents.lock().unwrap().len() <= PRUNE_ABOVE + 1);
    }
}
