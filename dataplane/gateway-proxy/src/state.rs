//! What the data plane reads per request: the current [`Generation`] (compiled clusters plus the
//! TLS configs and credentials built from their files), swapped atomically on reload, and the
//! health of every upstream server, which outlives generations.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use http::HeaderValue;
use sluice_gateway::cluster::{
    check_agent_servers, load_dir, AgentReach, GatewaySnapshot, InvalidSources, LoadedCluster,
};
use sluice_role_metrics::CertificateExpiry;

use crate::error::{ClusterFileError, ProxyError};
use crate::metrics::GatewayMetrics;

/// One cluster's runtime material, built from the files its spec names.
#[derive(Debug)]
pub struct ClusterRuntime {
    /// Served to clients whose TLS server name is one of the cluster's hostnames.
    pub server_tls: Arc<rustls::ServerConfig>,
    /// How the gateway connects to the cluster's apiservers (its own identity).
    pub client_tls: Arc<rustls::ClientConfig>,
    /// `Authorization` the gateway sends upstream when configured with a bearer token.
    pub bearer: Option<HeaderValue>,
    /// One health flag per server of the cluster (same order as `servers`).
    pub health: Box<[Arc<ServerHealth>]>,
}

/// A config generation: immutable once built.
#[derive(Debug)]
pub struct Generation {
    pub number: u64,
    pub snapshot: GatewaySnapshot,
    pub clusters: Box<[ClusterRuntime]>,
}

/// Health of one upstream server, written by the health checker.
#[derive(Debug)]
pub struct ServerHealth {
    healthy: AtomicBool,
}

impl ServerHealth {
    pub fn new(healthy: bool) -> Self {
        Self {
            healthy: AtomicBool::new(healthy),
        }
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub fn set(&self, healthy: bool) -> bool {
        self.healthy.swap(healthy, Ordering::Relaxed) != healthy
    }
}

/// The gateway shared by every core.
#[derive(Debug)]
pub struct Gateway {
    current: ArcSwap<Generation>,
    /// Health by (cluster, endpoint), kept across reloads so a reload neither revives a dead
    /// server nor forgets a live one.
    health: Mutex<HashMap<(String, String), Arc<ServerHealth>>>,
    next_generation: AtomicU64,
    pub metrics: GatewayMetrics,
    /// The clusters directory, or what names the control plane in logs (`https://...`).
    pub dir: PathBuf,
    /// Where each generation's per-cluster certificate expiry goes, once the role exports it;
    /// the lock also orders publications, so the last one shows the current generation.
    expiry: Mutex<Option<CertificateExpiry>>,
    /// How agent servers are reached, once the daemon wired a tunnel node and a signing key.
    agent_path: std::sync::OnceLock<crate::agent_link::AgentPath>,
    /// What this gateway's config offers agent servers: a reload that adds one the config
    /// cannot serve is refused, as the start was.
    agent_reach: Mutex<AgentReach>,
}

impl Gateway {
    /// Loads `dir`; refuses to start on any error (each names its file, field and reason).
    pub fn load(dir: &Path, metrics: GatewayMetrics) -> Result<Arc<Self>, ProxyError> {
        let health = Mutex::new(HashMap::new());
        let first = load_generation(dir, 1, &health)?;
        Ok(Arc::new(Self {
            current: ArcSwap::from_pointee(first),
            health,
            next_generation: AtomicU64::new(2),
            metrics,
            dir: dir.to_path_buf(),
            expiry: Mutex::new(None),
            agent_path: std::sync::OnceLock::new(),
            agent_reach: Mutex::default(),
        }))
    }

    /// What the config offers agent servers (checked again by every directory reload).
    pub fn set_agent_reach(&self, reach: AgentReach) {
        *self
            .agent_reach
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = reach;
    }

    /// Lets agent servers be reached (set once, by the daemon, before serving).
    pub fn set_agent_path(&self, path: crate::agent_link::AgentPath) {
        if self.agent_path.set(path).is_err() {
            tracing::warn!("the gateway's agent path was already set; the first one stays");
        }
    }

    /// How agent servers are reached; `None` without a tunnel node or signing key.
    pub fn agent_path(&self) -> Option<&crate::agent_link::AgentPath> {
        self.agent_path.get()
    }

    /// A gateway whose clusters come from elsewhere than a directory (the control plane),
    /// starting with `clusters` (possibly none until the first list arrives).
    pub fn with_clusters(
        origin: &str,
        clusters: Vec<LoadedCluster>,
        metrics: GatewayMetrics,
    ) -> Result<Arc<Self>, ProxyError> {
        let health = Mutex::new(HashMap::new());
        let first = build_generation(clusters, 1, &health)?;
        Ok(Arc::new(Self {
            current: ArcSwap::from_pointee(first),
            health,
            next_generation: AtomicU64::new(2),
            metrics,
            dir: PathBuf::from(origin),
            expiry: Mutex::new(None),
            agent_path: std::sync::OnceLock::new(),
            agent_reach: Mutex::default(),
        }))
    }

    /// Makes `clusters` the next generation on every core at once; on an error the current
    /// one stays (the same all-or-nothing rule as a directory reload).
    pub fn install(&self, clusters: Vec<LoadedCluster>) -> Result<u64, ProxyError> {
        let number = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let generation = build_generation(clusters, number, &self.health)?;
        self.current.store(Arc::new(generation));
        self.publish_expiry();
        Ok(number)
    }

    /// Exports the expiry of each cluster's serving certificate (`listener="gateway"`) and
    /// upstream client certificate (`listener="upstream_client"`), by cluster, for this
    /// generation and every one installed or reloaded later.
    pub fn export_certificate_expiry(&self, expiry: CertificateExpiry) {
        *self
            .expiry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(expiry);
        self.publish_expiry();
    }

    /// Sets the expiry gauges from the generation in force (read under the lock: of two
    /// concurrent swaps, the later publication reads the later generation).
    fn publish_expiry(&self) {
        let expiry = self
            .expiry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(expiry) = expiry.as_ref() else {
            return;
        };
        let generation = self.current();
        let clusters = generation.snapshot.clusters();
        expiry.set_clusters(
            "gateway",
            clusters
                .iter()
                .map(|cluster| (&*cluster.name, cluster.serving.cert_file.as_path())),
        );
        expiry.set_clusters(
            "upstream_client",
            clusters.iter().filter_map(|cluster| {
                let file = cluster.client.cert_file.as_deref()?;
                Some((&*cluster.name, file))
            }),
        );
    }

    /// The generation to use for one request (lock-free).
    pub fn current(&self) -> Arc<Generation> {
        self.current.load_full()
    }

    /// Loads the directory again; on success the new generation replaces the old one on every
    /// core at once, on failure the old one stays.
    pub fn reload(&self) -> Result<u64, ProxyError> {
        let number = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let loaded = load_dir(&self.dir)?;
        let reach = *self
            .agent_reach
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut refused = InvalidSources::default();
        check_agent_servers(&loaded, reach, &mut refused);
        if !refused.is_empty() {
            return Err(ProxyError::Config(refused));
        }
        let generation = build_generation(loaded, number, &self.health)?;
        self.current.store(Arc::new(generation));
        self.publish_expiry();
        Ok(number)
    }
}

/// Builds a generation from a directory of `UpstreamCluster` files.
pub fn load_generation(
    dir: &Path,
    number: u64,
    health: &Mutex<HashMap<(String, String), Arc<ServerHealth>>>,
) -> Result<Generation, ProxyError> {
    build_generation(load_dir(dir)?, number, health)
}

/// Builds a generation from loaded clusters: compiled, with their TLS configs and tokens.
fn build_generation(
    loaded: Vec<LoadedCluster>,
    number: u64,
    health: &Mutex<HashMap<(String, String), Arc<ServerHealth>>>,
) -> Result<Generation, ProxyError> {
    let snapshot = GatewaySnapshot::compile(loaded)?;
    let mut table = health
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut clusters = Vec::with_capacity(snapshot.clusters().len());
    for cluster in snapshot.clusters() {
        let file_error = |cause: ClusterFileError| ProxyError::ClusterFiles {
            file: cluster.source.clone(),
            cluster: cluster.name.clone(),
            cause,
        };
        for secret in [
            Some(&cluster.serving.key_file),
            cluster.client.key_file.as_ref(),
            cluster.client.bearer_token_file.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            warn_if_exposed(secret);
        }
        let server_tls = crate::tls::server_config(&cluster.serving).map_err(file_error)?;
        let client_tls = crate::tls::client_config(&cluster.client).map_err(file_error)?;
        let token = match (
            &cluster.client.bearer_token,
            &cluster.client.bearer_token_file,
        ) {
            (Some(token), _) => Some(token.trim().to_string()),
            (None, Some(file)) => Some(
                std::fs::read_to_string(file)
                    .map_err(|source| {
                        file_error(ClusterFileError::BearerTokenFile {
                            path: file.clone(),
                            source,
                        })
                    })?
                    .trim()
                    .to_string(),
            ),
            (None, None) => None,
        };
        let bearer = token
            .map(|token| {
                let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
                    .map_err(|_| file_error(ClusterFileError::BearerToken))?;
                // Never HPACK-indexed upstream, never printed by Debug.
                value.set_sensitive(true);
                Ok::<_, ProxyError>(value)
            })
            .transpose()?;
        let health = cluster
            .servers
            .iter()
            .map(|server| {
                table
                    .entry((cluster.name.to_string(), server.endpoint.to_string()))
                    // New servers are presumed healthy until a check says otherwise, so a
                    // reload never opens a window without upstreams.
                    .or_insert_with(|| Arc::new(ServerHealth::new(true)))
                    .clone()
            })
            .collect();
        clusters.push(ClusterRuntime {
            server_tls,
            client_tls,
            bearer,
            health,
        });
    }
    Ok(Generation {
        number,
        snapshot,
        clusters: clusters.into(),
    })
}

/// The permission bits of a secret file that let its group or others read it (`None`: private).
pub fn exposed_bits(mode: u32) -> Option<u32> {
    let exposed = mode & 0o044;
    (exposed != 0).then_some(mode & 0o777)
}

/// Warns once per file and mode when a secret file (a private key, a bearer token file) is
/// readable by its group or by others. The file is still used: refusing would take the gateway
/// down on a reload; the warning names the file and its mode so it can be fixed.
fn warn_if_exposed(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    static WARNED: Mutex<Option<std::collections::HashSet<(std::path::PathBuf, u32)>>> =
        Mutex::new(None);
    let Ok(metadata) = std::fs::metadata(path) else {
        return; // loading it reports the error
    };
    let Some(mode) = exposed_bits(metadata.permissions().mode()) else {
        return;
    };
    // A check before logging starts (the start's preflight loads every file first) must not
    // use up the one warning: the load after logging started gives it.
    if !tracing::dispatcher::has_been_set() {
        return;
    }
    let mut warned = WARNED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if warned
        .get_or_insert_with(Default::default)
        .insert((path.to_path_buf(), mode))
    {
        tracing::warn!(file = %path.display(), mode = format_args!("{mode:04o}"), "secret file is readable by its group or others; chmod 600 it");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_files_readable_by_group_or_others_are_flagged() {
        assert_eq!(exposed_bits(0o100600), None);
        assert_eq!(exposed_bits(0o400), None);
        assert_eq!(exposed_bits(0o100640), Some(0o640));
        assert_eq!(exposed_bits(0o604), Some(0o604));
        assert_eq!(exposed_bits(0o644), Some(0o644));
    }
}
