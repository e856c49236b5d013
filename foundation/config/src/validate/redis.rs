//! `redis:`: the registry of multi-node routing, and what a node needs besides it.

use std::time::Duration;

use serde_norway::Value;

use super::{duration, readable_file, scalar, text, Errors};
use crate::raw::RawRedis;
use crate::{RedisConfig, RedisTargetConfig, TunnelConfig};

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

pub(super) fn redis(raw: &RawRedis, errors: &mut Errors) -> RedisConfig {
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

/// What multi-node routing needs from the tunnel section: a tunnel to route for, and a private
/// JWT of its own so that a node-to-node token is never accepted from an agent, or vice versa.
pub(super) fn check_multi_node(
    redis_present: bool,
    tunnel: Option<&TunnelConfig>,
    errors: &mut Errors,
) {
    if !redis_present {
        return;
    }
    let Some(tunnel) = tunnel else {
        errors.push("redis", "is only used by a node with a tunnel section");
        return;
    };
    match &tunnel.private_jwt {
        None => errors.push(
            "tunnel.private_jwt.secret_file",
            "is required with redis: nodes sign calls to each other's private endpoints",
        ),
        Some(private)
            if private.issuer == tunnel.jwt.issuer && private.audience == tunnel.jwt.audience =>
        {
            errors.push(
                "tunnel.private_jwt",
                "needs its own issuer or audience, distinct from tunnel.jwt",
            )
        }
        Some(_) => {}
    }
}
