//! VM NetworkPolicy model and the pure conjunction compiler that turns it into OpenFlow flows and
//! minimal diffs.
//!
//! - [`model`]: Antrea's internal NetworkPolicy shape (policies, rules, address and applied-to
//!   groups, patches).
//! - [`load`]: YAML/JSON documents into a validated [`model::PolicySet`], every error with its
//!   path.
//! - [`compile`]: the flow pipeline, full compile, the incremental [`compile::PolicyCompiler`].

pub mod compile;
pub mod load;
pub mod model;
