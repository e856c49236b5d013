//! The Kubernetes `meta.k8s.io/v1 Status` object, in one place for every role: the control
//! plane's API and its watch streams send it, the gateway answers its own refusals with it,
//! the apiserver simulator imitates kube-apiserver with it, and the watch client reads it back.
//!
//! - [`StatusReason`]: the reasons Sluice sends, each with its HTTP code and whether a client
//!   may retry.
//! - [`Status`]: the object; [`Status::to_vec`] and [`Status::to_value`] are the one encoder,
//!   [`Status::decode`] and [`Status::from_value`] the one decoder.
//! - [`DecodeError`]: why bytes are not a `Status`, field by field; the decoder never panics on
//!   any input (property-tested here, fuzzed by `fuzz/fuzz_targets/watch_event.rs`).
//!
//! The encoder writes the keys in kube-apiserver's order (`kind`, `apiVersion`, `metadata`,
//! `status`, `message`, `reason`, `details`, `code`); [`Status::to_value`] gives the same object
//! as a `serde_json::Value`, whose map sorts the keys, for callers that embed it in a larger
//! document (a watch ERROR event).

mod decode;
mod reason;
mod status;

pub use decode::DecodeError;
pub use reason::StatusReason;
pub use status::{Outcome, Status, StatusCause, StatusDetails, API_VERSION, KIND};
