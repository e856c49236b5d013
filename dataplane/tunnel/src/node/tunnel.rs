//! A tunnel as the node holds it: both directions of an agent's Connect stream. Idle, it is
//! either parked in the registry by the call that last used it, or owned by a task that offers
//! it there and watches it until a call claims it.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use http::HeaderMap;
use sluice_grpc::Code;
use sluice_metrics::PerCoreGauge;
use sluice_runtime::Closing;

use super::answer::status_headers;
use super::NodeShared;
use crate::error::{ErrorKind, TunnelError};
use crate::registry::{AgentId, QueueFull};
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
    pub(super) closing: Closing,
    /// Fired when the tunnel is parked: wakes its connection's [`unpark_stale`].
    pub(super) parked: ParkedSignal,
    pub(super) _open: OpenTunnel,
    /// Its place in the agent's `tunnel.max_tunnels_per_agent`.
    pub(super) _slot: super::quota::TunnelSlot,
}

/// Fired each time a tunnel is parked on a connection. The connection's sweep waits on it with
/// no timer while nothing is parked there: an idle agent connection then costs no wake-up (a
/// sweep every second on each of 15,000 idle connections was 15,000 wake-ups a second).
#[derive(Debug, Clone, Default)]
pub(super) struct ParkedSignal(Arc<event_listener::Event>);

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

/// Gives a tunnel back from a call that did not use it up: parked in the registry for the
/// next call of its agent, unless it has to close (its connection is closing, its agent was
/// revoked) or requests wait for an offer; then an owner task takes it (and closes it, or
/// offers it).
pub(super) fn give_back(node: &Arc<NodeShared>, tunnel: TunnelStreams) {
    if !must_close(node, &tunnel) {
        let (agent, connection_id) = (tunnel.agent, tunnel.connection_id);
        let parked = tunnel.parked.clone();
        match node.registry.park(agent, connection_id, tunnel) {
            // After the park, never before: the sweep listens before it looks, so a tunnel
            // it did not see parked has always fired a listener it holds.
            Ok(()) => {
                parked.0.notify(1);
                return;
            }
            Err(refused) => return hold(node, refused),
        }
    }
    hold(node, tunnel);
}

fn must_close(node: &NodeShared, tunnel: &TunnelStreams) -> bool {
    tunnel.closing.is_fired() || !node.still_allowed(tunnel.agent, &tunnel.token)
}

/// Hands a tunnel to an owner task ([`hold_idle`]).
fn hold(node: &Arc<NodeShared>, tunnel: TunnelStreams) {
    let node = node.clone();
    sluice_runtime::spawn_contained("tunnel-idle", hold_idle(node, tunnel));
}

/// A tunnel of `agent` for a call. Nothing watched a parked tunnel, so one that has to close
/// goes to an owner task (which closes it) and the next is taken; one the agent closed while
/// parked fails at its first send, before the client saw anything (`StaleTunnel`). Refused
/// (RESOURCE_EXHAUSTED) when `tunnel.max_waiting_calls_per_agent` calls already wait for one,
/// or twice that once the call has had a place among them (`admitted`, which the registry
/// sets).
pub(super) async fn claim(
    node: &Arc<NodeShared>,
    agent: AgentId,
    admitted: &Cell<bool>,
) -> Result<TunnelStreams, TunnelError> {
    let limit = node.agent_limits.waiting_calls;
    loop {
        let tunnel = match node.registry.acquire(agent, limit, admitted).await {
            Ok(tunnel) => tunnel,
            Err(QueueFull { waiting }) => {
                node.metrics.waiting_refused();
                return Err(TunnelError::new(
                    ErrorKind::OverShare,
                    format!(
                        "{waiting} calls already wait for a tunnel of agent {agent} on this node, \
                         the limit (tunnel.max_waiting_calls_per_agent is {limit}); retry later"
                    ),
                ));
            }
        };
        if !must_close(node, &tunnel) {
            return Ok(tunnel);
        }
        hold(node, tunnel);
    }
}

/// How long a tunnel stays parked before an owner task takes it over and watches it (for the
/// agent closing it, or its agent being revoked). Under load the next call takes a parked
/// tunnel within microseconds; this bounds how long one the agent closed goes unnoticed.
const PARKED_FOR: Duration = Duration::from_secs(1);

/// Once a connection is closing, how soon a tunnel parked on it is closed.
const CLOSING_SWEEP: Duration = Duration::from_millis(20);

/// Runs beside an agent connection's serve loop, never returning: moves the tunnels parked on
/// the connection for longer than [`PARKED_FOR`] to owner tasks, and all of them once the
/// connection is closing (drain, retirement), so its streams end and the connection can close.
/// While none is parked it sleeps until one is (`parked`) or the connection closes, so a
/// tunnel is still taken over between one and two [`PARKED_FOR`] after it was parked.
/// `agents`: the agents that opened tunnels on this connection so far (one, normally).
pub(super) async fn unpark_stale(
    node: &Arc<NodeShared>,
    closing: &Closing,
    parked: &ParkedSignal,
    agents: impl Fn() -> Vec<AgentId>,
) {
    loop {
        event_listener::listener!(parked.0 => next_park);
        let left = sweep(node, closing, &agents);
        // The timers are boxed: this future lives in every agent connection's task, and a
        // timer inline (640 bytes) would be held by every idle one, which waits with none.
        if closing.is_fired() {
            Box::pin(monoio::time::sleep(CLOSING_SWEEP)).await;
            continue;
        }
        if left == 0 {
            monoio::select! {
                () = closing.wait() => continue,
                () = next_park => {}
            }
        }
        monoio::select! {
            () = closing.wait() => {}
            () = Box::pin(monoio::time::sleep(PARKED_FOR)) => {}
        }
    }
}

/// One look at the connection's parked tunnels: the stale ones (all once it is closing) go to
/// owner tasks. Returns how many stay parked.
fn sweep(node: &Arc<NodeShared>, closing: &Closing, agents: impl Fn() -> Vec<AgentId>) -> usize {
    let fired = closing.is_fired();
    let now = Instant::now();
    let mut left = 0;
    for agent in agents() {
        let stale = node.registry.unpark(agent, |tunnel, since| {
            if !tunnel.closing.is_same(closing) {
                return false;
            }
            let stale = fired || now.saturating_duration_since(since) >= PARKED_FOR;
            left += usize::from(!stale);
            stale
        });
        for tunnel in stale {
            hold(node, tunnel);
        }
    }
    left
}

/// The tunnels of `agents` still parked on a connection that ended: dropped (their streams
/// are gone).
pub(super) fn drop_parked(node: &NodeShared, closing: &Closing, agents: &[AgentId]) {
    for agent in agents {
        drop(
            node.registry
                .unpark(*agent, |tunnel, _| tunnel.closing.is_same(closing)),
        );
    }
}
