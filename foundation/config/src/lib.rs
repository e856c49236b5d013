//! Sluice configuration.
//!
//! One YAML document, read into serde types, then checked in a single pass that reports every
//! problem with its path (`listeners.admin.address: invalid socket address "x:y"`). Unknown
//! fields are errors. A config is used whole or not at all: callers get either a [`Config`] or a
//! [`InvalidConfig`] listing everything wrong, which is what lets a reload keep the last good config.

mod listener;
mod raw;
pub mod reload;
mod validate;

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use listener::{ConnectionLimits, ListenerConfig, ListenersConfig, ServerTlsConfig};
pub use sluice_config_error::{FieldError, InvalidConfig};

/// The configuration `sluice up` runs with when given no file: loopback only.
pub const EMBEDDED_DEFAULTS: &str = include_str!("embedded_defaults.yaml");

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub runtime: RuntimeConfig,
    pub logging: LoggingConfig,
    pub listeners: ListenersConfig,
    /// The node side of the reverse tunnel; `None` when this process does not route tunnels.
    pub tunnel: Option<TunnelConfig>,
    /// The agent role (`sluice agent`); `None` otherwise.
    pub agent: Option<AgentConfig>,
    /// Redis for the agent tracker (multi-node); without it a node keeps its registry to itself.
    pub redis: Option<RedisConfig>,
    /// The Kubernetes API gateway; `None` when this process does not run it.
    pub gateway: Option<GatewayConfig>,
    /// eBPF counters on the node's data-plane interfaces; `None`: none loaded.
    pub ebpf: Option<EbpfConfig>,
}

/// `ebpf:`: the interfaces whose traffic the eBPF programs count, per direction and protocol,
/// and to the data-plane listeners' ports (docs/EBPF.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EbpfConfig {
    pub interfaces: Vec<String>,
}

/// Where the gateway's `UpstreamCluster` objects live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayConfig {
    pub source: ClusterSource,
    /// The only directory whose files an `UpstreamCluster` from the control plane may name
    /// (`None`: such objects may name no files). Local cluster files are not limited.
    pub credentials_dir: Option<PathBuf>,
    /// How often a clusters directory is checked for changes (hot reload).
    pub reload_interval: Duration,
    pub access_log: AccessLogConfig,
    /// Ed25519 private key (PKCS#8 PEM) the gateway signs each request's user with for the
    /// agent behind an agent server; required by clusters with agent servers (checked with
    /// the clusters, since the config alone does not know them). Readable when set.
    pub agent_assertion_key_file: Option<PathBuf>,
}

/// `gateway.access_log`, `tunnel.access_log`: one structured line per request, written off the
/// worker threads (a backlog drops lines and counts them, it never blocks a worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessLogConfig {
    pub enabled: bool,
    /// One request in this many is logged (`sample`: N, or a ratio such as 0.01 for 100).
    pub sample_every: u32,
    /// Every request answered with an error (HTTP status 400 and above, gRPC code not OK) is
    /// logged, sampled or not.
    pub errors_always: bool,
}

impl Default for AccessLogConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            sample_every: 1,
            errors_always: true,
        }
    }
}

/// `gateway.clusters_dir` or `gateway.source.controlplane`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterSource {
    /// A directory of YAML files, each with one or more `UpstreamCluster` objects.
    Directory(PathBuf),
    /// Listed and watched on the control plane's API.
    ControlPlane(ControlPlaneSource),
}

/// How a role reaches the control plane's API (`...: {controlplane: {url, ca_file, ...}}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlaneSource {
    /// `https://host:port`.
    pub url: String,
    /// This role's name in the status it reports (`None`: a gateway uses the host name, a
    /// node its `tunnel.node_name`).
    pub name: Option<String>,
    /// CA the control plane's serving certificate chains to.
    pub ca_file: PathBuf,
    /// Bearer token (`sluice controlplane token create`); re-read at every reconnect.
    pub token_file: Option<PathBuf>,
    /// Client certificate and key (CN = subject, O = role), instead of or besides a token.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// Where Redis is and how the tracker uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    pub target: RedisTargetConfig,
    pub ca_file: Option<PathBuf>,
    pub key_prefix: String,
    pub ttl: Duration,
    pub refresh: Duration,
    pub gc_interval: Duration,
    pub unregister_delay: Duration,
}

#[derive(Clone, PartialEq, Eq)]
pub enum RedisTargetConfig {
    /// `redis://`, `rediss://` (TLS) or `redis+unix://` (socket), with optional user:password.
    Url(String),
    /// Redis Cluster seed nodes.
    Cluster(Vec<String>),
}

/// Shown with passwords redacted: a config dump or error must not leak Redis credentials.
impl std::fmt::Debug for RedisTargetConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisTargetConfig::Url(url) => f.debug_tuple("Url").field(&redact_url(url)).finish(),
            RedisTargetConfig::Cluster(urls) => f
                .debug_tuple("Cluster")
                .field(&urls.iter().map(|url| redact_url(url)).collect::<Vec<_>>())
                .finish(),
        }
    }
}

/// A URL with the password of its user info replaced by `***` (`redis://user:***@host:6379`),
/// for errors and logs. Text that is not a URL with user info is returned as it is.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.to_string();
    };
    let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
    if user.len() == userinfo.len() && !userinfo.is_empty() {
        // `redis://secret@host`: the lone user info is the password (AUTH with no user name).
        return format!("{scheme}://***@{host}{tail}");
    }
    format!("{scheme}://{user}:***@{host}{tail}")
}

/// How the thread-per-core data plane runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    pub workers: Workers,
    pub driver: DriverChoice,
    /// io_uring submission queue size per worker.
    pub uring_entries: u32,
    /// How long in-flight work may run after a stop signal before it is cut off.
    pub drain_timeout: Duration,
    /// `runtime.overload`: what the process does near its memory or descriptor limit.
    pub overload: OverloadConfig,
}

/// `runtime.overload`: pressure is the highest of resident memory / memory limit and open
/// descriptors / `RLIMIT_NOFILE`; each action turns on at its percentage and off again
/// `recover_margin_percent` below it (docs/CONFIG.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverloadConfig {
    /// How often the monitor samples.
    pub interval: Duration,
    pub max_memory: MemoryLimit,
    pub stop_accepting_percent: u8,
    pub shed_new_requests_percent: u8,
    pub recover_margin_percent: u8,
}

impl Default for OverloadConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(250),
            max_memory: MemoryLimit::Auto,
            stop_accepting_percent: 95,
            shed_new_requests_percent: 98,
            recover_margin_percent: 5,
        }
    }
}

/// `runtime.overload.max_memory_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryLimit {
    /// The cgroup's `memory.max` if one is set, else memory is not watched.
    Auto,
    /// Memory is not watched (descriptors still are).
    Off,
    Bytes(u64),
}

/// Number of data-plane worker threads (one monoio runtime each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// One per available CPU.
    Auto,
    Count(NonZeroUsize),
}

impl Workers {
    /// The concrete worker count on this machine.
    pub fn resolve(self) -> usize {
        match self {
            Workers::Auto => std::thread::available_parallelism().map_or(1, NonZeroUsize::get),
            Workers::Count(count) => count.get(),
        }
    }
}

/// Which monoio I/O driver the workers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverChoice {
    /// io_uring, falling back to epoll when io_uring cannot be set up.
    Auto,
    /// io_uring only; refuse to start without it.
    Uring,
    /// epoll (monoio's legacy driver).
    Legacy,
}

impl DriverChoice {
    pub const NAMES: [&'static str; 3] = ["auto", "uring", "legacy"];

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "auto" => Some(Self::Auto),
            "uring" | "io_uring" => Some(Self::Uring),
            "legacy" | "epoll" => Some(Self::Legacy),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggingConfig {
    pub format: LogFormat,
    /// A `tracing` filter directive such as `info` or `info,sluice_runtime=debug`.
    pub level: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// The highest `tunnel.max_metadata_entries`: `http::HeaderMap` panics past 24,576 distinct
/// names, and agents apply this ceiling to what their node forwards.
pub const METADATA_ENTRIES_CEILING: usize = 16_384;
/// The highest `tunnel.max_metadata_bytes`: no HTTP/2 peer takes a header list near it.
pub const METADATA_BYTES_CEILING: usize = 1024 * 1024;

/// The node side of the reverse tunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelConfig {
    /// This node's name, reported by ListConnectedAgents.
    pub node_name: String,
    /// Longest time a request waits for a free tunnel of its agent.
    pub max_wait: Duration,
    /// Largest gRPC message accepted in either direction.
    pub max_message_bytes: usize,
    /// Most metadata values one call's headers or trailers may carry, from a client or an agent.
    pub max_metadata_entries: usize,
    /// Most bytes of metadata names and values one call's headers or trailers may carry.
    pub max_metadata_bytes: usize,
    /// Most bytes of partly received agent messages the whole node holds at once; a call that
    /// would go beyond is refused RESOURCE_EXHAUSTED.
    pub max_buffered_bytes: usize,
    /// The agents allowed to connect: id and SHA-256 of their token.
    pub agents: Vec<AgentTokenConfig>,
    /// Take the allowed agents from the control plane's `Agent` objects instead (then
    /// `agents` must be empty).
    pub agents_from: Option<ControlPlaneSource>,
    pub jwt: JwtConfig,
    /// JWTs nodes sign for each other's private endpoints (required with `redis`).
    pub private_jwt: Option<JwtConfig>,
    /// host:port other nodes use to reach this node's private endpoint (default: its bound
    /// address).
    pub advertise_address: Option<String>,
    /// How this node calls other nodes' private endpoints over TLS (required when
    /// `listeners.private.tls` is set: nodes share one layout).
    pub peer_tls: Option<PeerTlsConfig>,
    /// Networks other nodes' advertised private addresses (read from Redis) must lie in before
    /// this node dials them with its private JWT; empty: any address.
    pub peer_allowlist: Vec<IpNetwork>,
    /// How long this node gives another node to connect and to acknowledge what it sent.
    pub peer_timeouts: PeerTimeouts,
    /// Calls to and from other nodes that offer it travel as tunnel messages the node holding
    /// the agent splices into its tunnel unread (default on; off: plain gRPC requests, as
    /// nodes without framed calls send them).
    pub splice_private_hop: bool,
    /// What one agent may hold on this node, and how large its Descriptor may be.
    pub agent_limits: AgentLimits,
    pub access_log: AccessLogConfig,
}

/// Per-agent bounds on a node (`tunnel.max_*_per_agent`, `tunnel.max_agent_*`): an agent with a
/// valid token chooses its connection ids, versions and service lists, so each is capped before
/// it costs memory on the node or a record in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentLimits {
    /// Distinct connection ids (agent processes) one agent may have on this node at once.
    pub connections: usize,
    /// Tunnels one agent may hold on this node at once, idle or carrying a call.
    pub tunnels: usize,
    /// Calls that may wait at once for a tunnel of one agent on this node; more are refused.
    pub waiting_calls: usize,
    /// Service names one Descriptor may list.
    pub services: usize,
    /// Bytes of the agent version (header or Descriptor).
    pub version_bytes: usize,
    /// Most connections one ListConnectedAgents answer carries; more come page by page.
    pub list_page_size: usize,
}

impl Default for AgentLimits {
    fn default() -> Self {
        Self {
            connections: 64,
            tunnels: 2048,
            waiting_calls: 1024,
            services: 64,
            version_bytes: 128,
            list_page_size: 500,
        }
    }
}

/// Bounds on reaching another node's private endpoint, so a black-holed peer fails a call with
/// UNAVAILABLE instead of holding it until the client's deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerTimeouts {
    /// TCP connect, TLS and HTTP/2 handshakes together (`tunnel.peer_connect_timeout`).
    pub connect: Duration,
    /// Longest time data sent on a peer connection may stay unacknowledged before the kernel
    /// closes it (TCP_USER_TIMEOUT; `tunnel.peer_unacked_timeout`).
    pub unacked: Duration,
}

impl Default for PeerTimeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(3),
            unacked: Duration::from_secs(10),
        }
    }
}

/// An IP network in CIDR notation (`10.0.0.0/8`, `fd00::/8`; a bare address is a /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNetwork {
    pub address: std::net::IpAddr,
    pub prefix: u8,
}

impl IpNetwork {
    /// Parses `address/prefix` or a bare address.
    pub fn parse(text: &str) -> Option<Self> {
        let (address, prefix) = match text.trim().split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text.trim(), None),
        };
        let address: std::net::IpAddr = address.parse().ok()?;
        let bits = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(prefix) => prefix.parse::<u8>().ok().filter(|prefix| *prefix <= bits)?,
            None => bits,
        };
        Some(Self { address, prefix })
    }

    /// Whether `ip` lies in this network (IPv4-mapped IPv6 addresses count as IPv4).
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        use std::net::IpAddr;
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.address, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// TLS client settings for node-to-node calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTlsConfig {
    /// CA that issued the other nodes' private-endpoint certificates.
    pub ca_file: PathBuf,
    /// This node's client certificate and key, for private listeners that require one.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// Name checked against the peer's certificate; without it, the peer's IP address.
    pub server_name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentTokenConfig {
    pub id: i64,
    /// SHA-256 of the agent's bearer token; the token itself is never stored.
    pub token_sha256: [u8; 32],
}

/// How the external endpoint validates callers' JWTs (HS256).
#[derive(Clone, PartialEq, Eq)]
pub struct JwtConfig {
    pub secret: Vec<u8>,
    pub secret_file: PathBuf,
    pub issuer: String,
    pub audience: String,
    /// Allowed clock skew for exp/nbf/iat.
    pub leeway: Duration,
    /// Longest accepted `exp - iat`: tokens must be short-lived.
    pub max_lifetime: Duration,
}

impl std::fmt::Debug for JwtConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtConfig")
            .field("secret", &"<redacted>")
            .field("secret_file", &self.secret_file)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("leeway", &self.leeway)
            .field("max_lifetime", &self.max_lifetime)
            .finish()
    }
}

/// A URL the agent dials or forwards to: `http://` is HTTP/2 cleartext, `https://` is TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub url: String,
    pub tls: bool,
    pub host: String,
    pub port: u16,
}

/// The agent role.
#[derive(Clone, PartialEq, Eq)]
pub struct AgentConfig {
    pub token: String,
    pub token_file: PathBuf,
    pub nodes: Vec<Endpoint>,
    /// CA for `https://` nodes.
    pub ca_file: Option<PathBuf>,
    pub forward_to: Endpoint,
    /// CA for an `https://` backend.
    pub forward_ca_file: Option<PathBuf>,
    pub max_message_bytes: usize,
    pub pool: PoolConfig,
    pub reconnect: ReconnectConfig,
    /// Forward the gateway's Kubernetes API calls to an apiserver (opt-in).
    pub kubernetes_api: Option<KubernetesApiConfig>,
}

/// `agent.kubernetes_api`: the one apiserver the agent forwards the gateway's requests to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesApiConfig {
    /// The id this agent has on the nodes; the gateway's assertions must name it.
    pub agent_id: u64,
    /// `https://host:port`, as written (or as derived in a pod).
    pub url: String,
    pub host: String,
    pub port: u16,
    /// CA of the apiserver's serving certificate.
    pub ca_file: PathBuf,
    /// The agent's own credential towards the apiserver.
    pub credential: KubeCredential,
    /// Ed25519 public keys (PEM files) whose assertions the agent accepts.
    pub gateway_keys: Vec<PathBuf>,
    /// Most Kubernetes API requests this agent forwards at once.
    pub max_in_flight: usize,
}

/// How the agent authenticates to its apiserver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeCredential {
    /// A bearer token file, read again whenever it changes (projected tokens rotate).
    TokenFile(PathBuf),
    /// A client certificate and its key.
    ClientCertificate {
        cert_file: PathBuf,
        key_file: PathBuf,
    },
}

impl std::fmt::Debug for AgentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentConfig")
            .field("token", &"<redacted>")
            .field("token_file", &self.token_file)
            .field("nodes", &self.nodes)
            .field("forward_to", &self.forward_to)
            .field("pool", &self.pool)
            .field("kubernetes_api", &self.kubernetes_api)
            .finish_non_exhaustive()
    }
}

/// The agent's pool of idle tunnels per node (defaults as in agentk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    pub min_idle: usize,
    pub max: usize,
    pub grow_by: usize,
    pub idle_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconnectConfig {
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Config {
    /// The embedded defaults, validated.
    pub fn embedded_defaults() -> Result<Self, InvalidConfig> {
        load_str(EMBEDDED_DEFAULTS, "<embedded defaults>")
    }
}

/// Reads and validates a YAML file.
pub fn load_file(path: &Path) -> Result<Config, InvalidConfig> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| InvalidConfig {
        origin: origin.clone(),
        errors: vec![FieldError::new("", format!("cannot read file: {error}"))],
    })?;
    load_str(&text, &origin)
}

/// Parses and validates YAML text; `origin` names it in error messages.
pub fn load_str(text: &str, origin: &str) -> Result<Config, InvalidConfig> {
    let fail = |errors: Vec<FieldError>| InvalidConfig {
        origin: origin.to_string(),
        errors,
    };
    let mut unknown_fields = Vec::new();
    let raw: raw::RawConfig = if is_empty_document(text) {
        raw::RawConfig::default()
    } else {
        let deserializer = serde_norway::Deserializer::from_str(text);
        let mut record_unknown = |path: serde_ignored::Path<'_>| {
            unknown_fields.push(path.to_string());
        };
        let tracked = serde_ignored::Deserializer::new(deserializer, &mut record_unknown);
        match serde_path_to_error::deserialize(tracked) {
            Ok(raw) => raw,
            Err(error) => {
                let path = error.path().to_string();
                let path = if path == "." { String::new() } else { path };
                let reason = serde_reason(&error.into_inner().to_string(), &path);
                return Err(fail(vec![FieldError::new(path, reason)]));
            }
        }
    };
    let mut errors = sluice_config_error::ErrorList::default();
    for path in unknown_fields {
        errors.push(path, "unknown field");
    }
    let config = validate::validate(&raw, &mut errors);
    if errors.list.is_empty() {
        Ok(config)
    } else {
        Err(fail(errors.list))
    }
}

/// serde_norway prefixes its messages with the path (which we print already) and names our
/// internal `Raw*` structs; operators need neither.
fn serde_reason(message: &str, path: &str) -> String {
    let message = message
        .strip_prefix(path)
        .and_then(|rest| rest.strip_prefix(": "))
        .unwrap_or(message);
    const STRUCT: &str = "expected struct Raw";
    match message.find(STRUCT) {
        Some(start) => {
            let name_start = start + "expected struct ".len();
            let name_end = message[name_start..]
                .find(' ')
                .map_or(message.len(), |offset| name_start + offset);
            format!(
                "{}expected a mapping{}",
                &message[..start],
                &message[name_end..]
            )
        }
        None => message.to_string(),
    }
}

fn is_empty_document(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .all(|line| line.is_empty() || line.starts_with('#') || line == "---")
}

#[cfg(test)]
mod tests;
