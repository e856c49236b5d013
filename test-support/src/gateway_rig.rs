//! The pieces every gateway test's rig repeats: the UpstreamCluster file in front of simulators,
//! the start of `sluice run` checked against its monoio driver, and curl as a client that
//! reaches the gateway by the cluster's TLS server name.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::{Certificates, ClientCert, SluiceLauncher, SluiceProcess};

/// The simulators' health check the gateway tests use: a failed simulator is noticed well
/// within a second, so a test never waits long for the gateway to see a change.
pub const HEALTH_CHECK_FAST: &str = "  healthCheck: {interval: 200ms, timeout: 1s}\n";

/// A `secureServing` line that also serves `127.0.0.1`, for clients that dial the address.
pub const SERVE_LOOPBACK: &str = "    extraHostnames: ['127.0.0.1']\n";

/// An UpstreamCluster named `host` with `urls` as its servers, the gateway's client `identity`
/// and its serving certificate and client CA from `certs`; `serving_extra` lines go under
/// `secureServing:` and `rest` under `spec:` (health check, pool, policies: they differ per test).
pub fn upstream_cluster_yaml(
    host: &str,
    urls: &[String],
    certs: &Certificates,
    identity: &ClientCert,
    serving_extra: &str,
    rest: &str,
) -> String {
    let servers: String = urls
        .iter()
        .map(|url| format!("  - endpoint: {url}\n"))
        .collect();
    format!(
        "apiVersion: proxy.sluice.dev/v1alpha1\nkind: UpstreamCluster\nmetadata:\n  name: {host}\nspec:\n  servers:\n{servers}  clientConfig:\n    certFile: {gw_cert}\n    keyFile: {gw_key}\n    caFile: {ca}\n  secureServing:\n    certFile: {cert}\n    keyFile: {key}\n    clientCAFile: {ca}\n{serving_extra}{rest}",
        gw_cert = identity.cert.display(),
        gw_key = identity.key.display(),
        ca = certs.ca_cert.display(),
        cert = certs.server_cert.display(),
        key = certs.server_key.display(),
    )
}

/// Writes `cluster` as `cluster.yaml` in a new `clusters` directory under `dir`; that directory.
pub fn write_clusters_dir(dir: &Path, cluster: &str) -> PathBuf {
    let clusters_dir = dir.join("clusters");
    std::fs::create_dir_all(&clusters_dir).expect("clusters directory");
    std::fs::write(clusters_dir.join("cluster.yaml"), cluster).expect("cluster file");
    clusters_dir
}

/// The config of a gateway alone: `workers` cores on the monoio `driver`, the admin and gateway
/// listeners on free loopback ports (`listener_extra`: flow-map entries, each after a comma, on
/// the gateway listener), clusters from the files in `clusters_dir` (`gateway_extra`: entries
/// after it, each after a comma, such as the reload interval).
pub fn gateway_config_yaml(
    driver: &str,
    workers: usize,
    listener_extra: &str,
    clusters_dir: &Path,
    gateway_extra: &str,
) -> String {
    format!(
        "runtime: {{workers: {workers}, drain_timeout: 2s, driver: {driver}}}\nlisteners:\n  admin: {{address: '127.0.0.1:0'}}\n  gateway: {{address: '127.0.0.1:0'{listener_extra}}}\ngateway: {{clusters_dir: '{}'{gateway_extra}}}\n",
        clusters_dir.display()
    )
}

/// `sluice run --config config` from `launcher` (a gateway, a node), once ready checked to run on the monoio
/// `driver` (a test that meant one driver and silently got the other proves nothing).
pub fn run_on_driver(launcher: SluiceLauncher, config: &Path, driver: &str) -> SluiceProcess {
    let process = launcher
        .arg("run")
        .arg("--config")
        .arg(config)
        .spawn()
        .expect("sluice run starts");
    let metrics = crate::http_get(process.address("admin"), "/metrics")
        .expect("admin /metrics")
        .body;
    crate::assert_driver(&metrics, driver);
    process
}

/// curl with `options` to `path` on the gateway listener of `process` as `host` (resolved to
/// loopback), trusting the CA of `certs` and presenting `client` when given.
pub fn gateway_curl(
    process: &SluiceProcess,
    host: &str,
    certs: &Certificates,
    client: Option<&ClientCert>,
    options: &[&str],
    path: &str,
) -> Command {
    let address = process.address("gateway");
    curl_at(address, host, &certs.ca_cert, client, options, path)
}

/// curl with `options` to `path` on `address` as `host` (resolved to the address, so TLS and
/// routing see the cluster's name), trusting `ca` and presenting `client` when given; for a
/// gateway whose address outlives its process (restarts) or lies in another namespace.
pub fn curl_at(
    address: SocketAddr,
    host: &str,
    ca: &Path,
    client: Option<&ClientCert>,
    options: &[&str],
    path: &str,
) -> Command {
    let (ip, port) = (address.ip(), address.port());
    let mut command = Command::new("curl");
    command.args(options).arg("--cacert").arg(ca);
    if let Some(client) = client {
        command
            .arg("--cert")
            .arg(&client.cert)
            .arg("--key")
            .arg(&client.key);
    }
    command
        .args(["--resolve", &format!("{host}:{port}:{ip}")])
        .arg(format!("https://{host}:{port}{path}"));
    command
}

/// (status, body) of a curl run with `--write-out '\n%{http_code}'`; status 0 when curl got no
/// answer.
pub fn code_and_body(output: &Output) -> (u16, String) {
    let text = String::from_utf8_lossy(&output.stdout);
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}
