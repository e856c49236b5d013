//! The single validation pass: raw YAML values in, typed config out, every error recorded with
//! its path. Defaults live here, next to the checks, so the two cannot drift apart.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use serde_norway::Value;

use crate::listener::listener;
use crate::raw::{Leaf, RawConfig};
use crate::{
    Config, DriverChoice, ListenersConfig, LogFormat, LoggingConfig, RuntimeConfig, Workers,
};
pub(crate) use sluice_config_error::ErrorList as Errors;

mod access_log;
mod agent;
mod controlplane;
mod ebpf;
mod gateway;
mod listeners;
mod overload;
mod redis;
mod tunnel;

use agent::agent;
use gateway::gateway;
use tunnel::tunnel;

const MAX_WORKERS: usize = 1024;

/// Returns the typed config; it is only meaningful when `errors` stayed empty. The phases run in
/// the order errors are reported in: sections first, then the listeners that depend on them.
pub(crate) fn validate(raw: &RawConfig, errors: &mut Errors) -> Config {
    let runtime = runtime(raw, errors);
    let logging = logging(raw, errors);
    let tunnel = raw.tunnel.as_ref().map(|raw| tunnel(raw, errors));
    let agent = raw.agent.as_ref().map(|raw| agent(raw, errors));
    let redis = raw.redis.as_ref().map(|raw| redis::redis(raw, errors));
    redis::check_multi_node(redis.is_some(), tunnel.as_ref(), errors);
    let private = listeners::private(raw, redis.is_some(), tunnel.as_ref(), errors);
    let (agent_listener, external) = listeners::tunnel_sides(raw, tunnel.is_some(), errors);
    let gateway = raw.gateway.as_ref().map(|raw| gateway(raw, errors));
    let listeners = ListenersConfig {
        gateway: listeners::gateway(raw, gateway.is_some(), errors),
        private,
        agent: agent_listener,
        external,
        admin: listener(
            &raw.listeners.admin,
            "listeners.admin",
            default_admin_address(raw),
            errors,
        ),
    };
    Config {
        runtime,
        logging,
        listeners,
        tunnel,
        agent,
        redis,
        gateway,
        ebpf: raw.ebpf.as_ref().map(|raw| ebpf::ebpf(raw, errors)),
    }
}

/// A node (or gateway) admin listens on 9901, an agent-only file's on 9902: the two roles
/// commonly share a host (the README's minimal node and agent), and one default port would
/// make the second to start fail to bind.
fn default_admin_address(raw: &RawConfig) -> &'static str {
    if raw.agent.is_some() && raw.tunnel.is_none() && raw.gateway.is_none() {
        "127.0.0.1:9902"
    } else {
        "127.0.0.1:9901"
    }
}

/// `runtime:`: worker threads, the I/O driver and how long a drain may take.
fn runtime(raw: &RawConfig, errors: &mut Errors) -> RuntimeConfig {
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
        overload: overload::overload(&raw.runtime.overload, errors),
    };
    if !runtime.uring_entries.is_power_of_two() {
        errors.push(
            "runtime.uring_entries",
            format!("{} is not a power of two", runtime.uring_entries),
        );
    }
    runtime
}

/// `logging:`: the format and level of the log lines.
fn logging(raw: &RawConfig, errors: &mut Errors) -> LoggingConfig {
    LoggingConfig {
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
    }
}

/// A path to a file that must exist and be readable now (so a typo fails at start-up, not at
/// the first handshake).
pub(crate) fn readable_file(
    leaf: &Leaf,
    path: &str,
    required: bool,
    errors: &mut Errors,
) -> Option<PathBuf> {
    let Some(value) = leaf else {
        if required {
            errors.push(path, "is required");
        }
        return None;
    };
    let text = scalar(value, path, errors)?;
    if text.is_empty() {
        if required {
            errors.push(path, "is required");
        }
        return None;
    }
    let file = PathBuf::from(&text);
    match std::fs::File::open(&file) {
        Ok(_) => Some(file),
        Err(error) => {
            errors.push(path, format!("cannot read {text:?}: {error}"));
            None
        }
    }
}

/// Most bytes a secret file may hold: a key is tens of bytes, and a bound keeps a mistaken path
/// (a log, `/dev/zero`) from being read whole into memory at start-up.
const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

/// Reads a secret from a file, without its trailing newline.
fn secret_from_file(leaf: &Leaf, path: &str, errors: &mut Errors) -> Option<(PathBuf, Vec<u8>)> {
    let file = readable_file(leaf, path, true, errors)?;
    match read_bounded(&file, MAX_SECRET_FILE_BYTES) {
        Ok(None) => {
            errors.push(
                path,
                format!(
                    "{} holds more than {MAX_SECRET_FILE_BYTES} bytes: a secret file holds one key",
                    file.display()
                ),
            );
            None
        }
        Ok(Some(mut bytes)) => {
            while bytes.last().is_some_and(u8::is_ascii_whitespace) {
                bytes.pop();
            }
            if bytes.is_empty() {
                errors.push(path, format!("{} is empty", file.display()));
                return None;
            }
            Some((file, bytes))
        }
        Err(error) => {
            errors.push(path, format!("cannot read {}: {error}", file.display()));
            None
        }
    }
}

/// The file's bytes, or `None` when it holds more than `limit`.
fn read_bounded(file: &std::path::Path, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(file)?
        .take(limit + 1)
        .read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= limit).then_some(bytes))
}

fn text(leaf: &Leaf, path: &str, default: &str, errors: &mut Errors) -> String {
    match leaf {
        None => default.to_string(),
        Some(value) => scalar(value, path, errors).unwrap_or_else(|| default.to_string()),
    }
}

/// The text of a scalar leaf, or `None` (with an error) for mappings and sequences.
/// A `true`/`false` field; `default` when absent.
pub(crate) fn flag(value: Option<&Value>, path: &str, default: bool, errors: &mut Errors) -> bool {
    let Some(value) = value else {
        return default;
    };
    match scalar(value, path, errors).as_deref() {
        Some("true") => true,
        Some("false") => false,
        Some(other) => {
            errors.push(path, format!("expected true or false, found {other:?}"));
            default
        }
        None => default,
    }
}

pub(crate) fn scalar(value: &Value, path: &str, errors: &mut Errors) -> Option<String> {
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

pub(crate) fn socket_address(
    leaf: &Leaf,
    path: &str,
    default: &str,
    errors: &mut Errors,
) -> SocketAddr {
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

pub(crate) fn unsigned(
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

pub(crate) fn duration(
    leaf: &Leaf,
    path: &str,
    default: Duration,
    errors: &mut Errors,
) -> Duration {
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
