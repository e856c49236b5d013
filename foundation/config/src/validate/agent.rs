//! `agent:`: the agent role, which dials the nodes' tunnels and forwards their calls to a local
//! gRPC backend.

use std::time::Duration;

use serde_norway::Value;

use super::tunnel::{DEFAULT_MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES_LIMIT};
use super::{duration, readable_file, scalar, secret_from_file, unsigned, Errors};
use crate::raw::{RawAgent, RawPool, RawReconnect};
use crate::{AgentConfig, Endpoint, PoolConfig, ReconnectConfig};

#[path = "agent_kube.rs"]
pub(crate) mod kube;

/// `agent:`: the agent role's token, the nodes it dials and the backend it forwards calls to.
pub(super) fn agent(raw: &RawAgent, errors: &mut Errors) -> AgentConfig {
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
    let pool = pool(&raw.pool, errors);
    let reconnect = reconnect(&raw.reconnect, errors);
    let kubernetes_api = raw.kubernetes_api.as_ref().and_then(|section| {
        kube::kubernetes_api(section, kube::InCluster::from_env().as_ref(), errors)
    });
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
        kubernetes_api,
    }
}

/// `agent.pool`: the idle tunnels the agent keeps open to each node.
fn pool(raw: &RawPool, errors: &mut Errors) -> PoolConfig {
    let pool = PoolConfig {
        min_idle: unsigned(&raw.min_idle, "agent.pool.min_idle", 2, (1, 10_000), errors) as usize,
        max: unsigned(&raw.max, "agent.pool.max", 500, (1, 100_000), errors) as usize,
        grow_by: unsigned(&raw.grow_by, "agent.pool.grow_by", 10, (1, 10_000), errors) as usize,
        idle_timeout: duration(
            &raw.idle_timeout,
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
    pool
}

/// `agent.reconnect`: the backoff between attempts to reach a node.
fn reconnect(raw: &RawReconnect, errors: &mut Errors) -> ReconnectConfig {
    let reconnect = ReconnectConfig {
        initial_backoff: duration(
            &raw.initial_backoff,
            "agent.reconnect.initial_backoff",
            Duration::from_secs(1),
            errors,
        ),
        max_backoff: duration(
            &raw.max_backoff,
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
    reconnect
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
