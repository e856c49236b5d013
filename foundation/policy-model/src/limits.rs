//! Bounds of the compiler's priority space (see `sluice_policy::compile::priority`). They live
//! here because they are part of what a valid policy is: the loader and the control plane refuse
//! a policy outside them with the same message, before any compiler sees it.

/// Highest allowed policy priority number (lowest precedence).
pub const MAX_POLICY_PRIORITY: u16 = 999;
/// Rules per policy; the rule number space is `MAX_RULES_PER_POLICY` wide per policy priority.
pub const MAX_RULES_PER_POLICY: u16 = 64;
