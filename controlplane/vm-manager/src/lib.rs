//! The control plane's VMManager (issue 15, seed 004): it drives each `VirtualMachine` through
//! Unmanaged, Agentless, AgentedBootstrap and AgentedConnected from its spec and its agent's
//! `VirtualMachineRuntimeInfo` heartbeats, and writes every NetworkPolicy's realization status.
//!
//! [`state`] holds the decisions as pure functions (the state machine, the statuses);
//! [`VmManager`] is the I/O: it follows the store, re-checks staleness on a timer and writes
//! statuses through the API server's status path, so the same metadata and validation rules
//! apply as to a `PUT .../status`.

mod cache;
mod controller;
mod error;
pub mod events;
mod metrics;
pub mod state;

pub use controller::VmManager;
pub use error::VmManagerError;
pub use metrics::VmMetrics;

/// The default staleness timeout: three missed reports at the agent's default 30 s interval,
/// so one lost write or a slow control plane does not flip enforcement.
pub const DEFAULT_HEARTBEAT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(90);
