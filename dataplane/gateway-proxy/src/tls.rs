//! TLS for the gateway: per-cluster server configs chosen by SNI before the handshake goes on
//! (so each cluster serves its own certificate and trusts its own client CA), and the client
//! configs the gateway uses towards apiservers.

use std::sync::Arc;

use monoio_compat::TcpStreamCompat;
use rustls::server::WebPkiClientVerifier;
use sluice_gateway::cluster::spec::{ClientConfig, SecureServing};
use sluice_grpc::tls::{load_certificates, load_private_key, provider, root_store};
use tokio_rustls::server::TlsStream;

use crate::state::{Gateway, Generation};

const ALPN_HTTP1: &[u8] = b"http/1.1";

/// The server side for one cluster: its certificate; client certificates are verified against
/// its client CA when one is set, but not required (bearer-token clients present none).
pub fn server_config(serving: &SecureServing) -> Result<Arc<rustls::ServerConfig>, String> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?;
    let builder = match &serving.client_ca_file {
        Some(ca) => {
            let roots = root_store(ca).map_err(|error| error.to_string())?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .allow_unauthenticated()
                .build()
                .map_err(|error| format!("spec.secureServing.clientCAFile: {error}"))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let certs = load_certificates(&serving.cert_file).map_err(|error| error.to_string())?;
    let key = load_private_key(&serving.key_file).map_err(|error| error.to_string())?;
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|error| format!("spec.secureServing: {error}"))?;
    config.alpn_protocols = vec![sluice_grpc::tls::ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()];
    Ok(Arc::new(config))
}

/// The gateway's own identity towards a cluster's apiservers (HTTP/2 only).
pub fn client_config(client: &ClientConfig) -> Result<Arc<rustls::ClientConfig>, String> {
    if client.insecure {
        return Err(
            "spec.clientConfig.insecure is not supported: give caFile so the gateway can verify the apiservers"
                .to_string(),
        );
    }
    let roots = match &client.ca_file {
        Some(ca) => root_store(ca).map_err(|error| error.to_string())?,
        None => rustls::RootCertStore::empty(),
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?
        .with_root_certificates(roots);
    let mut config = match (&client.cert_file, &client.key_file) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(
                load_certificates(cert).map_err(|error| error.to_string())?,
                load_private_key(key).map_err(|error| error.to_string())?,
            )
            .map_err(|error| format!("spec.clientConfig: {error}"))?,
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![sluice_grpc::tls::ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

/// An accepted client connection: which cluster it is for and the TLS stream.
pub struct Accepted {
    pub generation: Arc<Generation>,
    pub cluster: usize,
    pub stream: TlsStream<TcpStreamCompat>,
}

/// Why a TLS connection was refused before any HTTP.
#[derive(Debug)]
pub enum AcceptError {
    /// No cluster serves the name (or, without SNI, the address) the client asked for.
    UnknownHost(String),
    Handshake(std::io::Error),
}

/// Reads the ClientHello, picks the cluster by server name (without SNI, e.g. a client that
/// dialled an IP address, by the listener's local address, which may be configured as a
/// hostname) and completes the handshake with that cluster's config.
pub async fn accept(
    gateway: &Gateway,
    io: TcpStreamCompat,
    local_ip: std::net::IpAddr,
) -> Result<Accepted, AcceptError> {
    let start = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io)
        .await
        .map_err(AcceptError::Handshake)?;
    let generation = gateway.current();
    let local = local_ip.to_string();
    let requested = start
        .client_hello()
        .server_name()
        .map(str::to_string)
        .unwrap_or(local);
    let Some((cluster, _)) = generation.snapshot.cluster_for_host(&requested) else {
        return Err(AcceptError::UnknownHost(requested));
    };
    let config = generation.clusters[cluster].server_tls.clone();
    let stream = start
        .into_stream(config)
        .await
        .map_err(AcceptError::Handshake)?;
    Ok(Accepted {
        generation,
        cluster,
        stream,
    })
}
