//! The node's connection registry: idle tunnels of each agent wait here, and requests take one
//! or wait for one.
//!
//! Striped by agent id (256 stripes, as kas does) so cores serving different agents never
//! contend; a stripe's lock is held only to push or pop, never across an await. A tunnel is
//! offered by the task that owns its HTTP/2 stream (on the core its agent connection lives on);
//! a request claims it by sending that task a reply channel, and the task hands the streams over.
//! The hand-over is a message, so a tunnel that died a moment ago is simply skipped.
//!
//! A tunnel a call just finished with is *parked* instead: the registry holds the tunnel itself,
//! and the next call of its agent takes it with one lock, without an owner task, a channel or
//! a wake-up (a third of a node's CPU per call under load went to that hand-over). Nothing
//! watches a parked tunnel, so it stays parked only briefly: the node moves the ones parked
//! longer than a moment, and those of a connection that is closing, to owner tasks
//! ([`ConnectionRegistry::unpark`]), and a call checks the one it takes.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use futures_channel::oneshot;

pub use sluice_locator::AgentId;

const STRIPES: usize = 256;

/// A reply channel: the requester's half of a claim.
pub type Claim<T> = oneshot::Sender<T>;

/// An idle tunnel as the registry holds it.
#[derive(Debug)]
struct IdleTunnel<T> {
    id: u64,
    connection_id: i64,
    claims: oneshot::Sender<Claim<T>>,
}

/// A tunnel parked by the call that last used it: held here, not by a task.
#[derive(Debug)]
struct Parked<T> {
    connection_id: i64,
    since: Instant,
    tunnel: T,
}

#[derive(Debug)]
struct AgentSlot<T> {
    idle: VecDeque<IdleTunnel<T>>,
    /// Newest last; calls take the newest (its buffers are the warmest), the node moves the
    /// oldest to owner tasks.
    parked: VecDeque<Parked<T>>,
    waiters: VecDeque<oneshot::Sender<IdleTunnel<T>>>,
    /// Waits that ended since the last prune of `waiters` (some were served, not given up):
    /// the prune comes once they reach half the queue, so it costs O(1) per ended wait
    /// instead of a scan of every waiter per wait begun or ended. 32 bits: the slot is in
    /// every idle agent's registry entry (issue 36), and a prune resets it at half the queue.
    ended: u32,
    /// Requests waiting in this slot now (each a live [`Waiting`]), against the cap
    /// `acquire` is given: `waiters` also holds senders of requests that gave up until a prune.
    /// The slot stays while one waits, so the count is never applied to another slot.
    waiting: u32,
    /// Prunes of `waiters` so far: what the tests bound.
    #[cfg(test)]
    prunes: usize,
}

impl<T> Default for AgentSlot<T> {
    fn default() -> Self {
        Self {
            idle: VecDeque::new(),
            parked: VecDeque::new(),
            waiters: VecDeque::new(),
            ended: 0,
            waiting: 0,
            #[cfg(test)]
            prunes: 0,
        }
    }
}

impl<T> AgentSlot<T> {
    fn is_empty(&self) -> bool {
        self.idle.is_empty()
            && self.parked.is_empty()
            && self.waiters.is_empty()
            && self.waiting == 0
    }

    /// Whether a live request waits: the waiters that gave up are dropped from the front until
    /// one that did not (each is dropped once, so this is O(1) per waiter over its life).
    fn has_waiters(&mut self) -> bool {
        while self
            .waiters
            .front()
            .is_some_and(|waiter| waiter.is_canceled())
        {
            self.waiters.pop_front();
        }
        !self.waiters.is_empty()
    }

    /// One wait ended: drops the waiters that gave up once enough waits ended to pay for it.
    fn wait_ended(&mut self) {
        self.waiting = self.waiting.saturating_sub(1);
        self.ended = self.ended.saturating_add(1);
        if 2 * self.ended as usize >= self.waiters.len() {
            self.waiters.retain(|waiter| !waiter.is_canceled());
            self.ended = 0;
            #[cfg(test)]
            {
                self.prunes += 1;
            }
        }
    }
}

/// foldhash, not SipHash: a call looks its agent up at least twice (claim, park).
type Stripe<T> = foldhash::HashMap<AgentId, AgentSlot<T>>;

/// Idle tunnels and waiting requests, by agent.
#[derive(Debug)]
pub struct ConnectionRegistry<T> {
    stripes: Box<[Mutex<Stripe<T>>]>,
    idle: AtomicUsize,
    /// Of those, parked ones (`unpark` looks through the stripes only when there are any).
    parked: AtomicUsize,
    /// Requests waiting for a tunnel, across agents (the slots' `waiting` summed).
    waiting: AtomicUsize,
}

impl<T> Default for ConnectionRegistry<T> {
    fn default() -> Self {
        Self {
            stripes: (0..STRIPES).map(|_| Mutex::default()).collect(),
            idle: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
        }
    }
}

/// The owner side of an offered tunnel: resolves with a requester's claim.
pub type Claims<T> = oneshot::Receiver<Claim<T>>;

impl<T> ConnectionRegistry<T> {
    pub fn new() -> Self {
        Self::default()
    }

    fn stripe(&self, agent: AgentId) -> std::sync::MutexGuard<'_, Stripe<T>> {
        let index = (agent as u64 as usize) % STRIPES;
        // A poisoned stripe only means another thread panicked while holding it; the map is
        // still consistent (every mutation is a single push or pop).
        self.stripes[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Idle tunnels across all agents.
    pub fn idle_count(&self) -> usize {
        self.idle.load(Ordering::Relaxed)
    }

    /// Requests waiting for a tunnel, across all agents.
    pub fn waiting_count(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Offers an idle tunnel of `agent`. Hands it straight to the oldest live waiter if there is
    /// one, else queues it. The caller keeps the returned receiver and, when a claim arrives,
    /// sends the tunnel's streams through it.
    pub fn offer(&self, agent: AgentId, tunnel_id: u64, connection_id: i64) -> Claims<T> {
        let (claims_tx, claims_rx) = oneshot::channel();
        let mut tunnel = IdleTunnel {
            id: tunnel_id,
            connection_id,
            claims: claims_tx,
        };
        let mut stripe = self.stripe(agent);
        let slot = stripe.entry(agent).or_default();
        while let Some(waiter) = slot.waiters.pop_front() {
            match waiter.send(tunnel) {
                Ok(()) => return claims_rx,
                // That waiter gave up (deadline, client gone): try the next.
                Err(returned) => tunnel = returned,
            }
        }
        slot.idle.push_back(tunnel);
        self.idle.fetch_add(1, Ordering::Relaxed);
        claims_rx
    }

    /// Removes an idle tunnel that closed before anyone claimed it. Returns whether it was still
    /// queued (false: a requester took it concurrently and will find its claim refused).
    pub fn withdraw(&self, agent: AgentId, tunnel_id: u64) -> bool {
        let mut stripe = self.stripe(agent);
        let Some(slot) = stripe.get_mut(&agent) else {
            return false;
        };
        // Found from the front, where a draining connection's oldest tunnels are.
        let position = slot.idle.iter().position(|tunnel| tunnel.id == tunnel_id);
        let removed = position.and_then(|index| slot.idle.remove(index)).is_some();
        if removed {
            self.idle.fetch_sub(1, Ordering::Relaxed);
        }
        if slot.is_empty() {
            stripe.remove(&agent);
        }
        removed
    }

    /// Drops every idle tunnel of `agent` (their owners see the offer end and close them; parked
    /// ones are dropped, which resets their streams) and wakes every request waiting for one
    /// (each looks again). Returns how many idle tunnels were dropped.
    pub fn evict(&self, agent: AgentId) -> usize {
        let mut stripe = self.stripe(agent);
        let Some(slot) = stripe.get_mut(&agent) else {
            return 0;
        };
        let idle = std::mem::take(&mut slot.idle);
        let parked = std::mem::take(&mut slot.parked);
        slot.waiters.clear();
        // Kept while requests wait: their count belongs to this slot until they end.
        if slot.is_empty() {
            stripe.remove(&agent);
        }
        drop(stripe);
        let dropped = idle.len() + parked.len();
        self.idle.fetch_sub(dropped, Ordering::Relaxed);
        self.parked.fetch_sub(parked.len(), Ordering::Relaxed);
        dropped
    }

    /// Agents with a slot (idle tunnels or waiting requests) right now. Slots are reclaimed
    /// when they empty, so waiting for agents that never connect leaves nothing behind.
    pub fn tracked_agents(&self) -> usize {
        self.stripes
            .iter()
            .map(|stripe| {
                stripe
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .len()
            })
            .sum()
    }

    /// One wait of `agent` ended: its waiters that gave up are dropped in time, and its slot
    /// once it holds nothing.
    fn reclaim(&self, agent: AgentId) {
        let mut stripe = self.stripe(agent);
        if let Some(slot) = stripe.get_mut(&agent) {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            slot.wait_ended();
            if slot.is_empty() {
                stripe.remove(&agent);
            }
        }
    }

    /// Takes a tunnel of `agent` (the newest parked one, else an offered one), waiting as long
    /// as the caller's future is polled (callers bound it with their deadline; dropping the
    /// future withdraws the wait and reclaims the agent's slot if nothing else is in it: agent
    /// ids come from clients, so a slot left behind per id would be a leak anyone can grow).
    /// Refused at once when `max_waiting` requests already wait for one of `agent`'s tunnels:
    /// those are served first, so a request behind them could only wait longer. `admitted`:
    /// whether the request has had a place among them (set here when it takes one). One that
    /// has, waiting anew (woken to look at other nodes, by an eviction, or its tunnel closed
    /// before the hand-over), is held to twice the cap instead: new requests may take the
    /// places such returns left meanwhile, and the returns are not refused for it unless that
    /// repeats until the count is twice the cap, so the count never goes past that.
    pub async fn acquire(
        &self,
        agent: AgentId,
        max_waiting: usize,
        admitted: &Cell<bool>,
    ) -> Result<T, QueueFull> {
        loop {
            let offered = {
                let mut stripe = self.stripe(agent);
                let slot = stripe.entry(agent).or_default();
                if let Some(parked) = slot.parked.pop_back() {
                    self.idle.fetch_sub(1, Ordering::Relaxed);
                    self.parked.fetch_sub(1, Ordering::Relaxed);
                    if slot.is_empty() {
                        stripe.remove(&agent);
                    }
                    return Ok(parked.tunnel);
                }
                match slot.idle.pop_front() {
                    Some(tunnel) => {
                        self.idle.fetch_sub(1, Ordering::Relaxed);
                        if slot.is_empty() {
                            stripe.remove(&agent);
                        }
                        Offered::Now(tunnel)
                    }
                    None if slot.waiting as usize >= cap_for(max_waiting, admitted.get()) => {
                        let waiting = slot.waiting as usize;
                        if slot.is_empty() {
                            stripe.remove(&agent);
                        }
                        return Err(QueueFull { waiting });
                    }
                    None => {
                        // Waiters that gave up go when waits end (`reclaim`), not here: a scan
                        // per wait begun made W waiting calls cost W^2.
                        slot.waiting = slot.waiting.saturating_add(1);
                        self.waiting.fetch_add(1, Ordering::Relaxed);
                        admitted.set(true);
                        let (waiter_tx, waiter_rx) = oneshot::channel();
                        slot.waiters.push_back(waiter_tx);
                        Offered::Later(waiter_rx)
                    }
                }
            };
            let tunnel = match offered {
                Offered::Now(tunnel) => tunnel,
                Offered::Later(waiter) => {
                    let mut waiting = Waiting {
                        registry: self,
                        agent,
                        receiver: Some(waiter),
                    };
                    let Some(receiver) = waiting.receiver.as_mut() else {
                        continue;
                    };
                    match receiver.await {
                        Ok(tunnel) => tunnel,
                        // The registry never drops a waiter's sender without sending; be robust
                        // anyway.
                        Err(_) => continue,
                    }
                }
            };
            let (reply_tx, reply_rx) = oneshot::channel();
            if tunnel.claims.send(reply_tx).is_err() {
                continue; // Its owner has gone: the tunnel closed while idle.
            }
            if let Ok(streams) = reply_rx.await {
                return Ok(streams);
            }
        }
    }

    /// Parks a tunnel of `agent` that a call just finished with, for the next call to take
    /// directly. Refused (the tunnel comes back) while requests wait for one of the agent's
    /// tunnels: they wait for offers, so the caller offers it through an owner task instead.
    pub fn park(&self, agent: AgentId, connection_id: i64, tunnel: T) -> Result<(), T> {
        let mut stripe = self.stripe(agent);
        let slot = stripe.entry(agent).or_default();
        if slot.has_waiters() {
            return Err(tunnel);
        }
        slot.parked.push_back(Parked {
            connection_id,
            since: Instant::now(),
            tunnel,
        });
        self.idle.fetch_add(1, Ordering::Relaxed);
        self.parked.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Takes out the parked tunnels of `agent` for which `take(tunnel, since)` holds (parked too
    /// long, or on a connection that is closing), for the caller to hand to owner tasks. Looks
    /// at that agent's slot alone: each agent connection sweeps its own agents' tunnels, so the
    /// work grows with the tunnels parked, not with connections times tunnels.
    pub fn unpark(&self, agent: AgentId, mut take: impl FnMut(&T, Instant) -> bool) -> Vec<T> {
        let mut taken = Vec::new();
        if self.parked.load(Ordering::Relaxed) == 0 {
            return taken;
        }
        let mut stripe = self.stripe(agent);
        let Some(slot) = stripe.get_mut(&agent) else {
            return taken;
        };
        let mut index = 0;
        while let Some(parked) = slot.parked.get(index) {
            if !take(&parked.tunnel, parked.since) {
                index += 1;
            } else if let Some(parked) = slot.parked.remove(index) {
                taken.push(parked.tunnel);
            }
        }
        if slot.is_empty() {
            stripe.remove(&agent);
        }
        self.idle.fetch_sub(taken.len(), Ordering::Relaxed);
        self.parked.fetch_sub(taken.len(), Ordering::Relaxed);
        taken
    }

    /// Whether `agent` has an idle tunnel here right now (a hint: another request may take it
    /// first, in which case `acquire` waits as usual).
    pub fn has_idle(&self, agent: AgentId) -> bool {
        self.stripe(agent)
            .get(&agent)
            .is_some_and(|slot| !slot.idle.is_empty() || !slot.parked.is_empty())
    }

    /// `agent`'s idle tunnels per connection, for ListConnectedAgents: one stripe locked for
    /// one agent's tunnels, so a page of the listing does not hold up the calls of every agent.
    pub fn idle_by_connection(&self, agent: AgentId) -> HashMap<i64, u32> {
        let mut counts = HashMap::new();
        if let Some(slot) = self.stripe(agent).get(&agent) {
            let connections = slot.idle.iter().map(|tunnel| tunnel.connection_id);
            let parked = slot.parked.iter().map(|parked| parked.connection_id);
            for connection_id in connections.chain(parked) {
                *counts.entry(connection_id).or_insert(0) += 1;
            }
        }
        counts
    }
}

/// A request waiting in an agent's slot; when it ends (served, or dropped at its deadline) the
/// slot is reclaimed if nothing else is in it.
struct Waiting<'a, T> {
    registry: &'a ConnectionRegistry<T>,
    agent: AgentId,
    receiver: Option<oneshot::Receiver<IdleTunnel<T>>>,
}

impl<T> Drop for Waiting<'_, T> {
    fn drop(&mut self) {
        // Dropped first so the registry sees this waiter as gone.
        drop(self.receiver.take());
        self.registry.reclaim(self.agent);
    }
}

/// The waiting requests a request may find before it is refused: `max_waiting` for a new one,
/// twice that for one that had a place (see [`ConnectionRegistry::acquire`]).
fn cap_for(max_waiting: usize, admitted: bool) -> usize {
    if admitted {
        max_waiting.saturating_mul(2)
    } else {
        max_waiting
    }
}

/// `acquire` refused a request: this many already wait for the agent's tunnels here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull {
    pub waiting: usize,
}

enum Offered<T> {
    Now(IdleTunnel<T>),
    Later(oneshot::Receiver<IdleTunnel<T>>),
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
