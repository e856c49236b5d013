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
    /// The CA's private key (tests that sign their own certificates need it).
    pub ca_key: PathBuf,
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
        let ca_key = KeyPair::generate()?;
        let ca_key_pem = ca_key.serialize_pem();
        let issuer = CertifiedIssuer::self_signed(ca_params, ca_key)?;

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
        let ca_key_path = write(dir.path(), "ca-key.pem", &ca_key_pem);
        let server_cert_path = write(dir.path(), "server.pem", &server_cert.pem());
        let server_key_path = write(dir.path(), "server-key.pem", &server_key.serialize_pem());
        Ok(Self {
            dir,
            ca_cert: ca_path,
            server_cert: server_cert_path,
            server_key: server_key_path,
            ca_key: ca_key_path,
        })
    }

    /// Issues a client certificate with CN = `user` and one O per group (how Kubernetes reads
    /// user and groups from a certificate).
    ///
    /// rcgen keeps one value per attribute type in a subject, and Kubernetes needs several O
    /// values, so the certificate is signed by `openssl x509` with this CA's key; rcgen still
    /// makes the key pair.
    pub fn client(&self, user: &str, groups: &[&str]) -> std::io::Result<ClientCert> {
        let safe: String = user
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let dir = self.dir.path();
        let key = KeyPair::generate().map_err(std::io::Error::other)?;
        let key_path = write(dir, &format!("client-{safe}-key.pem"), &key.serialize_pem());
        let csr_path = dir.join(format!("client-{safe}.csr"));
        let cert_path = dir.join(format!("client-{safe}.pem"));
        let extensions = write(dir, "client-ext.cnf", "extendedKeyUsage=clientAuth\n");
        let escape = |value: &str| {
            value
                .replace('\\', "\\\\")
                .replace('/', "\\/")
                .replace('+', "\\+")
        };
        let mut subject = format!("/CN={}", escape(user));
        for group in groups {
            subject.push_str(&format!("/O={}", escape(group)));
        }
        run_openssl(
            std::process::Command::new("openssl")
                .args(["req", "-new", "-key"])
                .arg(&key_path)
                .args(["-subj", &subject, "-out"])
                .arg(&csr_path),
        )?;
        run_openssl(
            std::process::Command::new("openssl")
                .args(["x509", "-req", "-days", "2", "-in"])
                .arg(&csr_path)
                .arg("-CA")
                .arg(&self.ca_cert)
                .arg("-CAkey")
                .arg(&self.ca_key)
                .arg("-CAcreateserial")
                .arg("-extfile")
                .arg(&extensions)
                .arg("-out")
                .arg(&cert_path),
        )?;
        Ok(ClientCert {
            cert: cert_path,
            key: key_path,
        })
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

fn run_openssl(command: &mut std::process::Command) -> std::io::Result<()> {
    let output = command.output().map_err(|error| {
        std::io::Error::other(format!("cannot run openssl (apt install openssl): {error}"))
    })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "openssl failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}

fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents)
        .unwrap_or_else(|error| panic!("cannot write {}: {error}", path.display()));
    path
}

/// A certificate's notAfter as Unix seconds, read by openssl and date(1), not by Sluice's
/// parser: what tests compare the expiry metrics with.
pub fn not_after_by_openssl(cert: &Path) -> f64 {
    let script = "date -d \"$(openssl x509 -enddate -noout -in \"$1\" | cut -d= -f2)\" +%s";
    let output = std::process::Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(cert)
        .output()
        .expect("sh, openssl and date run");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("date printed Unix seconds")
}
