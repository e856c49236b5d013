//! The single validation pass: raw YAML values in, typed config out, every error recorded with
//! its path. Defaults live here, next to the checks, so the two cannot drift apart.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::time::Duration;

use serde_norway::Value;

use crate::error::Errors;
use crate::raw::{Leaf, RawConfig, RawListener};
use crate::{
    Config, DriverChoice, ListenerConfig, ListenersConfig, LogFormat, LoggingConfig, RuntimeConfig,
    Workers,
};

const MAX_WORKERS: usize = 1024;

/// Returns the typed config; it is only meaningful when `errors` stayed empty.
pub(crate) fn validate(raw: &RawConfig, errors: &mut Errors) -> Config {
    let runtime = RuntimeConfig {
        workers: workers(&raw.runtime.workers, "runtime.workers", errors),
        driver: one_of(
            &raw.runtime.driver,
            "runtime.driver",
            &DriverChoice::NAMES,
            "auto",
            errors,
        )
        .and_then(|name| DriverChoice::parse(&name))
        .unwrap_or(DriverChoice::Auto),
        uring_entries: unsigned(
            &raw.runtime.uring_entries,
            "runtime.uring_entries",
            1024,
            (256, 32_768),
            errors,
        ) as u32,
        drain_timeout: duration(
            &raw.runtime.drain_timeout,
            "runtime.drain_timeout",
            Duration::from_secs(30),
            errors,
        ),
    };
    if !runtime.uring_entries.is_power_of_two() {
        errors.push(
            "runtime.uring_entries",
            format!("{} is not a power of two", runtime.uring_entries),
        );
    }
    let logging = LoggingConfig {
        format: match one_of(
            &raw.logging.format,
            "logging.format",
            &["text", "json"],
            "text",
            errors,
        )
        .as_deref()
        {
            Some("json") => LogFormat::Json,
            _ => LogFormat::Text,
        },
        level: log_level(&raw.logging.level, "logging.level", errors),
    };
    let listeners = ListenersConfig {
        admin: listener(
            &raw.listeners.admin,
            "listeners.admin",
            "127.0.0.1:9901",
            errors,
        ),
    };
    Config {
        runtime,
        logging,
        listeners,
    }
}

fn listener(
    raw: &RawListener,
    path: &str,
    default_address: &str,
    errors: &mut Errors,
) -> ListenerConfig {
    let address = socket_address(
        &raw.address,
        &format!("{path}.address"),
        default_address,
        errors,
    );
    ListenerConfig {
        address,
        backlog: unsigned(
            &raw.backlog,
            &format!("{path}.backlog"),
            1024,
            (1, 65_535),
            errors,
        ) as u32,
        max_connections_per_worker: unsigned(
            &raw.max_connections_per_worker,
            &format!("{path}.max_connections_per_worker"),
            1024,
            (1, 1_000_000),
            errors,
        ) as usize,
        header_timeout: duration(
            &raw.header_timeout,
            &format!("{path}.header_timeout"),
            Duration::from_secs(10),
            errors,
        ),
        idle_timeout: duration(
            &raw.idle_timeout,
            &format!("{path}.idle_timeout"),
            Duration::from_secs(60),
            errors,
        ),
    }
}

/// The text of a scalar leaf, or `None` (with an error) for mappings and sequences.
fn scalar(value: &Value, path: &str, errors: &mut Errors) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        Value::Bool(flag) => Some(flag.to_string()),
        Value::Null => Some(String::new()),
        Value::Sequence(_) => {
            errors.push(path, "expected a single value, found a list");
            None
        }
        Value::Mapping(_) => {
            errors.push(path, "expected a single value, found a mapping");
            None
        }
        Value::Tagged(tagged) => scalar(&tagged.value, path, errors),
    }
}

fn socket_address(leaf: &Leaf, path: &str, default: &str, errors: &mut Errors) -> SocketAddr {
    let fallback = || {
        default
            .parse()
            .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)))
    };
    let Some(value) = leaf else {
        return fallback();
    };
    let Some(text) = scalar(value, path, errors) else {
        return fallback();
    };
    match text.parse::<SocketAddr>() {
        Ok(address) => address,
        Err(_) => {
            errors.push(
                path,
                format!("invalid socket address {text:?}: expected IP:PORT such as 127.0.0.1:9901 or [::1]:9901"),
            );
            fallback()
        }
    }
}

fn unsigned(
    leaf: &Leaf,
    path: &str,
    default: u64,
    (min, max): (u64, u64),
    errors: &mut Errors,
) -> u64 {
    let Some(value) = leaf else {
        return default;
    };
    let Some(text) = scalar(value, path, errors) else {
        return default;
    };
    match text.parse::<u64>() {
        Ok(number) if (min..=max).contains(&number) => number,
        Ok(number) => {
            errors.push(path, format!("{number} is out of range {min}..={max}"));
            default
        }
        Err(_) => {
            errors.push(
                path,
                format!("invalid number {text:?}: expected a whole number in {min}..={max}"),
            );
            default
        }
    }
}

fn workers(leaf: &Leaf, path: &str, errors: &mut Errors) -> Workers {
    let Some(value) = leaf else {
        return Workers::Auto;
    };
    let Some(text) = scalar(value, path, errors) else {
        return Workers::Auto;
    };
    if text == "auto" {
        return Workers::Auto;
    }
    match text.parse::<usize>() {
        Ok(count) if count <= MAX_WORKERS => match NonZeroUsize::new(count) {
            Some(count) => Workers::Count(count),
            None => {
                errors.push(path, "must be at least 1 (or \"auto\" for one per CPU)");
                Workers::Auto
            }
        },
        Ok(count) => {
            errors.push(
                path,
                format!("{count} is more than the limit of {MAX_WORKERS}"),
            );
            Workers::Auto
        }
        Err(_) => {
            errors.push(
                path,
                format!("invalid worker count {text:?}: expected \"auto\" or a number"),
            );
            Workers::Auto
        }
    }
}

fn duration(leaf: &Leaf, path: &str, default: Duration, errors: &mut Errors) -> Duration {
    let Some(value) = leaf else {
        return default;
    };
    let Some(text) = scalar(value, path, errors) else {
        return default;
    };
    match humantime::parse_duration(&text) {
        Ok(duration) => duration,
        Err(_) => {
            errors.push(
                path,
                format!("invalid duration {text:?}: expected a number with a unit such as 500ms, 30s or 5m"),
            );
            default
        }
    }
}

fn one_of(
    leaf: &Leaf,
    path: &str,
    allowed: &[&str],
    default: &str,
    errors: &mut Errors,
) -> Option<String> {
    let Some(value) = leaf else {
        return Some(default.to_string());
    };
    let text = scalar(value, path, errors)?;
    if allowed.contains(&text.as_str()) {
        Some(text)
    } else {
        errors.push(
            path,
            format!(
                "invalid value {text:?}: expected one of {}",
                allowed.join(", ")
            ),
        );
        None
    }
}

fn log_level(leaf: &Leaf, path: &str, errors: &mut Errors) -> String {
    const DEFAULT: &str = "info";
    let Some(value) = leaf else {
        return DEFAULT.to_string();
    };
    let Some(text) = scalar(value, path, errors) else {
        return DEFAULT.to_string();
    };
    match tracing_subscriber::EnvFilter::builder().parse(&text) {
        Ok(_) => text,
        Err(error) => {
            errors.push(path, format!("invalid log filter {text:?}: {error}"));
            DEFAULT.to_string()
        }
    }
}
