//! The control plane `sluice up` runs embedded: its store and certificates in the demo
//! directory, the demo UpstreamCluster stored in it, and a gateway token for the demo gateway,
//! which then takes its clusters from the control plane instead of a directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use sluice_apiserver::auth::{issue, Identity, Role};
use sluice_apiserver::server::{create_object, store_token};

use crate::controlplane::{ControlPlaneOptions, RunningControlPlane};

/// The embedded control plane, stopped when dropped.
pub struct DemoControlPlane {
    pub url: String,
    pub kubeconfig: PathBuf,
    pub source: sluice_config::ControlPlaneSource,
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
    /// Starts it on `listen` with its data in `dir`, stores `cluster_yaml` (the demo
    /// UpstreamCluster) and issues the demo gateway's token.
    pub fn start(dir: &Path, listen: SocketAddr, cluster_yaml: &str) -> anyhow::Result<Self> {
        let cluster: serde_json::Value =
            serde_norway::from_str(cluster_yaml).context("the demo cluster's YAML")?;
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
                    match prepare(options, cluster, &token_path).await {
                        Ok(running) => {
                            let url = running.url.clone();
                            let kubeconfig = running.kubeconfig.clone();
                            let ca = running.ca_file.clone();
                            let _ = started.send(Ok((url, kubeconfig, ca)));
                            let _ = stopped.await;
                            running.shutdown().await;
                        }
                        Err(error) => {
                            let _ = started.send(Err(error));
                        }
                    }
                });
            })?;
        let (url, kubeconfig, ca_file) = outcome
            .recv()
            .context("the control plane's thread ended before it started")??;
        Ok(Self {
            source: sluice_config::ControlPlaneSource {
                url: url.clone(),
                name: None,
                ca_file,
                token_file: Some(token_file),
                cert_file: None,
                key_file: None,
            },
            url,
            kubeconfig,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

async fn prepare(
    options: ControlPlaneOptions,
    cluster: serde_json::Value,
    token_file: &Path,
) -> anyhow::Result<RunningControlPlane> {
    let running = crate::controlplane::start(options).await?;
    let store = running.server.store().clone();
    let spec = sluice_apiserver::kinds::upstream_cluster();
    create_object(store.as_ref(), &spec, cluster)
        .await
        .map_err(|error| anyhow::anyhow!("storing the demo cluster: {}", error.message))?;
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
