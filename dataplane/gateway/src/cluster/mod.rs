//! `UpstreamCluster` objects: the YAML model ([`spec`]), validation with field paths
//! ([`validate`]), loading from files ([`load_dir`]) and the compiled, immutable
//! [`GatewaySnapshot`] the data plane reads.

mod load;
mod snapshot;
pub mod spec;
mod validate;

pub use load::{check_unique, load_dir, parse_clusters, LoadedCluster};
pub use sluice_config_error::{FieldError, InvalidConfig, InvalidSources};
pub use snapshot::{strip_port, CompiledCluster, CompiledServer, GatewaySnapshot};
pub use validate::{check_hostname, validate};

#[cfg(test)]
mod tests;
