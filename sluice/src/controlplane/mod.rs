//! `sluice controlplane`: the kube-like API server on its embedded store or on etcd, HTTPS on
//! its own listener; `sluice controlplane token create` issues bearer tokens through it.
//!
//! Replicas over one etcd (`--etcd-endpoints`) serve the same data and each takes writes. They
//! must present one serving identity: the first replica generates the CA and serving
//! certificate in its `--pki-dir` (default `<data-dir>/pki`), and the others are started with
//! a copy of that directory as their `--pki-dir` (or all get `--tls-cert/--tls-key` signed by
//! the operator's CA). Tokens are Token objects in the store, which every replica follows, so a
//! token issued through one replica authenticates on all. Only the first replica that finds no
//! admin token in the store issues one and writes `admin.kubeconfig`; a replica that finds an
//! admin token but no kubeconfig in its own data directory issues none (see [`bootstrap_admin`]).

#[cfg(feature = "etcd")]
mod etcd_metrics;
#[cfg(test)]
mod flag_props;
mod limits;
mod overload;
mod store_limits;
mod token;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sluice_apiserver::bootstrap;
use sluice_apiserver::server::{ApiServer, ServerLimits};
use sluice_store::{Compactor, EmbeddedStore, Store};
#[cfg(feature = "etcd")]
use sluice_store::{EtcdClientCert, EtcdConfig, EtcdStore, EtcdTls};
use sluice_vm_manager::{VmManager, VmMetrics};
use tokio::sync::watch;

pub use limits::LimitArgs;
pub use overload::OverloadArgs;
pub use store_limits::StoreLimitArgs;
pub use token::create_token;

/// How `sluice controlplane` serves.
#[derive(Debug, Clone)]
pub struct ControlPlaneOptions {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Where the CA and serving certificate are generated (or found); default
    /// `<data-dir>/pki`. Replicas of one cluster share its contents.
    pub pki_dir: Option<PathBuf>,
    /// The embedded store in `<data-dir>/store.redb`, or etcd.
    pub store: StoreChoice,
    /// Serving certificate and key; generated in the PKI directory when not given.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// CA of accepted client certificates; without it only bearer tokens authenticate.
    pub client_ca: Option<PathBuf>,
    /// Extra names of the generated serving certificate.
    pub hostnames: Vec<String>,
    /// History kept for watchers to resume from (kube-apiserver: 5 minutes).
    pub compaction_interval: Duration,
    pub limits: ServerLimits,
    /// Bytes the embedded store may hold (objects and kept history) before writes get 507.
    pub store_quota_bytes: u64,
    /// How long after its agent's last runtime-info report an Agented VM stays
    /// AgentedConnected (the VMManager's staleness timeout).
    pub vm_heartbeat_timeout: Duration,
    /// Near the memory or descriptor limit: stop accepting, shed new requests (`run` only).
    pub overload: sluice_config::OverloadConfig,
}

/// Which store the API server keeps its objects in.
#[derive(Debug, Clone, Default)]
pub enum StoreChoice {
    /// A redb file in the data directory: one machine, nothing to install.
    #[default]
    Embedded,
    /// An etcd v3 cluster: several replicas may serve it (builds with the `etcd` feature).
    #[cfg(feature = "etcd")]
    Etcd(EtcdConfig),
}

impl ControlPlaneOptions {
    /// The defaults of `sluice controlplane` on `listen` and `data_dir`: embedded store,
    /// generated certificates, tokens only, 5 minutes of history.
    pub fn embedded(listen: SocketAddr, data_dir: PathBuf) -> Self {
        Self {
            listen,
            data_dir,
            pki_dir: None,
            store: StoreChoice::Embedded,
            tls_cert: None,
            tls_key: None,
            client_ca: None,
            hostnames: Vec::new(),
            compaction_interval: Duration::from_secs(300),
            limits: ServerLimits::default(),
            store_quota_bytes: sluice_store::DEFAULT_QUOTA_BYTES,
            vm_heartbeat_timeout: sluice_vm_manager::DEFAULT_HEARTBEAT_TIMEOUT,
            overload: sluice_config::OverloadConfig::default(),
        }
    }
}

/// The `--etcd-*` flags of `sluice controlplane`.
#[derive(Debug, Clone, clap::Args)]
pub struct EtcdArgs {
    /// Keep the objects in etcd v3 instead of the embedded store: the members' client URLs,
    /// comma-separated (http:// or https://). Several replicas may serve one etcd.
    #[arg(long, value_name = "URL[,URL...]", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,
    /// Prefix of every key in etcd; replicas of one control plane use the same one.
    #[arg(
        long,
        value_name = "PREFIX",
        default_value = "/sluice",
        requires = "etcd_endpoints"
    )]
    pub etcd_prefix: String,
    /// CA of the etcd members' certificates (https:// endpoints).
    #[arg(long, value_name = "FILE", requires = "etcd_endpoints")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate for etcd (`--client-cert-auth`); with --etcd-key and --etcd-ca.
    #[arg(long, value_name = "FILE", requires_all = ["etcd_key", "etcd_ca"])]
    pub etcd_cert: Option<PathBuf>,
    /// The client certificate's key.
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
    /// How long one etcd request may take before the API answers 503 (or start-up fails).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration, requires = "etcd_endpoints")]
    pub etcd_request_timeout: std::time::Duration,
}

impl EtcdArgs {
    /// The store these flags choose: etcd when endpoints are given, else the embedded one.
    #[cfg(feature = "etcd")]
    pub fn store(self) -> anyhow::Result<StoreChoice> {
        if self.etcd_endpoints.is_empty() {
            return Ok(StoreChoice::Embedded);
        }
        let client = self
            .etcd_cert
            .zip(self.etcd_key)
            .map(|(cert, key)| EtcdClientCert { cert, key });
        Ok(StoreChoice::Etcd(EtcdConfig {
            endpoints: self.etcd_endpoints,
            prefix: self.etcd_prefix,
            request_timeout: self.etcd_request_timeout,
            tls: self.etcd_ca.map(|ca| EtcdTls { ca, client }),
            ..EtcdConfig::default()
        }))
    }

    /// Without the `etcd` feature only the embedded store exists.
    #[cfg(not(feature = "etcd"))]
    pub fn store(self) -> anyhow::Result<StoreChoice> {
        if self.etcd_endpoints.is_empty() {
            return Ok(StoreChoice::Embedded);
        }
        anyhow::bail!(
            "--etcd-endpoints: this sluice was built without the `etcd` feature (its etcd client \
             needs protoc to build): cargo build --release --features etcd"
        )
    }
}

/// The client certificate the control plane presents to etcd (read once, at connect).
fn etcd_client_cert(store: &StoreChoice) -> Option<&Path> {
    match store {
        StoreChoice::Embedded => None,
        #[cfg(feature = "etcd")]
        StoreChoice::Etcd(config) => Some(config.tls.as_ref()?.client.as_ref()?.cert.as_path()),
    }
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

/// The control plane's runtime for the CPUs the process may run on: two workers, or one
/// thread when it is pinned to one CPU (taskset, a cgroup's cpuset). On one CPU a second worker
/// adds nothing but cross-thread wake-ups, and the current-thread scheduler runs woken tasks in
/// order, so one store write's events reach a connection's watches together: at 10,000
/// watchers on one core, delivery p50 fell from 108-141 ms to 76-84 ms and p99 from
/// 303-711 ms to 237-374 ms over four interleaved runs, at the same CPU per event (issue 36,
/// docs/PERFORMANCE.md).
fn runtime_builder(cpus: usize) -> (tokio::runtime::Builder, &'static str) {
    if cpus <= 1 {
        (
            tokio::runtime::Builder::new_current_thread(),
            "current_thread",
        )
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(2);
        (builder, "multi_thread")
    }
}

/// `sluice controlplane`: serves until SIGINT or SIGTERM.
pub fn run(options: ControlPlaneOptions, addresses_file: Option<&Path>) -> std::process::ExitCode {
    let cpus = std::thread::available_parallelism().map_or(2, |cpus| cpus.get());
    let (mut builder, flavour) = runtime_builder(cpus);
    let runtime = match builder
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
        // The process's own monitor: an embedded control plane (`sluice up`) shares the
        // daemon's.
        sluice_overload::spawn_monitor(&options.overload)?;
        tracing::info!(cpus, runtime = flavour, "control plane runtime");
        let running = start(options).await?;
        if let Some(path) = addresses_file {
            write_address(path, running.address)?;
        }
        println!("control plane serving on {}", running.url);
        if running.kubeconfig.exists() {
            println!(
                "  kubectl --kubeconfig {} get upstreamclusters",
                running.kubeconfig.display()
            );
        } else {
            println!(
                "  kubectl --kubeconfig <the admin.kubeconfig of the replica that bootstrapped the cluster> --server {} get upstreamclusters",
                running.url
            );
        }
        crate::notify::ready("controlplane");
        stop_signal().await?;
        crate::notify::stopping("controlplane");
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
    // The etcd store's failover and retry counters join the control plane's /metrics.
    type StoreMetrics = Option<Box<dyn prometheus_client::collector::Collector>>;
    let (store, store_metrics): (Arc<dyn Store>, StoreMetrics) = match &options.store {
        StoreChoice::Embedded => {
            let store_path = options.data_dir.join("store.redb");
            let config = sluice_store::EmbeddedConfig {
                quota_bytes: options.store_quota_bytes,
                ..sluice_store::EmbeddedConfig::default()
            };
            let store =
                tokio::task::spawn_blocking(move || EmbeddedStore::open_with(&store_path, config))
                    .await
                    .context("opening the store")?
                    .with_context(|| {
                        format!("opening the store in {}", options.data_dir.display())
                    })?;
            (Arc::new(store), None)
        }
        #[cfg(feature = "etcd")]
        StoreChoice::Etcd(config) => {
            let store = EtcdStore::connect(config.clone())
                .await
                .with_context(|| format!("connecting to etcd at {}", config.endpoints.join(",")))?;
            tracing::info!(endpoints = %config.endpoints.join(","), prefix = %config.prefix, "store: etcd");
            let metrics = etcd_metrics::EtcdCollector(store.stats());
            (Arc::new(store), Some(Box::new(metrics)))
        }
    };
    start_on(options, store, store_metrics).await
}

/// [`start`] on a store the caller opened (embedded or etcd), with the store's own metrics.
pub async fn start_on(
    options: ControlPlaneOptions,
    store: Arc<dyn Store>,
    store_metrics: Option<Box<dyn prometheus_client::collector::Collector>>,
) -> anyhow::Result<RunningControlPlane> {
    let pki_dir = options
        .pki_dir
        .clone()
        .unwrap_or_else(|| options.data_dir.join("pki"));
    let pki = bootstrap::ensure_pki(&pki_dir, &options.hostnames)?;
    let (cert, key) = match (&options.tls_cert, &options.tls_key) {
        (Some(cert), Some(key)) => (cert.clone(), key.clone()),
        (None, None) => (pki.cert.clone(), pki.key.clone()),
        _ => anyhow::bail!("--tls-cert and --tls-key go together"),
    };
    let tls = bootstrap::server_tls(&cert, &key, options.client_ca.as_deref())?;
    if options.vm_heartbeat_timeout < Duration::from_secs(1) {
        anyhow::bail!("--vm-heartbeat-timeout must be at least 1s");
    }
    let registry = sluice_apiserver::kinds::registry().context("the served kinds")?;
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("binding {}", options.listen))?;
    let address = listener.local_addr()?;
    let url = format!("https://{address}");
    let kubeconfig = options.data_dir.join("admin.kubeconfig");
    bootstrap_admin(store.as_ref(), &kubeconfig, &dialable_url(address), &pki.ca).await?;
    let mut vm_metrics = None;
    let server = ApiServer::with_metrics(registry, store.clone(), options.limits.clone(), |r| {
        vm_metrics = Some(VmMetrics::register(r));
        r.register_collector(Box::new(sluice_overload::OverloadCollector));
        sluice_admin::register_build_info(r, crate::daemon::VERSION, "tokio");
        r.register_collector(Box::new(sluice_admin::ProcessCollector));
        if let Some(collector) = store_metrics {
            r.register_collector(collector);
        }
        let expiry = sluice_admin::CertificateExpiry::register(r);
        expiry.set_all([("controlplane", cert.as_path())]);
        expiry.set_all(etcd_client_cert(&options.store).map(|file| ("etcd_client", file)));
    });
    server
        .load_tokens()
        .await
        .context("reading the stored tokens")?;
    let (stop, stopping) = watch::channel(false);
    tokio::spawn(server.clone().follow_tokens(stopping.clone()));
    // Every replica runs a VMManager: their status writes are compare-and-swap, so they
    // converge on one decision rather than needing a leader.
    let vm_manager = VmManager::new(
        server.clone(),
        options.vm_heartbeat_timeout,
        vm_metrics.unwrap_or_default(),
    );
    tokio::spawn(vm_manager.run(stopping.clone()));
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

/// The first admin token, issued once per store, not once per replica.
///
/// With `admin.kubeconfig` in the data directory nothing happens. Without it, an empty store
/// (no admin Token object) gets an admin token and the kubeconfig, as on a first start. A store
/// that already holds an admin token was bootstrapped by another replica (or this one lost its
/// data directory): no token is issued, since a replica that mints an admin credential on each
/// fresh start would leave unrevoked admin tokens behind; the operator copies the bootstrapping
/// replica's `admin.kubeconfig` (its CA is the shared one; `kubectl --server` or the
/// kubeconfig's `server` picks the replica), or issues more with `token create`.
async fn bootstrap_admin(
    store: &dyn Store,
    kubeconfig: &Path,
    url: &str,
    ca: &Path,
) -> anyhow::Result<()> {
    if !kubeconfig.exists() && admin_token_stored(store).await? {
        tracing::warn!(
            kubeconfig = %kubeconfig.display(),
            "the store already holds an admin token (another replica bootstrapped it): no new \
             one is issued; copy that replica's admin.kubeconfig to reach this one"
        );
        return Ok(());
    }
    if bootstrap::ensure_admin(store, kubeconfig, url, ca).await? {
        tracing::info!(kubeconfig = %kubeconfig.display(), "issued the first admin token");
    }
    Ok(())
}

/// Whether a Token object with the admin role is in the store.
async fn admin_token_stored(store: &dyn Store) -> anyhow::Result<bool> {
    use sluice_apiserver::auth::Role;
    let spec = sluice_apiserver::kinds::token();
    let prefix = sluice_apiserver::server::list_prefix(&spec, None);
    let mut after: Option<String> = None;
    let mut revision = None;
    loop {
        let page = store
            .list(&prefix, after.as_deref(), 500, revision)
            .await
            .context("reading the stored tokens")?;
        let admin = page.items.iter().any(|row| {
            serde_json::from_slice::<serde_json::Value>(&row.value)
                .ok()
                .as_ref()
                .and_then(sluice_apiserver::kinds::token_identity)
                .is_some_and(|(_, identity)| identity.role == Role::Admin)
        });
        if admin {
            return Ok(true);
        }
        match page.items.last() {
            Some(last) if page.more => after = Some(last.key.clone()),
            _ => return Ok(false),
        }
        revision = Some(page.revision);
    }
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

/// The URL the admin kubeconfig names. A wildcard listen address (`0.0.0.0`, `[::]`, as in a
/// pod) is neither an address to dial nor a name the certificate holds, so the loopback of its
/// family stands in: what `sluice controlplane token create` dials on the same host or in the
/// same pod (`kubectl exec`), and what the generated certificate always names.
fn dialable_url(address: SocketAddr) -> String {
    let ip = match address.ip() {
        ip if !ip.is_unspecified() => ip,
        std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
    };
    format!("https://{}", SocketAddr::new(ip, address.port()))
}

fn write_address(path: &Path, address: SocketAddr) -> anyhow::Result<()> {
    let temporary = path.with_extension("tmp");
    let text = serde_json::json!({ "controlplane": address.to_string() });
    std::fs::write(&temporary, serde_json::to_vec_pretty(&text)?)?;
    std::fs::rename(&temporary, path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{dialable_url, runtime_builder};

    #[test]
    fn one_cpu_gets_a_current_thread_runtime_and_more_get_two_workers() {
        assert_eq!(runtime_builder(1).1, "current_thread");
        assert_eq!(runtime_builder(2).1, "multi_thread");
        assert_eq!(runtime_builder(64).1, "multi_thread");
    }

    #[test]
    fn a_wildcard_listen_address_is_dialled_on_its_loopback() {
        let url = |address: &str| dialable_url(address.parse().unwrap());
        assert_eq!(url("0.0.0.0:6443"), "https://127.0.0.1:6443");
        assert_eq!(url("[::]:6443"), "https://[::1]:6443");
        assert_eq!(url("10.1.2.3:6443"), "https://10.1.2.3:6443");
        assert_eq!(url("[fd00::1]:7"), "https://[fd00::1]:7");
    }
}
