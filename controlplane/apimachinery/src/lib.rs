//! Kubernetes API machinery as pure functions, called by the control plane's HTTP server per
//! request: kinds as data, discovery, OpenAPI v3, object metadata rules, `Status` errors,
//! selectors, paging, watch events, Tables and patches. No sockets, no async runtime.
//!
//! Objects are `serde_json::Value`s; a kind is a [`KindSpec`] registered in a [`Registry`].

pub mod apply;
pub mod discovery;
pub mod kind;
pub mod limits;
pub mod list;
pub mod meta;
pub mod names;
pub mod openapi;
pub mod openapi_meta;
pub mod options;
pub mod patch;
pub mod schema;
pub mod selector;
pub mod status;
pub mod table;
pub mod timestamp;

pub use kind::{KindSpec, PrinterColumn, Registry, RegistryError, Validator};
pub use status::{
    FieldError, FieldErrorKind, StatusCause, StatusDetails, StatusError, StatusReason,
};
