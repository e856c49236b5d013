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

/// The entries are pruned of agents whose interval has passed once they reach this many, then
/// again each time they double from what a prune left: a drain of N agents inside one interval
/// prunes log2(N / 1024) times instead of once per agent past the first 1,024 (which made a
/// node's stop quadratic in its agents). The entries stay at most twice what the last prune
/// kept (agents that left within an interval), or this many.
const PRUNE_ABOVE: usize = 1024;

/// When each agent's last disconnect line was written, and the lines held back since.
#[derive(Debug, Default)]
pub(super) struct DisconnectLog {
    entries: Mutex<Entries>,
}

#[derive(Debug, Default)]
struct Entries {
    agents: HashMap<AgentId, (Instant, u64)>,
    /// The size at which the next new agent prunes first (at least [`PRUNE_ABOVE`]).
    prune_at: usize,
    /// Prunes so far: what the tests bound.
    prunes: u64,
}

impl DisconnectLog {
    pub(super) const EVERY: Duration = Duration::from_secs(10);

    /// `Some(lines held back since the agent's last one)` when a line may be written now.
    pub(super) fn admit(&self, agent: AgentId, now: Instant) -> Option<u64> {
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((last, held_back)) = entries.agents.get_mut(&agent) {
            if now.saturating_duration_since(*last) < Self::EVERY {
                *held_back += 1;
                return None;
            }
            *last = now;
            return Some(std::mem::take(held_back));
        }
        if entries.agents.len() >= entries.prune_at.max(PRUNE_ABOVE) {
            entries.agents.retain(|_, (last, held_back)| {
                *held_back > 0 || now.saturating_duration_since(*last) < Self::EVERY
            });
            entries.prune_at = 2 * entries.agents.len();
            entries.prunes += 1;
        }
        entries.agents.insert(agent, (now, 0));
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
        assert!(log.entries.lock().unwrap().agents.len() <= PRUNE_ABOVE + 1);
    }

    /// A node's drain disconnects all its agents at once. With a prune per new agent past
    /// the first 1,024 (each a scan of every entry), 100,000 agents took billions of steps.
    #[test]
    fn a_drain_of_many_agents_prunes_a_logarithmic_number_of_times() {
        let log = DisconnectLog::default();
        let now = Instant::now();
        for agent in 0..20_000 {
            assert_eq!(log.admit(agent, now), Some(0));
        }
        let entries = log.entries.lock().unwrap();
        assert_eq!(
            entries.agents.len(),
            20_000,
            "every agent is still in its interval"
        );
        assert!(
            entries.prunes <= 5,
            "{} prunes for 20,000 agents",
            entries.prunes
        );
    }

    /// Held to at most twice the agents that left within an interval: a drain's entries
    /// go at the first prune after their interval.
    #[test]
    fn a_drains_entries_go_at_the_next_prune_after_their_interval() {
        let log = DisconnectLog::default();
        let start = Instant::now();
        for agent in 0..10_000 {
            log.admit(agent, start);
        }
        let later = start + DisconnectLog::EVERY;
        for agent in 10_000..17_000 {
            log.admit(agent, later);
        }
        let entries = log.entries.lock().unwrap();
        assert_eq!(
            entries.agents.len(),
            7_000,
            "only the later agents are kept"
        );
    }
}
