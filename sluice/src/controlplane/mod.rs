//! `sluice controlplane`: the kube-like API server on its embedded store, HTTPS on its own
//! listener; `sluice controlplane token create` issues bearer tokens through it.

mod token;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sluice_apiserver::bootstrap;
use sluice_apiserver::server::{ApiServer, ServerLimits};
use sluice_store::{Compactor, EmbeddedStore, Store};
use tokio::sync::watch;

pub use token::create_token;

/// How `sluice controlplane` serves.
#[derive(Debug, Clone)]
pub struct ControlPlaneOptions {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Serving certificate and key; generated in `<data-dir>/pki/` when not given.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// CA of accepted client certificates; without it only bearer tokens authenticate.
    pub client_ca: Option<PathBuf>,
    /// Extra names of the generated serving certificate.
    pub hostnames: Vec<String>,
    /// History kept for watchers to resume from (kube-apiserver: 5 minutes).
    pub compaction_interval: Duration,
    pub limits: ServerLimits,
}

/// A running control plane: its address, what it wrote for clients, and how to stop it.
pub struct RunningControlPlane {
    pub address: SocketAddr,
    pub url: String,
    pub ca_file: PathBuf,
    pub kubeconfig: PathBuf,
    pub server: Arc<ApiServer>,
    stop: watch::Sender<bool>,
    served: tokio::task::JoinHandle<()>,
}

impl RunningControlPlane {
    /// Stops accepting, lets open requests finish (watches end) and waits for that.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.served.await;
    }
}

/// `sluice controlplane`: serves until SIGINT or SIGTERM.
pub fn run(options: ControlPlaneOptions, addresses_file: Option<&Path>) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sluice-controlplane")
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sluice controlplane: cannot start the runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        let running = start(options).await?;
        if let Some(path) = addresses_file {
            write_address(path, running.address)?;
        }
        println!("control plane serving on {}", running.url);
        println!(
            "  kubectl --kubeconfig {} get upstreamclusters",
            running.kubeconfig.display()
        );
        stop_signal().await?;
        tracing::info!("stopping the control plane: no new connections, open requests finish");
        running.shutdown().await;
        anyhow::Ok(())
    });
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sluice controlplane: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Opens the store, prepares certificates and the first admin token, and starts serving.
pub async fn start(options: ControlPlaneOptions) -> anyhow::Result<RunningControlPlane> {
    std::fs::create_dir_all(&options.data_dir)
        .with_context(|| format!("creating {}", options.data_dir.display()))?;
    let store_path = options.data_dir.join("store.redb");
    let store = tokio::task::spawn_blocking(move || EmbeddedStore::open(&store_path))
        .await
        .context("opening the store")?
        .with_context(|| format!("opening the store in {}", options.data_dir.display()))?;
    let store: Arc<dyn Store> = Arc::new(store);
    start_on(options, store).await
}

/// [`start`] on a store the caller opened (embedded or etcd).
pub async fn start_on(
    options: ControlPlaneOptions,
    store: Arc<dyn Store>,
) -> anyhow::Result<RunningControlPlane> {
    let pki = bootstrap::ensure_pki(&options.data_dir.join("pki"), &options.hostnames)?;
    let (cert, key) = match (&options.tls_cert, &options.tls_key) {
        (Some(cert), Some(key)) => (cert.clone(), key.clone()),
        (None, None) => (pki.cert.clone(), pki.key.clone()),
        _ => anyhow::bail!("--tls-cert and --tls-key go together"),
    };
    let tls = bootstrap::server_tls(&cert, &key, options.client_ca.as_deref())?;
    let registry = sluice_apiserver::kinds::registry().context("the served kinds")?;
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("binding {}", options.listen))?;
    let address = listener.local_addr()?;
    let url = format!("https://{address}");
    let kubeconfig = options.data_dir.join("admin.kubeconfig");
    if bootstrap::ensure_admin(store.as_ref(), &kubeconfig, &url, &pki.ca).await? {
        tracing::info!(kubeconfig = %kubeconfig.display(), "issued the first admin token");
    }
    let server = ApiServer::new(registry, store.clone(), options.limits.clone());
    server
        .load_tokens()
        .await
        .context("reading the stored tokens")?;
    let (stop, stopping) = watch::channel(false);
    tokio::spawn(server.clone().follow_tokens(stopping.clone()));
    let compactor = Compactor::new(store, options.compaction_interval);
    let compacting = tokio::spawn(compactor.run());
    let served = tokio::spawn({
        let server = server.clone();
        async move {
            server
                .serve(listener, tls, stopping, Duration::from_secs(10))
                .await;
            compacting.abort();
        }
    });
    tracing::info!(%url, "control plane serving");
    Ok(RunningControlPlane {
        address,
        url,
        ca_file: pki.ca,
        kubeconfig,
        server,
        stop,
        served,
    })
}

async fn stop_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    Ok(())
}

fn write_address(path: &Path, address: SocketAddr) -> anyhow::Result<()> {
    let temporary = path.with_extension("tmp");
    let text = serde_json::json!({ "controlplane": address.to_string() });
    std::fs::write(&temporary, serde_json::to_vec_pretty(&text)?)?;
    std::fs::rename(&temporary, path)?;
    Ok(())
}
