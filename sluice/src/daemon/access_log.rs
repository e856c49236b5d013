//! The gateway's and the tunnel node's access logs: switched from their config sections at
//! start and on every reload, counted on `/metrics`.

use prometheus_client::registry::Registry;
use sluice_access_log::Role;
use sluice_config::Config;

/// Registers the line counts where a role that logs is configured, and applies the sections.
pub fn wire(config: &Config, registry: &mut Registry) -> anyhow::Result<()> {
    if config.gateway.is_some() || config.tunnel.is_some() {
        registry.register_collector(Box::new(sluice_access_log::AccessLogCollector));
    }
    apply(config)?;
    Ok(())
}

/// Turns each role's log on or off and sets its sampling (one atomic store per role).
pub fn apply(config: &Config) -> std::io::Result<()> {
    if let Some(gateway) = &config.gateway {
        sluice_access_log::configure(Role::Gateway, &gateway.access_log)?;
    }
    if let Some(tunnel) = &config.tunnel {
        sluice_access_log::configure(Role::Tunnel, &tunnel.access_log)?;
    }
    Ok(())
}
