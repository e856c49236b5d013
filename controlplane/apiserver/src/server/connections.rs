//! The connection table: who holds a connection, and which to close first when it is full.
//!
//! A connection is unauthenticated from accept until a request on it authenticates (or its
//! client certificate names a role). Unauthenticated connections may fill only part of the
//! table, and only a few per source address, so peers without credentials can never take the
//! slots of the admin and the roles. When a new connection finds that part full it does not
//! wait or fail: the oldest unauthenticated connection of the same address (or, past the
//! global part, of the address holding the most) is closed for it. A flood of idle connections
//! therefore only ever displaces itself, and a fresh connection, the newest, gets its chance to
//! authenticate.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use super::admission::Slot;
// tokio's clock: the idle deadlines are its sleeps.
use tokio::time::Instant;

/// The table's bounds (from [`super::ServerLimits`]).
#[derive(Debug, Clone, Copy)]
pub struct TableLimits {
    pub max_connections: usize,
    pub max_unauthenticated: usize,
    pub max_unauthenticated_per_address: usize,
}

/// Why a connection was not admitted (a metric's `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Every slot is held by authenticated connections.
    #[error("every connection slot is held by an authenticated client")]
    Full,
}

impl Refused {
    pub fn reason(self) -> &'static str {
        match self {
            Refused::Full => "limit",
        }
    }
}

/// One connection's shared state: the table, its task and its requests see it.
#[derive(Debug)]
pub struct Tracked {
    id: u64,
    address: IpAddr,
    opened: Instant,
    authenticated: AtomicBool,
    /// The connection's place in its identity's share of the authenticated connections.
    share: Mutex<Option<Slot>>,
    /// Set when the table closed it for a newer connection; the task then ends.
    evicted: AtomicBool,
    wake: Notify,
    in_flight: AtomicUsize,
    /// Milliseconds after `opened` that the last request started or ended.
    last_active_ms: AtomicU64,
    table: Arc<ConnectionTable>,
}

impl Tracked {
    /// The connection authenticated, holding `share`: it leaves the unauthenticated part of
    /// the table. (Two requests authenticating at once on one HTTP/2 connection: the second's
    /// slot is given back.)
    pub fn authenticated(&self, share: Slot) {
        let mut held = self.share.lock().unwrap_or_else(PoisonError::into_inner);
        if held.is_none() {
            *held = Some(share);
        }
        drop(held);
        if !self.authenticated.swap(true, Ordering::AcqRel) {
            self.table.promote(self);
        }
    }

    pub fn is_authenticated(&self) -> bool {
        self.authenticated.load(Ordering::Acquire)
    }

    /// Resolves when the table closes this connection for a newer one.
    pub async fn evicted(&self) {
        while !self.evicted.load(Ordering::Acquire) {
            self.wake.notified().await;
        }
    }

    /// A request started; the guard ends it (hold it until the response body is sent).
    pub fn request(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.touch();
        InFlight(self.clone())
    }

    fn touch(&self) {
        let elapsed = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_active_ms.store(elapsed, Ordering::Release);
    }

    /// Resolves when the connection has had no request in flight for `idle` (for an
    /// authenticated one) or `first_request` (for one without credentials yet), returning
    /// which of the two ran out.
    pub async fn idle(&self, idle: Duration, first_request: Duration) -> &'static str {
        loop {
            let (limit, reason) = if self.is_authenticated() {
                (idle, "idle")
            } else {
                (first_request, "first_request_timeout")
            };
            let last = Duration::from_millis(self.last_active_ms.load(Ordering::Acquire));
            let deadline = self.opened + last + limit;
            if self.in_flight.load(Ordering::Acquire) > 0 {
                tokio::time::sleep(limit).await;
            } else if Instant::now() >= deadline {
                return reason;
            } else {
                tokio::time::sleep_until(deadline).await;
            }
        }
    }
}

/// A request in flight on a connection.
#[derive(Debug)]
pub struct InFlight(Arc<Tracked>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The connection's place in the table, released when its task ends however it ends.
#[derive(Debug)]
pub struct Admitted(pub Arc<Tracked>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.table.close(&self.0);
    }
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    /// Connections counted against `max_connections` (an evicted one stops counting at once).
    open: usize,
    unauthenticated: usize,
    /// Unauthenticated connections per address, oldest first.
    by_address: HashMap<IpAddr, VecDeque<Arc<Tracked>>>,
}

/// Every open connection of one server.
#[derive(Debug)]
pub struct ConnectionTable {
    limits: TableLimits,
    state: Mutex<State>,
}

impl ConnectionTable {
    pub fn new(limits: TableLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            state: Mutex::default(),
        })
    }

    /// Admits a connection from `address`, closing older unauthenticated ones to make room;
    /// returns it and how many were closed for it.
    pub fn admit(self: &Arc<Self>, address: IpAddr) -> Result<(Admitted, usize), Refused> {
        let key = address_key(address);
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut evicted = 0;
        let per_address = state.by_address.get(&key).map_or(0, VecDeque::len);
        if per_address >= self.limits.max_unauthenticated_per_address {
            evicted += usize::from(evict_oldest(&mut state, key));
        }
        while state.unauthenticated >= self.limits.max_unauthenticated
            || state.open >= self.limits.max_connections
        {
            let Some(busiest) = busiest_address(&state) else {
                return Err(Refused::Full);
            };
            evicted += usize::from(evict_oldest(&mut state, busiest));
        }
        state.next_id += 1;
        let tracked = Arc::new(Tracked {
            id: state.next_id,
            address: key,
            opened: Instant::now(),
            authenticated: AtomicBool::new(false),
            share: Mutex::new(None),
            evicted: AtomicBool::new(false),
            wake: Notify::new(),
            in_flight: AtomicUsize::new(0),
            last_active_ms: AtomicU64::new(0),
            table: self.clone(),
        });
        state.open += 1;
        state.unauthenticated += 1;
        state
            .by_address
            .entry(key)
            .or_default()
            .push_back(tracked.clone());
        Ok((Admitted(tracked), evicted))
    }

    /// Open and unauthenticated connections now.
    pub fn counts(&self) -> (usize, usize) {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (state.open, state.unauthenticated)
    }

    fn promote(&self, tracked: &Tracked) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if forget(&mut state, tracked) {
            state.unauthenticated -= 1;
        }
    }

    fn close(&self, tracked: &Tracked) {
        drop(
            tracked
                .share
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if forget(&mut state, tracked) {
            state.unauthenticated -= 1;
        }
        if !tracked.evicted.load(Ordering::Acquire) {
            state.open -= 1;
        }
    }
}

/// Takes `tracked` out of its address's queue; whether it was there (unauthenticated).
fn forget(state: &mut State, tracked: &Tracked) -> bool {
    let Some(queue) = state.by_address.get_mut(&tracked.address) else {
        return false;
    };
    let Some(position) = queue.iter().position(|other| other.id == tracked.id) else {
        return false;
    };
    queue.remove(position);
    if queue.is_empty() {
        state.by_address.remove(&tracked.address);
    }
    true
}

/// Closes the oldest unauthenticated connection of `address`; whether there was one.
fn evict_oldest(state: &mut State, address: IpAddr) -> bool {
    let Some(queue) = state.by_address.get_mut(&address) else {
        return false;
    };
    let Some(oldest) = queue.pop_front() else {
        return false;
    };
    if queue.is_empty() {
        state.by_address.remove(&address);
    }
    state.unauthenticated -= 1;
    state.open -= 1;
    oldest.evicted.store(true, Ordering::Release);
    oldest.wake.notify_one();
    true
}

/// The address holding the most unauthenticated connections; of several, the one whose oldest
/// is oldest (so a newcomer from a fresh address, an admin among thousands of one-connection
/// attackers, is the last to go).
fn busiest_address(state: &State) -> Option<IpAddr> {
    state
        .by_address
        .iter()
        .max_by_key(|(_, queue)| {
            let oldest = queue.front().map_or(u64::MAX, |tracked| tracked.id);
            (queue.len(), std::cmp::Reverse(oldest))
        })
        .map(|(address, _)| *address)
}

/// The unit of the per-address cap: an IPv4 address, or an IPv6 /64 (one host's usual share;
/// a per-address cap over single IPv6 addresses would cost an attacker nothing).
fn address_key(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(_) => address,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(max: usize, unauthenticated: usize, per_address: usize) -> Arc<ConnectionTable> {
        ConnectionTable::new(TableLimits {
            max_connections: max,
            max_unauthenticated: unauthenticated,
            max_unauthenticated_per_address: per_address,
        })
    }

    /// A slot of a pool large enough never to refuse.
    fn share() -> Slot {
        use super::super::admission::{BudgetKind, Pool, PoolLimits, RoleShare};
        use crate::auth::{Identity, Role};
        let share = RoleShare {
            reserved: 0,
            per_identity: 1000,
        };
        let pool = Pool::new(
            BudgetKind::Connections,
            PoolLimits {
                total: 1000,
                shares: [share; 4],
            },
        );
        pool.acquire(&Identity::new(Role::Admin, "a").unwrap())
            .unwrap()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn one_address_displaces_only_its_own_oldest() {
        let table = table(100, 50, 3);
        let other = table.admit(ip("10.0.0.9")).unwrap().0;
        let flood: Vec<Admitted> = (0..3)
            .map(|_| table.admit(ip("10.0.0.1")).unwrap().0)
            .collect();
        let (newest, closed) = table.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(closed, 1);
        assert!(flood[0].0.evicted.load(Ordering::Acquire));
        assert!(!flood[1].0.evicted.load(Ordering::Acquire));
        assert!(!newest.0.evicted.load(Ordering::Acquire));
        assert!(!other.0.evicted.load(Ordering::Acquire));
        assert_eq!(table.counts(), (4, 4));
        drop(flood);
        assert_eq!(
            table.counts(),
            (2, 2),
            "an evicted connection is not counted twice"
        );
    }

    #[test]
    fn among_equal_addresses_the_oldest_connection_goes_first() {
        let table = table(100, 3, 10);
        let first = table.admit(ip("10.0.0.1")).unwrap().0;
        let admin = table.admit(ip("10.0.0.2")).unwrap().0;
        let third = table.admit(ip("10.0.0.3")).unwrap().0;
        let (_fourth, closed) = table.admit(ip("10.0.0.4")).unwrap();
        assert_eq!(closed, 1);
        assert!(first.0.evicted.load(Ordering::Acquire));
        assert!(!admin.0.evicted.load(Ordering::Acquire));
        let _fifth = table.admit(ip("10.0.0.5")).unwrap();
        assert!(
            admin.0.evicted.load(Ordering::Acquire),
            "then the next oldest"
        );
        assert!(!third.0.evicted.load(Ordering::Acquire));
    }

    #[test]
    fn authenticated_connections_keep_their_slots() {
        let table = table(4, 2, 10);
        let admin = table.admit(ip("10.0.0.2")).unwrap().0;
        admin.0.authenticated(share());
        let role = table.admit(ip("10.0.0.3")).unwrap().0;
        role.0.authenticated(share());
        assert_eq!(table.counts(), (2, 0));
        // The unauthenticated part (2) fills, then turns over; the admin is never closed.
        let mut flood = Vec::new();
        for _ in 0..10 {
            flood.push(table.admit(ip("10.0.0.1")).unwrap().0);
        }
        assert!(!admin.0.evicted.load(Ordering::Acquire));
        assert_eq!(table.counts(), (4, 2));
        // A client from elsewhere still gets in (displacing the flood), and authenticates.
        let late = table.admit(ip("10.0.0.4")).unwrap().0;
        late.0.authenticated(share());
        let last = table.admit(ip("10.0.0.5")).unwrap().0;
        last.0.authenticated(share());
        assert_eq!(table.counts(), (4, 0));
        assert_eq!(table.admit(ip("10.0.0.1")).unwrap_err(), Refused::Full);
        drop(last);
        assert!(table.admit(ip("10.0.0.1")).is_ok());
    }

    #[test]
    fn a_connection_gives_its_identitys_share_back_when_it_closes() {
        use super::super::admission::{BudgetKind, Pool, PoolLimits, RoleShare};
        use crate::auth::{Identity, Role};
        let one = RoleShare {
            reserved: 1,
            per_identity: 1,
        };
        let pool = Pool::new(
            BudgetKind::Connections,
            PoolLimits {
                total: 4,
                shares: [one; 4],
            },
        );
        let vm = Identity::new(Role::VmAgent, "vm-1").unwrap();
        let table = table(10, 10, 10);
        let connection = table.admit(ip("10.0.0.1")).unwrap().0;
        connection.0.authenticated(pool.acquire(&vm).unwrap());
        assert_eq!(pool.acquire(&vm).unwrap_err().budget(), "identity");
        drop(connection);
        assert!(pool.acquire(&vm).is_ok());
    }

    #[test]
    fn ipv6_addresses_share_their_64() {
        assert_eq!(
            address_key(ip("2001:db8:1:2:aaaa::1")),
            address_key(ip("2001:db8:1:2:bbbb::9"))
        );
        assert_ne!(
            address_key(ip("2001:db8:1:2::1")),
            address_key(ip("2001:db8:1:3::1"))
        );
        assert_eq!(address_key(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
    }

    /// Real time, lower bounds only: the deadlines are short and nothing asserts an upper bound.
    #[tokio::test]
    async fn idle_connections_time_out_by_whether_they_authenticated() {
        let table = table(10, 10, 10);
        let anonymous = table.admit(ip("10.0.0.1")).unwrap().0;
        let started = Instant::now();
        let limits = (Duration::from_millis(100), Duration::from_millis(50));
        assert_eq!(
            anonymous.0.idle(limits.0, limits.1).await,
            "first_request_timeout"
        );
        assert!(started.elapsed() >= limits.1);
        let known = table.admit(ip("10.0.0.2")).unwrap().0;
        known.0.authenticated(share());
        let request = known.0.request();
        let idle = known.0.idle(limits.0, limits.1);
        tokio::pin!(idle);
        tokio::select! {
            _ = &mut idle => panic!("a connection with a request in flight is not idle"),
            _ = tokio::time::sleep(Duration::from_millis(400)) => {}
        }
        drop(request);
        assert_eq!(idle.await, "idle");
    }
}
