//! Hot reload: a thread watches the cluster directory (file names, sizes and modification
//! times, polled: no inotify dependency, and it also sees files replaced by rename) and loads it
//! again when anything changed. A valid directory becomes the new generation on every core at
//! once; an invalid one is logged with every error, counted, and the last good one stays.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::state::Gateway;

/// Stops the reloader thread when dropped.
#[derive(Debug)]
pub struct ReloaderHandle {
    /// Dropping it wakes the thread at once (its wait ends with "disconnected").
    stop: Option<Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for ReloaderHandle {
    fn drop(&mut self) {
        self.stop = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What the directory looked like: every entry's path, size and modification time.
type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>)>;

fn fingerprint(dir: &Path) -> Fingerprint {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| {
                    let metadata = entry.metadata().ok()?;
                    Some((entry.path(), metadata.len(), metadata.modified().ok()))
                })
                .collect()
        })
        .unwrap_or_default();
    entries.sort();
    entries
}

/// What one look at the directory did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    Unchanged,
    /// The directory changed and became this generation.
    Reloaded(u64),
    /// The directory changed but did not load; the last good generation stays.
    Rejected,
}

/// The reloader's memory between looks.
#[derive(Debug)]
struct Watch {
    seen: Fingerprint,
}

impl Watch {
    fn new(gateway: &Gateway) -> Self {
        Self {
            seen: fingerprint(&gateway.dir),
        }
    }

    /// Loads the directory again if it changed since the last look, and counts and logs the
    /// result. A rejected directory is not retried until it changes again.
    fn look(&mut self, gateway: &Gateway) -> Look {
        let now = fingerprint(&gateway.dir);
        if now == self.seen {
            return Look::Unchanged;
        }
        self.seen = now;
        match gateway.reload() {
            Ok(generation) => {
                gateway.metrics.reloads_ok.inc();
                tracing::info!(dir = %gateway.dir.display(), generation, "gateway clusters reloaded");
                Look::Reloaded(generation)
            }
            Err(error) => {
                gateway.metrics.reloads_failed.inc();
                tracing::error!(dir = %gateway.dir.display(), %error, "gateway reload rejected; the last good config stays");
                Look::Rejected
            }
        }
    }
}

/// Starts watching `gateway.dir` every `interval`.
pub fn spawn_reloader(
    gateway: Arc<Gateway>,
    interval: Duration,
) -> std::io::Result<ReloaderHandle> {
    let (stop, stopped) = channel::<()>();
    let thread = std::thread::Builder::new()
        .name("sluice-gateway-reload".to_string())
        .spawn(move || {
            let mut watch = Watch::new(&gateway);
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                watch.look(&gateway);
            }
        })?;
    Ok(ReloaderHandle {
        stop: Some(stop),
        thread: Some(thread),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ClusterFileError, ProxyError, Side};
    use crate::metrics::GatewayMetrics;

    /// A cluster directory with a self-signed certificate the clusters serve and trust.
    struct Clusters {
        dir: tempfile::TempDir,
        cert: PathBuf,
        key: PathBuf,
    }

    impl Clusters {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let generated = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
            // Only *.yaml / *.yml files are clusters: the PEM files can sit beside them.
            let cert = dir.path().join("cert.pem");
            let key = dir.path().join("key.pem");
            std::fs::write(&cert, generated.cert.pem()).unwrap();
            std::fs::write(&key, generated.signing_key.serialize_pem()).unwrap();
            Self { dir, cert, key }
        }

        fn yaml(&self, name: &str, servers: &[&str], client_extra: &str) -> String {
            let servers: String = servers
                .iter()
                .map(|server| format!("  - endpoint: {server}\n"))
                .collect();
            format!(
                "apiVersion: proxy.sluice.dev/v1alpha1\nkind: UpstreamCluster\nmetadata:\n  name: {name}\nspec:\n  servers:\n{servers}  clientConfig:\n    caFile: {cert}\n    certFile: {cert}\n    keyFile: {key}\n{client_extra}  secureServing:\n    certFile: {cert}\n    keyFile: {key}\n",
                cert = self.cert.display(),
                key = self.key.display(),
            )
        }

        fn write(&self, file: &str, text: &str) {
            std::fs::write(self.dir.path().join(file), text).unwrap();
        }

        fn gateway(&self) -> Arc<Gateway> {
            let metrics =
                GatewayMetrics::register(&mut prometheus_client::registry::Registry::default(), 1);
            Gateway::load(self.dir.path(), metrics).unwrap()
        }
    }

    fn cluster_names(gateway: &Gateway) -> Vec<String> {
        gateway
            .current()
            .snapshot
            .clusters()
            .iter()
            .map(|cluster| cluster.name.to_string())
            .collect()
    }

    #[test]
    fn a_good_directory_becomes_the_next_generation() {
        let clusters = Clusters::new();
        clusters.write(
            "a.yaml",
            &clusters.yaml("a.example.com", &["https://10.0.0.1:6443"], ""),
        );
        let gateway = clusters.gateway();
        let first = gateway.current();
        assert_eq!(first.number, 1);
        assert_eq!(cluster_names(&gateway), ["a.example.com"]);

        clusters.write(
            "b.yaml",
            &clusters.yaml("b.example.com", &["https://10.0.0.2:6443"], ""),
        );
        assert_eq!(gateway.reload().unwrap(), 2);
        assert_eq!(gateway.current().number, 2);
        let mut names = cluster_names(&gateway);
        names.sort();
        assert_eq!(names, ["a.example.com", "b.example.com"]);
        // Requests that started on the old generation keep it until they end.
        assert_eq!(first.snapshot.clusters().len(), 1);
    }

    #[test]
    fn a_bad_directory_keeps_the_last_good_generation() {
        let clusters = Clusters::new();
        clusters.write(
            "a.yaml",
            &clusters.yaml("a.example.com", &["https://10.0.0.1:6443"], ""),
        );
        let gateway = clusters.gateway();

        clusters.write("a.yaml", "apiVersion: [not yaml");
        let error = gateway.reload().unwrap_err();
        assert!(matches!(error, ProxyError::Config(_)), "{error:?}");
        assert_eq!(error.side(), Side::Config);
        assert_eq!(gateway.current().number, 1);
        assert_eq!(cluster_names(&gateway), ["a.example.com"]);

        // Valid YAML whose files cannot be used is refused just the same.
        clusters.write("token", "two\nlines");
        let token = clusters.dir.path().join("token");
        clusters.write(
            "a.yaml",
            &clusters.yaml(
                "a.example.com",
                &["https://10.0.0.1:6443"],
                &format!("    bearerTokenFile: {}\n", token.display()),
            ),
        );
        let error = gateway.reload().unwrap_err();
        assert!(
            matches!(
                &error,
                ProxyError::ClusterFiles {
                    cause: ClusterFileError::BearerToken,
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(
            error
                .to_string()
                .ends_with("a.yaml: cluster \"a.example.com\": spec.clientConfig: the bearer token is not a valid header value"),
            "{error}"
        );
        assert_eq!(gateway.current().number, 1);

        // Every attempt has its number; the next good one swaps in.
        clusters.write(
            "a.yaml",
            &clusters.yaml("a.example.com", &["https://10.0.0.9:6443"], ""),
        );
        assert_eq!(gateway.reload().unwrap(), 4);
        assert_eq!(
            &*gateway.current().snapshot.clusters()[0].servers[0].endpoint,
            "https://10.0.0.9:6443"
        );
    }

    #[test]
    fn an_insecure_client_config_is_refused_with_its_field() {
        let clusters = Clusters::new();
        clusters.write(
            "a.yaml",
            &clusters.yaml(
                "a.example.com",
                &["https://10.0.0.1:6443"],
                "    insecure: true\n",
            ),
        );
        let metrics =
            GatewayMetrics::register(&mut prometheus_client::registry::Registry::default(), 1);
        let error = Gateway::load(clusters.dir.path(), metrics).unwrap_err();
        assert!(
            matches!(
                &error,
                ProxyError::ClusterFiles {
                    cause: ClusterFileError::Insecure,
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(
            error
                .to_string()
                .contains("a.yaml: cluster \"a.example.com\": spec.clientConfig.insecure"),
            "{error}"
        );
    }

    #[test]
    fn server_health_outlives_a_reload() {
        let clusters = Clusters::new();
        let servers = ["https://10.0.0.1:6443", "https://10.0.0.2:6443"];
        clusters.write("a.yaml", &clusters.yaml("a.example.com", &servers, ""));
        let gateway = clusters.gateway();
        gateway.current().clusters[0].health[1].set(false);

        let servers = ["https://10.0.0.2:6443", "https://10.0.0.3:6443"];
        clusters.write("a.yaml", &clusters.yaml("a.example.com", &servers, ""));
        gateway.reload().unwrap();
        let health = &gateway.current().clusters[0].health;
        assert!(
            !health[0].is_healthy(),
            "a dead server is not revived by a reload"
        );
        assert!(health[1].is_healthy(), "a new server starts in rotation");
    }

    #[test]
    fn the_watch_reloads_only_when_the_directory_changed_and_counts_the_results() {
        let clusters = Clusters::new();
        let good = clusters.yaml("a.example.com", &["https://10.0.0.1:6443"], "");
        clusters.write("a.yaml", &good);
        let gateway = clusters.gateway();
        let mut watch = Watch::new(&gateway);
        assert_eq!(watch.look(&gateway), Look::Unchanged);

        clusters.write(
            "b.yaml",
            &clusters.yaml("b.example.com", &["https://10.0.0.2:6443"], ""),
        );
        assert_eq!(watch.look(&gateway), Look::Reloaded(2));
        assert_eq!(watch.look(&gateway), Look::Unchanged);

        clusters.write("b.yaml", "kind: [broken");
        assert_eq!(watch.look(&gateway), Look::Rejected);
        assert_eq!(
            watch.look(&gateway),
            Look::Unchanged,
            "a rejected directory is not loaded again until it changes"
        );
        assert_eq!(gateway.current().number, 2);

        std::fs::remove_file(clusters.dir.path().join("b.yaml")).unwrap();
        assert_eq!(watch.look(&gateway), Look::Reloaded(4));
        assert_eq!(gateway.metrics.reloads_ok.get(), 2);
        assert_eq!(gateway.metrics.reloads_failed.get(), 1);
    }

    #[test]
    fn certificate_expiry_follows_every_generation_loaded_or_installed() {
        let clusters = Clusters::new();
        clusters.write("alpha.yaml", &clusters.yaml("alpha", &["https://a:1"], ""));
        let gateway = clusters.gateway();
        let mut registry = prometheus_client::registry::Registry::default();
        let expiry = sluice_role_metrics::CertificateExpiry::register(&mut registry);
        gateway.export_certificate_expiry(expiry);
        let not_after = sluice_role_metrics::earliest_not_after(&clusters.cert).unwrap();
        let text = || {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            text
        };
        let series = |listener: &str, cluster: &str| {
            format!("sluice_tls_certificate_expiry_timestamp_seconds{{listener=\"{listener}\",cluster=\"{cluster}\"}} {not_after}")
        };
        let exported = text();
        assert!(exported.contains(&series("gateway", "alpha")), "{exported}");
        assert!(
            exported.contains(&series("upstream_client", "alpha")),
            "{exported}"
        );
        // The control plane's path: a list replaces the clusters (alpha gone, beta new).
        let beta = clusters.yaml("beta", &["https://b:1"], "");
        let loaded = sluice_gateway::cluster::parse_clusters(&beta, Path::new("cp/beta")).unwrap();
        gateway.install(loaded).unwrap();
        let exported = text();
        assert!(exported.contains(&series("gateway", "beta")), "{exported}");
        assert!(
            exported.contains(&series("upstream_client", "beta")),
            "{exported}"
        );
        assert!(!exported.contains("alpha"), "{exported}");
    }

    #[test]
    fn a_reload_adding_an_agent_server_the_config_cannot_serve_is_refused() {
        let clusters = Clusters::new();
        clusters.write(
            "a.yaml",
            &clusters.yaml("a.example.com", &["https://10.0.0.1:6443"], ""),
        );
        let gateway = clusters.gateway();
        let with_agent = clusters
            .yaml("a.example.com", &["https://10.0.0.1:6443"], "")
            .replace("  clientConfig:", "  - agent: {id: 42}\n  clientConfig:");
        clusters.write("a.yaml", &with_agent);
        let error = gateway.reload().unwrap_err();
        assert!(
            error.to_string().contains("spec.servers[1].agent"),
            "{error}"
        );
        assert_eq!(
            gateway.current().number,
            1,
            "the last good generation stays"
        );

        gateway.set_agent_reach(sluice_gateway::cluster::AgentReach {
            tunnel: true,
            assertion_key: true,
        });
        assert!(gateway.reload().is_ok());
        let current = gateway.current();
        assert_eq!(current.snapshot.clusters()[0].servers[1].agent, Some(42));
    }
}
