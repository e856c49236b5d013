//! The configuration exactly as written in YAML.
//!
//! Leaves are kept as untyped YAML values so that a wrong type in one field becomes one error
//! with its path in the validation pass instead of stopping deserialization at the first
//! mistake. Unknown fields are collected separately (see `crate::load_str`).

use serde::Deserialize;
use serde_norway::Value;

pub(crate) type Leaf = Option<Value>;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawConfig {
    pub(crate) runtime: RawRuntime,
    pub(crate) logging: RawLogging,
    pub(crate) listeners: RawListeners,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawRuntime {
    pub(crate) workers: Leaf,
    pub(crate) driver: Leaf,
    pub(crate) uring_entries: Leaf,
    pub(crate) drain_timeout: Leaf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawLogging {
    pub(crate) format: Leaf,
    pub(crate) level: Leaf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawListeners {
    pub(crate) admin: RawListener,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawListener {
    pub(crate) address: Leaf,
    pub(crate) backlog: Leaf,
    pub(crate) max_connections_per_worker: Leaf,
    pub(crate) header_timeout: Leaf,
    pub(crate) idle_timeout: Leaf,
}
