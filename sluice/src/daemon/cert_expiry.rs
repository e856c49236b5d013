//! The expiry of every certificate this process serves or presents, by the config name that
//! points at it (`sluice_tls_certificate_expiry_timestamp_seconds{listener}`). Listener and
//! control-plane client certificates are read at start-up and a renewed file takes a restart
//! to be served (docs/CONFIG.md), so their gauges are set once here and show the certificates
//! in force; the gateway's per-cluster ones follow each generation of clusters it installs
//! (`Gateway::export_certificate_expiry`, given the handle returned here).

use std::path::Path;

use prometheus_client::registry::Registry;
use sluice_config::{ClusterSource, Config};

/// `(label, file)` of each certificate `config` makes this process serve or present.
fn certificates(config: &Config) -> Vec<(&'static str, &Path)> {
    let mut found = Vec::new();
    for (name, listener) in config.listeners.data_listeners() {
        if let Some(tls) = listener.and_then(|listener| listener.tls.as_ref()) {
            found.push((name, tls.cert_file.as_path()));
        }
    }
    if let Some(tunnel) = &config.tunnel {
        if let Some((cert, _)) = tunnel.peer_tls.as_ref().and_then(|p| p.identity.as_ref()) {
            found.push(("peer_client", cert.as_path()));
        }
        if let Some(cert) = tunnel
            .agents_from
            .as_ref()
            .and_then(|s| s.cert_file.as_ref())
        {
            found.push(("controlplane_client", cert.as_path()));
        }
    }
    if let Some(gateway) = &config.gateway {
        if let ClusterSource::ControlPlane(source) = &gateway.source {
            if let Some(cert) = &source.cert_file {
                found.push(("controlplane_client", cert.as_path()));
            }
        }
    }
    found
}

/// Registers the gauges and sets them from the files `config` names.
pub(super) fn wire(config: &Config, registry: &mut Registry) -> sluice_admin::CertificateExpiry {
    let expiry = sluice_admin::CertificateExpiry::register(registry);
    expiry.set_all(certificates(config));
    expiry
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_are_found_by_their_config_names() {
        let mut config = sluice_config::load_str(
            "listeners: {admin: {address: '127.0.0.1:0'}}\n",
            "test.yaml",
        )
        .unwrap();
        assert_eq!(certificates(&config), vec![]);
        let mut listener = config.listeners.admin.clone();
        listener.tls = Some(sluice_config::ServerTlsConfig {
            cert_file: "/c/private.pem".into(),
            key_file: "/c/private.key".into(),
            client_ca_file: None,
        });
        config.listeners.private = Some(listener.clone());
        listener.tls.as_mut().unwrap().cert_file = "/c/external.pem".into();
        config.listeners.external = Some(listener);
        assert_eq!(
            certificates(&config),
            vec![
                ("external", Path::new("/c/external.pem")),
                ("private", Path::new("/c/private.pem")),
            ]
        );
    }
}
