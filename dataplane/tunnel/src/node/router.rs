//! The I/O around `route`: carries out each step (registry claims, locator
//! lookups, races, waits for tunnels and arrivals, timers, the client's reset) and feeds what
//! happened back to `RouteState::next_step`. It decides nothing itself.

use std::time::Instant;

use sluice_locator::EventListener;

use super::answer::Responder;
use super::remote::{RemoteCall, RemoteRouting};
use super::route::{RouteEvent, RouteState, RouteStep};
use super::tunnel::TunnelStreams;
use super::NodeShared;
use crate::error::TunnelError;
use crate::registry::AgentId;

/// Where a routed call goes.
pub(super) enum Route {
    /// A tunnel of the agent on this node.
    Local(TunnelStreams),
    /// Another node reported a ready tunnel and holds the call open.
    Remote(RemoteCall),
}

/// One call's routing I/O.
pub(super) struct Router<'a> {
    pub(super) node: &'a NodeShared,
    /// Other nodes, on the external endpoint of a node with a locator.
    pub(super) remote: Option<&'a RemoteRouting>,
    pub(super) agent: AgentId,
    pub(super) deadline: Option<Instant>,
    /// The client's request head, forwarded to other nodes.
    pub(super) parts: &'a http::request::Parts,
    pub(super) worker: usize,
}

impl Router<'_> {
    /// Carries out `step` and the steps after it until the call has a route or gives up.
    pub(super) async fn route(
        &self,
        state: &mut RouteState,
        mut step: RouteStep,
        responder: &mut Responder,
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
                    RouteEvent::Looked {
                        idle_here: self.node.registry.has_idle(self.agent),
                    }
                }
                RouteStep::ClaimLocal { until } => {
                    let claim = self.node.registry.acquire(self.agent);
                    match monoio::time::timeout_at(until.into(), claim).await {
                        Ok(tunnel) => return Ok(self.local(state, tunnel)),
                        Err(_) => RouteEvent::ClaimTimedOut,
                    }
                }
                RouteStep::Locate { fresh, until } => {
                    step = self.locate(state, fresh, until).await;
                    continue;
                }
                RouteStep::Race { candidates, until } => {
                    metrics.route("remote", self.worker);
                    metrics
                        .wait_duration
                        .observe(self.worker, state.waited_for(Instant::now()));
                    match self.race(&candidates, until, responder).await {
                        Ok(call) => return Ok(Route::Remote(call)),
                        Err(event) => {
                            step = state.next_step(event.event(&candidates), Instant::now());
                            continue;
                        }
                    }
                }
                RouteStep::Wait { until, poll } => {
                    match self.wait(until, poll, arrival.take(), responder).await {
                        Ok(tunnel) => return Ok(self.local(state, tunnel)),
                        Err(event) => event,
                    }
                }
                RouteStep::GiveUp(error) => return Err(error),
            };
            step = state.next_step(event, Instant::now());
        }
    }

    fn local(&self, state: &RouteState, tunnel: TunnelStreams) -> Route {
        self.node.metrics.route(state.local_label(), self.worker);
        Route::Local(tunnel)
    }

    async fn locate(&self, state: &mut RouteState, fresh: bool, until: Instant) -> RouteStep {
        let Some(remote) = self.remote else {
            return state.next_step(RouteEvent::LocatorFailed, Instant::now());
        };
        match remote.remote_nodes(self.agent, until, fresh).await {
            Ok(peers) => state.next_step(RouteEvent::Located(&peers), Instant::now()),
            // The locator is away: local tunnels still work; remote routing resumes with it.
            Err(error) => {
                tracing::debug!(agent = self.agent, %error, "agent lookup failed");
                state.next_step(RouteEvent::LocatorFailed, Instant::now())
            }
        }
    }

    async fn race(
        &self,
        candidates: &[super::route::Peer],
        until: Instant,
        responder: &mut Responder,
    ) -> Result<RemoteCall, RaceEnd> {
        let Some(remote) = self.remote else {
            return Err(RaceEnd::Lost);
        };
        let raced = monoio::select! {
            raced = remote.race(candidates, self.parts, self.deadline, self.agent) => raced,
            _ = monoio::time::sleep_until(until.into()) => return Err(RaceEnd::Expired),
            _ = responder.reset() => return Err(RaceEnd::Reset),
        };
        raced.map_err(|error| {
            tracing::info!(agent = self.agent, %error, "no node had a ready tunnel; deciding again");
            RaceEnd::Lost
        })
    }

    /// Waits for a tunnel of the agent here; `Err` with what ended the wait otherwise.
    async fn wait(
        &self,
        until: Instant,
        poll: Option<std::time::Duration>,
        arrival: Option<EventListener>,
        responder: &mut Responder,
    ) -> Result<TunnelStreams, RouteEvent<'static>> {
        let arrival = async {
            match arrival {
                Some(listener) => listener.await,
                None => std::future::pending().await,
            }
        };
        let poll = async {
            match poll {
                Some(every) => monoio::time::sleep(every).await,
                None => std::future::pending::<()>().await,
            }
        };
        monoio::select! {
            tunnel = self.node.registry.acquire(self.agent) => Ok(tunnel),
            _ = arrival => Err(RouteEvent::Woken),
            _ = poll => Err(RouteEvent::Woken),
            _ = responder.reset() => Err(RouteEvent::ClientReset),
            _ = monoio::time::sleep_until(until.into()) => Err(RouteEvent::Expired),
        }
    }
}

/// How a race ended without a winner.
enum RaceEnd {
    Lost,
    Expired,
    Reset,
}

impl RaceEnd {
    fn event(self, candidates: &[super::route::Peer]) -> RouteEvent<'_> {
        match self {
            RaceEnd::Lost => RouteEvent::RaceLost(candidates),
            RaceEnd::Expired => RouteEvent::Expired,
            RaceEnd::Reset => RouteEvent::ClientReset,
        }
    }
}
