//! rustls configuration from PEM files (ring provider). TLS runs through `tokio-rustls` over
//! `monoio-compat`, the combination that streams large h2 bodies correctly on monoio (see the
//! test `tests/h2_stream.rs`); `monoio-rustls` under h2 was seen to panic.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// ALPN protocol id of HTTP/2.
pub const ALPN_H2: &[u8] = b"h2";

/// Why TLS material could not be loaded; names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA: {0}")]
    Verifier(String),
}

fn file_error(path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// The crypto provider every Sluice TLS config uses (ring).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads every certificate in a PEM file (a chain, or a CA bundle).
pub fn load_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|error| file_error(path, format!("cannot read certificates: {error}")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| file_error(path, format!("invalid PEM: {error}")))?;
    if certificates.is_empty() {
        return Err(file_error(path, "no certificate in file"));
    }
    Ok(certificates)
}

/// Reads the first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|error| file_error(path, format!("cannot read private key: {error}")))
}

/// The CA certificates of a PEM file, as trust roots.
pub fn root_store(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in load_certificates(path)? {
        roots
            .add(certificate)
            .map_err(|error| file_error(path, format!("unusable CA certificate: {error}")))?;
    }
    Ok(roots)
}

/// A server config offering HTTP/2 only. With `client_ca`, clients must present a certificate
/// issued by it.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let builder =
        ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        Some(ca) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(root_store(ca)?), provider())
                    .build()
                    .map_err(|error| TlsError::Verifier(error.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(load_certificates(cert)?, load_private_key(key)?)?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

/// A client config offering HTTP/2, trusting `ca` (or, without it, nothing: every server
/// certificate is refused, so callers must configure a CA for TLS).
pub fn client_config(
    ca: Option<&Path>,
    client_identity: Option<(&Path, &Path)>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let roots = match ca {
        Some(ca) => root_store(ca)?,
        None => RootCertStore::empty(),
    };
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match client_identity {
        Some((cert, key)) => {
            builder.with_client_auth_cert(load_certificates(cert)?, load_private_key(key)?)?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}
