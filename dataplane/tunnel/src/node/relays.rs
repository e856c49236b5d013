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
/// Streams kept per core in all; each holds a stream and a task on the holding node.
const KEPT_PER_CORE: usize = 1024;

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

impl RelayStream {
    /// Usable for a next call: kept briefly, and not ended by the holding node meanwhile.
    fn usable(&self, kept_at: Instant, now: Instant) -> bool {
        now.duration_since(kept_at) < RELAY_KEPT && !self.recv.is_end_stream()
    }
}

/// Kept streams by node and agent, each with when it was kept.
type Kept = HashMap<(SocketAddr, AgentId), Vec<(Instant, RelayStream)>>;

/// One core's kept streams. Dropping one resets it, which ends it on the holding node.
#[derive(Default)]
pub(super) struct RelayPool {
    kept: RefCell<Kept>,
    count: Cell<usize>,
}

impl std::fmt::Debug for RelayPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayPool")
            .field("count", &self.count.get())
            .finish_non_exhaustive()
    }
}

impl RelayPool {
    /// A usable kept stream to one of `candidates` for `agent`, the most recently kept first.
    pub(super) fn take(&self, candidates: &[Peer], agent: AgentId) -> Option<RelayStream> {
        let now = Instant::now();
        let mut kept = self.kept.borrow_mut();
        for (_, address) in candidates {
            let Some(streams) = kept.get_mut(&(*address, agent)) else {
                continue;
            };
            let mut found = None;
            while let Some((kept_at, stream)) = streams.pop() {
                self.count.set(self.count.get() - 1);
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
    pub(super) fn keep(&self, agent: AgentId, stream: RelayStream) -> Option<RelayStream> {
        let now = Instant::now();
        let mut kept = self.kept.borrow_mut();
        if self.count.get() >= KEPT_PER_CORE {
            // Drop what can no longer be used before refusing.
            let mut count = 0;
            kept.retain(|_, streams| {
                streams.retain(|(kept_at, stream)| stream.usable(*kept_at, now));
                count += streams.len();
                !streams.is_empty()
            });
            self.count.set(count);
            if count >= KEPT_PER_CORE {
                return Some(stream);
            }
        }
        let streams = kept.entry((stream.address, agent)).or_default();
        if streams.len() >= KEPT_PER_AGENT {
            // The oldest goes: the newest is the likeliest to be taken and still usable.
            streams.remove(0);
            self.count.set(self.count.get() - 1);
        }
        streams.push((now, stream));
        self.count.set(self.count.get() + 1);
        None
    }
}
