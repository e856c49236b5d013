//! The configuration exactly as written in YAML.
//!
//! Leaves are kept as untyped YAML values so that a wrong type in one field becomes one error
//! with its path in the validation pass instead of stopping deserialization at the first
//! mistake. Unknown fields are collected separately (see `crate::load_str`).

use serde::Deserialize;
use serde_norway::Value;

pub(crate) type Leaf = Option<Value>;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawConfig {
    pub(crate) runtime: RawRuntime,
    pub(crate) logging: RawLogging,
    pub(crate) listeners: RawListeners,
    pub(crate) tunnel: Option<RawTunnel>,
    pub(crate) agent: Option<RawAgent>,
    pub(crate) redis: Option<RawRedis>,
    pub(crate) gateway: Option<RawGateway>,
    pub(crate) ebpf: Option<RawEbpf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawEbpf {
    pub(crate) interfaces: Vec<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawGateway {
    pub(crate) clusters_dir: Leaf,
    pub(crate) source: Option<RawSource>,
    pub(crate) credentials_dir: Leaf,
    pub(crate) reload_interval: Leaf,
    pub(crate) access_log: Option<RawAccessLog>,
    pub(crate) agent_assertion_key_file: Leaf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawAccessLog {
    pub(crate) enabled: Leaf,
    pub(crate) sample: Leaf,
    pub(crate) errors_always: Leaf,
}

/// `{controlplane: {...}}`: objects come from the control plane's API.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawSource {
    pub(crate) controlplane: Option<RawControlPlane>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawControlPlane {
    pub(crate) url: Leaf,
    pub(crate) name: Leaf,
    pub(crate) ca_file: Leaf,
    pub(crate) token_file: Leaf,
    pub(crate) cert_file: Leaf,
    pub(crate) key_file: Leaf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawRedis {
    pub(crate) url: Leaf,
    pub(crate) cluster: Vec<Value>,
    pub(crate) ca_file: Leaf,
    pub(crate) key_prefix: Leaf,
    pub(crate) ttl: Leaf,
    pub(crate) refresh: Leaf,
    pub(crate) gc_interval: Leaf,
    pub(crate) unregister_delay: Leaf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawRuntime {
    pub(crate) workers: Leaf,
    pub(crate) driver: Leaf,
    pub(crate) uring_entries: Leaf,
    pub(crate) drain_timeout: Leaf,
    pub(crate) overload: RawOverload,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawOverload {
    pub(crate) interval: Leaf,
    pub(crate) max_memory_bytes: Leaf,
    pub(crate) stop_accepting_percent: Leaf,
    pub(crate) shed_new_requests_percent: Leaf,
    pub(crate) recover_margin_percent: Leaf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawLogging {
    pub(crate) format: Leaf,
    pub(crate) level: Leaf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawListeners {
    pub(crate) admin: RawListener,
    pub(crate) agent: Option<RawListener>,
    pub(crate) external: Option<RawListener>,
    pub(crate) private: Option<RawListener>,
    pub(crate) gateway: Option<RawListener>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawListener {
    pub(crate) address: Leaf,
    pub(crate) backlog: Leaf,
    pub(crate) max_connections_per_worker: Leaf,
    pub(crate) handshake_timeout: Leaf,
    pub(crate) header_timeout: Leaf,
    pub(crate) idle_timeout: Leaf,
    pub(crate) keepalive_interval: Leaf,
    pub(crate) keepalive_timeout: Leaf,
    pub(crate) max_connection_age: Leaf,
    pub(crate) max_connections_per_ip: Leaf,
    pub(crate) tls: Option<RawServerTls>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawServerTls {
    pub(crate) cert_file: Leaf,
    pub(crate) key_file: Leaf,
    pub(crate) client_ca_file: Leaf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawTunnel {
    pub(crate) node_name: Leaf,
    pub(crate) max_wait: Leaf,
    pub(crate) max_message_bytes: Leaf,
    pub(crate) max_metadata_entries: Leaf,
    pub(crate) max_metadata_bytes: Leaf,
    pub(crate) max_buffered_bytes: Leaf,
    pub(crate) agents: Vec<RawAgentToken>,
    pub(crate) agents_from: Option<RawSource>,
    pub(crate) jwt: RawJwt,
    pub(crate) private_jwt: Option<RawJwt>,
    pub(crate) advertise_address: Leaf,
    pub(crate) peer_tls: Option<RawPeerTls>,
    pub(crate) peer_allowlist: Vec<Value>,
    pub(crate) peer_connect_timeout: Leaf,
    pub(crate) peer_unacked_timeout: Leaf,
    pub(crate) splice_private_hop: Leaf,
    pub(crate) max_connections_per_agent: Leaf,
    pub(crate) max_tunnels_per_agent: Leaf,
    pub(crate) max_waiting_calls_per_agent: Leaf,
    pub(crate) max_agent_services: Leaf,
    pub(crate) max_agent_version_bytes: Leaf,
    pub(crate) list_page_size: Leaf,
    pub(crate) access_log: Option<RawAccessLog>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawPeerTls {
    pub(crate) ca_file: Leaf,
    pub(crate) cert_file: Leaf,
    pub(crate) key_file: Leaf,
    pub(crate) server_name: Leaf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawAgentToken {
    pub(crate) id: Leaf,
    pub(crate) token_sha256: Leaf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawJwt {
    pub(crate) secret_file: Leaf,
    pub(crate) issuer: Leaf,
    pub(crate) audience: Leaf,
    pub(crate) leeway: Leaf,
    pub(crate) max_lifetime: Leaf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawAgent {
    pub(crate) token_file: Leaf,
    pub(crate) nodes: Vec<Value>,
    pub(crate) ca_file: Leaf,
    pub(crate) forward_to: Leaf,
    pub(crate) forward_ca_file: Leaf,
    pub(crate) max_message_bytes: Leaf,
    pub(crate) pool: RawPool,
    pub(crate) reconnect: RawReconnect,
    pub(crate) kubernetes_api: Option<RawKubernetesApi>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawKubernetesApi {
    pub(crate) agent_id: Leaf,
    pub(crate) url: Leaf,
    pub(crate) ca_file: Leaf,
    pub(crate) token_file: Leaf,
    pub(crate) client_cert_file: Leaf,
    pub(crate) client_key_file: Leaf,
    pub(crate) gateway_keys: Vec<Value>,
    pub(crate) max_in_flight: Leaf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawPool {
    pub(crate) min_idle: Leaf,
    pub(crate) max: Leaf,
    pub(crate) grow_by: Leaf,
    pub(crate) idle_timeout: Leaf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawReconnect {
    pub(crate) initial_backoff: Leaf,
    pub(crate) max_backoff: Leaf,
}
