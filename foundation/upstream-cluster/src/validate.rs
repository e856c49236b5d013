//! Validation of one `UpstreamCluster` in a single pass that reports every problem with its
//! field path. Pure: file existence is checked by the loader.

use std::collections::HashSet;
use std::net::IpAddr;

use crate::spec::{
    DispatchPolicy, DispatchPolicyRule, UpstreamCluster, UpstreamClusterSpec, UpstreamServer,
    API_VERSION, KIND,
};

/// The verbs a dispatch rule may name (besides `*`), as the gateway's request info derives
/// them: the apiserver's resource verbs, then the HTTP methods of non-resource URLs. The
/// gateway checks that its `Verb` enum names exactly these.
pub const DISPATCH_VERBS: [&str; 13] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "proxy",
    "post",
    "put",
    "head",
    "options",
];

/// Collects `(path, reason)` pairs.
#[derive(Default)]
pub(crate) struct Problems(pub Vec<(String, String)>);

impl Problems {
    fn add(&mut self, path: impl Into<String>, reason: impl Into<String>) {
        self.0.push((path.into(), reason.into()));
    }
}

/// Every problem of `cluster`, as (field path, reason).
pub fn validate(cluster: &UpstreamCluster) -> Vec<(String, String)> {
    let mut problems = Problems::default();
    if cluster.api_version != API_VERSION {
        problems.add(
            "apiVersion",
            format!("must be {API_VERSION:?}, not {:?}", cluster.api_version),
        );
    }
    if cluster.kind != KIND {
        problems.add("kind", format!("must be {KIND:?}, not {:?}", cluster.kind));
    }
    if let Err(reason) = check_hostname(&cluster.metadata.name) {
        problems.add("metadata.name", reason);
    }
    validate_spec(&cluster.spec, &mut problems);
    problems.0
}

/// A DNS name in lower case (RFC 1123 subdomain) or an IP literal: what clients send as TLS
/// server name or Host.
pub fn check_hostname(name: &str) -> Result<(), String> {
    if name.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a lower-case DNS name (RFC 1123) or an IP address"
        ))
    }
}

fn validate_spec(spec: &UpstreamClusterSpec, problems: &mut Problems) {
    let endpoints = validate_servers(&spec.servers, problems);

    let client = &spec.client_config;
    if client.cert_file.is_some() != client.key_file.is_some() {
        problems.add(
            "spec.clientConfig",
            "certFile and keyFile must be set together",
        );
    }
    if client.bearer_token.is_some() && client.bearer_token_file.is_some() {
        problems.add(
            "spec.clientConfig",
            "set bearerToken or bearerTokenFile, not both",
        );
    }
    if client.cert_file.is_none()
        && client.bearer_token.is_none()
        && client.bearer_token_file.is_none()
    {
        problems.add(
            "spec.clientConfig",
            "the gateway needs its own identity upstream (certFile/keyFile or a bearer token) to impersonate users",
        );
    }
    for (index, name) in spec.secure_serving.extra_hostnames.iter().enumerate() {
        let path = format!("spec.secureServing.extraHostnames[{index}]");
        if let Err(reason) = check_hostname(name) {
            problems.add(path, reason);
        }
    }

    let mut schema_names = HashSet::new();
    for (index, schema) in spec.flow_control.schemas.iter().enumerate() {
        let path = format!("spec.flowControl.schemas[{index}]");
        if schema.name.is_empty() {
            problems.add(format!("{path}.name"), "must not be empty");
        } else if !schema_names.insert(schema.name.as_str()) {
            problems.add(
                format!("{path}.name"),
                format!("{:?} is defined twice", schema.name),
            );
        }
        let kinds = usize::from(schema.exempt.is_some())
            + usize::from(schema.max_requests_inflight.is_some())
            + usize::from(schema.token_bucket.is_some());
        if kinds != 1 {
            problems.add(
                &path,
                "set exactly one of exempt, maxRequestsInflight, tokenBucket",
            );
        }
        if let Some(inflight) = &schema.max_requests_inflight {
            if inflight.max == 0 {
                problems.add(
                    format!("{path}.maxRequestsInflight.max"),
                    "must be at least 1",
                );
            }
        }
        if let Some(bucket) = &schema.token_bucket {
            if bucket.qps == 0 {
                problems.add(format!("{path}.tokenBucket.qps"), "must be at least 1");
            }
            if bucket.burst == 0 {
                problems.add(format!("{path}.tokenBucket.burst"), "must be at least 1");
            }
        }
    }

    let mut policy_names = HashSet::new();
    for (index, policy) in spec.dispatch_policies.iter().enumerate() {
        let path = format!("spec.dispatchPolicies[{index}]");
        if let Some(name) = &policy.name {
            if !policy_names.insert(name.as_str()) {
                problems.add(format!("{path}.name"), format!("{name:?} is used twice"));
            }
        }
        validate_policy(policy, &path, &endpoints, &schema_names, problems);
    }

    let health = &spec.health_check;
    if !health.path.starts_with('/') {
        problems.add("spec.healthCheck.path", "must start with /");
    }
    if health.interval.is_zero() {
        problems.add("spec.healthCheck.interval", "must be positive");
    }
    if health.timeout.is_zero() {
        problems.add("spec.healthCheck.timeout", "must be positive");
    }
    if health.healthy_threshold == 0 {
        problems.add("spec.healthCheck.healthyThreshold", "must be at least 1");
    }
    if health.unhealthy_threshold == 0 {
        problems.add("spec.healthCheck.unhealthyThreshold", "must be at least 1");
    }
    let pool = &spec.connection_pool;
    if pool.connections_per_server == 0 {
        problems.add(
            "spec.connectionPool.connectionsPerServer",
            "must be at least 1",
        );
    }
    if pool.max_connections_per_server < pool.connections_per_server {
        problems.add(
            "spec.connectionPool.maxConnectionsPerServer",
            "must be at least connectionsPerServer",
        );
    }
    if pool.max_concurrent_streams == 0 {
        problems.add(
            "spec.connectionPool.maxConcurrentStreams",
            "must be at least 1",
        );
    }
    if pool.long_running_streams_percent == 0 || pool.long_running_streams_percent > 100 {
        problems.add(
            "spec.connectionPool.longRunningStreamsPercent",
            "must be between 1 and 100",
        );
    }
    for (field, value) in [
        ("maxLongRunningPerUser", pool.max_long_running_per_user),
        ("maxUpgradeConnections", pool.max_upgrade_connections),
        (
            "reservedConnectionsPerServer",
            pool.reserved_connections_per_server,
        ),
    ] {
        if value == 0 {
            problems.add(format!("spec.connectionPool.{field}"), "must be at least 1");
        }
    }
    if pool.max_queued_per_user > pool.max_queued_per_server {
        problems.add(
            "spec.connectionPool.maxQueuedPerUser",
            "must be at most maxQueuedPerServer",
        );
    }
    if pool.keepalive_interval.is_zero() || pool.keepalive_timeout.is_zero() {
        problems.add(
            "spec.connectionPool",
            "keepaliveInterval and keepaliveTimeout must be positive",
        );
    }
    if spec.authentication.review_timeout.is_zero() {
        problems.add("spec.authentication.reviewTimeout", "must be positive");
    }
}

/// Each server is an endpoint or an agent, named once; returns the names `upstreamSubset` may
/// use (endpoints as written, agents as `agent:<id>`).
fn validate_servers(servers: &[UpstreamServer], problems: &mut Problems) -> HashSet<String> {
    let mut names = HashSet::new();
    if servers.is_empty() {
        problems.add("spec.servers", "at least one server is required");
    }
    for (index, server) in servers.iter().enumerate() {
        let path = format!("spec.servers[{index}]");
        let (field, name) = match (&server.endpoint, &server.agent) {
            (Some(endpoint), None) => {
                if let Err(reason) = check_endpoint(endpoint) {
                    problems.add(format!("{path}.endpoint"), reason);
                }
                ("endpoint", endpoint.clone())
            }
            (None, Some(agent)) => {
                if let Err(reason) = check_agent_id(agent.id) {
                    problems.add(format!("{path}.agent.id"), reason);
                }
                ("agent.id", agent.name())
            }
            _ => {
                problems.add(
                    path,
                    "set exactly one of endpoint (an apiserver the gateway dials) and agent (an agent whose tunnel reaches one)",
                );
                continue;
            }
        };
        if names.contains(&name) {
            problems.add(
                format!("{path}.{field}"),
                format!("{name:?} is listed twice"),
            );
        }
        names.insert(name);
    }
    names
}

/// The tunnel's agent ids are positive signed 64-bit integers.
fn check_agent_id(id: u64) -> Result<(), String> {
    if id == 0 {
        Err("must be at least 1 (agent ids are positive)".into())
    } else if i64::try_from(id).is_err() {
        Err(format!(
            "{id} is above {}, the largest agent id the tunnel knows",
            i64::MAX
        ))
    } else {
        Ok(())
    }
}

fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let uri: http::Uri = endpoint
        .parse()
        .map_err(|error| format!("{endpoint:?} is not a URL: {error}"))?;
    match uri.scheme_str() {
        Some("https" | "http") => {}
        _ => {
            return Err(format!(
                "{endpoint:?} must start with https:// (or http://)"
            ))
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{endpoint:?} has no host"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!("{endpoint:?} must not have a path or query"));
    }
    Ok(())
}

fn validate_policy(
    policy: &DispatchPolicy,
    path: &str,
    servers: &HashSet<String>,
    schemas: &HashSet<&str>,
    problems: &mut Problems,
) {
    for (index, endpoint) in policy.upstream_subset.iter().enumerate() {
        if !servers.contains(endpoint) {
            problems.add(
                format!("{path}.upstreamSubset[{index}]"),
                format!("{endpoint:?} is not one of spec.servers"),
            );
        }
    }
    let schema = &policy.flow_control_schema_name;
    if !schema.is_empty() && !schemas.contains(schema.as_str()) {
        problems.add(
            format!("{path}.flowControlSchemaName"),
            format!("{schema:?} is not defined in spec.flowControl.schemas"),
        );
    }
    for (index, rule) in policy.rules.iter().enumerate() {
        validate_rule(rule, &format!("{path}.rules[{index}]"), problems);
    }
}

fn validate_rule(rule: &DispatchPolicyRule, path: &str, problems: &mut Problems) {
    if rule.verbs.is_empty() {
        problems.add(
            format!("{path}.verbs"),
            "is empty, so the rule can never match (use [\"*\"] for all verbs)",
        );
    }
    if rule.resources.is_empty() && rule.non_resource_urls.is_empty() {
        problems.add(
            path,
            "names neither resources nor nonResourceURLs, so it can never match",
        );
    }
    if !rule.resources.is_empty() && rule.api_groups.is_empty() {
        problems.add(
            format!("{path}.apiGroups"),
            "is empty, so no resource request can match (use [\"\"] for the core group, [\"*\"] for all)",
        );
    }
    for (index, verb) in rule.verbs.iter().enumerate() {
        let name = verb.strip_prefix('-').unwrap_or(verb);
        if verb != "*" && !DISPATCH_VERBS.contains(&name) {
            problems.add(
                format!("{path}.verbs[{index}]"),
                format!(
                    "{verb:?} is not a request verb (get, list, watch, create, update, patch, delete, deletecollection, proxy; post, put, head, options for non-resource URLs)"
                ),
            );
        }
    }
    for (index, resource) in rule.resources.iter().enumerate() {
        let field = format!("{path}.resources[{index}]");
        let value = resource.strip_prefix('-').unwrap_or(resource);
        if resource == "-*" {
            problems.add(field, "\"-*\" would match nothing");
        } else if value.is_empty() {
            problems.add(field, "must not be empty");
        } else if value.ends_with("/*") {
            problems.add(
                field,
                format!("{resource:?}: \"resource/*\" is not allowed; list the subresources or use \"*/subresource\""),
            );
        } else if value != "*" && value.split('/').count() > 2
            || value.split('/').any(str::is_empty)
        {
            problems.add(
                field,
                format!("{resource:?} must be \"resource\", \"resource/subresource\" or \"*/subresource\""),
            );
        }
    }
    for (field, values) in [
        ("verbs", &rule.verbs),
        ("apiGroups", &rule.api_groups),
        ("resourceNames", &rule.resource_names),
        ("users", &rule.users),
        ("userGroups", &rule.user_groups),
    ] {
        if values.iter().any(|value| value == "-*") {
            problems.add(format!("{path}.{field}"), "\"-*\" would match nothing");
        }
    }
    for (index, account) in rule.service_accounts.iter().enumerate() {
        if account.namespace.is_empty() || account.name.is_empty() {
            problems.add(
                format!("{path}.serviceAccounts[{index}]"),
                "namespace and name must both be set",
            );
        }
    }
    for (index, url) in rule.non_resource_urls.iter().enumerate() {
        let field = format!("{path}.nonResourceURLs[{index}]");
        if url.starts_with('-') {
            problems.add(field, format!("{url:?}: nonResourceURLs cannot be negated"));
        } else if url != "*" && !url.starts_with('/') {
            problems.add(field, format!("{url:?} must start with / (or be \"*\")"));
        } else if url.trim_end_matches('*').contains('*') {
            problems.add(
                field,
                format!("{url:?}: \"*\" is only allowed as the final character"),
            );
        }
    }
}
