use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

/// A client certificate: subject CN (user) and O (groups), PEM files on disk.
#[derive(Debug, Clone)]
pub struct ClientCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A throw-away CA with a server certificate for `localhost`/`127.0.0.1`/`::1`, written as PEM
/// files into a temporary directory that lives as long as this value.
#[derive(Debug)]
pub struct Certificates {
    dir: tempfile::TempDir,
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Certificates {
    /// Generates the CA and a server certificate for the given extra DNS names.
    pub fn generate(extra_server_names: &[&str]) -> std::io::Result<Self> {
        Self::try_generate(extra_server_names).map_err(std::io::Error::other)
    }

    fn try_generate(
        extra_server_names: &[&str],
    ) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let dir = tempfile::tempdir()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "sluice test CA");
        let issuer = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

        let mut names = vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            "::1".to_string(),
        ];
        names.extend(extra_server_names.iter().map(|name| name.to_string()));
        let mut server_params = CertificateParams::new(names)?;
        server_params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_key = KeyPair::generate()?;
        let server_cert = server_params.signed_by(&server_key, &issuer)?;

        let ca_path = write(dir.path(), "ca.pem", &issuer.pem());
        let server_cert_path = write(dir.path(), "server.pem", &server_cert.pem());
        let server_key_path = write(dir.path(), "server-key.pem", &server_key.serialize_pem());
        Ok(Self {
            dir,
            ca_cert: ca_path,
            server_cert: server_cert_path,
            server_key: server_key_path,
            issuer,
        })
    }

    /// Issues a client certificate with CN = `user` and one O per group.
    pub fn client(&self, user: &str, groups: &[&str]) -> std::io::Result<ClientCert> {
        self.try_client(user, groups).map_err(std::io::Error::other)
    }

    fn try_client(&self, user: &str, groups: &[&str]) -> Result<ClientCert, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let safe: String = user
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        Ok(ClientCert {
            cert: write(self.dir.path(), &format!("client-{safe}.pem"), &cert.pem()),
            key: write(
                self.dir.path(),
                &format!("client-{safe}-key.pem"),
                &key.serialize_pem(),
            ),
        })
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents)
        .unwrap_or_else(|error| panic!("cannot write {}: {error}", path.display()));
    path
}
