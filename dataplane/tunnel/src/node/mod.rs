//! The node side of the tunnel.
//!
//! Agents park `Connect` streams on the agent endpoint ([`endpoints::agent`]); each becomes an
//! idle tunnel in the [`ConnectionRegistry`], held by the task that owns its stream, or parked
//! there by the call that last used it (`tunnel`). Clients call agents on the external endpoint ([`endpoints::external`]); other
//! nodes forward calls to the private endpoint ([`endpoints::private`]). A call reads top-down:
//! authenticate, parse the call (`call`), route ([`route`] decides, `router` does the I/O),
//! relay through a local tunnel or another node (`relay`, `remote`), answer (`answer`).
//! `bookkeeping` tracks agent connections for ListConnectedAgents and the agent locator.

mod answer;
mod bookkeeping;
mod call;
mod collector;
mod disconnects;
pub mod endpoints;
mod framed;
mod listing;
mod peer_request;
mod pumps;
mod quota;
mod relay;
mod relays;
mod remote;
mod remote_relay;
pub mod route;
mod router;
mod tunnel;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::ServerConfig;
use sluice_config::{ListenerConfig, TunnelConfig};
use sluice_grpc::transport::H2Settings;
use sluice_locator::AgentLocator;

use crate::auth::{AgentTokens, JwtValidator};
use crate::metrics::TunnelMetrics;
use crate::registry::ConnectionRegistry;
use crate::wire::{BufferBudget, MetadataLimits};

pub use collector::NodeCollector;
pub use endpoints::{AgentEndpoint, ExternalEndpoint, GatewayLink, PrivateEndpoint};
pub use tunnel::TunnelStreams;

/// The node's decoders of what agents and clients send, for the fuzz targets (`fuzz/`): not
/// an API.
#[doc(hidden)]
pub mod fuzzing {
    pub use super::listing::{page_token, parse_page_token};
    pub use super::quota::{announcement, check_descriptor};
}

use arc_swap::ArcSwap;
use remote::{PeerTls, PrivateSigner};

use crate::registry::AgentId;

/// State shared by every core of a node.
#[derive(Debug)]
pub struct NodeShared {
    pub registry: ConnectionRegistry<TunnelStreams>,
    connections: Mutex<bookkeeping::Connections>,
    /// Bounds the "agent disconnected" log lines per agent.
    disconnect_log: disconnects::DisconnectLog,
    /// Swapped whole when the allowed agents change (from the control plane).
    tokens: ArcSwap<AgentTokens>,
    /// Swapped whole by a config reload (a rotated key, `tunnel.jwt`).
    jwt: ArcSwap<JwtValidator>,
    pub node_name: String,
    /// `tunnel.max_wait` in nanoseconds; a config reload stores a new value.
    max_wait_nanos: AtomicU64,
    pub max_message_bytes: usize,
    /// Metadata one call may carry, from its client or its agent.
    pub metadata_limits: MetadataLimits,
    /// Bytes of partly received agent messages held node-wide (`tunnel.max_buffered_bytes`).
    pub buffer_budget: Arc<BufferBudget>,
    pub metrics: TunnelMetrics,
    next_tunnel_id: AtomicU64,
    agent_tls: Option<Arc<ServerConfig>>,
    external_tls: Option<Arc<ServerConfig>>,
    private_tls: Option<Arc<ServerConfig>>,
    /// TLS for calls to other nodes' private endpoints.
    peer_tls: Option<PeerTls>,
    /// Networks other nodes' advertised addresses must lie in (empty: any).
    peer_allowlist: Vec<sluice_config::IpNetwork>,
    /// How long another node gets to connect and to acknowledge what this node sent it.
    peer_timeouts: sluice_config::PeerTimeouts,
    /// Calls between this node and other nodes that offer it travel framed
    /// (`tunnel.splice_private_hop`, `framed.rs`).
    pub(super) splice_private_hop: bool,
    settings: H2Settings,
    /// Publishes which agents this node holds and finds the others (multi-node); `None`
    /// without Redis.
    locator: Option<Arc<dyn AgentLocator>>,
    /// Checks tokens on the private endpoint; signs tokens for other nodes' private endpoints.
    private_jwt: Option<(JwtValidator, PrivateSigner)>,
    /// What one agent may hold here and announce (`tunnel.max_*_per_agent`, `max_agent_*`).
    agent_limits: sluice_config::AgentLimits,
    /// Tunnels each agent holds, against `agent_limits.tunnels`.
    tunnel_counts: Arc<quota::TunnelCounts>,
}

impl NodeShared {
    /// Replaces the agents allowed to connect. Agents whose token is gone lose their idle
    /// tunnels now and cannot open new ones; a tunnel carrying a call finishes it and is then
    /// closed instead of parked again. Returns the revoked agents.
    pub fn set_agents(&self, agents: &[sluice_config::AgentTokenConfig]) -> Vec<AgentId> {
        let newer = Arc::new(AgentTokens::new(agents));
        let older = self.tokens.swap(newer.clone());
        let revoked = older.revoked_by(&newer);
        for agent in &revoked {
            let closed = self.registry.evict(*agent);
            tracing::info!(agent, idle_tunnels_closed = closed, "agent revoked");
        }
        revoked
    }

    /// Closes the idle tunnels of agents the current table no longer accepts (for tunnels that
    /// were opening while the table changed).
    pub fn evict_revoked(&self, agents: &[AgentId]) {
        for agent in agents {
            self.registry.evict(*agent);
        }
    }

    /// The validator of client JWTs in force (changed by [`Self::set_jwt`]).
    pub fn jwt(&self) -> arc_swap::Guard<Arc<JwtValidator>> {
        self.jwt.load()
    }

    /// Validates client JWTs with `config` from now on (a reload: a rotated secret, another
    /// issuer or audience). Calls in flight keep the verdict they had; every core's cache of
    /// verified tokens is emptied at its next call, so a token of the old key is refused at once.
    pub fn set_jwt(&self, config: &sluice_config::JwtConfig) {
        let generation = self.jwt.load().generation() + 1;
        self.jwt.store(Arc::new(
            JwtValidator::new(config).with_generation(generation),
        ));
    }

    /// Longest time a call waits for a free tunnel of its agent (`tunnel.max_wait`).
    pub fn max_wait(&self) -> Duration {
        Duration::from_nanos(self.max_wait_nanos.load(Ordering::Relaxed))
    }

    /// Applies a reloaded `tunnel.max_wait` to calls that arrive from now on.
    pub fn set_max_wait(&self, max_wait: Duration) {
        self.max_wait_nanos
            .store(duration_nanos(max_wait), Ordering::Relaxed);
    }

    /// Tunnels `agent` holds on this node now, idle or carrying a call.
    pub fn tunnels_held(&self, agent: AgentId) -> usize {
        self.tunnel_counts.held(agent)
    }

    /// Counts and logs an agent refused for a per-agent limit; returns the error it gets.
    fn agent_refused(
        &self,
        agent: AgentId,
        refusal: crate::metrics::AgentRefusal,
        error: crate::error::TunnelError,
    ) -> crate::error::TunnelError {
        self.metrics.agent_refused(refusal);
        // Debug, not info: an agent over its share retries at will, and a line per attempt
        // would let it fill the node's disk; the counter carries the rate.
        tracing::debug!(agent, reason = refusal.label(), %error, "agent tunnel refused");
        error
    }

    /// Whether a tunnel opened with the token of digest `token` may be parked again.
    pub(crate) fn still_allowed(&self, agent: AgentId, token: &[u8; 32]) -> bool {
        self.tokens.load().allows(agent, token)
    }
}

fn duration_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

fn server_tls(
    listener: &ListenerConfig,
) -> Result<Option<Arc<ServerConfig>>, sluice_grpc::tls::TlsError> {
    listener
        .tls
        .as_ref()
        .map(|tls| {
            sluice_grpc::tls::server_config(
                &tls.cert_file,
                &tls.key_file,
                tls.client_ca_file.as_deref(),
            )
        })
        .transpose()
}

impl NodeShared {
    pub fn new(
        config: &TunnelConfig,
        agent_listener: &ListenerConfig,
        external_listener: &ListenerConfig,
        private_listener: Option<&ListenerConfig>,
        metrics: TunnelMetrics,
        locator: Option<Arc<dyn AgentLocator>>,
    ) -> Result<Arc<Self>, sluice_grpc::tls::TlsError> {
        Ok(Arc::new(Self {
            registry: ConnectionRegistry::new(),
            connections: Mutex::default(),
            disconnect_log: disconnects::DisconnectLog::default(),
            tokens: ArcSwap::from_pointee(AgentTokens::new(&config.agents)),
            jwt: ArcSwap::from_pointee(JwtValidator::new(&config.jwt)),
            node_name: config.node_name.clone(),
            max_wait_nanos: AtomicU64::new(duration_nanos(config.max_wait)),
            max_message_bytes: config.max_message_bytes,
            metadata_limits: MetadataLimits {
                entries: config.max_metadata_entries,
                bytes: config.max_metadata_bytes,
            },
            buffer_budget: Arc::new(BufferBudget::new(config.max_buffered_bytes)),
            metrics,
            next_tunnel_id: AtomicU64::new(1),
            agent_tls: server_tls(agent_listener)?,
            external_tls: server_tls(external_listener)?,
            private_tls: match private_listener {
                Some(listener) => server_tls(listener)?,
                None => None,
            },
            peer_tls: config.peer_tls.as_ref().map(PeerTls::new).transpose()?,
            peer_allowlist: config.peer_allowlist.clone(),
            peer_timeouts: config.peer_timeouts,
            splice_private_hop: config.splice_private_hop,
            settings: H2Settings::default(),
            locator,
            private_jwt: config
                .private_jwt
                .as_ref()
                .map(|private| (JwtValidator::new(private), PrivateSigner::new(private))),
            agent_limits: config.agent_limits,
            tunnel_counts: Arc::default(),
        }))
    }
}

#[cfg(test)]
pub(crate) mod test_node {
    use super::*;
    use prometheus_client::registry::Registry;
    use sluice_config::JwtConfig;

    pub(crate) fn node(locator: Option<Arc<dyn AgentLocator>>) -> Arc<NodeShared> {
        node_with(locator, None)
    }

    /// A test node that checks and signs node-to-node tokens with `private_jwt`.
    #[allow(clippy::unwrap_used)]
    pub(crate) fn node_with(
        locator: Option<Arc<dyn AgentLocator>>,
        private_jwt: Option<JwtConfig>,
    ) -> Arc<NodeShared> {
        node_limited(locator, private_jwt, sluice_config::AgentLimits::default())
    }

    /// A test node holding agents to `agent_limits`.
    #[allow(clippy::unwrap_used)]
    pub(crate) fn node_limited(
        locator: Option<Arc<dyn AgentLocator>>,
        private_jwt: Option<JwtConfig>,
        agent_limits: sluice_config::AgentLimits,
    ) -> Arc<NodeShared> {
        let listener = ListenerConfig {
            address: "127.0.0.1:0".parse().unwrap(),
            backlog: 16,
            max_connections_per_worker: 16,
            limits: sluice_config::ConnectionLimits {
                header_timeout: Duration::from_secs(1),
                idle_timeout: Duration::from_secs(1),
                ..Default::default()
            },
            tls: None,
        };
        let config = TunnelConfig {
            node_name: "n".into(),
            max_wait: Duration::from_secs(1),
            max_message_bytes: 1024,
            max_metadata_entries: 512,
            max_metadata_bytes: 64 * 1024,
            max_buffered_bytes: 1 << 20,
            agents: Vec::new(),
            agents_from: None,
            jwt: JwtConfig {
                secret: vec![7; 32],
                secret_file: "s".into(),
                issuer: "i".into(),
                audience: "a".into(),
                leeway: Duration::from_secs(1),
                max_lifetime: Duration::from_secs(10),
            },
            private_jwt,
            advertise_address: None,
            peer_tls: None,
            peer_allowlist: Vec::new(),
            peer_timeouts: Default::default(),
            splice_private_hop: true,
            agent_limits,
            access_log: Default::default(),
        };
        let metrics = TunnelMetrics::register(&mut Registry::default(), 1);
        NodeShared::new(&config, &listener, &listener, None, metrics, locator).unwrap()
    }

    /// Runs a future on a legacy-driver runtime with timers, as a worker core would.
    #[allow(clippy::unwrap_used)]
    pub(crate) fn run<F: std::future::Future>(future: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap()
            .block_on(future)
    }
}
