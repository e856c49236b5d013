//! Where a call goes, decided as a plain function over plain data.
//!
//! [`RouteState::next_step`] takes what the driver (`router`) observed and returns what
//! to do next: claim this node's idle tunnel, ask the locator, race other nodes, wait, or give up
//! with an error. It reads no clock (the driver passes `now`) and touches no socket, so every
//! branch is tested below without I/O.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sluice_grpc::Code;

use crate::error::{ErrorKind, TunnelError};
use crate::registry::AgentId;

/// How often a call waiting for its agent asks the locator again, in case an arrival message
/// was lost (Redis reconnect); pub/sub wakes it sooner.
pub const ROUTE_POLL: Duration = Duration::from_secs(2);

/// How long a call whose remote routing failed (the locator did not answer, or every node it
/// lists failed the call) still waits for a tunnel to arrive before it fails with UNAVAILABLE:
/// enough for an agent's quick reconnect to rescue it, short enough that the client can retry
/// through another node well inside its deadline instead of burning it on this one.
pub const REMOTE_FAILURE_GRACE: Duration = Duration::from_secs(1);

/// Another node holding the agent: its name and private endpoint.
pub type Peer = (String, SocketAddr);

/// One call's routing so far.
#[derive(Debug, Clone)]
pub struct RouteState {
    agent: AgentId,
    arrived: Instant,
    deadline: Option<Instant>,
    /// The earlier of the deadline and the node's `max_wait` from the call's arrival.
    wait_until: Instant,
    max_wait: Duration,
    /// Whether other nodes may hold the agent (a locator, on the external endpoint).
    cluster: bool,
    /// Whether the call has waited for a tunnel (counted as "waited", asks the locator afresh).
    waited: bool,
    /// Nodes whose race this call lost; not asked again.
    tried: Vec<String>,
    /// Since when remote routing has been failing this call, and why (UNAVAILABLE once the
    /// grace is over); cleared when the locator answers with a node still to try.
    remote_failure: Option<RemoteFailure>,
    /// A node this call tried did not answer at all: when every listed node is tried, remote
    /// routing has failed (a partition), not merely moved (nodes restarting).
    unreachable_tried: bool,
}

/// Why a call cannot be routed to another node.
#[derive(Debug, Clone)]
struct RemoteFailure {
    since: Instant,
    kind: ErrorKind,
    message: String,
}

/// What the driver observed since the last step.
#[derive(Debug)]
pub enum RouteEvent<'a> {
    /// The registry was looked at: whether this node holds an idle tunnel of the agent.
    Looked { idle_here: bool },
    /// Claiming the idle tunnel took until the end of the wait (another call took it).
    ClaimTimedOut,
    /// The locator listed these other nodes (this node left out).
    Located(Vec<Peer>),
    /// The locator did not answer; local tunnels still work.
    LocatorFailed,
    /// An arrival of the agent, or the poll interval passed.
    Woken,
    /// The wait (or a race) reached `wait_until`.
    Expired,
    /// The client reset the call.
    ClientReset,
    /// The race among these nodes found none with a ready tunnel; each answered (refused the
    /// connection or the stream: a node going away, whose agents reconnect elsewhere).
    RaceLost(&'a [Peer]),
    /// As `RaceLost`, but at least one of these nodes did not answer at all (a partition).
    Unreachable(&'a [Peer]),
    /// The one node a call was sent to directly ended it before confirming a tunnel (it
    /// answered without one, its stream broke); `forwarded`: whether any byte of the client's
    /// request body went to it. Only a call that forwarded nothing may be routed again.
    Unconfirmed {
        peer: &'a Peer,
        error: TunnelError,
        forwarded: bool,
    },
    /// Starting the call failed; `replied`: whether the client already got part of an answer.
    Failed { error: TunnelError, replied: bool },
}

/// What the driver does next.
#[derive(Debug, PartialEq, Eq)]
pub enum RouteStep {
    /// Look at the registry (arm the arrival listener first) and report `Looked`;
    /// `retried`: the call is routed again after a failure.
    Look { retried: bool },
    /// Claim this node's idle tunnel, waiting at most until `until`.
    ClaimLocal { until: Instant },
    /// Ask the locator which other nodes hold the agent; `fresh`: not from the core's cache.
    Locate { fresh: bool, until: Instant },
    /// Open the call on every candidate at once; the first with a ready tunnel wins.
    Race {
        candidates: Vec<Peer>,
        until: Instant,
    },
    /// Send the call to the only candidate at once, request body included, without waiting
    /// for its 100 Continue first; until the node confirms a tunnel (the 100 still comes), the
    /// call is bound by `until` as a race is.
    Direct { candidate: Peer, until: Instant },
    /// Wait for a local tunnel or an arrival until `until`; with `poll`, wake after that long
    /// to ask the locator again.
    Wait {
        until: Instant,
        poll: Option<Duration>,
    },
    /// Answer the client with this error.
    GiveUp(TunnelError),
}

impl RouteStep {
    /// How a call reaches other nodes: several candidates are raced (each confirms a tunnel
    /// with 100 Continue before any body byte leaves this node, so the losers cost nothing);
    /// a single one has nobody to race, and the round trip of its confirmation is skipped.
    pub fn remote(mut candidates: Vec<Peer>, until: Instant) -> RouteStep {
        if candidates.len() == 1 {
            if let Some(candidate) = candidates.pop() {
                return RouteStep::Direct { candidate, until };
            }
        }
        RouteStep::Race { candidates, until }
    }
}

impl RouteState {
    /// A call for `agent` arriving at `now`.
    pub fn new(
        agent: AgentId,
        deadline: Option<Instant>,
        max_wait: Duration,
        cluster: bool,
        now: Instant,
    ) -> Self {
        let wait_until = deadline.map_or(now + max_wait, |deadline| deadline.min(now + max_wait));
        Self {
            agent,
            arrived: now,
            deadline,
            wait_until,
            max_wait,
            cluster,
            waited: false,
            tried: Vec::new(),
            remote_failure: None,
            unreachable_tried: false,
        }
    }

    /// The first step of every call.
    pub fn start(&self) -> RouteStep {
        RouteStep::Look { retried: false }
    }

    pub fn wait_until(&self) -> Instant {
        self.wait_until
    }

    /// Seconds since the call arrived (the wait-duration metric).
    pub fn waited_for(&self, now: Instant) -> f64 {
        now.saturating_duration_since(self.arrived).as_secs_f64()
    }

    /// The route metric a local tunnel counts under.
    pub fn local_label(&self) -> &'static str {
        if self.waited {
            "waited"
        } else {
            "local"
        }
    }

    /// Decides the next step from the last observation.
    pub fn next_step(&mut self, event: RouteEvent<'_>, now: Instant) -> RouteStep {
        match event {
            // Bounded like a wait's poll: the tunnel seen idle may be gone by the claim (taken
            // by another call, or closed by a drain), and the call then looks again, elsewhere
            // too, instead of waiting its whole max_wait for a tunnel on this node.
            RouteEvent::Looked { idle_here: true } => RouteStep::ClaimLocal {
                until: self.wait_until.min(now + ROUTE_POLL),
            },
            RouteEvent::Looked { idle_here: false } if now >= self.wait_until => {
                RouteStep::GiveUp(self.expired())
            }
            RouteEvent::Looked { idle_here: false } | RouteEvent::ClaimTimedOut => {
                self.locate_or_wait(now)
            }
            RouteEvent::Located(mut candidates) => {
                let listed = candidates.clone();
                candidates.retain(|(name, _)| !self.tried.contains(name));
                if !candidates.is_empty() {
                    self.remote_failure = None;
                    return RouteStep::remote(candidates, self.wait_until);
                }
                if listed.is_empty() || !self.unreachable_tried {
                    // Nobody holds the agent, or only nodes that refused the call (going away:
                    // their agents reconnect elsewhere): wait for it to arrive, as allowed.
                    self.remote_failure = None;
                } else {
                    self.failed_remotely(
                        now,
                        ErrorKind::PeerUnavailable,
                        peers_failed(self.agent, &listed),
                    );
                }
                self.wait(now)
            }
            RouteEvent::LocatorFailed => {
                let agent = self.agent;
                let message = format!(
                    "agent {agent} has no tunnel on this node and the agent tracker (Redis) \
                     did not answer, so no other node can be asked"
                );
                self.failed_remotely(now, ErrorKind::LocatorUnavailable, message);
                self.wait(now)
            }
            RouteEvent::Woken => RouteStep::Look { retried: false },
            RouteEvent::Expired => match self.remote_failure.clone() {
                Some(failure) if now < self.wait_until => {
                    RouteStep::GiveUp(TunnelError::new(failure.kind, failure.message))
                }
                _ => RouteStep::GiveUp(self.expired()),
            },
            RouteEvent::ClientReset => RouteStep::GiveUp(TunnelError::client_gone()),
            RouteEvent::RaceLost(peers) => {
                self.tried
                    .extend(peers.iter().map(|(name, _)| name.clone()));
                RouteStep::Look { retried: true }
            }
            RouteEvent::Unreachable(peers) => {
                self.unreachable_tried = true;
                self.next_step(RouteEvent::RaceLost(peers), now)
            }
            // Its bytes are gone from this node: routing it again could deliver a partial
            // request, so the call ends here.
            RouteEvent::Unconfirmed {
                error,
                forwarded: true,
                ..
            } => RouteStep::GiveUp(error),
            // It refused the call for a share it is over (its calls waiting for the agent):
            // final, as on this node; a wait here could only wait for that node's tunnels.
            RouteEvent::Unconfirmed { error, .. } if error.code() == Code::ResourceExhausted => {
                RouteStep::GiveUp(error)
            }
            // It answered, so it is going away rather than cut off: its agents reconnect
            // elsewhere, and the call waits for them as allowed.
            RouteEvent::Unconfirmed {
                peer,
                forwarded: false,
                ..
            } => self.next_step(RouteEvent::RaceLost(std::slice::from_ref(peer)), now),
            RouteEvent::Failed { error, replied } => {
                if error.retry_before_reply() && !replied {
                    RouteStep::Look { retried: true }
                } else {
                    RouteStep::GiveUp(error)
                }
            }
        }
    }

    /// Records the first reason remote routing failed (its grace runs from then).
    fn failed_remotely(&mut self, now: Instant, kind: ErrorKind, message: String) {
        if self.remote_failure.is_none() {
            self.remote_failure = Some(RemoteFailure {
                since: now,
                kind,
                message,
            });
        }
    }

    /// The end of the wait: the node's wait, or sooner the end of a remote failure's grace.
    fn wait_end(&self) -> Instant {
        match &self.remote_failure {
            Some(failure) => self.wait_until.min(failure.since + REMOTE_FAILURE_GRACE),
            None => self.wait_until,
        }
    }

    fn locate_or_wait(&mut self, now: Instant) -> RouteStep {
        if now >= self.wait_until {
            return RouteStep::GiveUp(self.expired());
        }
        if let Some(failure) = &self.remote_failure {
            if now >= failure.since + REMOTE_FAILURE_GRACE {
                return RouteStep::GiveUp(TunnelError::new(failure.kind, failure.message.clone()));
            }
        }
        if self.cluster {
            RouteStep::Locate {
                fresh: self.waited || !self.tried.is_empty(),
                until: self.wait_until,
            }
        } else {
            self.wait(now)
        }
    }

    fn wait(&mut self, now: Instant) -> RouteStep {
        if now >= self.wait_until {
            return RouteStep::GiveUp(self.expired());
        }
        self.waited = true;
        RouteStep::Wait {
            until: self.wait_end(),
            poll: self.cluster.then_some(ROUTE_POLL),
        }
    }

    /// The error of a call whose wait ended: its own deadline, or the node's `max_wait`,
    /// whichever came first (both are DEADLINE_EXCEEDED; the message says which).
    fn expired(&self) -> TunnelError {
        let agent = self.agent;
        if self
            .deadline
            .is_some_and(|deadline| deadline <= self.wait_until)
        {
            return TunnelError::new(
                ErrorKind::DeadlineExceeded,
                format!("deadline exceeded while waiting for a tunnel of agent {agent}"),
            );
        }
        let scope = if self.cluster {
            "in the cluster"
        } else {
            "on this node"
        };
        TunnelError::new(
            ErrorKind::NoTunnel,
            format!(
                "agent {agent} has no free tunnel {scope} after waiting {:?}",
                self.max_wait
            ),
        )
    }
}

/// The message of a call every listed node failed: which nodes, and where.
fn peers_failed(agent: AgentId, listed: &[Peer]) -> String {
    let nodes = listed
        .iter()
        .map(|(name, address)| format!("{name} ({address})"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "agent {agent} is held only by node {nodes}, which could not take the call \
         (unreachable, or no free tunnel); see this node's log for the cause"
    )
}

/// The other nodes a locator listed, as race candidates: this node and unparsable addresses
/// left out.
pub fn peers_of(entries: Vec<sluice_locator::NodeEntry>, this_node: &str) -> Vec<Peer> {
    entries
        .into_iter()
        .filter(|entry| entry.node != this_node)
        .filter_map(|entry| {
            entry
                .private_address
                .parse()
                .ok()
                .map(|address| (entry.node, address))
        })
        .collect()
}

#[cfg(test)]
#[path = "route_tests.rs"]
mod tests;
