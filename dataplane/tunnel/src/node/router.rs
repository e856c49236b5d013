//! The one driver of a call's routing, for both call endpoints. It makes the call's
//! `RouteState`, carries out each step the state returns (registry claims, locator lookups,
//! races, waits for tunnels and arrivals, timers, the client's reset), starts the call on the
//! route found, and feeds every outcome back to `RouteState::next_step`: no other module makes
//! or feeds a `RouteState`. It decides nothing itself.

use std::sync::Arc;
use std::time::Instant;

use h2::RecvStream;
use sluice_grpc::Code;
use sluice_locator::EventListener;

use super::answer::{ClientReset, Responder};
use super::call::CallTarget;
use super::framed::{relay_spliced, start_spliced};
use super::pumps::{CallBody, Upload};
use super::relay::{relay_local, start_local, CallHead};
use super::remote::{RemoteCall, RemoteRouting};
use super::remote_relay::relay_remote;
use super::route::{RouteEvent, RouteState, RouteStep};
use super::tunnel::{give_back, TunnelStreams};
use super::NodeShared;
use crate::error::{ErrorKind, TunnelError};
use crate::registry::AgentId;

/// Whether a call relayed down a local tunnel ended unread and may go to another tunnel: the
/// agent withdrew the tunnel without reading it (REFUSED_STREAM, see `ReadError::Refused`), the
/// node still holds all of the request it read (`Upload::replayable`) and the client has seen
/// nothing.
fn refused_unread(error: &TunnelError, replayable: bool, replied: bool) -> bool {
    replayable && error.kind() == ErrorKind::StaleTunnel && !replied
}

/// Where a routed call goes.
enum Route {
    /// A tunnel of the agent on this node.
    Local(TunnelStreams),
    /// Another node reported a ready tunnel and holds the call open.
    Remote(RemoteCall),
}

/// Whether the caller hears of a local tunnel before the call uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Readiness {
    /// The call starts on the tunnel at once.
    Silent,
    /// A routing node racing several nodes asked (`expect: 100-continue`, private endpoint):
    /// the first tunnel is reported with 100 Continue and used once that node starts the body.
    Report,
}

/// One call's routing.
pub(super) struct Router<'a> {
    pub(super) node: &'a Arc<NodeShared>,
    /// Other nodes, on the external endpoint of a node with a locator.
    pub(super) remote: Option<&'a RemoteRouting>,
    pub(super) agent: AgentId,
    pub(super) deadline: Option<Instant>,
    /// When the call arrived ([`CallTarget::arrived`]): its wait for a route starts here, so
    /// routing reads no clock of its own before its first await.
    arrived: Instant,
    /// The client's request head, forwarded to other nodes.
    pub(super) parts: &'a http::request::Parts,
    pub(super) worker: usize,
    /// The route the call last took, for its latency's label.
    taken: std::cell::Cell<crate::metrics::CallRoute>,
    /// How the call goes down a tunnel of this node.
    carry: Carry,
    /// A framed call ended at a message boundary both ways ([`Self::relay_goes_on`]).
    relay_goes_on: std::cell::Cell<bool>,
    /// The call has had a place among its agent's waiting calls on this node (the registry
    /// sets it): when it waits again, after looking at other nodes or a tunnel that failed
    /// before use, it is held to twice `tunnel.max_waiting_calls_per_agent`, not to the cap
    /// that new calls may have filled meanwhile.
    admitted: std::cell::Cell<bool>,
}

/// How a call goes down a tunnel of this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Carry {
    /// A client's gRPC call: RequestInfo from its headers, its messages wrapped (`relay.rs`).
    Relay,
    /// A routing node's framed call: its tunnel messages spliced in unread (`framed.rs`).
    Splice,
}

/// How carrying a call on a local tunnel ended.
enum Carried {
    Ended(Result<Code, TunnelError>),
    /// The tunnel failed before the call used it: routing decides again.
    Again(RouteEvent<'static>),
}

impl<'a> Router<'a> {
    pub(super) fn new(
        node: &'a Arc<NodeShared>,
        remote: Option<&'a RemoteRouting>,
        target: &CallTarget,
        parts: &'a http::request::Parts,
        worker: usize,
    ) -> Self {
        Self {
            node,
            remote,
            agent: target.agent,
            deadline: target.deadline,
            arrived: target.arrived,
            parts,
            worker,
            taken: std::cell::Cell::new(crate::metrics::CallRoute::None),
            carry: Carry::Relay,
            relay_goes_on: std::cell::Cell::new(false),
            admitted: std::cell::Cell::new(false),
        }
    }

    /// The call is a routing node's framed call (`framed.rs`).
    pub(super) fn splicing(mut self) -> Self {
        self.carry = Carry::Splice;
        self
    }

    /// The route the call took ([`CallRoute::None`](crate::metrics::CallRoute) before any).
    pub(super) fn taken(&self) -> crate::metrics::CallRoute {
        self.taken.get()
    }
}

impl Router<'_> {
    /// The route phase of a call, to its end: routes it, starts it on the route found and
    /// relays it. A tunnel that broke before the call used it, or a node called directly that
    /// did not take it, sends the call back to routing.
    pub(super) async fn drive(
        &self,
        body: RecvStream,
        readiness: Readiness,
        responder: &mut Responder,
    ) -> Result<Code, TunnelError> {
        let mut body = CallBody {
            body,
            early: Vec::new(),
            ended: false,
        };
        self.drive_body(&mut body, readiness, responder).await
    }

    /// [`Self::drive`] on a body the caller keeps: a framed stream carries further calls
    /// (`framed.rs`).
    pub(super) async fn drive_body(
        &self,
        body: &mut CallBody,
        readiness: Readiness,
        responder: &mut Responder,
    ) -> Result<Code, TunnelError> {
        let node = &**self.node;
        let head = CallHead::new(
            self.parts.uri.path(),
            &self.parts.headers,
            self.agent,
            self.deadline,
        );
        let cluster = self.remote.is_some();
        let mut now = self.arrived;
        let mut state = RouteState::new(self.agent, self.deadline, node.max_wait(), cluster, now);
        let mut step = state.start();
        let mut report = readiness == Readiness::Report;
        loop {
            let route = self
                .route(&mut state, step, now, responder)
                .await
                .inspect_err(|_| self.observe_wait(&state))?;
            let tunnel = match route {
                Route::Local(tunnel) => {
                    self.taken.set(crate::metrics::CallRoute::Local);
                    tunnel
                }
                Route::Remote(call) => {
                    self.taken.set(crate::metrics::CallRoute::Remote);
                    if call.framed {
                        node.metrics.remote_framed.inc(self.worker);
                    }
                    if call.on_kept_stream() {
                        node.metrics.relays_reused.inc(self.worker);
                    }
                    let until = state.wait_until();
                    let relayed =
                        relay_remote(node, self.remote, &head, call, body, responder, until).await;
                    match relayed {
                        Ok(outcome) => return outcome,
                        // A node called directly did not take the call after all: routing
                        // goes on as after a lost race (or ends, when the body went to it).
                        Err(unconfirmed) => {
                            now = Instant::now();
                            step = state.next_step(unconfirmed.event(), now);
                            continue;
                        }
                    }
                }
            };
            if std::mem::take(&mut report) {
                let offer = self.node.splice_private_hop;
                if let Err(error) = responder.report_ready(body, offer).await {
                    give_back(self.node, tunnel);
                    return Err(error);
                }
            }
            let carried = match self.carry {
                Carry::Relay => {
                    self.relay_local(tunnel, &head, body, &state, responder)
                        .await
                }
                Carry::Splice => self.splice_local(tunnel, body, &state, responder).await,
            };
            match carried {
                Carried::Ended(outcome) => return outcome,
                Carried::Again(failed) => {
                    now = Instant::now();
                    step = state.next_step(failed, now);
                }
            }
        }
    }

    /// A call on a tunnel of this node: started (RequestInfo down), then relayed.
    async fn relay_local(
        &self,
        mut tunnel: TunnelStreams,
        head: &CallHead<'_>,
        body: &mut CallBody,
        state: &RouteState,
        responder: &mut Responder,
    ) -> Carried {
        let mut up = match start_local(self.node, &mut tunnel, head, body).await {
            Ok(up) => up,
            Err(error) => return self.not_started(error, responder),
        };
        self.observe_wait(state);
        let call = (&mut body.body, &mut *responder);
        let relayed =
            relay_local(self.node, tunnel, &mut up, call, self.deadline, self.worker).await;
        self.relayed(relayed, up, body, responder)
    }

    /// A framed call from a routing node on a tunnel of this node: its frames spliced in.
    async fn splice_local(
        &self,
        mut tunnel: TunnelStreams,
        body: &mut CallBody,
        state: &RouteState,
        responder: &mut Responder,
    ) -> Carried {
        let (mut up, scanner) = match start_spliced(self.node, &mut tunnel, body).await {
            Ok(started) => started,
            Err(error) => return self.not_started(error, responder),
        };
        self.observe_wait(state);
        let call = (&mut *body, &mut *responder);
        let relayed = relay_spliced(
            self.node,
            tunnel,
            (&mut up, scanner),
            call,
            self.deadline,
            self.worker,
        )
        .await;
        let relayed = relayed.map(|(code, boundary)| {
            self.relay_goes_on.set(boundary);
            code
        });
        let carried = self.relayed(relayed, up, body, responder);
        if let Carried::Ended(_) = carried {
            // Once per call, not per tunnel it tried.
            self.node.metrics.private_spliced.inc(self.worker);
        }
        carried
    }

    /// Whether anything of this call's answer went out. A framed stream's head went out with
    /// its first call, so a later call on it has replied only once a byte of its own answer
    /// passed, and a splice fails `StaleTunnel` only before that (`framed.rs`).
    fn replied(&self, responder: &Responder) -> bool {
        match self.carry {
            Carry::Relay => responder.replied(),
            Carry::Splice => false,
        }
    }

    /// Whether the framed call ended at a message boundary both ways, so its stream can carry
    /// the routing node's next call.
    pub(super) fn relay_goes_on(&self) -> bool {
        self.relay_goes_on.get()
    }

    /// A tunnel that failed before the call was started on it: routing decides again.
    fn not_started(&self, error: TunnelError, responder: &Responder) -> Carried {
        Carried::Again(RouteEvent::Failed {
            error,
            replied: self.replied(responder),
        })
    }

    /// A relayed call's end; one the agent refused unread goes back to routing with all of
    /// its request.
    fn relayed(
        &self,
        relayed: Result<Code, TunnelError>,
        up: Upload,
        body: &mut CallBody,
        responder: &Responder,
    ) -> Carried {
        match relayed {
            Err(error) if refused_unread(&error, up.replayable(), self.replied(responder)) => {
                up.restore(&mut body.early, &mut body.ended);
                Carried::Again(RouteEvent::Failed {
                    error,
                    replied: false,
                })
            }
            other => Carried::Ended(other),
        }
    }

    /// The call's wait for a route, once it has one or gave up.
    fn observe_wait(&self, state: &RouteState) {
        let waited = state.waited_for(Instant::now());
        self.node.metrics.wait_duration.observe(self.worker, waited);
    }

    /// Carries out `step` (decided at `now`) and the steps after it until the call has a route
    /// or gives up. A look takes no time, so the step after it is decided at the same `now`:
    /// the clock is read once per awaited step, not per step.
    async fn route(
        &self,
        state: &mut RouteState,
        mut step: RouteStep,
        mut now: Instant,
        client: &mut impl ClientReset,
    ) -> Result<Route, TunnelError> {
        let metrics = &self.node.metrics;
        let mut arrival = None;
        loop {
            let event = match step {
                RouteStep::Look { retried } => {
                    if retried {
                        metrics.route("retried", self.worker);
                    }
                    // Listen first, so an arrival between this look and a wait is not missed.
                    arrival = self.remote.map(|remote| remote.locator.listen(self.agent));
                    let looked = RouteEvent::Looked {
                        idle_here: self.node.registry.has_idle(self.agent),
                    };
                    step = state.next_step(looked, now);
                    continue;
                }
                RouteStep::ClaimLocal { until } => {
                    let claim = super::tunnel::claim(self.node, self.agent, &self.admitted);
                    match within(until, claim).await {
                        Some(Ok(tunnel)) => return Ok(self.local(state, tunnel)),
                        Some(Err(error)) => RouteEvent::Failed {
                            error,
                            replied: false,
                        },
                        None => RouteEvent::ClaimTimedOut,
                    }
                }
                RouteStep::Locate { fresh, until } => self.locate(fresh, until).await,
                RouteStep::Race { candidates, until } => {
                    metrics.route("remote", self.worker);
                    metrics
                        .wait_duration
                        .observe(self.worker, state.waited_for(Instant::now()));
                    match self.race(&candidates, until, client).await {
                        Ok(call) => return Ok(Route::Remote(call)),
                        Err(event) => {
                            now = Instant::now();
                            step = state.next_step(event.event(&candidates), now);
                            continue;
                        }
                    }
                }
                RouteStep::Direct { candidate, until } => {
                    metrics.route("remote", self.worker);
                    metrics
                        .wait_duration
                        .observe(self.worker, state.waited_for(Instant::now()));
                    match self.direct(&candidate, until, client).await {
                        Ok(call) => return Ok(Route::Remote(call)),
                        Err(event) => {
                            let candidates = std::slice::from_ref(&candidate);
                            now = Instant::now();
                            step = state.next_step(event.event(candidates), now);
                            continue;
                        }
                    }
                }
                RouteStep::Wait { until, poll } => {
                    match self.wait(until, poll, arrival.take(), client).await {
                        Ok(tunnel) => return Ok(self.local(state, tunnel)),
                        Err(event) => event,
                    }
                }
                RouteStep::GiveUp(error) => return Err(error),
            };
            now = Instant::now();
            step = state.next_step(event, now);
        }
    }

    fn local(&self, state: &RouteState, tunnel: TunnelStreams) -> Route {
        self.node.metrics.route(state.local_label(), self.worker);
        Route::Local(tunnel)
    }

    /// Asks the locator which other nodes hold the agent.
    async fn locate(&self, fresh: bool, until: Instant) -> RouteEvent<'static> {
        let Some(remote) = self.remote else {
            return RouteEvent::LocatorFailed;
        };
        match remote.remote_nodes(self.agent, until, fresh).await {
            Ok(peers) => RouteEvent::Located(peers),
            // The locator is away: local tunnels still work; remote routing resumes with it.
            Err(error) => {
                tracing::debug!(agent = self.agent, %error, "agent lookup failed");
                RouteEvent::LocatorFailed
            }
        }
    }

    async fn race(
        &self,
        candidates: &[super::route::Peer],
        until: Instant,
        client: &mut impl ClientReset,
    ) -> Result<RemoteCall, RaceEnd> {
        let Some(remote) = self.remote else {
            return Err(RaceEnd::Lost { unreachable: false });
        };
        let raced = monoio::select! {
            raced = remote.race(candidates, self.parts, self.deadline, self.agent) => raced,
            _ = boxed_sleep_until(until) => return Err(RaceEnd::Expired),
            _ = client.reset() => return Err(RaceEnd::Reset),
        };
        raced.map_err(|failed| {
            if failed.error.kind() == ErrorKind::OverShare {
                return RaceEnd::Refused(failed.error);
            }
            tracing::info!(agent = self.agent, error = %failed.error, "no node had a ready tunnel; deciding again");
            RaceEnd::Lost {
                unreachable: failed.unreachable,
            }
        })
    }

    /// Opens the call on the only candidate; what follows (body, confirmation) is the
    /// relay's. Nothing of the request is sent when this fails.
    async fn direct(
        &self,
        candidate: &super::route::Peer,
        until: Instant,
        client: &mut impl ClientReset,
    ) -> Result<RemoteCall, RaceEnd> {
        let Some(remote) = self.remote else {
            return Err(RaceEnd::Lost { unreachable: false });
        };
        let opened = monoio::select! {
            opened = remote.direct(candidate, self.parts, self.deadline, self.agent) => opened,
            _ = boxed_sleep_until(until) => return Err(RaceEnd::Expired),
            _ = client.reset() => return Err(RaceEnd::Reset),
        };
        opened.map_err(|failed| {
            tracing::info!(agent = self.agent, error = %failed.error, "the node holding the agent cannot be reached; deciding again");
            RaceEnd::Lost {
                unreachable: failed.unreachable,
            }
        })
    }

    /// Waits for a tunnel of the agent here; `Err` with what ended the wait otherwise.
    async fn wait(
        &self,
        until: Instant,
        poll: Option<std::time::Duration>,
        arrival: Option<EventListener>,
        client: &mut impl ClientReset,
    ) -> Result<TunnelStreams, RouteEvent<'static>> {
        let arrival = async {
            match arrival {
                Some(listener) => listener.await,
                None => std::future::pending().await,
            }
        };
        let poll = async {
            match poll {
                Some(every) => boxed_sleep_until(Instant::now() + every).await,
                None => std::future::pending::<()>().await,
            }
        };
        monoio::select! {
            claimed = super::tunnel::claim(self.node, self.agent, &self.admitted) => claimed.map_err(|error| {
                RouteEvent::Failed { error, replied: false }
            }),
            _ = arrival => Err(RouteEvent::Woken),
            _ = poll => Err(RouteEvent::Woken),
            _ = client.reset() => Err(RouteEvent::ClientReset),
            _ = boxed_sleep_until(until) => Err(RouteEvent::Expired),
        }
    }
}

/// `future`, or `None` once `until` passed. The timer is made only when the future does not
/// finish at its first poll (claiming a tunnel the registry just reported idle usually does),
/// and boxed: a monoio timer is 640 bytes with 128-byte alignment, which would otherwise be part
/// of (and copied with) every call's future.
async fn within<F: std::future::Future>(until: Instant, future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(future.as_mut().poll(cx))).await;
    if let std::task::Poll::Ready(output) = first {
        return Some(output);
    }
    monoio::select! {
        biased;
        output = future => Some(output),
        () = boxed_sleep_until(until) => None,
    }
}

/// A timer kept out of the caller's future state (see [`within`]).
async fn boxed_sleep_until(until: Instant) {
    Box::pin(monoio::time::sleep_until(until.into())).await;
}

/// How a race ended without a winner.
enum RaceEnd {
    /// No node took the call; `unreachable` when one of them did not answer at all.
    Lost {
        unreachable: bool,
    },
    Expired,
    Reset,
    /// Every node refused the call for a share it is over: final.
    Refused(TunnelError),
}

impl RaceEnd {
    fn event(self, candidates: &[super::route::Peer]) -> RouteEvent<'_> {
        match self {
            RaceEnd::Refused(error) => RouteEvent::Failed {
                error,
                replied: false,
            },
            RaceEnd::Lost { unreachable: false } => RouteEvent::RaceLost(candidates),
            RaceEnd::Lost { unreachable: true } => RouteEvent::Unreachable(candidates),
            RaceEnd::Expired => RouteEvent::Expired,
            RaceEnd::Reset => RouteEvent::ClientReset,
        }
    }
}

#[cfg(test)]
#[path = "router_tests.rs"]
mod tests;
