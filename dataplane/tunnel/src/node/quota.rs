//! What one agent may hold on a node (`tunnel.max_*_per_agent`) and how large what it announces
//! may be (`tunnel.max_agent_*`). An agent with a valid token chooses its connection ids, its
//! version text, its service list and how many tunnels it opens; each is checked here before the
//! tunnel is accepted, so nothing over the limits reaches the node's bookkeeping or Redis.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use http::HeaderMap;
use sluice_config::AgentLimits;
use sluice_proto::tunnel::v1::Descriptor;

use crate::error::{ErrorKind, TunnelError};
use crate::protocol::{AGENT_VERSION_HEADER, CONNECTION_ID_HEADER};
use crate::registry::AgentId;

/// Longest service name a Descriptor may list: fully qualified gRPC service names are far
/// shorter, and the limit keeps a Descriptor's size a function of `tunnel.max_agent_services`.
pub(crate) const MAX_SERVICE_NAME_BYTES: usize = 256;

/// Digits of the largest `i64`: a connection id is a non-negative decimal integer.
const MAX_CONNECTION_ID_DIGITS: usize = 19;

/// Tunnels each agent holds on this node (idle, parked or carrying a call), across cores.
#[derive(Debug, Default)]
pub(crate) struct TunnelCounts {
    by_agent: Mutex<HashMap<AgentId, usize>>,
}

impl TunnelCounts {
    fn lock(&self) -> MutexGuard<'_, HashMap<AgentId, usize>> {
        self.by_agent
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A place for one more tunnel of `agent`, or `OverShare` when it already holds `limit`.
    pub(crate) fn acquire(
        self: &Arc<Self>,
        agent: AgentId,
        limit: usize,
    ) -> Result<TunnelSlot, TunnelError> {
        let mut counts = self.lock();
        let held = counts.entry(agent).or_insert(0);
        if *held >= limit {
            return Err(TunnelError::new(
                ErrorKind::OverShare,
                format!(
                    "the agent holds {held} tunnels on this node, the limit (tunnel.max_tunnels_per_agent is {limit})"
                ),
            ));
        }
        *held += 1;
        Ok(TunnelSlot {
            counts: self.clone(),
            agent,
        })
    }

    /// Tunnels `agent` holds now.
    pub(crate) fn held(&self, agent: AgentId) -> usize {
        self.lock().get(&agent).copied().unwrap_or(0)
    }
}

/// One tunnel's place in its agent's count, given back when the tunnel is dropped, wherever it
/// is then (its idle task, the registry, a call). Holds the counts only, not the node.
#[derive(Debug)]
pub(crate) struct TunnelSlot {
    counts: Arc<TunnelCounts>,
    agent: AgentId,
}

impl Drop for TunnelSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.lock();
        if let Some(held) = counts.get_mut(&self.agent) {
            *held = held.saturating_sub(1);
            // An agent that left costs no entry.
            if *held == 0 {
                counts.remove(&self.agent);
            }
        }
    }
}

/// The largest Descriptor `limits` allow, encoded: each service name with its tag and length,
/// the version, and room for the flags. A larger first message is refused before it is buffered.
pub(super) fn descriptor_bytes(limits: &AgentLimits) -> usize {
    limits
        .services
        .saturating_mul(MAX_SERVICE_NAME_BYTES + 3)
        .saturating_add(limits.version_bytes + 64)
}

fn malformed(message: String) -> TunnelError {
    TunnelError::new(ErrorKind::BadRequest, message)
}

/// The connection id and version an agent announces in its Connect metadata. A missing id is 0
/// and a missing version empty (older agents); present, each must be well-formed and short.
pub fn announcement<'a>(
    headers: &'a HeaderMap,
    limits: &AgentLimits,
) -> Result<(i64, &'a str), TunnelError> {
    let connection_id = match headers.get(CONNECTION_ID_HEADER) {
        None => 0,
        Some(value) => {
            let digits = value.as_bytes();
            let well_formed = !digits.is_empty()
                && digits.len() <= MAX_CONNECTION_ID_DIGITS
                && digits.iter().all(u8::is_ascii_digit);
            let parsed = std::str::from_utf8(digits)
                .ok()
                .filter(|_| well_formed)
                .and_then(|text| text.parse::<i64>().ok());
            parsed.ok_or_else(|| {
                malformed(format!(
                    "{CONNECTION_ID_HEADER} must be a non-negative decimal integer of at most {MAX_CONNECTION_ID_DIGITS} digits that fits in 63 bits"
                ))
            })?
        }
    };
    let version = match headers.get(AGENT_VERSION_HEADER) {
        None => "",
        Some(value) => value
            .to_str()
            .map_err(|_| malformed(format!("{AGENT_VERSION_HEADER} must be visible ASCII")))?,
    };
    check_version(version, AGENT_VERSION_HEADER, limits)?;
    Ok((connection_id, version))
}

fn check_version(version: &str, field: &str, limits: &AgentLimits) -> Result<(), TunnelError> {
    if version.len() > limits.version_bytes {
        return Err(malformed(format!(
            "{field} has {} bytes, over the limit of {} (tunnel.max_agent_version_bytes)",
            version.len(),
            limits.version_bytes
        )));
    }
    Ok(())
}

/// The Descriptor's service list and version within `limits`; a service name is a fully
/// qualified gRPC name (letters, digits, `_` and `.`).
pub fn check_descriptor(descriptor: &Descriptor, limits: &AgentLimits) -> Result<(), TunnelError> {
    if descriptor.services.len() > limits.services {
        return Err(malformed(format!(
            "the Descriptor lists {} services, over the limit of {} (tunnel.max_agent_services)",
            descriptor.services.len(),
            limits.services
        )));
    }
    for (index, service) in descriptor.services.iter().enumerate() {
        let well_formed = !service.is_empty()
            && service.len() <= MAX_SERVICE_NAME_BYTES
            && service
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'.');
        if !well_formed {
            return Err(malformed(format!(
                "Descriptor.services[{index}] is not a gRPC service name (1..={MAX_SERVICE_NAME_BYTES} bytes of letters, digits, '_' and '.')"
            )));
        }
    }
    check_version(
        &descriptor.agent_version,
        "Descriptor.agent_version",
        limits,
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use sluice_grpc::Code;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, value.parse().unwrap());
        }
        headers
    }

    #[test]
    fn tunnels_are_counted_per_agent_and_given_back_on_drop() {
        let counts = Arc::new(TunnelCounts::default());
        let first = counts.acquire(7, 2).unwrap();
        let second = counts.acquire(7, 2).unwrap();
        let refused = counts.acquire(7, 2).unwrap_err();
        assert_eq!(refused.code(), Code::ResourceExhausted);
        assert!(refused.message().contains("max_tunnels_per_agent"));
        // Another agent has its own share.
        let other = counts.acquire(8, 2).unwrap();
        drop(first);
        assert_eq!(counts.held(7), 1);
        let third = counts.acquire(7, 2).unwrap();
        drop((second, third, other));
        assert_eq!(counts.held(7), 0);
        assert!(counts.lock().is_empty(), "agents that left cost no entry");
    }

    #[test]
    fn announcements_are_checked() {
        let limits = AgentLimits::default();
        assert_eq!(announcement(&headers(&[]), &limits).unwrap(), (0, ""));
        let good = headers(&[(CONNECTION_ID_HEADER, "42"), (AGENT_VERSION_HEADER, "v1.2")]);
        assert_eq!(announcement(&good, &limits).unwrap(), (42, "v1.2"));
        let max = i64::MAX.to_string();
        let max_headers = headers(&[(CONNECTION_ID_HEADER, &max)]);
        assert_eq!(announcement(&max_headers, &limits).unwrap().0, i64::MAX);
        let long_version = "v".repeat(limits.version_bytes + 1);
        for bad in [
            headers(&[(CONNECTION_ID_HEADER, "")]),
            headers(&[(CONNECTION_ID_HEADER, "-1")]),
            headers(&[(CONNECTION_ID_HEADER, "+1")]),
            headers(&[(CONNECTION_ID_HEADER, "1e3")]),
            headers(&[(CONNECTION_ID_HEADER, "9223372036854775808")]),
            headers(&[(CONNECTION_ID_HEADER, &"1".repeat(40))]),
            headers(&[(AGENT_VERSION_HEADER, &long_version)]),
        ] {
            let error = announcement(&bad, &limits).unwrap_err();
            assert_eq!(error.code(), Code::InvalidArgument, "{bad:?}");
        }
    }

    #[test]
    fn the_largest_allowed_descriptor_fits_its_read_limit() {
        use prost::Message as _;
        let limits = AgentLimits::default();
        let descriptor = Descriptor {
            services: vec!["s".repeat(MAX_SERVICE_NAME_BYTES); limits.services],
            agent_version: "v".repeat(limits.version_bytes),
            reusable: true,
        };
        check_descriptor(&descriptor, &limits).unwrap();
        let request = sluice_proto::tunnel::v1::ConnectRequest {
            msg: Some(sluice_proto::tunnel::v1::connect_request::Msg::Descriptor(
                descriptor,
            )),
        };
        assert!(request.encoded_len() <= descriptor_bytes(&limits));
        assert!(descriptor_bytes(&limits) < 32 * 1024);
    }

    #[test]
    fn descriptors_are_checked() {
        let limits = AgentLimits {
            services: 2,
            ..AgentLimits::default()
        };
        let mut descriptor = Descriptor {
            services: vec!["echo.v1.Echo".into(), "grpc.health.v1.Health".into()],
            agent_version: "v1".into(),
            reusable: true,
        };
        check_descriptor(&descriptor, &limits).unwrap();
        descriptor.services.push("third.Service".into());
        let error = check_descriptor(&descriptor, &limits).unwrap_err();
        assert!(error.message().contains("max_agent_services"), "{error}");
        for bad in [
            String::new(),
            "a".repeat(MAX_SERVICE_NAME_BYTES + 1),
            "evil/../x".into(),
        ] {
            descriptor.services = vec![bad];
            let error = check_descriptor(&descriptor, &limits).unwrap_err();
            assert_eq!(error.code(), Code::InvalidArgument);
        }
        descriptor.services.clear();
        descriptor.agent_version = "x".repeat(limits.version_bytes + 1);
        assert!(check_descriptor(&descriptor, &limits).is_err());
    }
}
