//! Tunnel metrics. Hot-path counters are per-core (`sluice-metrics`); labelled families are
//! looked up once per (method, code) per core and cached by the handler.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use sluice_grpc::Code;
use sluice_metrics::{Cores, PerCoreCounter, PerCoreGauge, PerCoreHistogram};

/// Distinct method names given their own label; later ones are counted as "other" so a caller
/// cannot grow the metric set without bound.
pub(crate) const MAX_METHOD_LABELS: usize = 100;

/// Longest method name given its own label (longer ones are counted as "other").
pub(crate) const MAX_METHOD_LABEL_LEN: usize = 128;

/// The method label of calls refused before their caller was authenticated: the path is the
/// caller's text and is not used as a label until the caller has proved who it is.
pub const UNAUTHENTICATED_METHOD: &str = "unauthenticated";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    method: String,
    code: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FromLabels {
    from: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AuthLabels {
    endpoint: &'static str,
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// Why an agent's new connection or tunnel was refused: the label of
/// `sluice_tunnel_agent_refused_total{reason}` (a fixed set, never the agent's own text or id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentRefusal {
    /// Over `tunnel.max_connections_per_agent`.
    Connections,
    /// Over `tunnel.max_tunnels_per_agent`.
    Tunnels,
    /// A malformed or oversized connection id, version or Descriptor.
    Descriptor,
}

impl AgentRefusal {
    pub const ALL: [AgentRefusal; 3] = [Self::Connections, Self::Tunnels, Self::Descriptor];

    pub fn label(self) -> &'static str {
        match self {
            Self::Connections => "connections",
            Self::Tunnels => "tunnels",
            Self::Descriptor => "descriptor",
        }
    }
}

/// Where a call went: the `route` label of its latency, so remote calls (a hop through another
/// node) are selectable apart from local ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallRoute {
    /// On a tunnel of this node.
    Local,
    /// Relayed to another node that holds the agent.
    Remote,
    /// Forwarded here by another node (the private endpoint), carried on a tunnel of this node.
    Private,
    /// Answered before any route: refused, shed, listed agents, or no tunnel found.
    None,
}

impl CallRoute {
    const ALL: [Self; 4] = [Self::Local, Self::Remote, Self::Private, Self::None];

    pub fn label(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Remote => "remote",
            Self::Private => "private",
            Self::None => "none",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    decision: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    code: &'static str,
}

/// Routing decisions, in the order of `ROUTE_DECISIONS`.
const ROUTE_DECISIONS: [&str; 4] = ["local", "remote", "waited", "retried"];

#[derive(Debug, Clone)]
pub struct TunnelMetrics {
    routes: Vec<PerCoreCounter>,
    private_requests: Vec<PerCoreCounter>,
    requests: Family<CallLabels, PerCoreCounter, Cores>,
    auth_failures: Family<AuthLabels, Counter>,
    metadata_refused: Family<FromLabels, Counter>,
    peers_refused: Counter,
    peer_connect_failures: Counter,
    buffer_refused: Counter,
    waiting_refused: Counter,
    agent_refused: Family<ReasonLabels, Counter>,
    pub tunnels_connected: PerCoreGauge,
    /// One child per [`CallRoute`], resolved at start so observing allocates nothing.
    request_duration: Vec<PerCoreHistogram>,
    pub wait_duration: PerCoreHistogram,
    pub protocol_errors: PerCoreCounter,
    pub tunnels_reused: PerCoreCounter,
    /// Framed calls from other nodes spliced into a tunnel of this node.
    pub private_spliced: PerCoreCounter,
    /// Calls this node sent framed to another node.
    pub remote_framed: PerCoreCounter,
    /// Of those, calls sent on a framed stream kept from an earlier call.
    pub relays_reused: PerCoreCounter,
    methods: Arc<Mutex<HashSet<String>>>,
}

impl TunnelMetrics {
    pub fn register(registry: &mut Registry, workers: usize) -> Self {
        let route_family = Family::<DecisionLabels, PerCoreCounter, Cores>::new_with_constructor(
            Cores::new(workers),
        );
        let duration_family = Family::<RouteLabels, PerCoreHistogram, Cores>::new_with_constructor(
            Cores::new(workers),
        );
        let private_family =
            Family::<CodeLabels, PerCoreCounter, Cores>::new_with_constructor(Cores::new(workers));
        let metrics = Self {
            routes: ROUTE_DECISIONS
                .iter()
                .map(|decision| {
                    route_family
                        .get_or_create(&DecisionLabels { decision })
                        .clone()
                })
                .collect(),
            private_requests: (0..=16u32)
                .map(|code| {
                    private_family
                        .get_or_create(&CodeLabels {
                            code: Code::from_u32(code).name(),
                        })
                        .clone()
                })
                .collect(),
            requests: Family::new_with_constructor(Cores::new(workers)),
            auth_failures: Family::default(),
            metadata_refused: Family::default(),
            peers_refused: Counter::default(),
            peer_connect_failures: Counter::default(),
            buffer_refused: Counter::default(),
            waiting_refused: Counter::default(),
            agent_refused: Family::default(),
            tunnels_connected: PerCoreGauge::new(workers),
            request_duration: CallRoute::ALL
                .iter()
                .map(|route| {
                    duration_family
                        .get_or_create(&RouteLabels {
                            route: route.label(),
                        })
                        .clone()
                })
                .collect(),
            wait_duration: PerCoreHistogram::new(workers, PerCoreHistogram::latency_bounds()),
            protocol_errors: PerCoreCounter::new(workers),
            tunnels_reused: PerCoreCounter::new(workers),
            private_spliced: PerCoreCounter::new(workers),
            remote_framed: PerCoreCounter::new(workers),
            relays_reused: PerCoreCounter::new(workers),
            methods: Arc::default(),
        };
        registry.register(
            "sluice_tunnel_routes",
            "Routing decisions: local tunnel at once, remote node, local after waiting, retried",
            route_family,
        );
        registry.register(
            "sluice_tunnel_private_requests",
            "Calls other nodes forwarded to this node's private endpoint, by gRPC status code",
            private_family,
        );
        registry.register(
            "sluice_tunnel_request_duration_seconds",
            "Time from a call's arrival to its last byte relayed, by route (local, remote, \
             private: forwarded here by another node, none: answered before routing)",
            duration_family,
        );
        metrics.register_refusals(registry);
        metrics.register_traffic(registry);
        metrics
    }

    /// Observes one call's time, arrival to last byte, under the route it took.
    pub fn observe_request(&self, route: CallRoute, worker: usize, seconds: f64) {
        let index = CallRoute::ALL.iter().position(|r| *r == route).unwrap_or(0);
        self.request_duration[index].observe(worker, seconds);
    }

    /// The calls and tunnels as they go.
    fn register_traffic(&self, registry: &mut Registry) {
        registry.register(
            "sluice_tunnel_requests",
            "Calls relayed through tunnels (and refused before), by gRPC method and status code",
            self.requests.clone(),
        );
        registry.register(
            "sluice_tunnel_connected_tunnels",
            "Tunnels open from agents to this node, idle or carrying a call",
            self.tunnels_connected.clone(),
        );
        registry.register(
            "sluice_tunnel_wait_duration_seconds",
            "Time calls waited for a free tunnel of their agent",
            self.wait_duration.clone(),
        );
        registry.register(
            "sluice_tunnel_tunnels_reused",
            "Tunnels put back in the registry after a clean call (agents that declare reusable)",
            self.tunnels_reused.clone(),
        );
        registry.register(
            "sluice_tunnel_private_spliced_calls",
            "Framed calls from other nodes whose tunnel messages this node spliced into an agent's tunnel unread (tunnel.splice_private_hop)",
            self.private_spliced.clone(),
        );
        registry.register(
            "sluice_tunnel_remote_framed_calls",
            "Calls this node sent to another node framed as tunnel messages, that node having offered it (tunnel.splice_private_hop)",
            self.remote_framed.clone(),
        );
        registry.register(
            "sluice_tunnel_relay_streams_reused",
            "Framed calls this node sent on a stream to another node kept from an earlier call (no new HTTP/2 stream)",
            self.relays_reused.clone(),
        );
    }

    /// What was refused, and why.
    fn register_refusals(&self, registry: &mut Registry) {
        registry.register(
            "sluice_tunnel_auth_failures",
            "Refused credentials, by endpoint (agent, external) and reason",
            self.auth_failures.clone(),
        );
        registry.register(
            "sluice_tunnel_metadata_refused",
            "Calls refused because headers or trailers exceeded the metadata limits, by who sent them (client, agent)",
            self.metadata_refused.clone(),
        );
        registry.register(
            "sluice_tunnel_peer_addresses_refused",
            "Other nodes' advertised addresses (from Redis) not dialled because they are outside tunnel.peer_allowlist",
            self.peers_refused.clone(),
        );
        registry.register(
            "sluice_tunnel_peer_connect_failures",
            "Connections to other nodes' private endpoints that failed or timed out (tunnel.peer_connect_timeout)",
            self.peer_connect_failures.clone(),
        );
        registry.register(
            "sluice_tunnel_buffer_refused",
            "Calls refused because the node's buffer for partly received agent messages (tunnel.max_buffered_bytes) was full",
            self.buffer_refused.clone(),
        );
        registry.register(
            "sluice_tunnel_waiting_refused",
            "Calls refused because tunnel.max_waiting_calls_per_agent calls already waited for a tunnel of their agent on this node",
            self.waiting_refused.clone(),
        );
        for refusal in AgentRefusal::ALL {
            // Every reason shows from the start, at 0.
            drop(self.agent_refused.get_or_create(&ReasonLabels {
                reason: refusal.label(),
            }));
        }
        registry.register(
            "sluice_tunnel_agent_refused",
            "Agent connections and tunnels refused for the per-agent limits (tunnel.max_connections_per_agent, max_tunnels_per_agent, max_agent_*), by reason",
            self.agent_refused.clone(),
        );
        registry.register(
            "sluice_tunnel_protocol_errors",
            "Malformed frames or messages from agents or clients",
            self.protocol_errors.clone(),
        );
    }

    /// The counter for one (method, code); callers cache it per core.
    pub fn requests(&self, method: &str, code: Code) -> PerCoreCounter {
        let method = {
            let mut methods = self
                .methods
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if method == UNAUTHENTICATED_METHOD
                || methods.contains(method)
                || (method.len() <= MAX_METHOD_LABEL_LEN
                    && method.starts_with('/')
                    && methods.len() < MAX_METHOD_LABELS
                    && methods.insert(method.to_string()))
            {
                method.to_string()
            } else {
                "other".to_string()
            }
        };
        self.requests
            .get_or_create(&CallLabels {
                method,
                code: code.name(),
            })
            .clone()
    }

    /// Counts a routing decision ("local", "remote", "waited" or "retried").
    pub fn route(&self, decision: &str, worker: usize) {
        if let Some(index) = ROUTE_DECISIONS.iter().position(|known| *known == decision) {
            self.routes[index].inc(worker);
        }
    }

    /// Routing decisions of one kind counted so far (tests and diagnostics).
    pub fn routes(&self, decision: &str) -> u64 {
        ROUTE_DECISIONS
            .iter()
            .position(|known| *known == decision)
            .map_or(0, |index| self.routes[index].sum())
    }

    /// Counts a call served on the private endpoint.
    pub fn private_request(&self, code: Code, worker: usize) {
        self.private_requests[code.as_u32() as usize].inc(worker);
    }

    /// Counts metadata refused for exceeding the limits; `from` is "client" or "agent".
    pub fn metadata_refused(&self, from: &'static str) {
        self.metadata_refused
            .get_or_create(&FromLabels { from })
            .inc();
    }

    /// Counts a call refused because the node-wide buffer budget was exhausted.
    pub fn buffer_refused(&self) {
        self.buffer_refused.inc();
    }

    /// Counts a call refused because its agent's waiting calls were at their cap.
    pub fn waiting_refused(&self) {
        self.waiting_refused.inc();
    }

    /// Calls refused for the buffer budget so far (tests and diagnostics).
    pub fn buffer_refusals(&self) -> u64 {
        self.buffer_refused.get()
    }

    /// Counts an agent connection or tunnel refused for a per-agent limit.
    pub fn agent_refused(&self, refusal: AgentRefusal) {
        self.agent_refused
            .get_or_create(&ReasonLabels {
                reason: refusal.label(),
            })
            .inc();
    }

    /// Agent refusals of one reason counted so far (tests and diagnostics).
    pub fn agent_refusals(&self, refusal: AgentRefusal) -> u64 {
        self.agent_refused
            .get_or_create(&ReasonLabels {
                reason: refusal.label(),
            })
            .get()
    }

    /// Counts an advertised peer address outside `tunnel.peer_allowlist`.
    pub fn peer_refused(&self) {
        self.peers_refused.inc();
    }

    /// Counts a connection to another node that failed or timed out.
    pub fn peer_connect_failed(&self) {
        self.peer_connect_failures.inc();
    }

    /// Peer addresses refused so far (tests and diagnostics).
    pub fn peers_refused(&self) -> u64 {
        self.peers_refused.get()
    }

    /// Metadata refusals counted so far from one side (tests and diagnostics).
    pub fn metadata_refusals(&self, from: &'static str) -> u64 {
        self.metadata_refused
            .get_or_create(&FromLabels { from })
            .get()
    }

    pub fn auth_failure(&self, endpoint: &'static str, reason: &'static str) {
        self.auth_failures
            .get_or_create(&AuthLabels { endpoint, reason })
            .inc();
    }
}
