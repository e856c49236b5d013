//! Runs the daemon: config in, listeners bound, workers started, stop signal, drain, exit.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use prometheus_client::registry::Registry;
use sluice_admin::{AdminEndpoint, AdminMetrics, AdminOptions};
use sluice_config::{Config, ConfigError};
use sluice_runtime::{
    select_driver, Lifecycle, Placement, RuntimeOptions, ServerBuilder, StopSignals,
};

use crate::cli::RuntimeArgs;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `sluice run --config FILE`
    Run,
    /// `sluice up`: also prints what started and how to try it.
    Up,
}

/// Exit codes: 0 after a clean stop, 2 for an invalid configuration, 1 for any other failure.
pub fn run_with(
    loaded: Result<Config, ConfigError>,
    args: &RuntimeArgs,
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
    if let Some(workers) = args.workers {
        config.runtime.workers = sluice_config::Workers::Count(
            usize::from(workers)
                .try_into()
                .unwrap_or(std::num::NonZeroUsize::MIN),
        );
    }
    if let Some(driver) = args.driver {
        config.runtime.driver = driver.into();
    }
    crate::logging::init(&config.logging);
    match run(&config, addresses_file, mode) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            eprintln!("sluice: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(config: &Config, addresses_file: Option<&Path>, mode: Mode) -> anyhow::Result<()> {
    // Caught from here on, so a stop during start-up still drains instead of killing us.
    let signals = StopSignals::install()?;
    let selection = select_driver(config.runtime.driver, config.runtime.uring_entries)?;
    match &selection.fallback_reason {
        None => tracing::info!(driver = %selection.driver, "I/O driver selected"),
        Some(reason) => {
            tracing::warn!(driver = %selection.driver, %reason, "io_uring cannot be set up; falling back to the legacy (epoll) driver")
        }
    }
    let lifecycle = Arc::new(Lifecycle::new());
    let options = RuntimeOptions {
        workers: config.runtime.workers.resolve(),
        driver: selection.clone(),
        uring_entries: config.runtime.uring_entries,
        drain_timeout: config.runtime.drain_timeout,
    };
    let mut server = ServerBuilder::new(options, lifecycle.clone());
    let admin = server.bind("admin", &config.listeners.admin, Placement::Dedicated)?;

    let mut registry = Registry::default();
    sluice_admin::register_build_info(&mut registry, VERSION, selection.driver.as_str());
    server.register_metrics(&mut registry);
    let admin_metrics = AdminMetrics::register(&mut registry);
    server.serve(
        admin,
        AdminEndpoint::new(
            Arc::new(registry),
            admin_metrics,
            AdminOptions {
                header_timeout: config.listeners.admin.header_timeout,
                idle_timeout: config.listeners.admin.idle_timeout,
            },
        ),
    );

    let addresses = server.addresses();
    let workers = server.options().workers;
    let running = server.start()?;
    for (name, address) in &addresses {
        tracing::info!(listener = %name, %address, "listening");
    }
    tracing::info!(version = VERSION, workers, driver = %selection.driver, "ready");
    if let Some(path) = addresses_file {
        write_addresses(path, &addresses)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if mode == Mode::Up {
        print_banner(workers, &selection.driver.to_string(), &addresses);
    }

    let signal = signals.wait(lifecycle);
    tracing::info!(signal, drain_timeout = ?config.runtime.drain_timeout, "stopping: no new connections, draining in-flight work");
    let report = running.shutdown();
    tracing::info!(elapsed = ?report.elapsed, connections_cut = report.connections_cut, "stopped");
    Ok(())
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

fn print_banner(workers: usize, driver: &str, addresses: &[(String, std::net::SocketAddr)]) {
    let admin = addresses
        .iter()
        .find(|(name, _)| name == "admin")
        .map(|(_, address)| *address);
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "Sluice {VERSION} is up: {workers} data-plane worker(s) on the {driver} driver.\n"
    );
    for (name, address) in addresses {
        let _ = writeln!(out, "  {name:<8} http://{address}");
    }
    if let Some(admin) = admin {
        let _ = writeln!(out, "\nTry it:");
        let _ = writeln!(out, "  curl http://{admin}/metrics    # Prometheus metrics");
        let _ = writeln!(
            out,
            "  curl http://{admin}/readyz     # 200 when ready, 503 while draining"
        );
        let _ = writeln!(out, "  curl http://{admin}/healthz");
    }
    let _ = writeln!(out, "\nPress Ctrl-C to stop.");
    let _ = out.flush();
}
