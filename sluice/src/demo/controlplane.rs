//! The control plane `sluice up` runs embedded: its store and certificates in the demo
//! directory, the demo UpstreamCluster stored in it, and a gateway token for the demo gateway,
//! which then takes its clusters from the control plane instead of a directory. The VM demo
//! stores its VirtualMachines, policy and vm-agent token here too ([`DemoControlPlane::store_vm_demo`]).

use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use serde_json::Value;
use sluice_apiserver::auth::{issue, Identity, Role};
use sluice_apiserver::server::{create_object, store_token, ApiServer};
use sluice_store::Store;

use crate::controlplane::{ControlPlaneOptions, RunningControlPlane};

/// The embedded control plane, stopped when dropped.
pub struct DemoControlPlane {
    pub url: String,
    pub kubeconfig: PathBuf,
    pub source: sluice_config::ControlPlaneSource,
    /// Where it really listens (port 0 in tests becomes the bound port here).
    pub address: SocketAddr,
    /// Its runtime and server, to store the VM demo's objects after start.
    runtime: tokio::runtime::Handle,
    server: Arc<ApiServer>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for DemoControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DemoControlPlane")
            .field("url", &self.url)
            .finish()
    }
}

impl Drop for DemoControlPlane {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl DemoControlPlane {
    /// Starts it on `listen` with its data in `dir`, stores `clusters_yaml` (the demo
    /// UpstreamClusters) and issues the demo gateway's token.
    pub fn start(dir: &Path, listen: SocketAddr, clusters_yaml: &[String]) -> anyhow::Result<Self> {
        let clusters = clusters_yaml
            .iter()
            .map(|yaml| serde_norway::from_str::<serde_json::Value>(yaml))
            .collect::<Result<Vec<_>, _>>()
            .context("the demo clusters' YAML")?;
        let options = ControlPlaneOptions::embedded(listen, dir.to_path_buf());
        let token_file = dir.join("gateway.token");
        let (started, outcome) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let token_path = token_file.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-up-controlplane".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        let _ = started.send(Err(anyhow::Error::from(error)));
                        return;
                    }
                };
                runtime.block_on(async move {
                    match prepare(options, clusters, &token_path).await {
                        Ok(running) => {
                            let _ = started.send(Ok(Started {
                                url: running.url.clone(),
                                kubeconfig: running.kubeconfig.clone(),
                                ca_file: running.ca_file.clone(),
                                address: running.address,
                                server: running.server.clone(),
                                runtime: tokio::runtime::Handle::current(),
                            }));
                            let _ = stopped.await;
                            running.shutdown().await;
                        }
                        Err(error) => {
                            let _ = started.send(Err(error));
                        }
                    }
                });
            })?;
        let started = outcome
            .recv()
            .context("the control plane's thread ended before it started")??;
        Ok(Self {
            source: sluice_config::ControlPlaneSource {
                url: started.url.clone(),
                name: None,
                ca_file: started.ca_file,
                token_file: Some(token_file),
                cert_file: None,
                key_file: None,
            },
            url: started.url,
            kubeconfig: started.kubeconfig,
            address: started.address,
            runtime: started.runtime,
            server: started.server,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

/// What the control plane's thread hands back once it serves.
struct Started {
    url: String,
    kubeconfig: PathBuf,
    ca_file: PathBuf,
    address: SocketAddr,
    server: Arc<ApiServer>,
    runtime: tokio::runtime::Handle,
}

impl DemoControlPlane {
    /// The CA file of its serving certificate.
    pub fn ca_file(&self) -> &Path {
        &self.source.ca_file
    }

    /// Stores the VM demo's `objects` and a vm-agent token for `vm`, written (0600) to
    /// `token_file`; the server accepts the token as soon as this returns.
    pub fn store_vm_demo(
        &self,
        objects: Vec<Value>,
        vm: &str,
        token_file: &Path,
    ) -> anyhow::Result<()> {
        let server = self.server.clone();
        let issued = issue(Identity::new(Role::VmAgent, vm)?)?;
        let token_name = format!("vm-agent.{vm}");
        // This thread is outside the runtime: block_on runs the writes on the runtime's
        // reactor while the control plane keeps serving.
        self.runtime.block_on(async {
            let store = server.store().clone();
            for object in objects {
                create_demo_object(store.as_ref(), object).await?;
            }
            store_token(store.as_ref(), &token_name, &issued)
                .await
                .map_err(|error| {
                    anyhow::anyhow!("storing the vm-agent token: {}", error.message)
                })?;
            server.load_tokens().await?;
            anyhow::Ok(())
        })?;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(token_file)
            .and_then(|mut file| std::io::Write::write_all(&mut file, issued.secret.as_bytes()))
            .with_context(|| format!("writing {}", token_file.display()))
    }
}

/// Stores one of the VM demo's objects (a VirtualMachine, AppliedToGroup or NetworkPolicy),
/// validated as the API validates it.
pub async fn create_demo_object(store: &dyn Store, object: Value) -> anyhow::Result<()> {
    let kind = object["kind"].as_str().unwrap_or_default().to_string();
    let spec = match kind.as_str() {
        "VirtualMachine" => sluice_apiserver::kinds::virtual_machine(),
        "AppliedToGroup" => sluice_apiserver::kinds::applied_to_group(),
        "NetworkPolicy" => sluice_apiserver::kinds::network_policy(),
        other => anyhow::bail!("the VM demo has no {other:?} objects"),
    };
    create_object(store, &spec, object)
        .await
        .map(|_| ())
        .map_err(|error| anyhow::anyhow!("storing the demo {kind}: {}", error.message))
}

async fn prepare(
    options: ControlPlaneOptions,
    clusters: Vec<serde_json::Value>,
    token_file: &Path,
) -> anyhow::Result<RunningControlPlane> {
    let running = crate::controlplane::start(options).await?;
    let store = running.server.store().clone();
    let spec = sluice_apiserver::kinds::upstream_cluster();
    for cluster in clusters {
        create_object(store.as_ref(), &spec, cluster)
            .await
            .map_err(|error| anyhow::anyhow!("storing a demo cluster: {}", error.message))?;
    }
    let issued = issue(Identity::new(Role::Gateway, "sluice-up")?)?;
    store_token(store.as_ref(), "gateway.sluice-up", &issued)
        .await
        .map_err(|error| anyhow::anyhow!("storing the gateway token: {}", error.message))?;
    // The server follows the stored tokens; the gateway's first request may come at once.
    running.server.load_tokens().await?;
    std::fs::write(token_file, &issued.secret)
        .with_context(|| format!("writing {}", token_file.display()))?;
    Ok(running)
}
