//! `sluice_tls_certificate_expiry_timestamp_seconds{listener[, cluster]}`: when each certificate
//! a role serves or presents stops being valid, so an alert fires weeks before a handshake fails
//! (Envoy's `days_until_first_cert_expiring`, as an absolute time so it needs no refresh).
//! Label values are the config's listener and client names (a fixed set per role) and, for the
//! gateway's per-cluster certificates, the cluster's configured name; never a certificate's
//! subject nor anything a client sends.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};
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

#[derive(Debug, Clone, Hash, PartialEq, Eq)]
struct ListenerLabels {
    listener: &'static str,
    /// The configured object the certificate belongs to, where one listener has several (the
    /// gateway's clusters); the label is left out otherwise.
    cluster: Option<String>,
}

impl EncodeLabelSet for ListenerLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        ("listener", self.listener).encode(encoder.encode_label())?;
        if let Some(cluster) = &self.cluster {
            ("cluster", cluster.as_str()).encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

/// The expiry gauges of one role; clones share the series.
#[derive(Debug, Clone, Default)]
pub struct CertificateExpiry {
    expiry: Family<ListenerLabels, Gauge>,
    /// Per listener, the clusters [`Self::set_clusters`] last gave a series, so that a cluster
    /// gone from the config loses its series on the next reload.
    clusters: Arc<Mutex<HashMap<&'static str, BTreeSet<String>>>>,
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
        self.set_labels(
            ListenerLabels {
                listener,
                cluster: None,
            },
            path,
        )
    }

    fn set_labels(&self, labels: ListenerLabels, path: &Path) -> Result<i64, CertificateError> {
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

    /// Makes `certificates`, `(cluster, file)` pairs, the whole set of `listener`'s per-cluster
    /// series: each is set from its file, and the clusters of the previous call that are not
    /// among them lose theirs. Called with every generation of clusters a role installs.
    pub fn set_clusters<'a>(
        &self,
        listener: &'static str,
        certificates: impl IntoIterator<Item = (&'a str, &'a Path)>,
    ) {
        let mut clusters = self
            .clusters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let previous = clusters.remove(listener).unwrap_or_default();
        let mut current = BTreeSet::new();
        for (cluster, path) in certificates {
            let labels = ListenerLabels {
                listener,
                cluster: Some(cluster.to_owned()),
            };
            match self.set_labels(labels, path) {
                Ok(_) => {
                    current.insert(cluster.to_owned());
                }
                Err(error) => {
                    tracing::warn!(listener, cluster, %error, "no certificate expiry metric");
                }
            }
        }
        for gone in previous.difference(&current) {
            self.expiry.remove(&ListenerLabels {
                listener,
                cluster: Some(gone.clone()),
            });
        }
        clusters.insert(listener, current);
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
    fn per_cluster_series_follow_each_set_of_clusters() {
        let dir = tempfile::tempdir().unwrap();
        let (short, long) = (
            certificate_for_days(dir.path(), 30),
            certificate_for_days(dir.path(), 400),
        );
        let mut registry = Registry::default();
        let expiry = CertificateExpiry::register(&mut registry);
        let encoded = |registry: &Registry| {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
            text
        };
        let series = |cluster: &str, not_after: i64| {
            format!(
                "sluice_tls_certificate_expiry_timestamp_seconds{{listener=\"cluster_serving\",cluster=\"{cluster}\"}} {not_after}"
            )
        };
        let in_30 = earliest_not_after(&short).unwrap();
        let in_400 = earliest_not_after(&long).unwrap();
        expiry.set("external", &long).unwrap();
        expiry.set_clusters(
            "cluster_serving",
            [("prod", short.as_path()), ("dev", long.as_path())],
        );
        let text = encoded(&registry);
        assert!(
            text.lines().any(|line| line == series("prod", in_30)),
            "{text}"
        );
        assert!(
            text.lines().any(|line| line == series("dev", in_400)),
            "{text}"
        );
        // A reload: prod renewed, dev gone, a cluster whose file gives no time left out.
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").unwrap();
        expiry.set_clusters(
            "cluster_serving",
            [("prod", long.as_path()), ("broken", garbage.as_path())],
        );
        let text = encoded(&registry);
        assert!(
            text.lines().any(|line| line == series("prod", in_400)),
            "{text}"
        );
        assert!(!text.contains("cluster=\"dev\""), "{text}");
        assert!(!text.contains("cluster=\"broken\""), "{text}");
        let unlabelled = format!(
            "sluice_tls_certificate_expiry_timestamp_seconds{{listener=\"external\"}} {in_400}"
        );
        assert!(text.lines().any(|line| line == unlabelled), "{text}");
        expiry.set_clusters("cluster_serving", []);
        assert!(!encoded(&registry).contains("cluster="));
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
