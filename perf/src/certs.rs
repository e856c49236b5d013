//! Throw-away TLS material for the gateway scenario: one CA, a server certificate that every
//! TLS hop presents (simulator, HAProxy, nginx, the Sluice gateway), and the gateway's own client
//! certificate towards the simulator. ECDSA P-256 keys (rcgen's default), PEM files.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

#[derive(Debug, Clone)]
pub struct Pem {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Certificate then key in one file (HAProxy's `crt`).
    pub combined: PathBuf,
}

#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub server: Pem,
    pub gateway_client: Pem,
}

fn write(path: PathBuf, text: &str) -> anyhow::Result<PathBuf> {
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// Writes the files into `dir`; the server certificate names `server_names` (DNS names or IP
/// addresses).
pub fn generate(dir: &Path, server_names: &[&str]) -> anyhow::Result<TlsFiles> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "sluice-perf CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let ca_path = write(dir.join("ca.pem"), &ca.pem())?;
    let issue = |name: &str, sans: Vec<String>, usage| -> anyhow::Result<Pem> {
        let mut params = CertificateParams::new(sans)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &ca)?;
        let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
        Ok(Pem {
            cert: write(dir.join(format!("{name}.pem")), &cert_pem)?,
            key: write(dir.join(format!("{name}-key.pem")), &key_pem)?,
            combined: write(
                dir.join(format!("{name}-combined.pem")),
                &format!("{cert_pem}{key_pem}"),
            )?,
        })
    };
    let server = issue(
        "server",
        server_names.iter().map(|name| name.to_string()).collect(),
        ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    let gateway_client = issue(
        "sluice-gateway",
        Vec::new(),
        ExtendedKeyUsagePurpose::ClientAuth,
    )?;
    Ok(TlsFiles {
        ca: ca_path,
        server,
        gateway_client,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_pem_files() {
        let dir = tempfile::tempdir().unwrap();
        let files = generate(dir.path(), &["127.0.0.1", "kube.perf.test"]).unwrap();
        let combined = std::fs::read_to_string(&files.server.combined).unwrap();
        assert!(combined.contains("BEGIN CERTIFICATE") && combined.contains("PRIVATE KEY"));
        assert!(std::fs::read_to_string(&files.ca)
            .unwrap()
            .starts_with("-----BEGIN CERTIFICATE"));
        assert_ne!(files.server.cert, files.gateway_client.cert);
    }
}
