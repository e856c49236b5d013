//! The gateway in front of an apiserver that stops answering mid-stream: the simulator, the
//! gateway and the clients each in a namespace, and the gateway<->apiserver link black-holed
//! while a watch streams through it.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use test_support::{
    apiserver_options, curl_at, http_get, upstream_cluster_yaml, wait_until, write_clusters_dir,
    ApiServer, Certificates, ClientCert, Network, SluiceLauncher, SluiceProcess, HEALTH_CHECK_FAST,
};

use crate::common::BIN;

const HOST: &str = "kube.sluice.test";
const APISERVER: &str = "apiserver";
const GATEWAY: &str = "gateway";
const CLIENTS: &str = "clients";

struct GatewayRig {
    certs: Certificates,
    alice: ClientCert,
    _identity: ClientCert,
    server: ApiServer,
    gateway: SluiceProcess,
    _dir: tempfile::TempDir,
    net: Network,
}

impl GatewayRig {
    /// Keepalive PINGs every 1 s with a 1 s timeout, health checks every 200 ms with a 1 s
    /// timeout: the settings a partition test can wait out in seconds.
    fn start() -> Self {
        let net = Network::new(&[APISERVER, GATEWAY, CLIENTS]).unwrap();
        let apiserver_ip = net.host(APISERVER).ip;
        let certs = Certificates::generate(&[HOST, &apiserver_ip.to_string()]).unwrap();
        let identity = certs.client("sluice-gateway", &[]).unwrap();
        let options = apiserver_options(&certs).bind(apiserver_ip.into());
        let server = net
            .host(APISERVER)
            .run(move || ApiServer::start_with(options).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let pool = "  connectionPool: {maxConnectionsPerServer: 2, keepaliveInterval: 1s, keepaliveTimeout: 1s}\n";
        let rest = format!("{HEALTH_CHECK_FAST}{pool}");
        let urls = [server.url()];
        let cluster = upstream_cluster_yaml(HOST, &urls, &certs, &identity, "", &rest);
        let clusters_dir = write_clusters_dir(dir.path(), &cluster);
        let ip = net.host(GATEWAY).ip;
        let launcher = SluiceLauncher::new(BIN).unwrap();
        let config = launcher
            .write_file(
                "gateway.yaml",
                &format!(
                    "runtime: {{workers: 2, drain_timeout: 2s}}\nlisteners:\n  admin: {{address: '{ip}:0'}}\n  gateway: {{address: '{ip}:0'}}\ngateway: {{clusters_dir: '{}', reload_interval: 1s}}\n",
                    clusters_dir.display()
                ),
            )
            .unwrap();
        let gateway = net.host(GATEWAY).run(move || {
            launcher
                .arg("run")
                .arg("--config")
                .arg(config)
                .spawn()
                .expect("gateway starts")
        });
        let alice = certs.client("alice", &["dev-team"]).unwrap();
        Self {
            certs,
            alice,
            _identity: identity,
            server,
            gateway,
            _dir: dir,
            net,
        }
    }

    /// curl as alice over HTTP/2 to `HOST`, run in the clients' namespace.
    fn curl_command(&self, path: &str, max_time: &str) -> Command {
        let address = self.gateway.address("gateway");
        let options = [
            "--silent",
            "--show-error",
            "--http2",
            "--max-time",
            max_time,
        ];
        let (ca, alice) = (&self.certs.ca_cert, Some(&self.alice));
        let mut command = curl_at(address, HOST, ca, alice, &options, path);
        command
            .args(["--write-out", "\n%{http_code}"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }

    /// A GET through the gateway: status and body.
    fn get(&self, path: &str) -> (u16, String) {
        let mut command = self.curl_command(path, "10");
        let output = self
            .net
            .host(CLIENTS)
            .run(move || command.output().expect("curl runs"));
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    fn spawn_watch(&self, path: &str) -> Child {
        let mut command = self.curl_command(path, "120");
        command.arg("-N");
        self.net
            .host(CLIENTS)
            .run(move || command.spawn().expect("curl runs"))
    }

    /// `sluice_gateway_upstream_healthy` of the one server (None before the first check).
    fn healthy(&self) -> Option<bool> {
        let admin = self.gateway.address("admin");
        let text = self
            .net
            .host(CLIENTS)
            .run(move || http_get(admin, "/metrics").map(|response| response.body))
            .ok()?;
        let series = format!(
            "sluice_gateway_upstream_healthy{{cluster=\"{HOST}\",server=\"{}\"}} ",
            self.server.url()
        );
        text.lines()
            .find_map(|line| line.strip_prefix(&series))
            .map(|value| value.trim() == "1")
    }
}

/// The watch's upstream goes silent (black-holed link) mid-stream: the gateway's keepalive PING
/// goes unanswered, the upstream connection is dropped and the client's watch ends (it re-lists
/// and watches again, as client-go does) instead of hanging; health checks mark the server
/// down, so new requests get 503 with a Kubernetes Status at once; when the link returns the
/// server is healthy again and requests succeed. The times are printed.
#[test]
fn an_apiserver_that_stops_answering_mid_watch_ends_the_watch_and_leaves_rotation() {
    let rig = GatewayRig::start();
    assert!(
        wait_until(Duration::from_secs(15), || rig.healthy() == Some(true)),
        "the apiserver never became healthy: {}",
        rig.gateway.stderr()
    );
    let pods = "/api/v1/namespaces/default/pods";
    let (code, body) = rig.get(pods);
    assert_eq!(code, 200, "{body}");
    let watch = rig.spawn_watch(&format!("{pods}?watch=1"));
    assert!(
        wait_until(Duration::from_secs(10), || rig.server.watchers("pods") >= 1),
        "the watch never reached the apiserver"
    );
    rig.server.create_pod("default", "before-the-cut");

    let cut = Instant::now();
    rig.net.cut(GATEWAY, APISERVER).unwrap();
    // The watch ends by itself: curl exits (whatever the status) long before its 120 s limit.
    let output = watch.wait_with_output().unwrap();
    let watch_ended = cut.elapsed();
    let streamed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        streamed.contains("before-the-cut"),
        "the event before the cut was streamed: {streamed}"
    );
    assert!(
        wait_until(Duration::from_secs(15), || rig.healthy() == Some(false)),
        "the silent apiserver stayed in rotation"
    );
    let marked_down = cut.elapsed();
    let asked = Instant::now();
    let (code, body) = rig.get(pods);
    let refused_in = asked.elapsed();
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("\"kind\":\"Status\""), "{body}");

    rig.net.heal(GATEWAY, APISERVER).unwrap();
    let healed = Instant::now();
    let mut last = (0, String::new());
    assert!(
        wait_until(Duration::from_secs(20), || {
            last = rig.get(pods);
            last.0 == 200
        }),
        "requests never succeeded again after the link returned: last {last:?}, healthy {:?}; gateway log:\n{}",
        rig.healthy(),
        rig.gateway.stderr()
    );
    let recovered = healed.elapsed();
    eprintln!(
        "silent apiserver: watch ended {:.2} s after the cut (curl said {:?}); marked down after {:.2} s; \
         503 answered in {:.3} s; requests succeed {:.2} s after the link returned",
        watch_ended.as_secs_f64(),
        String::from_utf8_lossy(&output.stderr).trim(),
        marked_down.as_secs_f64(),
        refused_in.as_secs_f64(),
        recovered.as_secs_f64(),
    );
    // Keepalive interval + timeout (2 s) and the health checker's timeout, with room for a
    // loaded machine; nothing near the 120 s the client would otherwise wait.
    assert!(watch_ended < Duration::from_secs(15), "{watch_ended:?}");
    assert!(refused_in < Duration::from_secs(3), "{refused_in:?}");
    assert!(!rig.gateway.stderr().contains("panicked"));
}
