//! The Kubernetes API gateway pillar: its listener, health checker and cluster reloader.

use anyhow::Context;
use prometheus_client::registry::Registry;
use sluice_config::Config;
use sluice_gateway_proxy::{
    Gateway, GatewayCollector, GatewayEndpoint, GatewayMetrics, HealthChecker, ReloaderHandle,
};
use sluice_runtime::{Placement, ServerBuilder};

/// Loads the clusters and serves the gateway listener when the config has a `gateway` section;
/// returns the reloader that watches the clusters directory.
pub fn wire(
    config: &Config,
    server: &mut ServerBuilder,
    registry: &mut Registry,
    workers: usize,
) -> anyhow::Result<Option<ReloaderHandle>> {
    let (Some(gateway), Some(listener)) = (&config.gateway, &config.listeners.gateway) else {
        return Ok(None);
    };
    let metrics = GatewayMetrics::register(registry, workers);
    let loaded = Gateway::load(&gateway.clusters_dir, metrics).with_context(|| {
        format!(
            "gateway.clusters_dir {}: refusing to start",
            gateway.clusters_dir.display()
        )
    })?;
    registry.register_collector(Box::new(GatewayCollector(loaded.clone())));
    let generation = loaded.current();
    tracing::info!(
        dir = %gateway.clusters_dir.display(),
        clusters = generation.snapshot.clusters().len(),
        "gateway clusters loaded"
    );
    let gateway_id = server.bind("gateway", listener, Placement::Workers)?;
    server.serve(
        gateway_id,
        GatewayEndpoint {
            gateway: loaded.clone(),
            workers,
        },
    );
    server.spawn_background(HealthChecker {
        gateway: loaded.clone(),
    });
    Ok(Some(sluice_gateway_proxy::spawn_reloader(
        loaded,
        gateway.reload_interval,
    )?))
}
