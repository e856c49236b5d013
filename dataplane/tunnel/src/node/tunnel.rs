//! A tunnel as the node holds it: both directions of an agent's Connect stream, owned by one
//! task that parks it in the registry until a call claims it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use http::HeaderMap;
use sluice_grpc::Code;
use sluice_metrics::PerCoreGauge;

use super::answer::status_headers;
use super::NodeShared;
use crate::registry::AgentId;
use crate::wire::TunnelReader;

/// A tunnel handed from its owner to a call.
#[derive(Debug)]
pub struct TunnelStreams {
    pub agent: AgentId,
    /// SHA-256 of the token the agent opened the tunnel with.
    pub(super) token: [u8; 32],
    pub(super) connection_id: i64,
    /// Agent -> node messages.
    pub(super) recv: RecvStream,
    /// Node -> agent messages.
    pub(super) send: SendStream<Bytes>,
    /// Bytes already read from `recv`.
    pub(super) reader: TunnelReader,
    /// The agent takes further calls on this tunnel after a clean one (its Descriptor says so).
    pub(super) reusable: bool,
    /// Fired when the agent's connection closes (drain, or retired by age): a parked tunnel
    /// then closes, and the agent opens its tunnels on a new connection.
    pub(super) closing: sluice_runtime::Closing,
    pub(super) _open: OpenTunnel,
}

/// Counts a tunnel as connected for as long as it exists, on the core that opened it. Holds
/// only the gauge: a tunnel must not keep the node state (which holds the registry of tunnels)
/// alive.
#[derive(Debug)]
pub(super) struct OpenTunnel {
    connected: PerCoreGauge,
    worker: usize,
}

impl OpenTunnel {
    pub(super) fn new(connected: &PerCoreGauge, worker: usize) -> Self {
        connected.inc(worker);
        Self {
            connected: connected.clone(),
            worker,
        }
    }
}

impl Drop for OpenTunnel {
    fn drop(&mut self) {
        self.connected.dec(self.worker);
    }
}

/// Keeps an idle tunnel in the registry until a request claims it, the agent closes it, or the
/// worker drains. A claim whose requester already gave up (deadline, client gone, another node
/// won a race) puts the tunnel back instead of wasting it.
pub(super) async fn hold_idle(node: Arc<NodeShared>, mut streams: TunnelStreams) {
    enum Idle<C> {
        Claimed(C),
        Closed,
        Draining,
    }
    let closing = streams.closing.clone();
    let mut draining = std::pin::pin!(closing.wait());
    loop {
        let (agent, connection_id) = (streams.agent, streams.connection_id);
        if !node.still_allowed(agent, &streams.token) {
            let mut trailers = HeaderMap::new();
            status_headers(
                &mut trailers,
                Code::PermissionDenied,
                "the agent's token was revoked",
            );
            let _ = streams.send.send_trailers(trailers);
            return;
        }
        let tunnel_id = node.next_tunnel_id.fetch_add(1, Ordering::Relaxed);
        let claims = node.registry.offer(agent, tunnel_id, connection_id);
        let idle = monoio::select! {
            claim = claims => match claim {
                Ok(claim) => Idle::Claimed(claim),
                Err(_) => Idle::Closed,
            },
            // An idle tunnel carries nothing; any event on it (end, reset, stray data) closes it.
            _ = streams.recv.data() => Idle::Closed,
            _ = &mut draining => Idle::Draining,
        };
        match idle {
            Idle::Claimed(claim) => match claim.send(streams) {
                Ok(()) => return,
                Err(returned) => streams = returned,
            },
            Idle::Closed => {
                node.registry.withdraw(agent, tunnel_id);
                return;
            }
            Idle::Draining => {
                node.registry.withdraw(agent, tunnel_id);
                let mut trailers = HeaderMap::new();
                status_headers(&mut trailers, Code::Unavailable, "node is shutting down");
                let _ = streams.send.send_trailers(trailers);
                return;
            }
        }
    }
}

/// Gives a tunnel back to the registry from a call that did not use it up.
pub(super) fn give_back(node: &Arc<NodeShared>, tunnel: TunnelStreams) {
    let node = node.clone();
    sluice_runtime::spawn_contained("tunnel-idle", hold_idle(node, tunnel));
}
