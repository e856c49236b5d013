//! `UpstreamCluster` objects (`proxy.sluice.dev/v1alpha1`): the model ([`spec`]), validation
//! with field paths ([`validate`]) and loading from YAML files ([`load_dir`]). The gateway
//! compiles them into its snapshot; the control plane validates the same objects with the same
//! messages, so this lives in the foundation both planes may use.

pub mod api;
pub mod confine;
mod load;
mod reach;
pub mod spec;
mod validate;

pub use load::{check_unique, load_dir, parse_clusters, LoadedCluster};
pub use reach::{check_agent_servers, AgentReach};
pub use sluice_config_error::{FieldError, InvalidConfig, InvalidSources};
pub use validate::{check_hostname, validate, DISPATCH_VERBS};

#[cfg(test)]
mod tests;
