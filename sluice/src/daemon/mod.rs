//! Runs the daemon: config in, listeners bound, workers started, stop signal, drain, exit.
//! Each pillar wires its listeners and background tasks in its own module.

mod access_log;
mod agent_link;
pub(crate) mod assertion_key;
mod cert_expiry;
mod ebpf;
mod feeds;
pub(crate) use feeds::client_config as watch_client_config;
mod gateway;
mod hook;
pub use hook::RunHook;
mod preflight;
mod reload;
mod status;
mod tunnel;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use prometheus_client::registry::Registry;
use sluice_admin::{AdminEndpoint, AdminMetrics, AdminOptions};
use sluice_config::{Config, InvalidConfig};
use sluice_runtime::{
    select_driver, DriverSelection, Lifecycle, ListenerId, Placement, RuntimeOptions,
    ServerBuilder, StopSignals,
};

use crate::cli::RuntimeArgs;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub enum Mode {
    /// `sluice run --config FILE` or `sluice agent --config FILE`: SIGHUP reloads FILE.
    Run { config: PathBuf },
    /// `sluice up`: a fixed config (no reload) and the demo, which adds to the run and prints
    /// what started and how to try it. Only the `demo` feature builds one.
    #[cfg_attr(not(feature = "demo"), allow(dead_code))]
    Up(Box<dyn RunHook>),
}

impl Mode {
    fn hook(&self) -> Option<&dyn RunHook> {
        match self {
            Mode::Run { .. } => None,
            Mode::Up(hook) => Some(hook.as_ref()),
        }
    }
}

/// The config file and every file it names that a start reads (certificates, keys, CA
/// bundles, cluster files): what `run`, `agent` and `check-config` share, so they refuse the
/// same files with the same messages.
pub fn load(path: &Path) -> Result<Config, InvalidConfig> {
    let config = sluice_config::load_file(path)?;
    preflight::check(&config, &path.display().to_string())?;
    Ok(config)
}

/// Exit codes: 0 after a clean stop, 2 for an invalid configuration, 1 for any other failure.
pub fn run_with(
    loaded: Result<Config, InvalidConfig>,
    args: &CommandLine,
    addresses_file: Option<&Path>,
    mode: Mode,
) -> ExitCode {
    let mut config = match loaded {
        Ok(config) => config,
        Err(error) => {
            eprintln!("{error}");
            eprintln!(
                "refusing to start: {} configuration error(s)",
                error.errors.len()
            );
            return ExitCode::from(2);
        }
    };
    if let Err(error) = args.applies_to(&config) {
        eprintln!("{error}");
        return ExitCode::from(2);
    }
    let overrides = command_line_overrides(args);
    overrides(&mut config);
    let log = crate::logging::init(&config.logging);
    match run(config, addresses_file, mode, (overrides, log)) {
        Ok(()) => ExitCode::SUCCESS,
        // Logged once: the log goes to stderr already (as JSON when asked).
        Err(error) => {
            tracing::error!("{error:#}");
            ExitCode::FAILURE
        }
    }
}

/// What the command line changes in every loaded config (start-up and each reload).
pub(super) type Overrides = Box<dyn Fn(&mut Config)>;

/// The flags that replace config fields: `--workers` and `--driver` on every role that runs
/// workers, `--advertise-address` on `run`.
pub struct CommandLine {
    pub runtime: RuntimeArgs,
    pub advertise_address: Option<std::net::SocketAddr>,
}

impl From<RuntimeArgs> for CommandLine {
    fn from(runtime: RuntimeArgs) -> Self {
        Self {
            runtime,
            advertise_address: None,
        }
    }
}

impl CommandLine {
    /// Refuses a flag the file has no field for, rather than ignoring it.
    fn applies_to(&self, config: &Config) -> Result<(), String> {
        if self.advertise_address.is_some() && config.tunnel.is_none() {
            return Err("--advertise-address: the configuration has no `tunnel` section".into());
        }
        Ok(())
    }
}

/// Applied at start and to every reloaded file, so a reload does not see them as changes.
fn command_line_overrides(args: &CommandLine) -> Overrides {
    let (workers, driver) = (args.runtime.workers, args.runtime.driver);
    let advertise_address = args.advertise_address.map(|address| address.to_string());
    Box::new(move |config| {
        if let (Some(address), Some(tunnel)) = (&advertise_address, config.tunnel.as_mut()) {
            tunnel.advertise_address = Some(address.clone());
        }
        if let Some(workers) = workers {
            config.runtime.workers = sluice_config::Workers::Count(
                usize::from(workers)
                    .try_into()
                    .unwrap_or(std::num::NonZeroUsize::MIN),
            );
        }
        if let Some(driver) = driver {
            config.runtime.driver = driver.into();
        }
    })
}

fn run(
    mut config: Config,
    addresses_file: Option<&Path>,
    mode: Mode,
    (overrides, log): (Overrides, Option<crate::logging::LogFilterHandle>),
) -> anyhow::Result<()> {
    // Caught from here on, so a stop during start-up still drains instead of killing us; a
    // SIGHUP during start-up waits for the reload loop (`up`: see `hang_up`).
    let signals = StopSignals::install_with_reload()?;
    let selection = driver(&config)?;
    let lifecycle = Arc::new(Lifecycle::new());
    let workers = config.runtime.workers.resolve();
    let options = RuntimeOptions {
        workers,
        driver: selection.clone(),
        uring_entries: config.runtime.uring_entries,
        drain_timeout: config.runtime.drain_timeout,
    };
    let mut server = ServerBuilder::new(options, lifecycle.clone());
    let mut registry = Registry::default();
    sluice_admin::register_build_info(&mut registry, VERSION, selection.driver.as_str());
    registry.register_collector(Box::new(sluice_admin::ProcessCollector));
    let expiry = cert_expiry::wire(&config, &mut registry);
    // Started before any listener accepts, so a process that starts near its limits never
    // admits what it cannot carry (docs/CONFIG.md, runtime.overload).
    sluice_overload::spawn_monitor(&config.runtime.overload)?;
    registry.register_collector(Box::new(sluice_overload::OverloadCollector));
    access_log::wire(&config, &mut registry)?;
    let admin = server.bind("admin", &config.listeners.admin, Placement::Dedicated)?;

    let (pillars, node_shared) =
        Pillars::wire(&config, &mut server, &mut registry, workers, &expiry)?;
    if let Some(hook) = mode.hook() {
        hook.wire(&mut config, &mut server)?;
    }
    tunnel::wire_agent(&config, &mut server, &mut registry)?;
    let addresses = server.addresses();
    let counters = ebpf::wire(&config, &addresses, &mut registry);
    let mut reloader = match &mode {
        Mode::Run { config: path } => Some(reload::Reloader::new(
            path.clone(),
            overrides,
            config.clone(),
            node_shared,
            log,
            &mut registry,
        )),
        Mode::Up(_) => None,
    };
    serve_admin(&config, &mut server, registry, admin);

    let running = server.start()?;
    for (name, address) in &addresses {
        tracing::info!(listener = %name, %address, "listening");
    }
    tracing::info!(version = VERSION, workers, driver = %selection.driver, "ready");
    if let Some(path) = addresses_file {
        write_addresses(path, &addresses)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(hook) = mode.hook() {
        hook.announce(workers, &selection.driver.to_string(), &addresses)?;
    }

    crate::notify::ready("sluice");
    let signal = signals.wait_with_reload(lifecycle.clone(), || match &mut reloader {
        Some(reloader) => reloader.reload(),
        None => hang_up(),
    });
    crate::notify::stopping("sluice");
    tracing::info!(signal, drain_timeout = ?config.runtime.drain_timeout, "stopping: no new connections, draining in-flight work");
    // Peers stop routing calls here before the listeners close and the GOAWAYs go out.
    pillars.withdraw(&lifecycle);
    let report = running.shutdown();
    pillars.stop();
    drop(counters);
    tracing::info!(elapsed = ?report.elapsed, connections_cut = report.connections_cut, "stopped");
    // The demo's child processes and directory go last, after the drain.
    drop(mode);
    if lifecycle.has_failed() {
        // A worker thread died: exit non-zero so the supervisor restarts the process.
        anyhow::bail!("a worker thread died; stopped so the process can be restarted");
    }
    Ok(())
}

/// `sluice up` has no file to reload: its SIGHUP is its terminal gone (closed, SSH lost). It
/// stops as on SIGTERM, so the demo's directory (JWT secret, admin kubeconfig, CA key) and
/// namespaces are removed instead of being left behind by the default action's sudden death.
fn hang_up() {
    tracing::info!("SIGHUP: the terminal is gone; stopping as on SIGTERM");
    // SAFETY: raise(3) takes a plain signal number; the SIGTERM handler is installed above.
    if unsafe { libc::raise(libc::SIGTERM) } != 0 {
        tracing::warn!("cannot raise SIGTERM after SIGHUP; stop with Ctrl-C");
    }
}

/// The I/O driver the config asks for, or the legacy one when io_uring cannot be set up (logged).
fn driver(config: &Config) -> anyhow::Result<DriverSelection> {
    let selection = select_driver(config.runtime.driver, config.runtime.uring_entries)?;
    match &selection.fallback_reason {
        None => tracing::info!(driver = %selection.driver, "I/O driver selected"),
        Some(reason) => {
            tracing::warn!(driver = %selection.driver, %reason, "io_uring cannot be set up; falling back to the legacy (epoll) driver")
        }
    }
    Ok(selection)
}

/// What the pillars leave running beside the workers, stopped after the drain.
struct Pillars {
    tracker: Option<sluice_tracker::TrackerHandle>,
    reloader: Option<sluice_gateway_proxy::ReloaderHandle>,
    feeds: Option<feeds::Feeds>,
}

impl Pillars {
    /// Wires the node and the gateway (each when the config has it) and the control plane's
    /// feeds to them; also returns what a config reload changes in the node.
    fn wire(
        config: &Config,
        server: &mut ServerBuilder,
        registry: &mut Registry,
        workers: usize,
        expiry: &sluice_admin::CertificateExpiry,
    ) -> anyhow::Result<(Self, Option<Arc<sluice_tunnel::node::NodeShared>>)> {
        let node = tunnel::wire_node(config, server, registry, workers)?;
        let node_shared = node.as_ref().map(|node| node.node.clone());
        let gateway = gateway::wire(
            config,
            server,
            registry,
            workers,
            expiry,
            node_shared.as_ref(),
        )?;
        let mut targets = feeds::FeedTargets::default();
        let (tracker, node_feed) = node.map_or((None, None), |node| (node.tracker, node.feed));
        let (reloader, gateway_feed) =
            gateway.map_or((None, None), |gateway| (gateway.reloader, gateway.feed));
        targets.node = node_feed;
        targets.gateway = gateway_feed;
        targets.gateway_credentials = config
            .gateway
            .as_ref()
            .and_then(|gateway| gateway.credentials_dir.clone());
        targets.gateway_agents = preflight::agent_reach(config);
        let pillars = Pillars {
            tracker,
            reloader,
            feeds: feeds::spawn(targets, registry)?,
        };
        Ok((pillars, node_shared))
    }

    /// At drain start: this node's tracker entries leave Redis, so other nodes stop sending
    /// calls here while in-flight ones finish (lookups still work for them). A peer may still
    /// hold a listing of this node from just before (its cache lives about a second), so
    /// everything keeps serving through a grace, readiness already 503, before the GOAWAYs:
    /// no call is sent here after this node stopped taking calls.
    fn withdraw(&self, lifecycle: &Lifecycle) {
        const WITHDRAW_GRACE: std::time::Duration = std::time::Duration::from_millis(1500);
        let Some(tracker) = &self.tracker else {
            return;
        };
        lifecycle.announce_drain();
        if !tracker.withdraw(std::time::Duration::from_secs(3)) {
            tracing::warn!("could not remove this node's tracker entries from redis at drain start; peers may still route here until the stop");
        }
        tracing::info!(grace = ?WITHDRAW_GRACE, "draining: serving on while other nodes' routes to this node expire");
        std::thread::sleep(WITHDRAW_GRACE);
    }

    fn stop(self) {
        if let Some(tracker) = &self.tracker {
            // Remove this node's entries at once rather than leaving them to expire.
            if !tracker.shutdown(std::time::Duration::from_secs(3)) {
                tracing::warn!(
                    "could not remove this node's tracker entries from redis; they expire by TTL"
                );
            }
        }
        drop(self.reloader);
        drop(self.feeds);
    }
}

fn serve_admin(
    config: &Config,
    server: &mut ServerBuilder,
    mut registry: Registry,
    admin: ListenerId,
) {
    server.register_metrics(&mut registry);
    let admin_metrics = AdminMetrics::register(&mut registry);
    server.serve(
        admin,
        AdminEndpoint::new(
            Arc::new(registry),
            admin_metrics,
            AdminOptions {
                header_timeout: config.listeners.admin.limits.header_timeout,
                idle_timeout: config.listeners.admin.limits.idle_timeout,
            },
        ),
    );
}

/// Written to a temporary name and renamed, so a reader never sees half a file.
fn write_addresses(
    path: &Path,
    addresses: &[(String, std::net::SocketAddr)],
) -> std::io::Result<()> {
    let map: serde_json::Map<String, serde_json::Value> = addresses
        .iter()
        .map(|(name, address)| (name.clone(), serde_json::Value::String(address.to_string())))
        .collect();
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, serde_json::to_vec_pretty(&map)?)?;
    std::fs::rename(&temporary, path)
}
