//! The `UpstreamCluster` object as written in YAML (`proxy.sluice.dev/v1alpha1`): KubeGateway's
//! fields plus sluice's additions (health checks, connection pool, authentication caches).
//! Unknown fields are errors everywhere, so a typo never silently turns a setting off.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

pub const API_VERSION: &str = "proxy.sluice.dev/v1alpha1";
pub const KIND: &str = "UpstreamCluster";

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UpstreamCluster {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: UpstreamClusterSpec,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ObjectMeta {
    /// The cluster's name, and its primary hostname: clients reach it with this TLS server
    /// name (as in KubeGateway, where the cluster name is the SNI host).
    pub name: String,
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UpstreamClusterSpec {
    pub servers: Vec<UpstreamServer>,
    #[serde(default)]
    pub client_config: ClientConfig,
    pub secure_serving: SecureServing,
    #[serde(default)]
    pub flow_control: FlowControl,
    /// Ordered: the first matching policy wins. Empty: every request goes to all servers,
    /// round robin, without flow control.
    #[serde(default)]
    pub dispatch_policies: Vec<DispatchPolicy>,
    /// Sluice addition.
    #[serde(default)]
    pub health_check: HealthCheck,
    /// Sluice addition.
    #[serde(default)]
    pub connection_pool: ConnectionPool,
    /// Sluice addition.
    #[serde(default)]
    pub authentication: Authentication,
}

/// One apiserver: dialed at `endpoint`, or reached through an agent's reverse tunnel (exactly
/// one of the two).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UpstreamServer {
    /// `https://host:port` of one apiserver.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Sluice addition: the agent whose reverse tunnel reaches its cluster's apiserver.
    #[serde(default)]
    pub agent: Option<AgentServer>,
    /// Kept in the config but never picked.
    #[serde(default)]
    pub disabled: bool,
}

impl UpstreamServer {
    /// How `upstreamSubset` and the status name this server: its endpoint, or `agent:<id>`.
    pub fn name(&self) -> String {
        match (&self.endpoint, &self.agent) {
            (Some(endpoint), _) => endpoint.clone(),
            (None, Some(agent)) => agent.name(),
            (None, None) => String::new(),
        }
    }
}

/// `{agent: {id: 42}}`: the agent (the tunnel's agent id) that serves this apiserver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentServer {
    pub id: u64,
}

impl AgentServer {
    /// The prefix of an agent server's name in `upstreamSubset`.
    pub const NAME_PREFIX: &'static str = "agent:";

    /// `agent:<id>`.
    pub fn name(&self) -> String {
        format!("{}{}", Self::NAME_PREFIX, self.id)
    }
}

/// How the gateway authenticates itself to the apiservers. Relative paths are relative to the
/// YAML file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientConfig {
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub bearer_token: Option<String>,
    pub bearer_token_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    /// Skip verifying the apiservers' certificates (tests only).
    #[serde(default)]
    pub insecure: bool,
}

/// What the gateway serves for this cluster's hostname(s), chosen per TLS server name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SecureServing {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// CA for x509 client authentication; without it clients must use tokens.
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: Option<PathBuf>,
    /// Sluice addition: more names (or IP literals) that reach this cluster besides
    /// `metadata.name`.
    #[serde(default)]
    pub extra_hostnames: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FlowControl {
    #[serde(default)]
    pub schemas: Vec<FlowControlSchema>,
}

/// A named limit; exactly one of the three kinds is set (KubeGateway's inline union).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FlowControlSchema {
    pub name: String,
    pub exempt: Option<Exempt>,
    pub max_requests_inflight: Option<MaxRequestsInflight>,
    pub token_bucket: Option<TokenBucket>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exempt {}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaxRequestsInflight {
    pub max: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBucket {
    pub qps: u32,
    pub burst: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum Strategy {
    #[default]
    RoundRobin,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DispatchPolicy {
    /// Sluice addition: a name for metrics and logs (defaults to the policy's index).
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub strategy: Strategy,
    /// Servers this policy sends to, by endpoint (an agent server as `agent:<id>`); empty means
    /// all. KubeGateway spells the field `upsteamSubset`; both spellings are accepted.
    #[serde(default, alias = "upsteamSubset")]
    pub upstream_subset: Vec<String>,
    #[serde(default)]
    pub rules: Vec<DispatchPolicyRule>,
    /// A schema of `flowControl.schemas`; empty means no limit.
    #[serde(default)]
    pub flow_control_schema_name: String,
}

/// One rule; its fields are ANDed, a policy's rules ORed. The gateway compiles them into its dispatch matcher.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DispatchPolicyRule {
    #[serde(default)]
    pub verbs: Vec<String>,
    #[serde(default, rename = "apiGroups")]
    pub api_groups: Vec<String>,
    #[serde(default)]
    pub resources: Vec<String>,
    #[serde(default)]
    pub resource_names: Vec<String>,
    #[serde(default)]
    pub users: Vec<String>,
    #[serde(default)]
    pub service_accounts: Vec<ServiceAccountRef>,
    #[serde(default)]
    pub user_groups: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    pub non_resource_urls: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceAccountRef {
    pub namespace: String,
    pub name: String,
}

/// Active health checks of every server (sluice addition).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
/// Fields left out take their defaults.
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HealthCheck {
    pub path: String,
    #[serde(deserialize_with = "duration")]
    pub interval: Duration,
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    /// Consecutive successes before a down server is used again.
    pub healthy_threshold: u32,
    /// Consecutive failures before a server leaves rotation.
    pub unhealthy_threshold: u32,
}

impl Default for HealthCheck {
    fn default() -> Self {
        Self {
            path: "/readyz".into(),
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            healthy_threshold: 1,
            unhealthy_threshold: 1,
        }
    }
}

/// Upstream HTTP/2 connections (sluice addition).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
/// Fields left out take their defaults.
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ConnectionPool {
    /// Long-lived HTTP/2 connections per apiserver (more open only while all are at the
    /// server's MAX_CONCURRENT_STREAMS, up to `maxConnectionsPerServer`).
    pub connections_per_server: u32,
    pub max_connections_per_server: u32,
    /// Streams the gateway opens per connection at most, below the server's own limit.
    pub max_concurrent_streams: u32,
    #[serde(deserialize_with = "duration")]
    pub keepalive_interval: Duration,
    #[serde(deserialize_with = "duration")]
    pub keepalive_timeout: Duration,
    /// Share (percent) of a core's streams to one apiserver that long-running requests
    /// (watch, exec, attach, port-forward, proxy) may hold together, so they never hold all.
    pub long_running_streams_percent: u32,
    /// Long-running requests one user may have open at once on one core.
    pub max_long_running_per_user: u32,
    /// Requests of one user one core may keep waiting for a stream to one apiserver.
    pub max_queued_per_user: u32,
    /// Requests one core may keep waiting for a stream to one apiserver, all users together.
    pub max_queued_per_server: u32,
    /// Longest wait for a stream; past it the request is answered 429 with Retry-After.
    #[serde(deserialize_with = "duration")]
    pub max_queue_wait: Duration,
    /// exec, attach and port-forward upgrades one core may hold open to the cluster's
    /// apiservers, all users together (each is a connection of its own).
    pub max_upgrade_connections: u32,
    /// Connections per apiserver and core kept for the gateway's own TokenReview and
    /// SubjectAccessReview calls: client requests never use them.
    pub reserved_connections_per_server: u32,
}

impl Default for ConnectionPool {
    fn default() -> Self {
        Self {
            connections_per_server: 2,
            max_connections_per_server: 8,
            max_concurrent_streams: 1000,
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(15),
            long_running_streams_percent: 50,
            max_long_running_per_user: 100,
            max_queued_per_user: 500,
            max_queued_per_server: 2000,
            max_queue_wait: Duration::from_secs(5),
            max_upgrade_connections: 500,
            reserved_connections_per_server: 1,
        }
    }
}

/// Client authentication against this cluster (sluice addition).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
/// Fields left out take their defaults.
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Authentication {
    /// Requests without credentials become `system:anonymous`.
    pub allow_anonymous: bool,
    #[serde(rename = "tokenReviewSuccessTTL", deserialize_with = "duration")]
    pub token_review_success_ttl: Duration,
    #[serde(rename = "tokenReviewFailureTTL", deserialize_with = "duration")]
    pub token_review_failure_ttl: Duration,
    #[serde(rename = "subjectAccessReviewTTL", deserialize_with = "duration")]
    pub subject_access_review_ttl: Duration,
    /// For TokenReview and SubjectAccessReview calls.
    #[serde(deserialize_with = "duration")]
    pub review_timeout: Duration,
    /// TokenReviews one core may have in flight; a new token past it is answered 429 with
    /// Retry-After instead of becoming one more review (sluice addition).
    pub max_concurrent_token_reviews: u32,
    /// Rejected bearer tokens one source IP may have reviewed at once per core before its
    /// further unknown tokens are answered 429 without a review (sluice addition).
    pub failed_token_review_burst: u32,
    /// How fast that allowance refills, per minute (sluice addition).
    pub failed_token_reviews_per_minute: u32,
}

impl Default for Authentication {
    fn default() -> Self {
        Self {
            allow_anonymous: false,
            token_review_success_ttl: Duration::from_secs(600),
            token_review_failure_ttl: Duration::from_secs(10),
            subject_access_review_ttl: Duration::from_secs(60),
            review_timeout: Duration::from_secs(2),
            max_concurrent_token_reviews: 32,
            failed_token_review_burst: 10,
            failed_token_reviews_per_minute: 60,
        }
    }
}

/// Durations are written like `5s`, `1m30s`, `250ms`.
fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_duration(&text)
        .map_err(|error| serde::de::Error::custom(format!("invalid duration {text:?}: {error}")))
}
