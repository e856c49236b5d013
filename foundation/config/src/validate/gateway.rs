//! `gateway:`: where the Kubernetes API gateway reads its UpstreamClusters and credentials.

use std::path::PathBuf;
use std::time::Duration;

use super::{controlplane, duration, readable_file, scalar, Errors};
use crate::raw::RawGateway;
use crate::{ClusterSource, GatewayConfig};

pub(super) fn gateway(raw: &RawGateway, errors: &mut Errors) -> GatewayConfig {
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
        access_log: super::access_log::access_log(
            raw.access_log.as_ref(),
            "gateway.access_log",
            errors,
        ),
        // Its content (an Ed25519 private key) is checked where the gateway loads it.
        agent_assertion_key_file: readable_file(
            &raw.agent_assertion_key_file,
            "gateway.agent_assertion_key_file",
            false,
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
