//! The VM node agent (`sluice vm-agent`): enforces VM NetworkPolicies on one Open vSwitch bridge, in one of two
//! modes:
//! - [`files`]: the policies of a file or directory, hot reloaded (no control plane);
//! - [`lifecycle`]: the seed's VM agent on the control plane: No-Op until its VirtualMachine
//!   says Agented, then uplink takeover, the VM's span of policies, runtime info reports.
//!
//! Flows stay on the bridge when the agent stops (enforcement survives an agent restart; the
//! next run replaces them atomically under a new cookie round).

mod admin;
mod enforcer;
mod error;
mod files;
mod lifecycle;
mod port_counters;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::registry::Registry;
use sluice_ovs::{ClientConfig, OvsdbClient, OvsdbError};
use sluice_policy_engine::{EngineConfig, EngineMetrics, RejectMeter};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

use enforcer::RealizeMetrics;
pub use error::{Stopped, VmAgentError};
pub use lifecycle::LifecycleOptions;
use port_counters::PortCounters;

/// Options of one agent run (the command-line flags).
#[derive(Debug, Clone)]
pub struct VmAgentOptions {
    pub bridge: String,
    /// A policy file or directory; `None` with `lifecycle`.
    pub policies: Option<PathBuf>,
    /// The control plane, this VM and where its state is kept; `None` with `policies`.
    pub lifecycle: Option<LifecycleOptions>,
    pub ovs_rundir: PathBuf,
    pub db_socket: Option<PathBuf>,
    pub admin: SocketAddr,
    /// Also how often the Reject meter's dropped packets are read.
    pub stats_interval: Duration,
    pub reject_meter: RejectMeter,
    /// Count every bridge port's traffic with the eBPF programs (docs/EBPF.md).
    pub ebpf: bool,
    /// Told when the agent serves and when it stops (systemd's readiness protocol).
    pub notify: Notify,
}

/// What the agent tells its supervisor: called once it enforces (when `/readyz` first answers
/// 200) and once it starts to stop. The binary passes sd_notify(3); tests pass nothing.
#[derive(Debug, Clone, Copy)]
pub struct Notify {
    pub ready: fn(),
    pub stopping: fn(),
}

impl Notify {
    /// Tells no one.
    pub const NONE: Notify = Notify {
        ready: || {},
        stopping: || {},
    };
}

/// The bridge and what enforces on it, shared by both modes.
pub(crate) struct Datapath {
    pub bridge: String,
    pub db_socket: PathBuf,
    pub engine: EngineConfig,
    pub engine_metrics: EngineMetrics,
    pub realize: RealizeMetrics,
    pub stats_interval: Duration,
    pub ports: PortCounters,
}

/// Runs the agent on a runtime of its own until SIGTERM or SIGINT.
pub fn run(options: VmAgentOptions) -> Result<(), VmAgentError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(VmAgentError::Runtime)?
        .block_on(run_agent(options))
}

/// Where the policies come from; the lifecycle's metrics are registered before the admin
/// endpoint serves, so a scrape never sees them appear late.
enum Source {
    File(PathBuf),
    ControlPlane(Box<(LifecycleOptions, lifecycle::LifecycleMetrics)>),
}

async fn run_agent(options: VmAgentOptions) -> Result<(), VmAgentError> {
    let engine_metrics = EngineMetrics::default();
    let realize = RealizeMetrics::default();
    let mut registry = Registry::default();
    if options.policies.is_none() && options.lifecycle.is_none() {
        return Err(VmAgentError::NoPolicySource);
    }
    sluice_role_metrics::register_build_info(&mut registry, env!("CARGO_PKG_VERSION"), "tokio");
    registry.register_collector(Box::new(sluice_role_metrics::ProcessCollector));
    let expiry = sluice_role_metrics::CertificateExpiry::register(&mut registry);
    // Set once: the watch client reads the file when it starts, so a renewal takes a restart.
    let client_cert = options
        .lifecycle
        .as_ref()
        .and_then(|l| l.client.client_cert.as_ref());
    expiry.set_all(client_cert.map(|files| ("controlplane_client", files.cert.as_path())));
    engine_metrics.register(&mut registry);
    realize.register(&mut registry);
    let ports = PortCounters::load(options.ebpf);
    ports.register(&mut registry);
    let source = match (options.policies, options.lifecycle) {
        (Some(path), _) => Source::File(path),
        (None, Some(lifecycle)) => {
            let metrics = lifecycle::LifecycleMetrics::register(&mut registry);
            Source::ControlPlane(Box::new((lifecycle, metrics)))
        }
        (None, None) => return Err(VmAgentError::NoPolicySource),
    };
    let ready = Arc::new(AtomicBool::new(false));
    serve_admin(options.admin, registry, ready.clone()).await?;

    let db_socket = options
        .db_socket
        .unwrap_or_else(|| options.ovs_rundir.join("db.sock"));
    ensure_bridge(&db_socket, &options.bridge).await?;
    let control_plane = match &source {
        Source::ControlPlane(lifecycle) => control_plane_addresses(&lifecycle.0.client.url).await,
        Source::File(_) => Vec::new(),
    };
    let datapath = Datapath {
        engine: EngineConfig {
            mgmt_socket: options.ovs_rundir.join(format!("{}.mgmt", options.bridge)),
            client: ClientConfig::default(),
            control_plane,
            stats_interval: options.stats_interval,
            reject_meter: options.reject_meter,
        },
        bridge: options.bridge,
        db_socket,
        engine_metrics,
        realize,
        stats_interval: options.stats_interval,
        ports,
    };
    let notify = options.notify;
    match source {
        Source::File(path) => files::run(datapath, path, &ready, notify, shutdown()).await,
        Source::ControlPlane(lifecycle) => {
            let (lifecycle, metrics) = *lifecycle;
            let serving = lifecycle::Serving {
                ready: &ready,
                notify,
            };
            lifecycle::run(datapath, lifecycle, metrics, serving, shutdown()).await
        }
    }
}

/// Binds the admin address and serves `/metrics`, `/healthz` and `/readyz` on it.
async fn serve_admin(
    address: SocketAddr,
    registry: Registry,
    ready: Arc<AtomicBool>,
) -> Result<(), VmAgentError> {
    let bind_error = |source| VmAgentError::AdminBind { address, source };
    let listener = TcpListener::bind(address).await.map_err(bind_error)?;
    let admin = listener.local_addr().map_err(bind_error)?;
    tracing::info!(%admin, "admin endpoint listening");
    // Tests and scripts read the chosen port from here when the address ends in :0.
    println!("admin listening on {admin}");
    tokio::spawn(admin::serve_admin(
        listener,
        Arc::new(Mutex::new(registry)),
        ready,
    ));
    Ok(())
}

/// Creates the bridge (netdev datapath) unless it exists.
async fn ensure_bridge(db_socket: &std::path::Path, bridge: &str) -> Result<(), VmAgentError> {
    let mut ovsdb = OvsdbClient::connect(db_socket, Duration::from_secs(10))
        .await
        .map_err(|source| VmAgentError::Ovsdb {
            what: "reaching OVSDB",
            source,
        })?;
    match ovsdb.create_bridge(bridge).await {
        Ok(()) => tracing::info!(%bridge, "bridge created"),
        Err(OvsdbError::AlreadyExists { .. }) => {}
        Err(source) => {
            return Err(VmAgentError::Ovsdb {
                what: "creating the bridge",
                source,
            })
        }
    }
    Ok(())
}

/// The control plane's addresses, exempt from policy in both directions so that no policy can
/// cut the agent off the control plane that could lift it. A name that does not resolve gives
/// no exemption (logged).
async fn control_plane_addresses(url: &str) -> Vec<SocketAddr> {
    let authority = url
        .trim_start_matches("https://")
        .split('/')
        .next()
        .unwrap_or_default();
    let with_port = if authority.contains(']') || authority.matches(':').count() == 1 {
        authority.to_string()
    } else {
        format!("{authority}:443")
    };
    let resolved = tokio::net::lookup_host(with_port.as_str()).await;
    match resolved {
        Ok(addresses) => addresses.collect(),
        Err(error) => {
            tracing::warn!(%url, %error, "control-plane address not resolved; no policy exemption for it");
            Vec::new()
        }
    }
}

/// Installs the SIGTERM and SIGINT handlers at once, and resolves on either (never, if they
/// cannot be installed: logged). Not an `async fn`: that would install them only when first
/// polled, after READY=1 went out, and a SIGTERM in between met the default action (no drain,
/// no STOPPING=1; seen by `packaging.rs` in about 3 of 8 runs).
fn shutdown() -> impl std::future::Future<Output = ()> {
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        let (Ok(mut terminate), Ok(mut interrupt)) = handlers else {
            tracing::error!("signal handlers not installed; stop the agent with SIGKILL");
            return std::future::pending().await;
        };
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    }
}
