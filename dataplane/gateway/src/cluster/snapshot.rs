//! The immutable, compiled form of all clusters that the data plane reads per request. Build it
//! once per config change and share it behind an `Arc`; swapping that `Arc` is the whole reload.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::dispatch::DispatchMatcher;
use crate::flow_control::{FlowControlSchema, FlowLimit};
use sluice_config_error::{InvalidConfig, InvalidSources};
use sluice_upstream_cluster::spec::{
    AgentServer, Authentication, ClientConfig, ConnectionPool, HealthCheck, SecureServing,
};
use sluice_upstream_cluster::{check_unique, LoadedCluster};

#[derive(Debug)]
pub struct GatewaySnapshot {
    clusters: Box<[CompiledCluster]>,
    /// Lower-case hostname -> index into `clusters`.
    hosts: HashMap<Box<str>, usize>,
}

#[derive(Debug)]
pub struct CompiledCluster {
    pub name: Box<str>,
    pub source: PathBuf,
    /// `metadata.name` first, then the extra hostnames.
    pub hostnames: Box<[Box<str>]>,
    pub servers: Box<[CompiledServer]>,
    pub client: ClientConfig,
    pub serving: SecureServing,
    pub schemas: Box<[FlowControlSchema]>,
    pub dispatch: DispatchMatcher,
    pub health_check: HealthCheck,
    pub connection_pool: ConnectionPool,
    pub authentication: Authentication,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledServer {
    /// As written in the config (the key of `upstreamSubset`); `agent:<id>` for an agent server.
    pub endpoint: Box<str>,
    pub uri: http::Uri,
    pub tls: bool,
    pub host: Box<str>,
    pub port: u16,
    pub disabled: bool,
    /// `Some(id)`: reached through agent `id`'s reverse tunnel, never dialed. `uri` and `host`
    /// then name `agent-<id>.sluice-agent.invalid` (a reserved TLD that never resolves, so a
    /// path that forgot to check this field fails instead of reaching some host) and `port` is 0.
    pub agent: Option<u64>,
}

/// The domain of an agent server's placeholder host (RFC 2606's `.invalid` never resolves).
pub const AGENT_HOST_DOMAIN: &str = "sluice-agent.invalid";

impl CompiledServer {
    /// An apiserver the gateway dials at `endpoint` (validated already).
    fn direct(endpoint: &str, disabled: bool) -> Result<Self, http::uri::InvalidUri> {
        let uri: http::Uri = endpoint.parse()?;
        let tls = uri.scheme_str() != Some("http");
        Ok(Self {
            endpoint: endpoint.into(),
            host: uri
                .host()
                .unwrap_or_default()
                .trim_matches(['[', ']'])
                .into(),
            port: uri.port_u16().unwrap_or(if tls { 443 } else { 80 }),
            tls,
            uri,
            disabled,
            agent: None,
        })
    }

    /// An apiserver behind agent `id`'s tunnel.
    fn agent(id: u64, disabled: bool) -> Result<Self, http::Error> {
        let host = format!("agent-{id}.{AGENT_HOST_DOMAIN}");
        let uri = http::Uri::builder()
            .scheme("http")
            .authority(host.as_str())
            .path_and_query("/")
            .build()?;
        Ok(Self {
            endpoint: AgentServer { id }.name().into(),
            uri,
            tls: false,
            host: host.into(),
            port: 0,
            disabled,
            agent: Some(id),
        })
    }
}

/// Longest DNS name; longer hosts cannot be configured, so they need no lookup.
const MAX_HOSTNAME: usize = 253;

impl GatewaySnapshot {
    /// Compiles validated clusters (as [`super::load_dir`] returns them). Checks uniqueness
    /// again so a snapshot built from other sources is just as safe.
    pub fn compile(clusters: Vec<LoadedCluster>) -> Result<Self, InvalidSources> {
        let mut errors = InvalidSources::default();
        check_unique(&clusters, &mut errors);
        let mut compiled = Vec::with_capacity(clusters.len());
        let mut hosts = HashMap::new();
        for loaded in clusters {
            match compile_cluster(loaded) {
                Ok(cluster) => {
                    for host in cluster.hostnames.iter() {
                        hosts.insert(host.clone(), compiled.len());
                    }
                    compiled.push(cluster);
                }
                Err(error) => errors.sources.push(error),
            }
        }
        if errors.is_empty() {
            Ok(Self {
                clusters: compiled.into(),
                hosts,
            })
        } else {
            Err(errors)
        }
    }

    /// The cluster serving `host` (a TLS server name or a Host header, with or without port;
    /// compared case-insensitively). Allocates nothing.
    pub fn cluster_for_host(&self, host: &str) -> Option<(usize, &CompiledCluster)> {
        let host = strip_port(host);
        let mut lower = [0u8; MAX_HOSTNAME];
        let bytes = host.as_bytes();
        let buffer = lower.get_mut(..bytes.len())?;
        for (target, byte) in buffer.iter_mut().zip(bytes) {
            *target = byte.to_ascii_lowercase();
        }
        let host = std::str::from_utf8(buffer).ok()?;
        let index = *self.hosts.get(host)?;
        Some((index, &self.clusters[index]))
    }

    pub fn clusters(&self) -> &[CompiledCluster] {
        &self.clusters
    }
}

/// `name:443` -> `name`, `[::1]:443` -> `::1`, `::1` stays.
pub fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(address, _)| address);
    }
    match host.rsplit_once(':') {
        Some((name, port))
            if !name.contains(':') && port.bytes().all(|byte| byte.is_ascii_digit()) =>
        {
            name
        }
        _ => host,
    }
}

fn compile_cluster(loaded: LoadedCluster) -> Result<CompiledCluster, InvalidConfig> {
    let LoadedCluster { source, cluster } = loaded;
    let spec = cluster.spec;
    let servers = spec
        .servers
        .iter()
        .enumerate()
        .map(|(index, server)| {
            let invalid = |reason: String| {
                InvalidConfig::one(
                    source.display().to_string(),
                    format!("spec.servers[{index}]"),
                    reason,
                )
            };
            match (&server.endpoint, &server.agent) {
                (Some(endpoint), None) => CompiledServer::direct(endpoint, server.disabled)
                    .map_err(|error| invalid(format!("{endpoint:?}: {error}"))),
                (None, Some(agent)) => CompiledServer::agent(agent.id, server.disabled)
                    .map_err(|error| invalid(format!("agent {}: {error}", agent.id))),
                _ => Err(invalid("set exactly one of endpoint and agent".into())),
            }
        })
        .collect::<Result<Box<[_]>, InvalidConfig>>()?;
    let schemas: Box<[FlowControlSchema]> = spec
        .flow_control
        .schemas
        .iter()
        .map(|schema| FlowControlSchema {
            name: schema.name.as_str().into(),
            limit: match (&schema.max_requests_inflight, &schema.token_bucket) {
                (Some(inflight), _) => FlowLimit::MaxRequestsInflight { max: inflight.max },
                (None, Some(bucket)) => FlowLimit::TokenBucket {
                    qps: bucket.qps,
                    burst: bucket.burst,
                },
                (None, None) => FlowLimit::Exempt,
            },
        })
        .collect();
    let dispatch = DispatchMatcher::compile(&spec.dispatch_policies, &spec.servers, |name| {
        schemas.iter().position(|schema| &*schema.name == name)
    });
    let hostnames = std::iter::once(cluster.metadata.name.as_str())
        .chain(
            spec.secure_serving
                .extra_hostnames
                .iter()
                .map(String::as_str),
        )
        .map(|host| host.to_ascii_lowercase().into())
        .collect();
    Ok(CompiledCluster {
        name: cluster.metadata.name.into(),
        source,
        hostnames,
        servers,
        client: spec.client_config,
        serving: spec.secure_serving,
        schemas,
        dispatch,
        health_check: spec.health_check,
        connection_pool: spec.connection_pool,
        authentication: spec.authentication,
    })
}
