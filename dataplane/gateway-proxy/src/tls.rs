//! TLS for the gateway: per-cluster server configs chosen by SNI before the handshake goes on
//! (so each cluster serves its own certificate and trusts its own client CA), and the client
//! configs the gateway uses towards apiservers. The handshake itself, which picks the cluster
//! from the current generation, is the listener's (`connection.rs`).

use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use sluice_gateway::cluster::spec::{ClientConfig, SecureServing};
use sluice_grpc::tls::{load_certificates, load_private_key, provider, root_store};

use crate::error::ClusterFileError;

const ALPN_HTTP1: &[u8] = b"http/1.1";

/// The server side for one cluster: its certificate; client certificates are verified against
/// its client CA when one is set, but not required (bearer-token clients present none).
pub fn server_config(
    serving: &SecureServing,
) -> Result<Arc<rustls::ServerConfig>, ClusterFileError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(ClusterFileError::Protocols)?;
    let builder = match &serving.client_ca_file {
        Some(ca) => {
            let roots = root_store(ca)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .allow_unauthenticated()
                .build()
                .map_err(ClusterFileError::ClientCa)?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let certs = load_certificates(&serving.cert_file)?;
    let key = load_private_key(&serving.key_file)?;
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(ClusterFileError::ServingCertificate)?;
    config.alpn_protocols = vec![sluice_grpc::tls::ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()];
    Ok(Arc::new(config))
}

/// The gateway's own identity towards a cluster's apiservers (HTTP/2 only).
pub fn client_config(client: &ClientConfig) -> Result<Arc<rustls::ClientConfig>, ClusterFileError> {
    if client.insecure {
        return Err(ClusterFileError::Insecure);
    }
    let roots = match &client.ca_file {
        Some(ca) => root_store(ca)?,
        None => rustls::RootCertStore::empty(),
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(ClusterFileError::Protocols)?
        .with_root_certificates(roots);
    let mut config = match (&client.cert_file, &client.key_file) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(load_certificates(cert)?, load_private_key(key)?)
            .map_err(ClusterFileError::ClientCertificate)?,
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![sluice_grpc::tls::ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}
