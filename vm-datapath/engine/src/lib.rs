//! Realizes compiled VM NetworkPolicies on an Open vSwitch bridge.
//!
//! - [`PolicyEngine`]: owns the OpenFlow connection and the [`PolicyCompiler`]; installs a new
//!   cookie round atomically at start, applies each change as one bundle, replays everything
//!   after the switch restarts, answers Reject packet-ins, and turns flow stats into per-rule
//!   counters.
//! - [`changes`]: pure set-to-set changes and net diffs; [`reject`]: the RST / ICMP replies;
//!   [`meter`]: the meter that bounds Reject packet-ins, and its dropped-packet counter.
//!
//! [`PolicyCompiler`]: sluice_policy::compile::PolicyCompiler

pub mod changes;
mod engine;
pub mod meter;
pub mod metrics;
pub mod reject;

pub use engine::{EngineConfig, EngineError, PolicyEngine, RealizeSummary};
pub use meter::RejectMeter;
pub use metrics::EngineMetrics;
