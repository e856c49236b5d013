//! What a control plane needs before it can serve, made on its first start like k3s does: a CA
//! and a serving certificate in `<data-dir>/pki/` (unless the operator brings their own), the
//! rustls server config, and a first admin token written as a kubeconfig for kubectl.

use std::fs;
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sluice_apimachinery::StatusError;
use sluice_store::Store;

use crate::auth::{issue, Identity, Role};
use crate::kinds::token_identity;
use crate::server::{list_prefix, store_token};

/// Why the control plane could not get ready to serve.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("{path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("generating the control plane's certificates failed: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("the TLS configuration is not usable: {0}")]
    Tls(String),
    #[error("the first admin token could not be stored: {0}")]
    Store(String),
}

/// The PEM files the server serves with.
#[derive(Debug, Clone)]
pub struct ServingFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The CA and serving certificate in `dir`, generated on the first call for `localhost`,
/// `127.0.0.1`, `::1` and `hostnames`; later calls reuse them.
pub fn ensure_pki(dir: &Path, hostnames: &[String]) -> Result<ServingFiles, BootstrapError> {
    let files = ServingFiles {
        ca: dir.join("ca.crt"),
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
    };
    if files.ca.exists() && files.cert.exists() && files.key.exists() {
        return Ok(files);
    }
    create_dir(dir)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "sluice control plane CA");
    let ca_key = KeyPair::generate()?;
    let ca_key_pem = ca_key.serialize_pem();
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key)?;
    let mut names = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    names.extend(hostnames.iter().cloned());
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "sluice-controlplane");
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca)?;
    write_private(&dir.join("ca.key"), &ca_key_pem)?;
    write_private(&files.key, &key.serialize_pem())?;
    write_file(&files.cert, &cert.pem())?;
    write_file(&files.ca, &ca.pem())?;
    Ok(files)
}

/// HTTPS with HTTP/2 and HTTP/1.1; client certificates are verified against `client_ca` when
/// given, but not required (bearer-token clients present none).
pub fn server_tls(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, BootstrapError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|error| BootstrapError::Tls(error.to_string()))?;
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for certificate in certificates(ca)? {
                roots
                    .add(certificate)
                    .map_err(|error| BootstrapError::Tls(format!("{}: {error}", ca.display())))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|error| BootstrapError::Tls(format!("{}: {error}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let key = PrivateKeyDer::from_pem_file(key).map_err(|error| BootstrapError::Pem {
        path: key.to_path_buf(),
        reason: error.to_string(),
    })?;
    let mut config = builder
        .with_single_cert(certificates(cert)?, key)
        .map_err(|error| BootstrapError::Tls(format!("{}: {error}", cert.display())))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, BootstrapError> {
    let pem = |reason: String| BootstrapError::Pem {
        path: path.to_path_buf(),
        reason,
    };
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|error| pem(error.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| pem(error.to_string()))?;
    if certificates.is_empty() {
        return Err(pem("no certificate in the file".into()));
    }
    Ok(certificates)
}

/// When the store holds no admin token yet, issues one, stores its digest and writes
/// `kubeconfig` (mode 0600) for `server_url` trusting `ca`. Returns whether it did.
pub async fn ensure_admin(
    store: &dyn Store,
    kubeconfig: &Path,
    server_url: &str,
    ca: &Path,
) -> Result<bool, BootstrapError> {
    let spec = crate::kinds::token();
    let page = store
        .list(&list_prefix(&spec, None), None, 0, None)
        .await
        .map_err(|error| BootstrapError::Store(error.to_string()))?;
    let has_admin = page.items.iter().any(|row| {
        serde_json::from_slice(&row.value)
            .ok()
            .as_ref()
            .and_then(token_identity)
            .is_some_and(|(_, identity)| identity.role == Role::Admin)
    });
    if has_admin && kubeconfig.exists() {
        return Ok(false);
    }
    let identity =
        Identity::new(Role::Admin, "admin").map_err(|e| BootstrapError::Store(e.to_string()))?;
    let issued = issue(identity).map_err(|error| BootstrapError::Store(error.to_string()))?;
    let name = format!("admin.{}", &issued.record.sha256[..8]);
    store_token(store, &name, &issued)
        .await
        .map_err(|error: StatusError| BootstrapError::Store(error.message))?;
    let ca_pem = fs::read_to_string(ca).map_err(|source| BootstrapError::File {
        path: ca.to_path_buf(),
        source,
    })?;
    write_private(
        kubeconfig,
        &kubeconfig_text(server_url, &ca_pem, "admin", &issued.secret),
    )?;
    Ok(true)
}

/// A kubeconfig (JSON, which kubectl reads as YAML) with one cluster, user and context.
pub fn kubeconfig_text(server_url: &str, ca_pem: &str, user: &str, token: &str) -> String {
    use base64::Engine;
    let ca_data = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let document = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "sluice", "cluster": {
            "server": server_url, "certificate-authority-data": ca_data}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "sluice", "context": {"cluster": "sluice", "user": user}}],
        "current-context": "sluice",
    });
    serde_json::to_string_pretty(&document).unwrap_or_default() + "\n"
}

fn create_dir(dir: &Path) -> Result<(), BootstrapError> {
    fs::create_dir_all(dir).map_err(|source| BootstrapError::File {
        path: dir.to_path_buf(),
        source,
    })?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(|source| {
        BootstrapError::File {
            path: dir.to_path_buf(),
            source,
        }
    })
}

fn write_file(path: &Path, text: &str) -> Result<(), BootstrapError> {
    fs::write(path, text).map_err(|source| BootstrapError::File {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes a secret readable by the owner only, created with that mode (never world-readable
/// for an instant).
fn write_private(path: &Path, text: &str) -> Result<(), BootstrapError> {
    let failed = |source| BootstrapError::File {
        path: path.to_path_buf(),
        source,
    };
    let temporary = path.with_extension("tmp");
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .map_err(failed)?;
    io::Write::write_all(&mut file, text.as_bytes()).map_err(failed)?;
    fs::rename(&temporary, path).map_err(failed)
}
