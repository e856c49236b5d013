//! Runs the daemon: config in, listeners bound, workers started, stop signal, drain, exit.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use prometheus_client::registry::Registry;
use sluice_admin::{AdminEndpoint, AdminMetrics, AdminOptions};
use sluice_config::{Config, ConfigError, RedisTargetConfig};
use sluice_runtime::{
    select_driver, Lifecycle, Placement, RuntimeOptions, ServerBuilder, StopSignals,
};
use sluice_tracker::{RedisTarget, TrackerMetrics, TrackerOptions};

use sluice_tunnel::agent::{AgentMetrics, AgentTask};
use sluice_tunnel::echo::EchoBackend;
use sluice_tunnel::metrics::TunnelMetrics;
use sluice_tunnel::node::{
    AgentEndpoint, ExternalEndpoint, NodeCollector, NodeShared, PrivateEndpoint,
};

use crate::cli::RuntimeArgs;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Debug)]
pub enum Mode {
    /// `sluice run --config FILE` or `sluice agent --config FILE`.
    Run,
    /// `sluice up`: the demo; also prints what started and how to try it.
    Up(Box<crate::demo::UpDemo>),
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
    match run(config, addresses_file, mode) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            eprintln!("sluice: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(mut config: Config, addresses_file: Option<&Path>, mode: Mode) -> anyhow::Result<()> {
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
    let admin = server.bind("admin", &config.listeners.admin, Placement::Dedicated)?;

    // The node side of the tunnel.
    let mut tracker = None;
    if let (Some(tunnel), Some(agent_listener), Some(external_listener)) = (
        &config.tunnel,
        &config.listeners.agent,
        &config.listeners.external,
    ) {
        let agent_id = server.bind("agent", agent_listener, Placement::Workers)?;
        let external_id = server.bind("external", external_listener, Placement::Workers)?;
        let private_id = match &config.listeners.private {
            Some(private) => Some(server.bind("private", private, Placement::Workers)?),
            None => None,
        };
        let metrics = TunnelMetrics::register(&mut registry, workers);
        if let Some(redis) = &config.redis {
            let target = match &redis.target {
                RedisTargetConfig::Url(url) => RedisTarget::Single {
                    url: url.clone(),
                    ca_file: redis.ca_file.clone(),
                },
                RedisTargetConfig::Cluster(urls) => RedisTarget::Cluster { urls: urls.clone() },
            };
            let options = TrackerOptions {
                node_name: tunnel.node_name.clone(),
                // Where other nodes reach this node's private endpoint.
                private_address: tunnel.advertise_address.clone().unwrap_or_else(|| {
                    private_id.map_or_else(String::new, |id| server.local_addr(id).to_string())
                }),
                key_prefix: redis.key_prefix.clone(),
                ttl: redis.ttl,
                refresh: redis.refresh,
                gc_interval: redis.gc_interval,
                unregister_delay: redis.unregister_delay,
            };
            tracker = Some(sluice_tracker::spawn(
                target,
                options,
                TrackerMetrics::register(&mut registry),
            )?);
        }
        let node = NodeShared::new(
            tunnel,
            agent_listener,
            external_listener,
            config.listeners.private.as_ref(),
            metrics,
            tracker
                .clone()
                .map(|tracker| Arc::new(tracker) as Arc<dyn sluice_locator::AgentLocator>),
        )?;
        registry.register_collector(Box::new(NodeCollector(node.clone())));
        server.serve(agent_id, AgentEndpoint { node: node.clone() });
        if let Some(private_id) = private_id {
            server.serve(private_id, PrivateEndpoint { node: node.clone() });
        }
        server.serve(external_id, ExternalEndpoint { node });
    }
    // The Kubernetes API gateway.
    let mut reloader = None;
    if let (Some(gateway), Some(listener)) = (&config.gateway, &config.listeners.gateway) {
        let metrics = sluice_gateway_proxy::GatewayMetrics::register(&mut registry, workers);
        let loaded = sluice_gateway_proxy::Gateway::load(&gateway.clusters_dir, metrics)
            .with_context(|| {
                format!(
                    "gateway.clusters_dir {}: refusing to start",
                    gateway.clusters_dir.display()
                )
            })?;
        registry.register_collector(Box::new(sluice_gateway_proxy::GatewayCollector(
            loaded.clone(),
        )));
        let generation = loaded.current();
        tracing::info!(
            dir = %gateway.clusters_dir.display(),
            clusters = generation.snapshot.clusters().len(),
            "gateway clusters loaded"
        );
        let gateway_id = server.bind("gateway", listener, Placement::Workers)?;
        server.serve(
            gateway_id,
            sluice_gateway_proxy::GatewayEndpoint {
                gateway: loaded.clone(),
                workers,
            },
        );
        server.spawn_background(sluice_gateway_proxy::HealthChecker {
            gateway: loaded.clone(),
        });
        reloader = Some(sluice_gateway_proxy::spawn_reloader(
            loaded,
            gateway.reload_interval,
        )?);
    }

    // The demo's echo backend, and the agent pointed at this node.
    if let Mode::Up(demo) = &mode {
        let mut backend_listener = config.listeners.admin.clone();
        backend_listener.address.set_port(0);
        let backend = server.bind("demo-backend", &backend_listener, Placement::Workers)?;
        server.serve(backend, EchoBackend);
        let local_agent_listener = server
            .addresses()
            .into_iter()
            .find(|(name, _)| name == "agent")
            .map(|(_, address)| address);
        let agent_address = demo
            .agent_target()
            .or(local_agent_listener)
            .context("the demo needs an agent listener")?;
        let backend_address = server.local_addr(backend);
        if let Some(agent) = config.agent.as_mut() {
            crate::demo::UpDemo::wire_agent(agent, agent_address, backend_address);
        }
    }
    // The agent role.
    if let Some(agent) = config.agent.clone() {
        let metrics = AgentMetrics::register(&mut registry);
        server.spawn_background(AgentTask::new(agent, metrics)?);
    }

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
    let running = server.start()?;
    for (name, address) in &addresses {
        tracing::info!(listener = %name, %address, "listening");
    }
    tracing::info!(version = VERSION, workers, driver = %selection.driver, "ready");
    if let Some(path) = addresses_file {
        write_addresses(path, &addresses)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Mode::Up(demo) = &mode {
        let gateway_address = addresses
            .iter()
            .find(|(name, _)| name == "gateway")
            .map(|(_, address)| *address);
        if let (Some(gateway), Some(address)) = (&demo.gateway, gateway_address) {
            gateway.write_kubeconfig(address)?;
        }
        print_banner(workers, &selection.driver.to_string(), &addresses, demo);
    }

    let signal = signals.wait(lifecycle);
    tracing::info!(signal, drain_timeout = ?config.runtime.drain_timeout, "stopping: no new connections, draining in-flight work");
    let report = running.shutdown();
    if let Some(tracker) = &tracker {
        // Remove this node's entries at once rather than leaving them to expire.
        if !tracker.shutdown(std::time::Duration::from_secs(3)) {
            tracing::warn!(
                "could not remove this node's tracker entries from redis; they expire by TTL"
            );
        }
    }
    drop(reloader);
    tracing::info!(elapsed = ?report.elapsed, connections_cut = report.connections_cut, "stopped");
    drop(mode);
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

fn print_banner(
    workers: usize,
    driver: &str,
    addresses: &[(String, SocketAddr)],
    demo: &crate::demo::UpDemo,
) {
    let find = |listener: &str| {
        addresses
            .iter()
            .find(|(name, _)| name == listener)
            .map(|(_, address)| *address)
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "Sluice {VERSION} is up: {workers} data-plane worker(s) on the {driver} driver.\n"
    );
    let describe = |name: &str| match name {
        "admin" => "/metrics /healthz /readyz",
        "agent" => "agents open reverse tunnels here",
        "external" => "clients call agents here (gRPC, JWT HS256, iss=gitlab aud=gitlab-kas)",
        "demo-backend" => "gRPC echo backend, reached through the tunnel of agent 1",
        "gateway" => "Kubernetes API gateway (TLS; the host name picks the cluster)",
        _ => "",
    };
    for (name, address) in addresses {
        let _ = writeln!(out, "  {name:<13} {address:<22} {}", describe(name));
    }
    match &demo.cluster {
        None => {
            let _ = writeln!(
                out,
                "\nA demo agent (id {}) is connected to this node through its own tunnels.",
                crate::demo::DEMO_AGENT_ID
            );
        }
        Some(cluster) => {
            let _ = writeln!(
                out,
                "\nThis process is node-1. The other nodes run as child processes, sharing redis-server on {}:",
                cluster.redis_socket.display()
            );
            for node in &cluster.nodes {
                let listed: Vec<String> = node
                    .addresses
                    .iter()
                    .map(|(name, address)| format!("{name} {address}"))
                    .collect();
                let _ = writeln!(
                    out,
                    "  {:<7} {}  (log: {})",
                    node.name,
                    listed.join(", "),
                    node.log.display()
                );
            }
            let holder = cluster.nodes.last().map_or("?", |node| node.name.as_str());
            let _ = writeln!(
                out,
                "\nThe demo agent (id {}) keeps its tunnels on {holder}; calls to node-1 below find it\nthrough Redis and go through {holder}'s private endpoint.",
                crate::demo::DEMO_AGENT_ID
            );
        }
    }
    if let Some(admin) = find("admin") {
        let _ = writeln!(out, "\nTry it:");
        let _ = writeln!(out, "  curl http://{admin}/metrics    # Prometheus metrics");
        let _ = writeln!(
            out,
            "  curl http://{admin}/readyz     # 200 when ready, 503 while draining"
        );
    }
    if let Some(external) = find("external") {
        let _ = writeln!(
            out,
            "  .venv/bin/python scripts/tunnel_client.py --node {external} --agent-id {} --jwt-secret-file {} hello",
            crate::demo::DEMO_AGENT_ID,
            demo.jwt_secret_file.display()
        );
        let _ = writeln!(out, "    (calls the echo backend through the tunnel; needs grpcio and PyJWT: scripts/test.sh creates .venv)");
    }
    if let Some(gateway) = &demo.gateway {
        let _ = writeln!(
            out,
            "  kubectl --kubeconfig {} get pods\n    (the Kubernetes API gateway in front of an apiserver simulator at {}; the user is\n    demo-user in group demo-team, forwarded upstream as Impersonate-User/Group)",
            gateway.kubeconfig.display(),
            gateway.simulator.address()
        );
    }
    let _ = writeln!(out, "\nPress Ctrl-C to stop.");
    let _ = out.flush();
}
