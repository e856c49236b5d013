//! The control plane pushing to the data plane: two gateways and a node fed by one control
//! plane (real processes), UpstreamCluster changes served by both gateways, each role's status
//! reports, an Agent deletion closing that agent's tunnels, and the gateways riding out a
//! control-plane restart.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use test_support::{
    http_get, wait_until, ApiServer, Certificates, ClientCert, ControlPlane, GrpcBackend,
    SluiceLauncher, SluiceProcess,
};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

fn cluster_json(
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

/// A gateway process fed by the control plane with a `gateway` token; the clusters' files are
/// in `credentials` (its `gateway.credentials_dir`).
fn start_gateway(cp: &ControlPlane, subject: &str, credentials: &std::path::Path) -> SluiceProcess {
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let token = launcher
        .write_file("token", &cp.token("gateway", subject))
        .unwrap();
    let config = launcher
        .write_file(
            "gateway.yaml",
            &format!(
                "runtime: {{workers: 1, drain_timeout: 2s}}\nlisteners:\n  admin: {{address: '127.0.0.1:0'}}\n  gateway: {{address: '127.0.0.1:0'}}\ngateway:\n  credentials_dir: '{}'\n  source:\n    controlplane: {{url: '{}', name: {subject}, ca_file: '{}', token_file: '{}'}}\n",
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

fn generation(gateway: &SluiceProcess) -> f64 {
    common::metric(gateway, "sluice_gateway_config_generation").unwrap_or(0.0)
}

/// GET /version through the gateway as `host` with alice's certificate: the HTTP status.
fn status_via(
    gateway: &SluiceProcess,
    host: &str,
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
        .arg(format!("https://{host}:{port}/version"))
        .output()
        .expect("curl is installed");
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

#[test]
fn one_control_plane_feeds_two_gateways_and_a_node() {
    let certs = Certificates::generate(&["one.sluice.test", "two.sluice.test"]).unwrap();
    let identity = certs.client("sluice-gateway", &[]).unwrap();
    let alice = certs.client("alice", &["dev"]).unwrap();
    let server = ApiServer::start_with(test_support::apiserver_options(&certs)).unwrap();
    let mut cp = ControlPlane::start(BIN, &[]).unwrap();
    let one = cluster_json("one.sluice.test", &certs, &identity, &server);
    let created = cp.kubectl(&["create", "-f", "-"], Some(&one));
    assert!(created.status.success(), "{created:?}");

    let gateways = [
        start_gateway(&cp, "gw-1", certs.dir()),
        start_gateway(&cp, "gw-2", certs.dir()),
    ];
    let fed = start_fed_node(&cp);
    for gateway in &gateways {
        assert!(
            wait_until(Duration::from_secs(10), || status_via(
                gateway,
                "one.sluice.test",
                &certs,
                &alice
            ) == 200),
            "the gateway never served the first cluster; stderr:\n{}",
            gateway.stderr()
        );
        assert_eq!(
            status_via(gateway, "two.sluice.test", &certs, &alice),
            0,
            "an unknown host is refused at TLS"
        );
    }

    // A new cluster: both gateways swap to a generation serving it. Timed from before the
    // write is sent (curl's start-up included, so an upper bound) to both gateways' new
    // generation, then checked with a real request.
    let before: Vec<f64> = gateways.iter().map(generation).collect();
    let two = cluster_json("two.sluice.test", &certs, &identity, &server);
    let sent = Instant::now();
    let (code, body) = cp.curl(
        "POST",
        "/apis/proxy.sluice.dev/v1alpha1/upstreamclusters",
        Some(&two),
    );
    assert_eq!(code, 201, "{body}");
    let acknowledged = sent.elapsed();
    let mut served_after = Vec::new();
    for (gateway, before) in gateways.iter().zip(&before) {
        assert!(wait_until(Duration::from_secs(5), || generation(gateway) > *before));
        served_after.push(sent.elapsed());
    }
    eprintln!("UpstreamCluster create: acknowledged after {acknowledged:?}; served by the gateways after {served_after:?} (from before the write was sent)");
    // The figure is reported above (docs/CONTROLPLANE.md quotes it); the bound here is loose
    // so a loaded CI machine does not fail a correct push.
    let slowest = served_after
        .iter()
        .max()
        .unwrap()
        .saturating_sub(acknowledged);
    assert!(
        slowest < Duration::from_secs(1),
        "a gateway took {slowest:?} after the write"
    );
    for gateway in &gateways {
        assert_eq!(status_via(gateway, "two.sluice.test", &certs, &alice), 200);
    }

    // Each role reports its view into the objects' status, each in its own entry.
    let health = |gateway: &str| {
        let path = format!("jsonpath={{.status.gateways.{gateway}.servers[0].healthy}}");
        cp.kubectl(&["get", "uc", "one.sluice.test", "-o", &path], None)
    };
    assert!(
        wait_until(Duration::from_secs(10), || ["gw-1", "gw-2"].iter().all(
            |gateway| String::from_utf8_lossy(&health(gateway).stdout) == "true"
        )),
        "the gateways never reported their servers' health"
    );
    let held = || {
        let output = cp.kubectl(
            &[
                "get",
                "agent",
                "agent-7",
                "-o",
                "jsonpath={.status.nodes.node-1.connected}",
            ],
            None,
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    assert!(
        wait_until(Duration::from_secs(10), || held() == "true"),
        "the node never reported agent 7"
    );
    delete_the_agent(&cp, &fed.node);

    // The control plane goes away: both gateways keep serving what they have.
    cp.stop();
    std::thread::sleep(Duration::from_millis(500));
    for gateway in &gateways {
        assert_eq!(status_via(gateway, "one.sluice.test", &certs, &alice), 200);
        assert_eq!(status_via(gateway, "two.sluice.test", &certs, &alice), 200);
        assert_eq!(
            common::metric(
                gateway,
                "sluice_controlplane_watch_connected{resource=\"upstreamclusters\"}"
            ),
            Some(0.0)
        );
    }
    // It comes back (same store): the gateways resume their watches and see a deletion made
    // right after, within a second of the return.
    cp.restart().unwrap();
    let returned = Instant::now();
    let deleted = cp.kubectl(&["delete", "uc", "two.sluice.test"], None);
    assert!(deleted.status.success(), "{deleted:?}");
    for gateway in &gateways {
        assert!(
            wait_until(Duration::from_secs(5), || status_via(
                gateway,
                "two.sluice.test",
                &certs,
                &alice
            ) == 0),
            "a gateway did not catch up; stderr:\n{}",
            gateway.stderr()
        );
    }
    let caught_up = returned.elapsed();
    eprintln!("control plane back -> both gateways caught up after {caught_up:?}");
    assert!(
        caught_up < Duration::from_secs(3),
        "catching up took {caught_up:?}"
    );
    for gateway in &gateways {
        assert_eq!(status_via(gateway, "one.sluice.test", &certs, &alice), 200);
        let metrics = http_get(gateway.address("admin"), "/metrics").unwrap().body;
        assert!(
            metrics.contains("sluice_controlplane_watch_relists_total")
                || metrics.contains("sluice_controlplane_watch_reconnects_total"),
            "{metrics}"
        );
    }
}

/// A node fed by `cp` with agent 7 connected through it.
struct FedNode {
    node: SluiceProcess,
    _agent: SluiceProcess,
    _backend: GrpcBackend,
    _token_dir: tempfile::TempDir,
    _secrets: common::Secrets,
}

fn start_fed_node(cp: &ControlPlane) -> FedNode {
    let secrets = common::Secrets::new();
    let digest = hex::encode(Sha256::digest(secrets.token(7).as_bytes()));
    let agent = serde_json::json!({
        "apiVersion": "tunnel.sluice.dev/v1alpha1", "kind": "Agent",
        "metadata": {"name": "agent-7"}, "spec": {"id": 7, "tokenSha256": digest}});
    assert!(cp
        .kubectl(&["create", "-f", "-"], Some(&agent.to_string()))
        .status
        .success());
    let launcher_dir = tempfile::tempdir().unwrap();
    let token = launcher_dir.path().join("node.token");
    std::fs::write(&token, cp.token("node", "node-1")).unwrap();
    let node = common::run_node(&format!(
        "runtime: {{workers: 2, drain_timeout: 2s}}\nlisteners:\n  admin: {{address: '127.0.0.1:0'}}\n  agent: {{address: '127.0.0.1:0'}}\n  external: {{address: '127.0.0.1:0'}}\ntunnel:\n  node_name: node-1\n  agents_from:\n    controlplane: {{url: '{}', ca_file: '{}', token_file: '{}'}}\n  jwt: {{secret_file: '{}'}}\n",
        cp.url(),
        cp.ca_file().display(),
        token.display(),
        secrets.jwt_secret.display()
    ));
    let backend = GrpcBackend::start().expect("grpc backend");
    let agent = common::start_agent(&secrets, 7, &node, backend.address, 4, None);
    common::wait_for_idle_tunnels(&node, 2.0);
    FedNode {
        node,
        _agent: agent,
        _backend: backend,
        _token_dir: launcher_dir,
        _secrets: secrets,
    }
}

/// Deleting agent 7 closes its tunnels on the node, which then refuses it.
fn delete_the_agent(cp: &ControlPlane, node: &SluiceProcess) {
    let deleted = cp.kubectl(&["delete", "agent", "agent-7"], None);
    assert!(deleted.status.success(), "{deleted:?}");
    assert!(
        wait_until(Duration::from_secs(5), || common::metric(
            node,
            "sluice_tunnel_idle_tunnels"
        ) == Some(0.0)),
        "the deleted agent's tunnels stayed open; stderr:\n{}",
        node.stderr()
    );
    // Its reconnections are refused: no tunnel comes back.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        common::metric(node, "sluice_tunnel_idle_tunnels"),
        Some(0.0)
    );
    assert!(node.stderr().contains("agent revoked"), "{}", node.stderr());
}
