//! A gateway fed by a control plane, the UpstreamCluster it is given and a request through it:
//! what the control-plane tests (`controlplane_push.rs`, `controlplane_backup.rs`) share.

use std::path::Path;
use std::process::Command;

use test_support::{
    ApiServer, Certificates, ClientCert, ControlPlane, SluiceLauncher, SluiceProcess,
};

use super::BIN;

/// An UpstreamCluster `name` (also its served hostname) with one server, `server`, reached with
/// `identity`, served with the test certificates and health-checked every 200 ms.
pub fn cluster_json(
    name: &str,
    certs: &Certificates,
    identity: &ClientCert,
    server: &ApiServer,
) -> String {
    serde_json::json!({
        "apiVersion": "proxy.sluice.dev/v1alpha1",
        "kind": "UpstreamCluster",
        "metadata": {"name": name},
        "spec": {
            "servers": [{"endpoint": server.url()}],
            "clientConfig": {
                "certFile": identity.cert, "keyFile": identity.key, "caFile": certs.ca_cert},
            "secureServing": {
                "certFile": certs.server_cert, "keyFile": certs.server_key,
                "clientCAFile": certs.ca_cert},
            "healthCheck": {"interval": "200ms", "timeout": "1s"},
        },
    })
    .to_string()
}

/// A gateway process named `name`, fed by the control plane with the gateway token `token`;
/// the clusters' files are in `credentials` (its `gateway.credentials_dir`).
pub fn start_fed_gateway(
    cp: &ControlPlane,
    name: &str,
    token: &str,
    credentials: &Path,
) -> SluiceProcess {
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let token = launcher.write_file("token", token).unwrap();
    let config = launcher
        .write_file(
            "gateway.yaml",
            &format!(
                "runtime: {{workers: 1, drain_timeout: 2s}}\nlisteners:\n  admin: {{address: '127.0.0.1:0'}}\n  gateway: {{address: '127.0.0.1:0'}}\ngateway:\n  credentials_dir: '{}'\n  source:\n    controlplane: {{url: '{}', name: {name}, ca_file: '{}', token_file: '{}'}}\n",
                credentials.display(),
                cp.url(),
                cp.ca_file().display(),
                token.display()
            ),
        )
        .unwrap();
    launcher
        .arg("run")
        .arg("--config")
        .arg(config)
        .spawn()
        .expect("gateway starts")
}

/// A request for `path` through the gateway as `host` with `alice`'s certificate: the HTTP
/// status (0: refused at TLS or no answer).
pub fn status_at(
    gateway: &SluiceProcess,
    host: &str,
    path: &str,
    certs: &Certificates,
    alice: &ClientCert,
) -> u16 {
    let port = gateway.address("gateway").port();
    let output = Command::new("curl")
        .args([
            "--silent",
            "--http2",
            "--max-time",
            "5",
            "--output",
            "/dev/null",
        ])
        .args(["--write-out", "%{http_code}"])
        .arg("--cacert")
        .arg(&certs.ca_cert)
        .arg("--cert")
        .arg(&alice.cert)
        .arg("--key")
        .arg(&alice.key)
        .args(["--resolve", &format!("{host}:{port}:127.0.0.1")])
        .arg(format!("https://{host}:{port}{path}"))
        .output()
        .expect("curl is installed");
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// GET /version through the gateway as `host`: the HTTP status (0: refused at TLS).
pub fn status_via(
    gateway: &SluiceProcess,
    host: &str,
    certs: &Certificates,
    alice: &ClientCert,
) -> u16 {
    status_at(gateway, host, "/version", certs, alice)
}
