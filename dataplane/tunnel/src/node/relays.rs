//! Framed streams a core keeps to other nodes between calls (`framed.rs`): after a clean framed
//! call the routing node keeps the stream, and the next call for the same agent to the same
//! node goes down it as the next RequestInfo, as a call goes down an agent's reused tunnel. No
//! new HTTP/2 stream, request head, 100 Continue, response head or trailers per call.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::{RecvStream, SendStream};

use super::route::Peer;
use crate::registry::AgentId;
use crate::wire::TunnelReader;

/// How long a kept stream is used for a next call. Well under the holding node's own wait for
/// one (`framed::RELAY_IDLE`), so a stream is not taken just as that node gives up on it.
const RELAY_KEPT: Duration = Duration::from_secs(3);
/// Streams kept per (node, agent): the calls to one agent in flight at once on one core.
const KEPT_PER_AGENT: usize = 128;
/// Streams kept per node: a kept stream counts against that node's limit of concurrent
/// streams on this core's connection (1,024, `H2Settings`), and new calls need the rest.
const KEPT_PER_NODE: usize = 256;
/// Streams kept per core in all; each holds a stream and a task on the holding node.
const KEPT_PER_CORE: usize = 1024;
/// While the pool is full, how often a keep may look through every kept stream for ones that
/// can no longer be used. Between looks a keep is refused at once (the stream is ended and the
/// next call opens a new one): a look per keep cost up to 1,024 checks per call under load.
const SWEEP_EVERY: Duration = Duration::from_millis(500);

/// A framed call's stream to another node, kept after the call.
pub(super) struct RelayStream {
    pub(super) node: String,
    pub(super) address: SocketAddr,
    pub(super) send: SendStream<Bytes>,
    pub(super) recv: RecvStream,
    /// What of the node's messages was read (nothing left over after a clean call).
    pub(super) reader: TunnelReader,
    /// The connection's flag: that node offered framed calls on it.
    pub(super) offers: Rc<Cell<bool>>,
}

/// What the pool keeps: a stream to a node, usable or not for a next call. A trait so the
/// pool's bookkeeping is tested without sockets.
pub(super) trait Keepable {
    fn node(&self) -> SocketAddr;
    fn usable(&self, kept_at: Instant, now: Instant) -> bool;
}

impl Keepable for RelayStream {
    fn node(&self) -> SocketAddr {
        self.address
    }

    /// Usable for a next call: kept briefly, and not ended by the holding node meanwhile.
    fn usable(&self, kept_at: Instant, now: Instant) -> bool {
        now.duration_since(kept_at) < RELAY_KEPT && !self.recv.is_end_stream()
    }
}

/// Kept streams by node and agent, each with when it was kept.
type Kept<S> = HashMap<(SocketAddr, AgentId), Vec<(Instant, S)>>;

/// One core's kept streams. Dropping one resets it, which ends it on the holding node.
pub(super) struct RelayPool<S = RelayStream> {
    kept: RefCell<Kept<S>>,
    count: Cell<usize>,
    /// Streams kept per node.
    per_node: RefCell<HashMap<SocketAddr, usize>>,
    /// When a full pool was last looked through.
    swept_at: Cell<Option<Instant>>,
    /// Streams looked at by sweeps so far: what the tests bound.
    #[cfg(test)]
    swept: Cell<usize>,
}

impl<S> Default for RelayPool<S> {
    fn default() -> Self {
        Self {
            kept: RefCell::default(),
            count: Cell::default(),
            per_node: RefCell::default(),
            swept_at: Cell::default(),
            #[cfg(test)]
            swept: Cell::default(),
        }
    }
}

impl<S> std::fmt::Debug for RelayPool<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayPool")
            .field("count", &self.count.get())
            .finish_non_exhaustive()
    }
}

impl<S: Keepable> RelayPool<S> {
    /// A usable kept stream to one of `candidates` for `agent`, the most recently kept first.
    pub(super) fn take(&self, candidates: &[Peer], agent: AgentId) -> Option<S> {
        self.take_at(candidates, agent, Instant::now())
    }

    fn take_at(&self, candidates: &[Peer], agent: AgentId, now: Instant) -> Option<S> {
        let mut kept = self.kept.borrow_mut();
        for (_, address) in candidates {
            let Some(streams) = kept.get_mut(&(*address, agent)) else {
                continue;
            };
            let mut found = None;
            while let Some((kept_at, stream)) = streams.pop() {
                self.forget(*address, 1);
                if stream.usable(kept_at, now) {
                    found = Some(stream);
                    break;
                }
            }
            if streams.is_empty() {
                kept.remove(&(*address, agent));
            }
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// Keeps a stream after a clean call; gives it back when the pool is full (the caller ends
    /// it).
    pub(super) fn keep(&self, agent: AgentId, stream: S) -> Option<S> {
        self.keep_at(agent, stream, Instant::now())
    }

    fn keep_at(&self, agent: AgentId, stream: S, now: Instant) -> Option<S> {
        let mut kept = self.kept.borrow_mut();
        let node = stream.node();
        let full = |pool: &Self| {
            pool.count.get() >= KEPT_PER_CORE
                || pool.per_node.borrow().get(&node).copied().unwrap_or(0) >= KEPT_PER_NODE
        };
        if full(self) {
            let due = self
                .swept_at
                .get()
                .is_none_or(|at| now.saturating_duration_since(at) >= SWEEP_EVERY);
            if !due {
                return Some(stream);
            }
            self.swept_at.set(Some(now));
            #[cfg(test)]
            self.swept.set(self.swept.get() + self.count.get());
            // Drop what can no longer be used before refusing.
            kept.retain(|(address, _), streams| {
                let before = streams.len();
                streams.retain(|(kept_at, stream)| stream.usable(*kept_at, now));
                self.forget(*address, before - streams.len());
                !streams.is_empty()
            });
            if full(self) {
                return Some(stream);
            }
        }
        let streams = kept.entry((node, agent)).or_default();
        if streams.len() >= KEPT_PER_AGENT {
            // The oldest goes: the newest is the likeliest to be taken and still usable.
            streams.remove(0);
            self.forget(node, 1);
        }
        streams.push((now, stream));
        self.count.set(self.count.get() + 1);
        *self.per_node.borrow_mut().entry(node).or_default() += 1;
        None
    }

    /// Counts `gone` streams to `node` as no longer kept.
    fn forget(&self, node: SocketAddr, gone: usize) {
        if gone == 0 {
            return;
        }
        self.count.set(self.count.get() - gone);
        let mut per_node = self.per_node.borrow_mut();
        if let Some(count) = per_node.get_mut(&node) {
            *count -= gone;
            if *count == 0 {
                per_node.remove(&node);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A kept stream: its node, an id, and whether the node ended it.
    #[derive(Debug, PartialEq)]
    struct Fake(SocketAddr, u32, bool);

    impl Keepable for Fake {
        fn node(&self) -> SocketAddr {
            self.0
        }

        fn usable(&self, kept_at: Instant, now: Instant) -> bool {
            now.duration_since(kept_at) < RELAY_KEPT && !self.2
        }
    }

    fn node(last: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, last], 8443))
    }

    fn peer(last: u8) -> Peer {
        (format!("node-{last}"), node(last))
    }

    #[test]
    fn the_newest_usable_stream_of_the_agent_on_a_candidate_is_taken() {
        let pool = RelayPool::default();
        let now = Instant::now();
        assert!(pool.keep_at(7, Fake(node(1), 1, false), now).is_none());
        assert!(pool.keep_at(7, Fake(node(1), 2, true), now).is_none());
        assert!(pool.keep_at(8, Fake(node(1), 3, false), now).is_none());
        assert!(pool.keep_at(7, Fake(node(2), 4, false), now).is_none());
        // Node 2 is not a candidate; on node 1 the newest (2) was ended, so 1 is taken.
        assert_eq!(
            pool.take_at(&[peer(1)], 7, now),
            Some(Fake(node(1), 1, false))
        );
        assert_eq!(pool.take_at(&[peer(1)], 7, now), None);
        assert_eq!(pool.count.get(), 2, "agent 8's and node 2's remain");
        // Too old to use.
        let later = now + RELAY_KEPT;
        assert_eq!(pool.take_at(&[peer(2)], 7, later), None);
        assert_eq!(
            pool.take_at(&[peer(1)], 8, now),
            Some(Fake(node(1), 3, false))
        );
        assert_eq!(pool.count.get(), 0);
        assert!(pool.per_node.borrow().is_empty());
    }

    #[test]
    fn an_agent_keeps_its_newest_streams_and_a_node_is_never_filled() {
        let pool = RelayPool::default();
        let now = Instant::now();
        for id in 0..KEPT_PER_AGENT as u32 + 5 {
            assert!(pool.keep_at(7, Fake(node(1), id, false), now).is_none());
        }
        assert_eq!(pool.count.get(), KEPT_PER_AGENT, "the oldest five went");
        let newest = pool.take_at(&[peer(1)], 7, now).unwrap();
        assert_eq!(newest.1, KEPT_PER_AGENT as u32 + 4);
        // Other agents on the same node fill it up to its share, then are refused.
        let mut refused = 0;
        for agent in 8..20 {
            for id in 0..KEPT_PER_AGENT as u32 {
                if pool.keep_at(agent, Fake(node(1), id, false), now).is_some() {
                    refused += 1;
                }
            }
        }
        assert_eq!(pool.per_node.borrow()[&node(1)], KEPT_PER_NODE);
        assert!(refused > 0);
        // What can no longer be used makes room.
        let later = now + RELAY_KEPT;
        assert!(pool.keep_at(30, Fake(node(1), 0, false), later).is_none());
        assert_eq!(pool.count.get(), 1);
        // Another node has its own share.
        assert!(pool.keep_at(7, Fake(node(2), 0, false), later).is_none());
        assert_eq!(pool.count.get(), 2);
    }

    /// A full pool is looked through at most once per `SWEEP_EVERY`, however many keeps it
    /// refuses; a look that is due frees what can no longer be used.
    #[test]
    fn a_full_pool_is_swept_once_per_interval_not_once_per_keep() {
        let pool = RelayPool::default();
        let now = Instant::now();
        let mut id = 0;
        for agent in 0..KEPT_PER_CORE / KEPT_PER_AGENT {
            let address = node(agent as u8 / 2);
            for _ in 0..KEPT_PER_AGENT {
                id += 1;
                assert!(pool
                    .keep_at(agent as AgentId, Fake(address, id, false), now)
                    .is_none());
            }
        }
        assert_eq!(pool.count.get(), KEPT_PER_CORE);
        for keep in 0..1_000u32 {
            let at = now + Duration::from_micros(u64::from(keep));
            assert!(pool.keep_at(99, Fake(node(50), keep, false), at).is_some());
        }
        assert_eq!(
            pool.swept.get(),
            KEPT_PER_CORE,
            "one sweep for 1,000 refused keeps"
        );
        // Past the interval and the streams' use-by time: the next keep sweeps and is kept.
        let later = now + RELAY_KEPT;
        assert!(pool.keep_at(99, Fake(node(50), 0, false), later).is_none());
        assert_eq!(pool.swept.get(), 2 * KEPT_PER_CORE);
        assert_eq!(pool.count.get(), 1);
    }
}
