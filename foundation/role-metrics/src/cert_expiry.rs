//! `sluice_tls_certificate_expiry_timestamp_seconds{listener}`: when each certificate a role
//! serves or presents stops being valid, so an alert fires weeks before a handshake fails
//! (Envoy's `days_until_first_cert_expiring`, as an absolute time so it needs no refresh).
//! Label values are the config's listener and client names (a fixed set per role), never a
//! certificate's subject.

use std::path::{Path, PathBuf};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use x509_parser::pem::Pem;

/// Why a certificate file gave no expiry time; names the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertificateError {
    #[error("{path}: cannot read: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path}: no certificate in file")]
    Empty { path: PathBuf },
    #[error("{path}: invalid certificate: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// The earliest notAfter (Unix seconds) of the certificates in a PEM file: a chain stops
/// validating when its first member expires, intermediate or leaf.
pub fn earliest_not_after(path: &Path) -> Result<i64, CertificateError> {
    let bytes = std::fs::read(path).map_err(|error| CertificateError::Read {
        path: path.to_path_buf(),
        reason: error.to_string(),
    })?;
    earliest_not_after_pem(&bytes).map_err(|failure| match failure {
        None => CertificateError::Empty {
            path: path.to_path_buf(),
        },
        Some(reason) => CertificateError::Invalid {
            path: path.to_path_buf(),
            reason,
        },
    })
}

/// [`earliest_not_after`] of PEM text: `Err(None)` when it holds no certificate.
fn earliest_not_after_pem(bytes: &[u8]) -> Result<i64, Option<String>> {
    let mut earliest: Option<i64> = None;
    for pem in Pem::iter_from_buffer(bytes) {
        let pem = pem.map_err(|error| Some(error.to_string()))?;
        if pem.label != "CERTIFICATE" {
            continue;
        }
        let certificate = pem.parse_x509().map_err(|error| Some(error.to_string()))?;
        let not_after = certificate.validity().not_after.timestamp();
        earliest = Some(earliest.map_or(not_after, |seen| seen.min(not_after)));
    }
    earliest.ok_or(None)
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: &'static str,
}

/// The expiry gauges of one role.
#[derive(Debug, Clone, Default)]
pub struct CertificateExpiry {
    expiry: Family<ListenerLabels, Gauge>,
}

impl CertificateExpiry {
    pub fn register(registry: &mut Registry) -> Self {
        let this = Self::default();
        registry.register(
            "sluice_tls_certificate_expiry_timestamp_seconds",
            "When the certificate (chain) a listener serves or a client presents expires (its \
             earliest notAfter, Unix seconds), by config name",
            this.expiry.clone(),
        );
        this
    }

    /// Sets `listener`'s expiry from the PEM file it serves or presents. On an error (the
    /// start refuses such files before this runs) the series is left out and the error returned.
    pub fn set(&self, listener: &'static str, path: &Path) -> Result<i64, CertificateError> {
        let labels = ListenerLabels { listener };
        match earliest_not_after(path) {
            Ok(not_after) => {
                self.expiry.get_or_create(&labels).set(not_after);
                Ok(not_after)
            }
            Err(error) => {
                self.expiry.remove(&labels);
                Err(error)
            }
        }
    }

    /// Sets every `(listener, file)` pair, logging the files that give no time.
    pub fn set_all<'a>(&self, certificates: impl IntoIterator<Item = (&'static str, &'a Path)>) {
        for (listener, path) in certificates {
            if let Err(error) = self.set(listener, path) {
                tracing::warn!(listener, %error, "no certificate expiry metric");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::{SystemTime, UNIX_EPOCH};

    use super::*;

    /// A self-signed certificate valid for `days` from now, by `openssl req`.
    fn certificate_for_days(dir: &Path, days: u32) -> PathBuf {
        let (cert, key) = (dir.join(format!("{days}.pem")), dir.join("key.pem"));
        let status = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=expiry"])
            .args(["-days", &days.to_string(), "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .unwrap();
        assert!(status.status.success(), "{status:?}");
        cert
    }

    fn now() -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    #[test]
    fn not_after_is_the_certificates_and_the_earliest_of_a_chain() {
        let dir = tempfile::tempdir().unwrap();
        let short = certificate_for_days(dir.path(), 30);
        let long = certificate_for_days(dir.path(), 400);
        let day = 86_400;
        // openssl counts from its own "now": a minute of slack either way.
        let in_30 = earliest_not_after(&short).unwrap();
        assert!((in_30 - (now() + 30 * day)).abs() < 60, "{in_30}");
        let in_400 = earliest_not_after(&long).unwrap();
        assert!((in_400 - (now() + 400 * day)).abs() < 60, "{in_400}");

        let chain = dir.path().join("chain.pem");
        let text =
            std::fs::read_to_string(&long).unwrap() + &std::fs::read_to_string(&short).unwrap();
        std::fs::write(&chain, text).unwrap();
        assert_eq!(earliest_not_after(&chain), Ok(in_30));
    }

    #[test]
    fn the_gauge_is_set_per_listener_and_left_out_for_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let cert = certificate_for_days(dir.path(), 30);
        let mut registry = Registry::default();
        let expiry = CertificateExpiry::register(&mut registry);
        let not_after = expiry.set("external", &cert).unwrap();
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").unwrap();
        assert!(expiry.set("private", &garbage).is_err());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let series = format!(
            "sluice_tls_certificate_expiry_timestamp_seconds{{listener=\"external\"}} {not_after}"
        );
        assert!(text.lines().any(|line| line == series), "{text}");
        assert!(!text.contains("listener=\"private\""), "{text}");
    }

    #[test]
    fn garbage_and_empty_files_are_typed_errors() {
        assert_eq!(earliest_not_after_pem(b"hello\n"), Err(None));
        let broken = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(matches!(
            earliest_not_after_pem(broken.as_bytes()),
            Err(Some(_))
        ));
        let missing = earliest_not_after(Path::new("/nonexistent/cert.pem")).unwrap_err();
        assert!(
            missing
                .to_string()
                .starts_with("/nonexistent/cert.pem: cannot read"),
            "{missing}"
        );
    }

    proptest::proptest! {
        /// Whatever a certificate file holds: a time or a typed error, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            let mut text = b"-----BEGIN CERTIFICATE-----\n".to_vec();
            text.extend_from_slice(&bytes);
            let _ = earliest_not_after_pem(&bytes);
            let _ = earliest_not_after_pem(&text);
        }
    }
}
