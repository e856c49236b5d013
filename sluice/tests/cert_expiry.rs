//! `sluice_tls_certificate_expiry_timestamp_seconds` for the certificates beyond the listeners
//! (issue 35): a gateway's per-cluster serving and upstream client certificates (following a
//! reload of its clusters), the VM agent's control-plane client certificate and the control
//! plane's etcd client certificate. Each role runs for real with certificates of known notAfter
//! (read back by openssl and date(1), not by Sluice's parser), and its live `/metrics` must
//! show exactly that time.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use test_support::{
    gateway_config_yaml, http_get, wait_until, write_clusters_dir, Certificates, ControlPlane,
    OvsInstance, SluiceLauncher, VmAgentProcess,
};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const GAUGE: &str = "sluice_tls_certificate_expiry_timestamp_seconds";

/// A self-signed certificate valid for `days` and its key, by `openssl req`.
fn certificate_for_days(dir: &Path, name: &str, days: u32) -> (PathBuf, PathBuf) {
    let (cert, key) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}-key.pem")),
    );
    let output = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args([
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
        ])
        .args(["-days", &days.to_string(), "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    (cert, key)
}

/// The value of the sample whose name and labels are exactly `series`.
fn value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

fn series(listener: &str, cluster: Option<&str>) -> String {
    match cluster {
        Some(cluster) => format!("{GAUGE}{{listener=\"{listener}\",cluster=\"{cluster}\"}}"),
        None => format!("{GAUGE}{{listener=\"{listener}\"}}"),
    }
}

/// An UpstreamCluster `name` serving `serving`, presenting `client` upstream when given (its
/// apiserver is a closed port, verified against the serving certificate: nothing is reached).
fn cluster_yaml(
    name: &str,
    serving: &(PathBuf, PathBuf),
    client: Option<&(PathBuf, PathBuf)>,
) -> String {
    // Without a certificate the gateway's identity upstream is a bearer token.
    let client = client.map_or("    bearerToken: unused\n".to_string(), |(cert, key)| {
        format!(
            "    certFile: {}\n    keyFile: {}\n",
            cert.display(),
            key.display()
        )
    });
    format!(
        "apiVersion: proxy.sluice.dev/v1alpha1\nkind: UpstreamCluster\nmetadata:\n  name: {name}\nspec:\n  servers:\n  - endpoint: https://127.0.0.1:1\n  clientConfig:\n{client}    caFile: {}\n  secureServing:\n    certFile: {}\n    keyFile: {}\n",
        serving.0.display(),
        serving.0.display(),
        serving.1.display()
    )
}

#[test]
fn a_gateways_cluster_certificates_are_exported_and_follow_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let serving = certificate_for_days(dir.path(), "prod", 10);
    let client = certificate_for_days(dir.path(), "prod-client", 30);
    let clusters_dir =
        write_clusters_dir(dir.path(), &cluster_yaml("prod", &serving, Some(&client)));
    let config = dir.path().join("gateway.yaml");
    let yaml = gateway_config_yaml("legacy", 1, "", &clusters_dir, ", reload_interval: 200ms");
    std::fs::write(&config, yaml).unwrap();
    let gateway = SluiceLauncher::new(BIN)
        .unwrap()
        .arg("run")
        .arg("--config")
        .arg(&config)
        .spawn()
        .expect("the gateway starts");
    let scrape = || http_get(gateway.address("admin"), "/metrics").unwrap().body;
    let text = scrape();
    let prod_serving = series("gateway", Some("prod"));
    let prod_client = series("upstream_client", Some("prod"));
    assert_eq!(
        value(&text, &prod_serving),
        Some(test_support::not_after_by_openssl(&serving.0)),
        "{text}"
    );
    assert_eq!(
        value(&text, &prod_client),
        Some(test_support::not_after_by_openssl(&client.0)),
        "{text}"
    );

    // The operator renames the cluster and gives it a new certificate without a client one.
    let renewed = certificate_for_days(dir.path(), "staging", 90);
    // Replaced by a rename, as an operator's tooling does, so the reload never reads half a file.
    let next = dir.path().join("cluster.yaml.next");
    std::fs::write(&next, cluster_yaml("staging", &renewed, None)).unwrap();
    std::fs::rename(&next, clusters_dir.join("cluster.yaml")).unwrap();
    let staging = series("gateway", Some("staging"));
    assert!(
        wait_until(Duration::from_secs(10), || value(&scrape(), &staging)
            .is_some()),
        "the reload never exported staging's certificate:\n{}\n{}",
        scrape(),
        gateway.stderr()
    );
    let text = scrape();
    assert_eq!(
        value(&text, &staging),
        Some(test_support::not_after_by_openssl(&renewed.0)),
        "{text}"
    );
    assert!(!text.contains("cluster=\"prod\""), "{text}");
    assert!(!text.contains("listener=\"upstream_client\""), "{text}");
}

#[test]
fn the_vm_agents_control_plane_client_certificate_is_exported() {
    let certs = Certificates::generate(&[]).unwrap();
    let ca = certs.ca_cert.to_str().unwrap();
    let cp = ControlPlane::start(BIN, &["--client-ca", ca]).unwrap();
    // CN = the VM (the agent's subject), O = its role: the control plane reads both from it.
    let identity = certs.client("vm-cert", &["vm-agent"]).unwrap();
    let ovs = OvsInstance::start().unwrap();
    let state = tempfile::tempdir().unwrap();
    let mut command = Command::new(BIN);
    command
        .args(["vm-agent", "--bridge", "brcert", "--admin", "127.0.0.1:0"])
        .args(["--controlplane", &cp.url(), "--vm", "vm-cert"])
        .arg("--controlplane-ca")
        .arg(cp.ca_file())
        .arg("--controlplane-cert")
        .arg(&identity.cert)
        .arg("--controlplane-key")
        .arg(&identity.key)
        .arg("--state-dir")
        .arg(state.path())
        .arg("--ovs-rundir")
        .arg(ovs.rundir());
    let agent = VmAgentProcess::spawn(command).unwrap();
    let scrape = || {
        http_get(agent.admin.parse().unwrap(), "/metrics")
            .unwrap()
            .body
    };
    let text = scrape();
    let expected = test_support::not_after_by_openssl(&identity.cert);
    assert_eq!(
        value(&text, &series("controlplane_client", None)),
        Some(expected),
        "{text}"
    );
    // The certificate alone (no token) authenticates the agent's watches.
    assert!(
        wait_until(Duration::from_secs(15), || scrape().lines().any(
            |line| line.starts_with("sluice_controlplane_watch_connected{") && line.ends_with(" 1")
        )),
        "no watch connected with the client certificate:\n{}\n{}",
        scrape(),
        agent.log()
    );
}

#[cfg(feature = "etcd")]
#[test]
fn the_control_planes_etcd_client_certificate_is_exported() {
    use test_support::{etcd_or_skip, EtcdServer, EtcdTlsFiles};
    if !etcd_or_skip("the_control_planes_etcd_client_certificate_is_exported") {
        return;
    }
    let certs = Certificates::generate(&[]).unwrap();
    let client = certs.client("sluice-apiserver", &[]).unwrap();
    let etcd = EtcdServer::start_tls(EtcdTlsFiles {
        cert: certs.server_cert.clone(),
        key: certs.server_key.clone(),
        ca: certs.ca_cert.clone(),
    })
    .unwrap();
    let endpoint = etcd.endpoint();
    let cp = ControlPlane::start(
        BIN,
        &[
            "--etcd-endpoints",
            &endpoint,
            "--etcd-ca",
            certs.ca_cert.to_str().unwrap(),
            "--etcd-cert",
            client.cert.to_str().unwrap(),
            "--etcd-key",
            client.key.to_str().unwrap(),
        ],
    )
    .unwrap();
    let (code, text) = cp.curl("GET", "/metrics", None);
    assert_eq!(code, 200, "{text}");
    let expected = test_support::not_after_by_openssl(&client.cert);
    assert_eq!(
        value(&text, &series("etcd_client", None)),
        Some(expected),
        "{text}"
    );
    assert!(
        value(&text, &series("controlplane", None)).is_some(),
        "{text}"
    );
}
