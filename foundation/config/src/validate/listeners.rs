//! `listeners:`: which listeners a config has. Each data-plane listener belongs to a section
//! (redis, tunnel, gateway) and is refused without it, so a stray listener cannot open a port
//! nothing serves.

use super::Errors;
use crate::listener::{listener, ListenerConfig};
use crate::raw::{RawConfig, RawListener};
use crate::TunnelConfig;

/// A listener that exists exactly when its section does: configured, defaulted, or refused
/// with `unused` when the section is missing.
fn section_listener(
    raw: &Option<RawListener>,
    path: &str,
    default: &str,
    section_present: bool,
    unused: &str,
    errors: &mut Errors,
) -> Option<ListenerConfig> {
    match (raw, section_present) {
        (Some(raw), true) => Some(listener(raw, path, default, errors)),
        (None, true) => Some(listener(&RawListener::default(), path, default, errors)),
        (Some(_), false) => {
            errors.push(path, unused);
            None
        }
        (None, false) => None,
    }
}

/// `listeners.private`: the node-to-node endpoint of multi-node routing.
pub(super) fn private(
    raw: &RawConfig,
    redis_present: bool,
    tunnel: Option<&TunnelConfig>,
    errors: &mut Errors,
) -> Option<ListenerConfig> {
    let private = section_listener(
        &raw.listeners.private,
        "listeners.private",
        "127.0.0.1:8155",
        redis_present,
        "is only used with a redis section (multi-node routing)",
        errors,
    );
    if let (Some(private), Some(tunnel)) = (&private, tunnel) {
        if private.tls.is_some() && tunnel.peer_tls.is_none() {
            errors.push(
                "tunnel.peer_tls.ca_file",
                "is required when listeners.private.tls is set: nodes call each other's private endpoints over TLS",
            );
        }
    }
    private
}

/// `listeners.agent` and `listeners.external`: the tunnel's two public sides.
pub(super) fn tunnel_sides(
    raw: &RawConfig,
    tunnel_present: bool,
    errors: &mut Errors,
) -> (Option<ListenerConfig>, Option<ListenerConfig>) {
    const UNUSED: &str = "is only used with a tunnel section; add `tunnel:` or remove it";
    let agent = section_listener(
        &raw.listeners.agent,
        "listeners.agent",
        "127.0.0.1:8150",
        tunnel_present,
        UNUSED,
        errors,
    );
    let external = section_listener(
        &raw.listeners.external,
        "listeners.external",
        "127.0.0.1:8151",
        tunnel_present,
        UNUSED,
        errors,
    );
    (agent, external)
}

/// `listeners.gateway`: the Kubernetes API gateway's port. Its certificates come from the
/// UpstreamClusters (chosen by SNI), so a listener-level TLS block is refused.
pub(super) fn gateway(
    raw: &RawConfig,
    gateway_present: bool,
    errors: &mut Errors,
) -> Option<ListenerConfig> {
    let gateway = section_listener(
        &raw.listeners.gateway,
        "listeners.gateway",
        "127.0.0.1:8443",
        gateway_present,
        "is only used with a gateway section; add `gateway:` or remove it",
        errors,
    );
    if gateway
        .as_ref()
        .is_some_and(|listener| listener.tls.is_some())
    {
        errors.push(
            "listeners.gateway.tls",
            "is not used: each UpstreamCluster serves its own certificate (spec.secureServing), chosen by SNI",
        );
    }
    gateway
}
