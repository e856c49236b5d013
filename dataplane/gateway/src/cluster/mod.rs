//! `UpstreamCluster` objects: the model, validation and file loading come from
//! `sluice-upstream-cluster` (shared with the control plane); this module adds the compiled,
//! immutable [`GatewaySnapshot`] the data plane reads.

mod snapshot;

pub use sluice_upstream_cluster::{
    check_agent_servers, check_hostname, check_unique, load_dir, parse_clusters, spec, validate,
    AgentReach, FieldError, InvalidConfig, InvalidSources, LoadedCluster, DISPATCH_VERBS,
};
pub use snapshot::{
    strip_port, CompiledCluster, CompiledServer, GatewaySnapshot, AGENT_HOST_DOMAIN,
};

#[cfg(test)]
mod tests;
