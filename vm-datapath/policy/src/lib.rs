//! VM NetworkPolicy compiler: turns the policy model into OpenFlow flows and minimal diffs.
//!
//! - [`model`] and [`load`]: Antrea's internal NetworkPolicy shape and its YAML/JSON loader,
//!   re-exported from `sluice-policy-model` (the control plane validates the same objects with
//!   the same messages, so they live in the foundation).
//! - [`compile`]: the flow pipeline, full compile, the incremental [`compile::PolicyCompiler`].

pub mod compile;

pub use sluice_policy_model::{limits, load, model, object};
