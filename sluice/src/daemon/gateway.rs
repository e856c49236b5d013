//! The Kubernetes API gateway pillar: its listener, health checker, and where its clusters
//! come from (a directory it reloads, or the control plane's feed).

use std::sync::Arc;

use anyhow::Context;
use prometheus_client::registry::Registry;
use sluice_config::{ClusterSource, Config, ControlPlaneSource};
use sluice_gateway_proxy::{
    Gateway, GatewayCollector, GatewayEndpoint, GatewayMetrics, HealthChecker, ReloaderHandle,
};
use sluice_runtime::{Placement, ServerBuilder};

/// The gateway as wired: the directory reloader, or the control plane to feed it from.
pub struct WiredGateway {
    pub reloader: Option<ReloaderHandle>,
    pub feed: Option<(ControlPlaneSource, Arc<Gateway>)>,
}

/// Loads the clusters and serves the gateway listener when the config has a `gateway` section.
pub fn wire(
    config: &Config,
    server: &mut ServerBuilder,
    registry: &mut Registry,
    workers: usize,
    expiry: &sluice_admin::CertificateExpiry,
    node: Option<&Arc<sluice_tunnel::node::NodeShared>>,
) -> anyhow::Result<Option<WiredGateway>> {
    let (Some(gateway), Some(listener)) = (&config.gateway, &config.listeners.gateway) else {
        return Ok(None);
    };
    let metrics = GatewayMetrics::register(registry, workers);
    let loaded = match &gateway.source {
        ClusterSource::Directory(dir) => Gateway::load(dir, metrics).with_context(|| {
            format!("gateway.clusters_dir {}: refusing to start", dir.display())
        })?,
        // The first list is applied by the feed (start-up waits for it a little).
        ClusterSource::ControlPlane(source) => {
            Gateway::with_clusters(&source.url, Vec::new(), metrics)?
        }
    };
    loaded.set_agent_reach(super::preflight::agent_reach(config));
    if let Some(path) = super::agent_link::agent_path(gateway, node)? {
        loaded.set_agent_path(path);
    }
    loaded.export_certificate_expiry(expiry.clone());
    registry.register_collector(Box::new(GatewayCollector(loaded.clone())));
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
    Ok(Some(match &gateway.source {
        ClusterSource::Directory(dir) => {
            tracing::info!(
                dir = %dir.display(),
                clusters = loaded.current().snapshot.clusters().len(),
                "gateway clusters loaded"
            );
            WiredGateway {
                reloader: Some(sluice_gateway_proxy::spawn_reloader(
                    loaded,
                    gateway.reload_interval,
                )?),
                feed: None,
            }
        }
        ClusterSource::ControlPlane(source) => WiredGateway {
            reloader: None,
            feed: Some((source.clone(), loaded)),
        },
    }))
}
