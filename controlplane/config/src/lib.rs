//! Sluice configuration.
//!
//! One YAML document, read into serde types, then checked in a single pass that reports every
//! problem with its path (`listeners.admin.address: invalid socket address "x:y"`). Unknown
//! fields are errors. A config is used whole or not at all: callers get either a [`Config`] or a
//! [`ConfigError`] listing everything wrong, which is what lets a reload keep the last good config.

mod error;
mod raw;
mod validate;

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::Path;
use std::time::Duration;

pub use error::{ConfigError, FieldError};

/// The configuration `sluice up` runs with when given no file: loopback only.
pub const EMBEDDED_DEFAULTS: &str = include_str!("embedded_defaults.yaml");

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub runtime: RuntimeConfig,
    pub logging: LoggingConfig,
    pub listeners: ListenersConfig,
}

/// How the thread-per-core data plane runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    pub workers: Workers,
    pub driver: DriverChoice,
    /// io_uring submission queue size per worker.
    pub uring_entries: u32,
    /// How long in-flight work may run after a stop signal before it is cut off.
    pub drain_timeout: Duration,
}

/// Number of data-plane worker threads (one monoio runtime each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// One per available CPU.
    Auto,
    Count(NonZeroUsize),
}

impl Workers {
    /// The concrete worker count on this machine.
    pub fn resolve(self) -> usize {
        match self {
            Workers::Auto => std::thread::available_parallelism().map_or(1, NonZeroUsize::get),
            Workers::Count(count) => count.get(),
        }
    }
}

/// Which monoio I/O driver the workers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverChoice {
    /// io_uring, falling back to epoll when io_uring cannot be set up.
    Auto,
    /// io_uring only; refuse to start without it.
    Uring,
    /// epoll (monoio's legacy driver).
    Legacy,
}

impl DriverChoice {
    pub const NAMES: [&'static str; 3] = ["auto", "uring", "legacy"];

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "auto" => Some(Self::Auto),
            "uring" | "io_uring" => Some(Self::Uring),
            "legacy" | "epoll" => Some(Self::Legacy),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggingConfig {
    pub format: LogFormat,
    /// A `tracing` filter directive such as `info` or `info,sluice_runtime=debug`.
    pub level: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Every listener has its own block; issues that add endpoints add fields here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenersConfig {
    pub admin: ListenerConfig,
}

/// Address and limits of one listener. Each worker binds its own socket to the address with
/// `SO_REUSEPORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerConfig {
    pub address: SocketAddr,
    pub backlog: u32,
    /// Connections one worker serves at once on this listener; past it the worker stops
    /// accepting until one closes (the kernel backlog absorbs the burst).
    pub max_connections_per_worker: usize,
    /// Longest wait for a complete request head.
    pub header_timeout: Duration,
    /// Longest idle time of a kept-alive connection between requests.
    pub idle_timeout: Duration,
}

impl Config {
    /// The embedded defaults, validated.
    pub fn embedded_defaults() -> Result<Self, ConfigError> {
        load_str(EMBEDDED_DEFAULTS, "<embedded defaults>")
    }
}

/// Reads and validates a YAML file.
pub fn load_file(path: &Path) -> Result<Config, ConfigError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError {
        origin: origin.clone(),
        errors: vec![FieldError::new("", format!("cannot read file: {error}"))],
    })?;
    load_str(&text, &origin)
}

/// Parses and validates YAML text; `origin` names it in error messages.
pub fn load_str(text: &str, origin: &str) -> Result<Config, ConfigError> {
    let fail = |errors: Vec<FieldError>| ConfigError {
        origin: origin.to_string(),
        errors,
    };
    let mut unknown_fields = Vec::new();
    let raw: raw::RawConfig = if is_empty_document(text) {
        raw::RawConfig::default()
    } else {
        let deserializer = serde_norway::Deserializer::from_str(text);
        let mut record_unknown = |path: serde_ignored::Path<'_>| {
            unknown_fields.push(path.to_string());
        };
        let tracked = serde_ignored::Deserializer::new(deserializer, &mut record_unknown);
        match serde_path_to_error::deserialize(tracked) {
            Ok(raw) => raw,
            Err(error) => {
                let path = error.path().to_string();
                let path = if path == "." { String::new() } else { path };
                let reason = serde_reason(&error.into_inner().to_string(), &path);
                return Err(fail(vec![FieldError::new(path, reason)]));
            }
        }
    };
    let mut errors = error::Errors::default();
    for path in unknown_fields {
        errors.push(path, "unknown field");
    }
    let config = validate::validate(&raw, &mut errors);
    if errors.list.is_empty() {
        Ok(config)
    } else {
        Err(fail(errors.list))
    }
}

/// serde_norway prefixes its messages with the path (which we print already) and names our
/// internal `Raw*` structs; operators need neither.
fn serde_reason(message: &str, path: &str) -> String {
    let message = message
        .strip_prefix(path)
        .and_then(|rest| rest.strip_prefix(": "))
        .unwrap_or(message);
    const STRUCT: &str = "expected struct Raw";
    match message.find(STRUCT) {
        Some(start) => {
            let name_start = start + "expected struct ".len();
            let name_end = message[name_start..]
                .find(' ')
                .map_or(message.len(), |offset| name_start + offset);
            format!(
                "{}expected a mapping{}",
                &message[..start],
                &message[name_end..]
            )
        }
        None => message.to_string(),
    }
}

fn is_empty_document(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .all(|line| line.is_empty() || line.starts_with('#') || line == "---")
}

#[cfg(test)]
mod tests;
