//! `sluice vm-agent`: enforces VM NetworkPolicies on one Open vSwitch bridge, in one of two
//! modes:
//! - [`files`]: the policies of a file or directory, hot reloaded (no control plane);
//! - [`lifecycle`]: the seed's VM agent on the control plane: No-Op until its VirtualMachine
//!   says Agented, then uplink takeover, the VM's span of policies, runtime info reports.
//!
//! Flows stay on the bridge when the agent stops (enforcement survives an agent restart; the
//! next run replaces them atomically under a new cookie round).

mod admin;
mod enforcer;
mod files;
mod lifecycle;
mod port_counters;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use prometheus_client::registry::Registry;
use sluice_ovs::{ClientConfig, OvsdbClient, OvsdbError};
use sluice_policy_engine::{EngineConfig, EngineMetrics, RejectMeter};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

use enforcer::RealizeMetrics;
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

pub fn run(options: VmAgentOptions) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sluice vm-agent: cannot start the runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run_agent(options)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sluice vm-agent: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run_agent(options: VmAgentOptions) -> anyhow::Result<()> {
    let engine_metrics = EngineMetrics::default();
    let realize = RealizeMetrics::default();
    let mut registry = Registry::default();
    engine_metrics.register(&mut registry);
    realize.register(&mut registry);
    let ports = PortCounters::load(options.ebpf);
    ports.register(&mut registry);
    let lifecycle_metrics = options
        .lifecycle
        .as_ref()
        .map(|_| lifecycle::LifecycleMetrics::register(&mut registry));
    let ready = Arc::new(AtomicBool::new(false));
    let listener = TcpListener::bind(options.admin)
        .await
        .with_context(|| format!("binding the admin address {}", options.admin))?;
    let admin = listener.local_addr()?;
    tracing::info!(%admin, "admin endpoint listening");
    // Tests and scripts read the chosen port from here when the address ends in :0.
    println!("admin listening on {admin}");
    tokio::spawn(admin::serve_admin(
        listener,
        Arc::new(Mutex::new(registry)),
        ready.clone(),
    ));

    let db_socket = options
        .db_socket
        .clone()
        .unwrap_or_else(|| options.ovs_rundir.join("db.sock"));
    ensure_bridge(&db_socket, &options.bridge).await?;
    let control_plane = match &options.lifecycle {
        Some(lifecycle) => control_plane_addresses(&lifecycle.source.url).await,
        None => Vec::new(),
    };
    let datapath = Datapath {
        bridge: options.bridge.clone(),
        db_socket,
        engine: EngineConfig {
            mgmt_socket: options.ovs_rundir.join(format!("{}.mgmt", options.bridge)),
            client: ClientConfig::default(),
            control_plane,
            stats_interval: options.stats_interval,
            reject_meter: options.reject_meter,
        },
        engine_metrics,
        realize,
        stats_interval: options.stats_interval,
        ports,
    };
    match (options.policies, options.lifecycle, lifecycle_metrics) {
        (Some(path), _, _) => files::run(datapath, path, &ready, shutdown()).await,
        (None, Some(lifecycle), Some(metrics)) => {
            lifecycle::run(datapath, lifecycle, metrics, &ready, shutdown()).await
        }
        _ => anyhow::bail!("give --policies or --controlplane"),
    }
}

/// Creates the bridge (netdev datapath) unless it exists.
async fn ensure_bridge(db_socket: &std::path::Path, bridge: &str) -> anyhow::Result<()> {
    let mut ovsdb = OvsdbClient::connect(db_socket, Duration::from_secs(10))
        .await
        .with_context(|| format!("connecting to OVSDB at {}", db_socket.display()))?;
    match ovsdb.create_bridge(bridge).await {
        Ok(()) => tracing::info!(%bridge, "bridge created"),
        Err(OvsdbError::AlreadyExists { .. }) => {}
        Err(error) => return Err(error).context("creating the bridge"),
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

/// Resolves on SIGTERM or SIGINT (never, if the handlers cannot be installed: logged).
async fn shutdown() {
    let (Ok(mut terminate), Ok(mut interrupt)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("signal handlers not installed; stop the agent with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
}
