//! Fair shares of the gateway's upstream streams, after Kubernetes API Priority and Fairness:
//! pure bookkeeping (no I/O, no clock, no wakers), driven by the proxy's pool.
//!
//! Two budgets, both per core (the data plane is thread-per-core, so each is `Rc`/`Cell`
//! state no other core touches, and a global count would need a lock on every request):
//!
//! - [`StreamQueue`], one per upstream server: a core may have `capacity` streams open to the
//!   server. Long-running requests (watch, exec, attach, port-forward, proxy) may hold at most
//!   `longRunningStreamsPercent` of them together, so they can never hold all. A request that
//!   finds every stream busy waits in its **user's** queue; a freed stream goes to the next
//!   user in turn (round robin over users with waiters), so a user with thousands of requests
//!   gets one turn like a user with one. Queues are bounded per user and in total; a request
//!   past a bound, or one that waits past `maxQueueWait` (the proxy's timer), is refused.
//!   APF shuffle-shards flows onto a fixed set of queues and orders them by virtual finish
//!   time; with one queue per waiting user and equal-cost turns we get exact per-user fairness
//!   for the price of a map entry per waiting user, which the total bound caps.
//! - [`LongRunningUsers`], one per cluster: a user may have at most `maxLongRunningPerUser`
//!   long-running requests open on a core. Upgrades (exec, attach, port-forward) do not use
//!   the shared streams but count here, since they hold an apiserver connection each.
//! - [`UpgradeSlots`], one per cluster: upgrades (exec, attach, port-forward) one core may hold
//!   open to the cluster's apiservers, all users together (`maxUpgradeConnections`): each is a
//!   TLS connection of its own to an apiserver, so without a bound they could hold as many
//!   connections as the users' budgets add up to.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

use crate::identity::UserInfo;

/// Why a request got no share (a fixed set: the `reason` label of the refusal metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum FairShareRefusal {
    #[error("the user has as many long-running requests open as it may")]
    UserLongRunning,
    #[error("long-running requests hold their whole share of the apiserver's streams")]
    ServerLongRunning,
    #[error("the user already has as many requests waiting for an apiserver stream as it may")]
    UserQueueFull,
    #[error("as many requests as allowed are waiting for an apiserver stream")]
    QueueFull,
    #[error("no apiserver stream became free within the queue wait limit")]
    QueueWait,
    #[error("the cluster's apiservers hold as many exec, attach and port-forward connections as they may")]
    ClusterUpgrades,
}

impl FairShareRefusal {
    pub const ALL: [FairShareRefusal; 6] = [
        FairShareRefusal::UserLongRunning,
        FairShareRefusal::ServerLongRunning,
        FairShareRefusal::UserQueueFull,
        FairShareRefusal::QueueFull,
        FairShareRefusal::QueueWait,
        FairShareRefusal::ClusterUpgrades,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FairShareRefusal::UserLongRunning => "user_long_running",
            FairShareRefusal::ServerLongRunning => "server_long_running",
            FairShareRefusal::UserQueueFull => "user_queue_full",
            FairShareRefusal::QueueFull => "queue_full",
            FairShareRefusal::QueueWait => "queue_wait",
            FairShareRefusal::ClusterUpgrades => "cluster_upgrades",
        }
    }

    /// Position in [`Self::ALL`] (for per-reason counters kept in an array).
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The limits of one core's streams to one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Streams this core may have open to the server.
    pub capacity: u32,
    /// Percent of `capacity` long-running requests may hold together (rounded down, so a
    /// server with one stream per core takes no long-running request unless it is 100).
    pub long_running_percent: u32,
    pub max_queued_per_user: u32,
    pub max_queued: u32,
}

impl StreamLimits {
    pub fn long_running_cap(&self) -> u32 {
        let percent = u64::from(self.long_running_percent.min(100));
        (u64::from(self.capacity) * percent / 100) as u32
    }
}

/// Identifies a waiting request, to cancel it when its wait ends without a stream.
pub type Ticket = u64;

/// What [`StreamQueue::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// A stream is the request's now; release it with [`StreamQueue::release`].
    Granted,
    /// The request waits; the queue hands its waiter to the grant callback when its turn
    /// comes, or it is cancelled with [`StreamQueue::cancel`].
    Queued(Ticket),
}

#[derive(Debug)]
struct Waiting<W> {
    ticket: Ticket,
    long_running: bool,
    waiter: W,
}

/// One core's streams to one server, shared fairly by users (see the module comment). `W` is
/// whatever the caller needs to wake a waiting request.
#[derive(Debug)]
pub struct StreamQueue<W> {
    limits: StreamLimits,
    in_use: u32,
    /// Long-running requests holding or waiting for a stream.
    long_running: u32,
    queued: u32,
    /// Users with waiting requests, each with its own queue, oldest first.
    flows: HashMap<Rc<str>, VecDeque<Waiting<W>>>,
    /// Whose turn is next: each user of `flows` exactly once.
    turns: VecDeque<Rc<str>>,
    next_ticket: Ticket,
}

impl<W> StreamQueue<W> {
    pub fn new(limits: StreamLimits) -> Self {
        Self {
            limits,
            in_use: 0,
            long_running: 0,
            queued: 0,
            flows: HashMap::new(),
            turns: VecDeque::new(),
            next_ticket: 0,
        }
    }

    pub fn limits(&self) -> StreamLimits {
        self.limits
    }

    /// Streams granted and not yet released.
    pub fn in_use(&self) -> u32 {
        self.in_use
    }

    pub fn queued(&self) -> u32 {
        self.queued
    }

    pub fn long_running(&self) -> u32 {
        self.long_running
    }

    /// New limits (the server announced its stream limit, or a reload changed the config);
    /// more capacity grants waiting requests at once.
    pub fn set_limits(&mut self, limits: StreamLimits, granted: impl FnMut(Ticket, W)) {
        if limits != self.limits {
            self.limits = limits;
            self.dispatch(granted);
        }
    }

    /// A request of `user` asks for a stream. Granted at once only when a stream is free and
    /// nobody waits (no overtaking); else queued within the bounds. `waiter` is made only when
    /// the request queues, so a granted request costs no allocation.
    pub fn admit(
        &mut self,
        user: &str,
        long_running: bool,
        waiter: impl FnOnce() -> W,
    ) -> Result<Admission, FairShareRefusal> {
        if long_running && self.long_running >= self.limits.long_running_cap() {
            return Err(FairShareRefusal::ServerLongRunning);
        }
        if self.in_use < self.limits.capacity && self.queued == 0 {
            self.in_use += 1;
            self.long_running += u32::from(long_running);
            return Ok(Admission::Granted);
        }
        let waiting = self.flows.get(user).map_or(0, VecDeque::len);
        if waiting >= self.limits.max_queued_per_user as usize {
            return Err(FairShareRefusal::UserQueueFull);
        }
        if self.queued >= self.limits.max_queued {
            return Err(FairShareRefusal::QueueFull);
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let entry = Waiting {
            ticket,
            long_running,
            waiter: waiter(),
        };
        match self.flows.get_mut(user) {
            Some(queue) => queue.push_back(entry),
            None => {
                let user: Rc<str> = Rc::from(user);
                self.turns.push_back(user.clone());
                self.flows.insert(user, VecDeque::from([entry]));
            }
        }
        self.queued += 1;
        self.long_running += u32::from(long_running);
        Ok(Admission::Queued(ticket))
    }

    /// A granted stream is free again; the next user in turn gets it.
    pub fn release(&mut self, long_running: bool, granted: impl FnMut(Ticket, W)) {
        self.in_use = self.in_use.saturating_sub(1);
        if long_running {
            self.long_running = self.long_running.saturating_sub(1);
        }
        self.dispatch(granted);
    }

    /// A waiting request gave up (its wait limit passed, or its client went away). False when
    /// it is not waiting any more (it was granted: the caller then holds a stream to release).
    pub fn cancel(&mut self, user: &str, ticket: Ticket) -> bool {
        let Some(queue) = self.flows.get_mut(user) else {
            return false;
        };
        let Some(position) = queue.iter().position(|waiting| waiting.ticket == ticket) else {
            return false;
        };
        let removed = queue.remove(position);
        if queue.is_empty() {
            self.flows.remove(user);
            self.turns.retain(|turn| &**turn != user);
        }
        self.queued -= 1;
        if removed.is_some_and(|waiting| waiting.long_running) {
            self.long_running = self.long_running.saturating_sub(1);
        }
        true
    }

    /// Free streams to waiting requests, one user at a time in turn.
    fn dispatch(&mut self, mut granted: impl FnMut(Ticket, W)) {
        while self.in_use < self.limits.capacity {
            let Some(user) = self.turns.pop_front() else {
                return;
            };
            let Some(queue) = self.flows.get_mut(&user) else {
                continue;
            };
            let Some(waiting) = queue.pop_front() else {
                self.flows.remove(&user);
                continue;
            };
            if queue.is_empty() {
                self.flows.remove(&user);
            } else {
                self.turns.push_back(user);
            }
            self.queued -= 1;
            self.in_use += 1;
            granted(waiting.ticket, waiting.waiter);
        }
    }
}

/// Users whose entry stays when their last long-running request ends, so that a user who
/// watches again allocates nothing; past it an idle entry is dropped (memory stays bounded by
/// this plus the users with something open).
const IDLE_USERS_KEPT: usize = 1024;

/// Open long-running requests by user (shared by the counters of every config generation).
type OpenByUser = Rc<RefCell<HashMap<Box<str>, u32>>>;

/// Long-running requests open per user on one core for one cluster (see the module comment).
#[derive(Debug)]
pub struct LongRunningUsers {
    max_per_user: u32,
    open: OpenByUser,
}

/// One open long-running request of a user; dropping it frees the user's slot.
#[derive(Debug)]
#[must_use = "dropping the slot frees it at once"]
pub struct LongRunningSlot {
    open: OpenByUser,
    user: Rc<UserInfo>,
}

impl Drop for LongRunningSlot {
    fn drop(&mut self) {
        let mut open = self.open.borrow_mut();
        let crowded = open.len() > IDLE_USERS_KEPT;
        if let Some(count) = open.get_mut(self.user.name.as_str()) {
            *count = count.saturating_sub(1);
            if *count == 0 && crowded {
                open.remove(self.user.name.as_str());
            }
        }
    }
}

impl LongRunningUsers {
    pub fn new(max_per_user: u32) -> Self {
        Self {
            max_per_user,
            open: OpenByUser::default(),
        }
    }

    /// The same counts under a new limit (a config reload): requests open before it still
    /// count, and free their slot here when they end.
    pub fn with_limit(previous: &LongRunningUsers, max_per_user: u32) -> Self {
        Self {
            max_per_user,
            open: previous.open.clone(),
        }
    }

    pub fn open(&self, user: &str) -> u32 {
        self.open.borrow().get(user).copied().unwrap_or(0)
    }

    /// Users with an entry (something open, or idle within [`IDLE_USERS_KEPT`]).
    pub fn users(&self) -> usize {
        self.open.borrow().len()
    }

    pub fn acquire(&self, user: &Rc<UserInfo>) -> Result<LongRunningSlot, FairShareRefusal> {
        let mut open = self.open.borrow_mut();
        match open.get_mut(user.name.as_str()) {
            Some(count) if *count >= self.max_per_user => {
                return Err(FairShareRefusal::UserLongRunning)
            }
            Some(count) => *count += 1,
            None if self.max_per_user == 0 => return Err(FairShareRefusal::UserLongRunning),
            None => {
                open.insert(Box::from(user.name.as_str()), 1);
            }
        }
        Ok(LongRunningSlot {
            open: self.open.clone(),
            user: user.clone(),
        })
    }
}

/// The per-core long-running budgets of one cluster (from its `connectionPool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LongRunningLimits {
    /// `maxLongRunningPerUser`.
    pub per_user: u32,
    /// `maxUpgradeConnections`.
    pub upgrades: u32,
}

/// Upgraded connections (exec, attach, port-forward) open on one core to one cluster's
/// apiservers (see the module comment); shared by the counters of every config generation.
#[derive(Debug)]
pub struct UpgradeSlots {
    max: u32,
    open: Rc<Cell<u32>>,
}

/// One open upgrade; dropping it frees its slot.
#[derive(Debug)]
#[must_use = "dropping the slot frees it at once"]
pub struct UpgradeSlot {
    open: Rc<Cell<u32>>,
}

impl Drop for UpgradeSlot {
    fn drop(&mut self) {
        self.open.set(self.open.get().saturating_sub(1));
    }
}

impl UpgradeSlots {
    /// Slots for at most `max` upgrades, counting on from `previous` (a config reload).
    pub fn new(max: u32, previous: Option<&UpgradeSlots>) -> Self {
        Self {
            max,
            open: previous
                .map(|previous| previous.open.clone())
                .unwrap_or_default(),
        }
    }

    pub fn open(&self) -> u32 {
        self.open.get()
    }

    pub fn acquire(&self) -> Result<UpgradeSlot, FairShareRefusal> {
        if self.open.get() >= self.max {
            return Err(FairShareRefusal::ClusterUpgrades);
        }
        self.open.set(self.open.get() + 1);
        Ok(UpgradeSlot {
            open: self.open.clone(),
        })
    }
}

#[cfg(test)]
#[path = "fair_share/tests.rs"]
mod tests;
