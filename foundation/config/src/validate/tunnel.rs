//! The `tunnel` section: the node's limits, the agents it lets connect, its JWTs and peers.

use std::time::Duration;

use super::{duration, readable_file, scalar, secret_from_file, text, unsigned, Errors};
use crate::raw::{RawJwt, RawPeerTls, RawTunnel};
use crate::{
    AgentLimits, AgentTokenConfig, IpNetwork, JwtConfig, PeerTimeouts, PeerTlsConfig, TunnelConfig,
};

fn node_name_default() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "sluice-node".to_string())
}

pub(super) const DEFAULT_MAX_MESSAGE_BYTES: u64 = 32 * 1024 * 1024;
pub(super) const MAX_MESSAGE_BYTES_LIMIT: u64 = 1024 * 1024 * 1024;
const DEFAULT_MAX_BUFFERED_BYTES: u64 = 256 * 1024 * 1024;

pub(super) fn tunnel(raw: &RawTunnel, errors: &mut Errors) -> TunnelConfig {
    let agents = agent_tokens(raw, errors);
    let agents_from = raw
        .agents_from
        .as_ref()
        .and_then(|source| super::controlplane::source(source, "tunnel.agents_from", errors));
    if agents_from.is_some() && !agents.is_empty() {
        errors.push(
            "tunnel.agents_from",
            "set either tunnel.agents or tunnel.agents_from, not both",
        );
    }
    TunnelConfig {
        agents_from,
        node_name: text(
            &raw.node_name,
            "tunnel.node_name",
            &node_name_default(),
            errors,
        ),
        max_wait: duration(
            &raw.max_wait,
            "tunnel.max_wait",
            Duration::from_secs(20),
            errors,
        ),
        max_message_bytes: unsigned(
            &raw.max_message_bytes,
            "tunnel.max_message_bytes",
            DEFAULT_MAX_MESSAGE_BYTES,
            (1024, MAX_MESSAGE_BYTES_LIMIT),
            errors,
        ) as usize,
        max_metadata_entries: unsigned(
            &raw.max_metadata_entries,
            "tunnel.max_metadata_entries",
            512,
            (16, crate::METADATA_ENTRIES_CEILING as u64),
            errors,
        ) as usize,
        max_metadata_bytes: unsigned(
            &raw.max_metadata_bytes,
            "tunnel.max_metadata_bytes",
            64 * 1024,
            (1024, crate::METADATA_BYTES_CEILING as u64),
            errors,
        ) as usize,
        max_buffered_bytes: unsigned(
            &raw.max_buffered_bytes,
            "tunnel.max_buffered_bytes",
            DEFAULT_MAX_BUFFERED_BYTES,
            (1024 * 1024, 1 << 40),
            errors,
        ) as usize,
        agents,
        jwt: jwt(
            &raw.jwt,
            "tunnel.jwt",
            ("gitlab", "gitlab-kas"),
            Duration::from_secs(60),
            errors,
        ),
        private_jwt: raw.private_jwt.as_ref().map(|raw| {
            jwt(
                raw,
                "tunnel.private_jwt",
                ("sluice-node", "sluice-private"),
                Duration::from_secs(10),
                errors,
            )
        }),
        // IP:PORT: other nodes parse what is advertised as one and skip anything else, so a
        // host name here would make this node unreachable for them without a word.
        advertise_address: raw.advertise_address.as_ref().map(|_| {
            super::socket_address(
                &raw.advertise_address,
                "tunnel.advertise_address",
                "",
                errors,
            )
            .to_string()
        }),
        peer_tls: raw.peer_tls.as_ref().and_then(|raw| peer_tls(raw, errors)),
        peer_allowlist: peer_allowlist(raw, errors),
        peer_timeouts: peer_timeouts(raw, errors),
        splice_private_hop: super::flag(
            raw.splice_private_hop.as_ref(),
            "tunnel.splice_private_hop",
            true,
            errors,
        ),
        agent_limits: agent_limits(raw, errors),
        access_log: super::access_log::access_log(
            raw.access_log.as_ref(),
            "tunnel.access_log",
            errors,
        ),
    }
}

/// `tunnel.peer_allowlist`: the networks a peer's advertised private address must lie in before
/// this node dials it with its private JWT.
fn peer_allowlist(raw: &RawTunnel, errors: &mut Errors) -> Vec<IpNetwork> {
    raw.peer_allowlist
        .iter()
        .enumerate()
        .filter_map(|(index, value)| {
            let path = format!("tunnel.peer_allowlist[{index}]");
            let text = scalar(value, &path, errors)?;
            let network = IpNetwork::parse(&text);
            if network.is_none() {
                errors.push(
                    &path,
                    format!("invalid network {text:?}: expected CIDR notation such as 10.0.0.0/8"),
                );
            }
            network
        })
        .collect()
}

/// `tunnel.max_connections_per_agent`, `max_tunnels_per_agent`, `max_waiting_calls_per_agent`,
/// `max_agent_services`, `max_agent_version_bytes` and `list_page_size`, each within its range.
fn agent_limits(raw: &RawTunnel, errors: &mut Errors) -> AgentLimits {
    let defaults = AgentLimits::default();
    let mut field = |leaf, name: &str, default: usize, range: (u64, u64)| {
        let path = format!("tunnel.{name}");
        unsigned(leaf, &path, default as u64, range, errors) as usize
    };
    AgentLimits {
        connections: field(
            &raw.max_connections_per_agent,
            "max_connections_per_agent",
            defaults.connections,
            (1, 100_000),
        ),
        tunnels: field(
            &raw.max_tunnels_per_agent,
            "max_tunnels_per_agent",
            defaults.tunnels,
            (1, 1_000_000),
        ),
        waiting_calls: field(
            &raw.max_waiting_calls_per_agent,
            "max_waiting_calls_per_agent",
            defaults.waiting_calls,
            (1, 1_000_000),
        ),
        services: field(
            &raw.max_agent_services,
            "max_agent_services",
            defaults.services,
            (0, 10_000),
        ),
        version_bytes: field(
            &raw.max_agent_version_bytes,
            "max_agent_version_bytes",
            defaults.version_bytes,
            (16, 4096),
        ),
        list_page_size: field(
            &raw.list_page_size,
            "list_page_size",
            defaults.list_page_size,
            (1, 10_000),
        ),
    }
}

/// `tunnel.peer_connect_timeout` and `tunnel.peer_unacked_timeout`, each within its range.
fn peer_timeouts(raw: &RawTunnel, errors: &mut Errors) -> PeerTimeouts {
    let defaults = PeerTimeouts::default();
    let bounded =
        |leaf, path: &str, default, (low, high): (Duration, Duration), errors: &mut Errors| {
            let value = duration(leaf, path, default, errors);
            if value < low || value > high {
                errors.push(path, format!("{value:?} is outside {low:?}..={high:?}"));
                return default;
            }
            value
        };
    PeerTimeouts {
        connect: bounded(
            &raw.peer_connect_timeout,
            "tunnel.peer_connect_timeout",
            defaults.connect,
            (Duration::from_millis(100), Duration::from_secs(60)),
            errors,
        ),
        unacked: bounded(
            &raw.peer_unacked_timeout,
            "tunnel.peer_unacked_timeout",
            defaults.unacked,
            (Duration::from_secs(1), Duration::from_secs(600)),
            errors,
        ),
    }
}

fn peer_tls(raw: &RawPeerTls, errors: &mut Errors) -> Option<PeerTlsConfig> {
    let ca_file = readable_file(&raw.ca_file, "tunnel.peer_tls.ca_file", true, errors);
    let cert = readable_file(&raw.cert_file, "tunnel.peer_tls.cert_file", false, errors);
    let key = readable_file(&raw.key_file, "tunnel.peer_tls.key_file", false, errors);
    let identity = match (cert, key, raw.cert_file.is_some(), raw.key_file.is_some()) {
        (Some(cert), Some(key), _, _) => Some((cert, key)),
        (_, _, true, false) => {
            errors.push("tunnel.peer_tls.key_file", "is required with cert_file");
            None
        }
        (_, _, false, true) => {
            errors.push("tunnel.peer_tls.cert_file", "is required with key_file");
            None
        }
        _ => None,
    };
    let server_name = raw
        .server_name
        .as_ref()
        .and_then(|value| scalar(value, "tunnel.peer_tls.server_name", errors));
    if let Some(name) = &server_name {
        if rustls_pki_types::ServerName::try_from(name.as_str()).is_err() {
            errors.push(
                "tunnel.peer_tls.server_name",
                format!("{name:?} is not a valid DNS name or IP address"),
            );
        }
    }
    Some(PeerTlsConfig {
        ca_file: ca_file?,
        identity,
        server_name,
    })
}

fn jwt(
    raw: &RawJwt,
    path: &str,
    (issuer, audience): (&str, &str),
    max_lifetime: Duration,
    errors: &mut Errors,
) -> JwtConfig {
    let (secret_file, secret) =
        secret_from_file(&raw.secret_file, &format!("{path}.secret_file"), errors)
            .unwrap_or_default();
    if !secret.is_empty() && secret.len() < 32 {
        errors.push(
            format!("{path}.secret_file"),
            format!(
                "the secret in {} has {} bytes; HS256 needs at least 32",
                secret_file.display(),
                secret.len()
            ),
        );
    }
    JwtConfig {
        secret,
        secret_file,
        issuer: text(&raw.issuer, &format!("{path}.issuer"), issuer, errors),
        audience: text(&raw.audience, &format!("{path}.audience"), audience, errors),
        leeway: duration(
            &raw.leeway,
            &format!("{path}.leeway"),
            Duration::from_secs(5),
            errors,
        ),
        max_lifetime: duration(
            &raw.max_lifetime,
            &format!("{path}.max_lifetime"),
            max_lifetime,
            errors,
        ),
    }
}

/// `tunnel.agents`: ids and token digests, each unique.
fn agent_tokens(raw: &RawTunnel, errors: &mut Errors) -> Vec<AgentTokenConfig> {
    let mut agents = Vec::with_capacity(raw.agents.len());
    let mut seen_ids = std::collections::HashSet::new();
    let mut seen_tokens = std::collections::HashSet::new();
    for (index, entry) in raw.agents.iter().enumerate() {
        let path = format!("tunnel.agents[{index}]");
        let id = match &entry.id {
            None => {
                errors.push(format!("{path}.id"), "is required");
                None
            }
            Some(_) => Some(unsigned(
                &entry.id,
                &format!("{path}.id"),
                0,
                (1, i64::MAX as u64),
                errors,
            ) as i64),
        };
        let digest = match &entry.token_sha256 {
            None => {
                errors.push(format!("{path}.token_sha256"), "is required");
                None
            }
            Some(value) => {
                scalar(value, &format!("{path}.token_sha256"), errors).and_then(|text| {
                    let mut digest = [0u8; 32];
                    match hex::decode_to_slice(text.trim(), &mut digest) {
                        Ok(()) => Some(digest),
                        Err(_) => {
                            errors.push(
                                format!("{path}.token_sha256"),
                                "expected 64 hex digits (sha256sum of the agent's token)",
                            );
                            None
                        }
                    }
                })
            }
        };
        if let (Some(id), Some(digest)) = (id, digest) {
            if id > 0 && !seen_ids.insert(id) {
                errors.push(
                    format!("{path}.id"),
                    format!("agent id {id} is listed twice"),
                );
            }
            if !seen_tokens.insert(digest) {
                errors.push(
                    format!("{path}.token_sha256"),
                    "the same token is listed for two agents",
                );
            }
            agents.push(AgentTokenConfig {
                id,
                token_sha256: digest,
            });
        }
    }
    agents
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use crate::{load_str, AgentLimits};

    fn tunnel_yaml(dir: &tempfile::TempDir, extra: &str) -> String {
        let secret = dir.path().join("jwt.secret");
        std::fs::write(&secret, "0123456789abcdef0123456789abcdef\n").unwrap();
        format!(
            "tunnel:\n  jwt: {{secret_file: '{}'}}\n{extra}",
            secret.display()
        )
    }

    #[test]
    fn agent_limits_default_and_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let config = load_str(&tunnel_yaml(&dir, ""), "node.yaml").unwrap();
        assert_eq!(config.tunnel.unwrap().agent_limits, AgentLimits::default());
        let yaml = tunnel_yaml(
            &dir,
            "  max_connections_per_agent: 3\n  max_tunnels_per_agent: 40\n  max_waiting_calls_per_agent: 9\n  max_agent_services: 0\n  max_agent_version_bytes: 16\n  list_page_size: 7\n",
        );
        let limits = load_str(&yaml, "node.yaml")
            .unwrap()
            .tunnel
            .unwrap()
            .agent_limits;
        assert_eq!(
            limits,
            AgentLimits {
                connections: 3,
                tunnels: 40,
                waiting_calls: 9,
                services: 0,
                version_bytes: 16,
                list_page_size: 7,
            }
        );
    }

    #[test]
    fn agent_limits_out_of_range_name_file_field_and_range() {
        let dir = tempfile::tempdir().unwrap();
        let yaml = tunnel_yaml(
            &dir,
            "  max_connections_per_agent: 0\n  max_tunnels_per_agent: many\n  max_waiting_calls_per_agent: 0\n  list_page_size: 20000\n",
        );
        let error = load_str(&yaml, "node.yaml").unwrap_err().to_string();
        for expected in [
            "node.yaml: tunnel.max_connections_per_agent: 0 is out of range 1..=100000",
            "node.yaml: tunnel.max_tunnels_per_agent",
            "node.yaml: tunnel.max_waiting_calls_per_agent: 0 is out of range 1..=1000000",
            "node.yaml: tunnel.list_page_size: 20000 is out of range 1..=10000",
        ] {
            assert!(error.contains(expected), "{expected} in {error}");
        }
    }

    #[test]
    fn the_advertised_address_is_ip_and_port() {
        let dir = tempfile::tempdir().unwrap();
        let advertised = |value: &str| {
            let yaml = tunnel_yaml(&dir, &format!("  advertise_address: '{value}'\n"));
            load_str(&yaml, "node.yaml").map(|config| config.tunnel.unwrap().advertise_address)
        };
        assert_eq!(
            advertised("10.0.0.7:8155").unwrap().as_deref(),
            Some("10.0.0.7:8155")
        );
        assert_eq!(
            advertised("[fd00::7]:8155").unwrap().as_deref(),
            Some("[fd00::7]:8155")
        );
        for wrong in ["node-1.sluice:8155", "fd00::7:8155", "10.0.0.7"] {
            let error = advertised(wrong).unwrap_err().to_string();
            assert!(
                error.contains(&format!(
                    "node.yaml: tunnel.advertise_address: invalid socket address {wrong:?}"
                )),
                "{error}"
            );
        }
    }
}
