//! What the control plane pushes to this process: UpstreamClusters to the gateway, Agents to
//! the tunnel node. Watch clients run on one tokio thread of their own, never on the data-plane
//! cores; each new snapshot is validated and swapped in whole, as a directory reload is, and a
//! bad or missing control plane leaves the last good state serving.

use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use serde_json::Value;
use sluice_config::{AgentTokenConfig, ControlPlaneSource};
use sluice_gateway_proxy::Gateway;
use sluice_tunnel::node::NodeShared;
use sluice_upstream_cluster::{check_agent_servers, AgentReach, InvalidSources};
use sluice_watch_client::{
    ClientCertFiles, Resource, Snapshot, Transport, WatchClient, WatchClientConfig, WatchMetrics,
};
use tokio::sync::{oneshot, watch};

/// How long start-up waits for the first list before serving without it.
const FIRST_SYNC: Duration = Duration::from_secs(10);

/// A tunnel that was authenticating when its agent was revoked is parked at most this long
/// later (an agent must send its Descriptor within 10 s); a second eviction then closes it.
const LATE_EVICTION: Duration = Duration::from_secs(11);

/// The roles' feeds, and the thread they run on; stopped when dropped.
pub struct Feeds {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Feeds {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What to feed.
#[derive(Default)]
pub struct FeedTargets {
    pub gateway: Option<(ControlPlaneSource, Arc<Gateway>)>,
    /// `gateway.credentials_dir`: the only files the gateway's objects may name.
    pub gateway_credentials: Option<PathBuf>,
    /// What the gateway's config offers agent servers; a cluster it cannot serve is refused.
    pub gateway_agents: AgentReach,
    pub node: Option<(ControlPlaneSource, Arc<NodeShared>)>,
}

/// Starts the feeds and waits (at most [`FIRST_SYNC`]) until each has applied its first list.
pub fn spawn(targets: FeedTargets, registry: &mut Registry) -> anyhow::Result<Option<Feeds>> {
    if targets.gateway.is_none() && targets.node.is_none() {
        return Ok(None);
    }
    let metrics = WatchMetrics::register(registry);
    let mut clients = Vec::new();
    let credentials = targets.gateway_credentials;
    if let Some((source, gateway)) = targets.gateway {
        let (client, reporter) =
            watch_and_report(&source, "proxy.sluice.dev", "upstreamclusters", &metrics)?;
        let name = source.name.clone().unwrap_or_else(host_name);
        let target = Target::Gateway(GatewayTarget {
            gateway,
            url: source.url,
            name,
            credentials,
            agents: targets.gateway_agents,
        });
        clients.push((client, target, reporter));
    }
    if let Some((source, node)) = targets.node {
        let (client, reporter) =
            watch_and_report(&source, "tunnel.sluice.dev", "agents", &metrics)?;
        clients.push((client, Target::Node(node), reporter));
    }
    let (stop, stopped) = oneshot::channel::<()>();
    let (synced, first) = mpsc::channel::<()>();
    let count = clients.len();
    let thread = std::thread::Builder::new()
        .name("sluice-controlplane-feeds".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    tracing::error!(%error, "cannot start the control-plane feeds' runtime");
                    return;
                }
            };
            runtime.block_on(run(clients, stopped, synced));
        })?;
    for _ in 0..count {
        if first.recv_timeout(FIRST_SYNC).is_err() {
            tracing::warn!(timeout = ?FIRST_SYNC, "no first list from the control plane yet; serving without it, it is applied when it arrives");
            break;
        }
    }
    Ok(Some(Feeds {
        stop: Some(stop),
        thread: Some(thread),
    }))
}

/// A watch client of `group/v1alpha1 plural` and a transport for the role's status reports.
fn watch_and_report(
    source: &ControlPlaneSource,
    group: &str,
    plural: &str,
    metrics: &WatchMetrics,
) -> anyhow::Result<(WatchClient, Transport)> {
    let config = client_config(source);
    let resource = Resource::new(group, "v1alpha1", plural);
    let client = WatchClient::new(config.clone(), resource, metrics.for_resource(plural))?;
    Ok((client, Transport::new(&config)?))
}

enum Target {
    Gateway(GatewayTarget),
    Node(Arc<NodeShared>),
}

struct GatewayTarget {
    gateway: Arc<Gateway>,
    /// The control plane's URL.
    url: String,
    /// The gateway's name in status reports.
    name: String,
    credentials: Option<PathBuf>,
    agents: AgentReach,
}

async fn run(
    clients: Vec<(WatchClient, Target, Transport)>,
    stopped: oneshot::Receiver<()>,
    synced: mpsc::Sender<()>,
) {
    let (stop_all, stopping) = watch::channel(false);
    let mut tasks = Vec::new();
    for (client, target, reporter) in clients {
        let snapshots = client.subscribe();
        let mut stop = stopping.clone();
        tasks.push(tokio::spawn(client.run(async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        })));
        tasks.push(tokio::spawn(match &target {
            Target::Gateway(target) => Box::pin(super::status::report_gateway(
                reporter,
                target.gateway.clone(),
                target.name.clone(),
                stopping.clone(),
            ))
                as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
            Target::Node(node) => Box::pin(super::status::report_node(
                reporter,
                node.clone(),
                snapshots.clone(),
                stopping.clone(),
            )),
        }));
        tasks.push(tokio::spawn(apply_snapshots(
            snapshots,
            target,
            synced.clone(),
            stopping.clone(),
        )));
    }
    let _ = stopped.await;
    let _ = stop_all.send(true);
    for task in tasks {
        let _ = task.await;
    }
}

/// Applies every new synced snapshot to its target until stopped.
async fn apply_snapshots(
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    target: Target,
    synced: mpsc::Sender<()>,
    mut stopping: watch::Receiver<bool>,
) {
    let mut announced = false;
    let mut applied = AppliedBase::default();
    loop {
        let snapshot = snapshots.borrow_and_update().clone();
        if applied.must_apply(&snapshot) {
            match &target {
                Target::Gateway(target) => apply_clusters(target, &snapshot),
                Target::Node(node) => apply_agents(node, &snapshot),
            }
            if !announced {
                announced = true;
                let _ = synced.send(());
            }
        }
        tokio::select! {
            changed = snapshots.changed() => if changed.is_err() { return },
            _ = stopping.wait_for(|stopped| *stopped) => return,
        }
    }
}

/// What the next snapshot is compared with: the last one applied, or a later one with the
/// same desired state.
#[derive(Default)]
struct AppliedBase(Option<Arc<Snapshot>>);

impl AppliedBase {
    /// Whether `snapshot` changes what the data path serves. A status write (every gateway's
    /// health report, every node's Agent entry) reaches every watcher: the data path is rebuilt
    /// only when what it serves changed. A synced snapshot becomes the base either way, so the
    /// next comparison costs what the next chunk changed; kept at the last applied one, it grew
    /// with every status write since (O(objects) once they had all been written, issue 36).
    fn must_apply(&mut self, snapshot: &Arc<Snapshot>) -> bool {
        if !snapshot.synced {
            return false;
        }
        let unchanged = self.0.as_ref().is_some_and(|last| {
            sluice_watch_client::same_desired_state(&last.objects, &snapshot.objects)
        });
        self.0 = Some(snapshot.clone());
        !unchanged
    }
}

fn apply_clusters(target: &GatewayTarget, snapshot: &Snapshot) {
    let GatewayTarget { gateway, url, .. } = target;
    let objects = snapshot.objects.values().map(|object| object.as_ref());
    let origin = format!("{url}/upstreamclusters");
    let credentials = target.credentials.as_deref();
    let loaded = sluice_upstream_cluster::api::load_objects(objects, &origin, credentials)
        .and_then(|clusters| {
            let mut refused = InvalidSources::default();
            check_agent_servers(&clusters, target.agents, &mut refused);
            if refused.is_empty() {
                Ok(clusters)
            } else {
                Err(refused)
            }
        })
        .map_err(sluice_gateway_proxy::ProxyError::from)
        .and_then(|clusters| gateway.install(clusters));
    match loaded {
        Ok(generation) => {
            gateway.metrics.reloads_ok.inc();
            tracing::info!(source = %url, generation, resource_version = %snapshot.resource_version, clusters = snapshot.objects.len(), "gateway clusters from the control plane");
        }
        Err(error) => {
            gateway.metrics.reloads_failed.inc();
            tracing::error!(source = %url, %error, "clusters from the control plane rejected; the last good config stays");
        }
    }
}

fn apply_agents(node: &Arc<NodeShared>, snapshot: &Snapshot) {
    let agents: Vec<AgentTokenConfig> = snapshot
        .objects
        .iter()
        .filter_map(|(key, object)| {
            let agent = agent_token(object);
            if agent.is_none() {
                tracing::warn!(agent = %key, "Agent object without a valid spec.id and spec.tokenSha256; skipped");
            }
            agent
        })
        .collect();
    let revoked = node.set_agents(&agents);
    tracing::info!(agents = agents.len(), revoked = revoked.len(), resource_version = %snapshot.resource_version, "allowed agents from the control plane");
    if !revoked.is_empty() {
        let node = node.clone();
        tokio::spawn(async move {
            tokio::time::sleep(LATE_EVICTION).await;
            node.evict_revoked(&revoked);
        });
    }
}

/// This gateway's name in the clusters' status: the host name.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "sluice-gateway".to_string())
}

/// An Agent object's id and token digest (the API validated them; a bad one is skipped).
fn agent_token(object: &Value) -> Option<AgentTokenConfig> {
    let id = object.pointer("/spec/id")?.as_i64().filter(|id| *id >= 1)?;
    let digest = object.pointer("/spec/tokenSha256")?.as_str()?;
    let mut token_sha256 = [0u8; 32];
    hex::decode_to_slice(digest, &mut token_sha256).ok()?;
    Some(AgentTokenConfig { id, token_sha256 })
}

pub(crate) fn client_config(source: &ControlPlaneSource) -> WatchClientConfig {
    let mut config = WatchClientConfig::new(source.url.clone(), source.ca_file.clone());
    config.token_file = source.token_file.clone();
    config.client_cert = match (&source.cert_file, &source.key_file) {
        (Some(cert), Some(key)) => Some(ClientCertFiles {
            cert: cert.clone(),
            key: key.clone(),
        }),
        _ => None,
    };
    // Resume quickly after a control-plane restart (the issue asks for catch-up within 1 s).
    config.backoff_min = Duration::from_millis(100);
    config.backoff_max = Duration::from_secs(1);
    config
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sluice_gateway_proxy::GatewayMetrics;
    use sluice_watch_client::ObjectKey;

    /// A gateway fed from the control plane, with no clusters yet.
    fn target(agents: AgentReach, credentials: &std::path::Path) -> GatewayTarget {
        let metrics = GatewayMetrics::register(&mut Registry::default(), 1);
        GatewayTarget {
            gateway: Gateway::with_clusters("https://cp", Vec::new(), metrics).unwrap(),
            url: "https://cp".into(),
            name: "gw".into(),
            credentials: Some(credentials.to_path_buf()),
            agents,
        }
    }

    /// A listed UpstreamCluster with an endpoint and an agent server, naming the files of
    /// `Certificates` inside its directory (the credentials directory).
    fn snapshot() -> Snapshot {
        let object = json!({
            "apiVersion": "proxy.sluice.dev/v1alpha1", "kind": "UpstreamCluster",
            "metadata": {"name": "behind-nat"},
            "spec": {
                "servers": [{"endpoint": "https://127.0.0.1:6443"}, {"agent": {"id": 42}}],
                "clientConfig": {"bearerToken": "gateway-token", "caFile": "ca.pem"},
                "secureServing": {"certFile": "server.pem", "keyFile": "server-key.pem"},
            },
        });
        let mut snapshot = Snapshot {
            synced: true,
            ..Snapshot::default()
        };
        snapshot
            .objects
            .insert(ObjectKey::new("", "behind-nat"), Arc::new(object));
        snapshot
    }

    #[test]
    fn an_agent_server_is_installed_only_when_the_config_can_serve_it() {
        let certs = test_support::Certificates::generate(&[]).unwrap();
        let credentials = certs.ca_cert.parent().unwrap();
        let refusing = target(AgentReach::default(), credentials);
        apply_clusters(&refusing, &snapshot());
        assert_eq!(refusing.gateway.metrics.reloads_failed.get(), 1);
        assert!(refusing.gateway.current().snapshot.clusters().is_empty());

        let serving = AgentReach {
            tunnel: true,
            assertion_key: true,
        };
        let serving = target(serving, credentials);
        apply_clusters(&serving, &snapshot());
        assert_eq!(serving.gateway.metrics.reloads_ok.get(), 1);
        let generation = serving.gateway.current();
        let cluster = &generation.snapshot.clusters()[0];
        assert_eq!(cluster.servers[1].agent, Some(42));
    }

    #[test]
    fn status_writes_are_not_applied_and_become_the_base() {
        let mut base = AppliedBase::default();
        let unsynced = Arc::new(Snapshot::default());
        assert!(
            !base.must_apply(&unsynced),
            "nothing is known before a LIST"
        );
        let first = Arc::new(snapshot());
        assert!(base.must_apply(&first));
        let key = ObjectKey::new("", "behind-nat");
        let with_status = |generation: u64, healthy: bool| {
            let mut next = (*first).clone();
            let mut object = (**next.objects.get(&key).unwrap()).clone();
            object["status"] = json!({"gateways": {"gw": {"healthy": healthy}}});
            next.objects.insert(key.clone(), Arc::new(object));
            next.generation = generation;
            Arc::new(next)
        };
        assert!(!base.must_apply(&with_status(2, true)));
        assert_eq!(base.0.as_ref().map(|base| base.generation), Some(2));
        assert!(!base.must_apply(&with_status(3, false)));
        let mut respecced = (*with_status(4, false)).clone();
        let mut object = (**respecced.objects.get(&key).unwrap()).clone();
        object["spec"]["servers"] = json!([{"endpoint": "https://127.0.0.1:7443"}]);
        respecced.objects.insert(key.clone(), Arc::new(object));
        assert!(base.must_apply(&Arc::new(respecced)));
    }
}
