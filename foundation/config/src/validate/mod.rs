//! The single validation pass: raw YAML values in, typed config out, every error recorded with
//! its path. Defaults live here, next to the checks, so the two cannot drift apart.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use serde_norway::Value;

use crate::listener::listener;
use crate::raw::{Leaf, RawAgent, RawConfig, RawGateway, RawListener, RawRedis};
use crate::{
    AgentConfig, ClusterSource, Config, DriverChoice, Endpoint, GatewayConfig, ListenersConfig,
    LogFormat, LoggingConfig, PoolConfig, ReconnectConfig, RedisConfig, RedisTargetConfig,
    RuntimeConfig, Workers,
};
pub(crate) use sluice_config_error::ErrorList as Errors;

mod controlplane;
mod ebpf;
mod overload;
mod tunnel;

use tunnel::{tunnel, DEFAULT_MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES_LIMIT};

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
        overload: overload::overload(&raw.runtime.overload, errors),
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
    let tunnel = raw.tunnel.as_ref().map(|raw| tunnel(raw, errors));
    let agent = raw.agent.as_ref().map(|raw| agent(raw, errors));
    let redis = raw.redis.as_ref().map(|raw| redis(raw, errors));
    if redis.is_some() && tunnel.is_none() {
        errors.push("redis", "is only used by a node with a tunnel section");
    }
    if let (Some(_), Some(tunnel)) = (&redis, &tunnel) {
        match &tunnel.private_jwt {
            None => errors.push(
                "tunnel.private_jwt.secret_file",
                "is required with redis: nodes sign calls to each other's private endpoints",
            ),
            Some(private)
                if private.issuer == tunnel.jwt.issuer
                    && private.audience == tunnel.jwt.audience =>
            {
                errors.push(
                    "tunnel.private_jwt",
                    "needs its own issuer or audience, distinct from tunnel.jwt",
                )
            }
            Some(_) => {}
        }
    }
    let private_listener = match (&raw.listeners.private, &redis) {
        (Some(raw), Some(_)) => Some(listener(raw, "listeners.private", "127.0.0.1:8155", errors)),
        (None, Some(_)) => Some(listener(
            &RawListener::default(),
            "listeners.private",
            "127.0.0.1:8155",
            errors,
        )),
        (Some(_), None) => {
            errors.push(
                "listeners.private",
                "is only used with a redis section (multi-node routing)",
            );
            None
        }
        (None, None) => None,
    };
    if let (Some(private), Some(tunnel)) = (&private_listener, &tunnel) {
        if private.tls.is_some() && tunnel.peer_tls.is_none() {
            errors.push(
                "tunnel.peer_tls.ca_file",
                "is required when listeners.private.tls is set: nodes call each other's private endpoints over TLS",
            );
        }
    }
    let tunnel_listener =
        |raw: &Option<RawListener>, name: &str, default: &str, errors: &mut Errors| {
            let path = format!("listeners.{name}");
            match (raw, &tunnel) {
                (Some(raw), Some(_)) => Some(listener(raw, &path, default, errors)),
                (None, Some(_)) => Some(listener(&RawListener::default(), &path, default, errors)),
                (Some(_), None) => {
                    errors.push(
                        path,
                        "is only used with a tunnel section; add `tunnel:` or remove it",
                    );
                    None
                }
                (None, None) => None,
            }
        };
    let agent_listener = tunnel_listener(&raw.listeners.agent, "agent", "127.0.0.1:8150", errors);
    let external_listener = tunnel_listener(
        &raw.listeners.external,
        "external",
        "127.0.0.1:8151",
        errors,
    );
    let gateway = raw.gateway.as_ref().map(|raw| gateway(raw, errors));
    let gateway_listener = match (&raw.listeners.gateway, &gateway) {
        (Some(raw), Some(_)) => Some(listener(raw, "listeners.gateway", "127.0.0.1:8443", errors)),
        (None, Some(_)) => Some(listener(
            &RawListener::default(),
            "listeners.gateway",
            "127.0.0.1:8443",
            errors,
        )),
        (Some(_), None) => {
            errors.push(
                "listeners.gateway",
                "is only used with a gateway section; add `gateway:` or remove it",
            );
            None
        }
        (None, None) => None,
    };
    if let Some(listener) = &gateway_listener {
        if listener.tls.is_some() {
            errors.push(
                "listeners.gateway.tls",
                "is not used: each UpstreamCluster serves its own certificate (spec.secureServing), chosen by SNI",
            );
        }
    }
    let listeners = ListenersConfig {
        gateway: gateway_listener,
        private: private_listener,
        agent: agent_listener,
        external: external_listener,
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
        tunnel,
        agent,
        redis,
        gateway,
        ebpf: raw.ebpf.as_ref().map(|raw| ebpf::ebpf(raw, errors)),
    }
}

fn gateway(raw: &RawGateway, errors: &mut Errors) -> GatewayConfig {
    let source = match (&raw.clusters_dir, &raw.source) {
        (Some(_), Some(_)) => {
            errors.push(
                "gateway.source",
                "set either gateway.clusters_dir or gateway.source, not both",
            );
            ClusterSource::Directory(PathBuf::new())
        }
        (None, Some(source)) => controlplane::source(source, "gateway.source", errors).map_or(
            ClusterSource::Directory(PathBuf::new()),
            ClusterSource::ControlPlane,
        ),
        (_, None) => ClusterSource::Directory(clusters_dir(raw, errors)),
    };
    GatewayConfig {
        source,
        credentials_dir: credentials_dir(raw, errors),
        reload_interval: duration(
            &raw.reload_interval,
            "gateway.reload_interval",
            Duration::from_secs(1),
            errors,
        ),
    }
}

/// `gateway.credentials_dir`: optional, a readable directory when set.
fn credentials_dir(raw: &RawGateway, errors: &mut Errors) -> Option<PathBuf> {
    let path = "gateway.credentials_dir";
    let text = scalar(raw.credentials_dir.as_ref()?, path, errors)?;
    match std::fs::read_dir(&text) {
        Ok(_) => Some(PathBuf::from(text)),
        Err(error) => {
            errors.push(path, format!("cannot read directory {text:?}: {error}"));
            None
        }
    }
}

fn clusters_dir(raw: &RawGateway, errors: &mut Errors) -> PathBuf {
    match raw
        .clusters_dir
        .as_ref()
        .and_then(|value| scalar(value, "gateway.clusters_dir", errors))
    {
        None => {
            errors.push(
                "gateway.clusters_dir",
                "is required: a directory of UpstreamCluster YAML files (or gateway.source)",
            );
            PathBuf::new()
        }
        Some(text) => {
            let dir = PathBuf::from(&text);
            if let Err(error) = std::fs::read_dir(&dir) {
                errors.push(
                    "gateway.clusters_dir",
                    format!("cannot read directory {text:?}: {error}"),
                );
            }
            dir
        }
    }
}

fn redis_url(value: &Value, path: &str, errors: &mut Errors) -> Option<String> {
    let text = scalar(value, path, errors)?;
    let scheme = text.split_once("://").map(|(scheme, _)| scheme);
    if matches!(scheme, Some("redis" | "rediss" | "redis+unix" | "unix")) {
        Some(text)
    } else {
        errors.push(
            path,
            format!(
                "invalid Redis URL {:?}: expected redis://, rediss:// or redis+unix://",
                crate::redact_url(&text)
            ),
        );
        None
    }
}

fn redis(raw: &RawRedis, errors: &mut Errors) -> RedisConfig {
    let target = match (&raw.url, raw.cluster.is_empty()) {
        (Some(url), true) => redis_url(url, "redis.url", errors).map(RedisTargetConfig::Url),
        (None, false) => {
            let urls: Vec<String> = raw
                .cluster
                .iter()
                .enumerate()
                .filter_map(|(index, url)| {
                    redis_url(url, &format!("redis.cluster[{index}]"), errors)
                })
                .collect();
            Some(RedisTargetConfig::Cluster(urls))
        }
        (Some(_), false) => {
            errors.push("redis", "set either url or cluster, not both");
            None
        }
        (None, true) => {
            errors.push(
                "redis.url",
                "is required (or list cluster seed nodes under redis.cluster)",
            );
            None
        }
    };
    let config = RedisConfig {
        target: target.unwrap_or(RedisTargetConfig::Url(String::new())),
        ca_file: readable_file(&raw.ca_file, "redis.ca_file", false, errors),
        key_prefix: text(&raw.key_prefix, "redis.key_prefix", "sluice", errors),
        ttl: duration(&raw.ttl, "redis.ttl", Duration::from_secs(300), errors),
        refresh: duration(
            &raw.refresh,
            "redis.refresh",
            Duration::from_secs(240),
            errors,
        ),
        gc_interval: duration(
            &raw.gc_interval,
            "redis.gc_interval",
            Duration::from_secs(600),
            errors,
        ),
        unregister_delay: duration(
            &raw.unregister_delay,
            "redis.unregister_delay",
            Duration::from_secs(5),
            errors,
        ),
    };
    if config.refresh >= config.ttl {
        errors.push(
            "redis.refresh",
            "must be shorter than redis.ttl, or entries expire between refreshes",
        );
    }
    config
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

fn endpoint(value: &Value, path: &str, errors: &mut Errors) -> Option<Endpoint> {
    let text = scalar(value, path, errors)?;
    let invalid = |errors: &mut Errors, why: &str| {
        errors.push(path, format!("invalid URL {text:?}: {why}"));
    };
    let uri = match text.parse::<http::Uri>() {
        Ok(uri) => uri,
        Err(error) => {
            invalid(errors, &error.to_string());
            return None;
        }
    };
    let tls = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => {
            invalid(
                errors,
                "expected http:// (HTTP/2 cleartext) or https:// (TLS)",
            );
            return None;
        }
    };
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        invalid(errors, "expected scheme://host:port without a path");
        return None;
    }
    let Some(host) = uri.host() else {
        invalid(errors, "no host");
        return None;
    };
    Some(Endpoint {
        url: text.clone(),
        tls,
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port: uri.port_u16().unwrap_or(if tls { 443 } else { 80 }),
    })
}

fn agent(raw: &RawAgent, errors: &mut Errors) -> AgentConfig {
    let (token_file, token) =
        secret_from_file(&raw.token_file, "agent.token_file", errors).unwrap_or_default();
    let token = String::from_utf8(token).unwrap_or_else(|_| {
        errors.push("agent.token_file", "the token is not UTF-8 text");
        String::new()
    });
    if raw.nodes.is_empty() {
        errors.push(
            "agent.nodes",
            "list at least one node URL, e.g. http://127.0.0.1:8150",
        );
    }
    let nodes = raw
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(index, value)| endpoint(value, &format!("agent.nodes[{index}]"), errors))
        .collect();
    let forward_to = match &raw.forward_to {
        Some(value) => endpoint(value, "agent.forward_to", errors),
        None => {
            errors.push(
                "agent.forward_to",
                "is required: the URL of the local gRPC backend",
            );
            None
        }
    };
    let pool = PoolConfig {
        min_idle: unsigned(
            &raw.pool.min_idle,
            "agent.pool.min_idle",
            2,
            (1, 10_000),
            errors,
        ) as usize,
        max: unsigned(&raw.pool.max, "agent.pool.max", 500, (1, 100_000), errors) as usize,
        grow_by: unsigned(
            &raw.pool.grow_by,
            "agent.pool.grow_by",
            10,
            (1, 10_000),
            errors,
        ) as usize,
        idle_timeout: duration(
            &raw.pool.idle_timeout,
            "agent.pool.idle_timeout",
            Duration::from_secs(60),
            errors,
        ),
    };
    if pool.min_idle > pool.max {
        errors.push(
            "agent.pool.min_idle",
            format!(
                "{} is more than agent.pool.max ({})",
                pool.min_idle, pool.max
            ),
        );
    }
    let reconnect = ReconnectConfig {
        initial_backoff: duration(
            &raw.reconnect.initial_backoff,
            "agent.reconnect.initial_backoff",
            Duration::from_secs(1),
            errors,
        ),
        max_backoff: duration(
            &raw.reconnect.max_backoff,
            "agent.reconnect.max_backoff",
            Duration::from_secs(20),
            errors,
        ),
    };
    if reconnect.initial_backoff > reconnect.max_backoff || reconnect.initial_backoff.is_zero() {
        errors.push(
            "agent.reconnect.initial_backoff",
            "must be more than zero and at most agent.reconnect.max_backoff",
        );
    }
    AgentConfig {
        token,
        token_file,
        nodes,
        ca_file: readable_file(&raw.ca_file, "agent.ca_file", false, errors),
        forward_to: forward_to.unwrap_or(Endpoint {
            url: String::new(),
            tls: false,
            host: String::new(),
            port: 0,
        }),
        forward_ca_file: readable_file(
            &raw.forward_ca_file,
            "agent.forward_ca_file",
            false,
            errors,
        ),
        max_message_bytes: unsigned(
            &raw.max_message_bytes,
            "agent.max_message_bytes",
            DEFAULT_MAX_MESSAGE_BYTES,
            (1024, MAX_MESSAGE_BYTES_LIMIT),
            errors,
        ) as usize,
        pool,
        reconnect,
    }
}

/// The text of a scalar leaf, or `None` (with an error) for mappings and sequences.
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
