//! The VM NetworkPolicy objects (Antrea's internal shape): the model the VM agent's compiler
//! (`sluice-policy`) works on and the control plane serves as `policy.sluice.dev/v1alpha1`
//! kinds. Both validate with the same code and messages, so it lives in the foundation both
//! may use.
//!
//! - [`model`]: policies, rules, address and applied-to groups, patches.
//! - [`load`]: YAML/JSON documents into a validated [`model::PolicySet`], every error with its
//!   path.
//! - [`object`]: the same checks on one stored object (the control plane's kinds).
//! - [`limits`]: the priority and rule-count bounds a valid policy keeps.

pub mod limits;
pub mod load;
pub mod model;
pub mod object;
