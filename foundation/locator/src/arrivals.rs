//! Waiters for agents' arrivals, woken when any node announces one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use event_listener::{Event, EventListener};

use crate::AgentId;

/// Waiters per agent. Listeners are `event-listener` futures, which tasks of any runtime await
/// across threads.
#[derive(Debug, Default)]
pub struct Arrivals {
    events: Mutex<HashMap<AgentId, Arc<Event>>>,
    heard: AtomicU64,
}

impl Arrivals {
    /// A listener that fires at the next arrival of `agent` (anywhere in the cluster). Create it
    /// before checking for a tunnel, so an arrival between the check and the wait is not missed.
    pub fn listen(&self, agent: AgentId) -> EventListener {
        let mut events = self
            .events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        events.entry(agent).or_default().listen()
    }

    /// Wakes every waiter of `agent`.
    pub fn notify(&self, agent: AgentId) {
        self.heard.fetch_add(1, Ordering::Relaxed);
        let event = {
            let mut events = self
                .events
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            events.remove(&agent)
        };
        if let Some(event) = event {
            event.notify(usize::MAX);
        }
    }

    /// Arrival messages heard so far.
    pub fn heard(&self) -> u64 {
        self.heard.load(Ordering::Relaxed)
    }
}
