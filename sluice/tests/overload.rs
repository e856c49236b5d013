//! Overload protection (issue 32, build point 6) against the real `sluice run` binary: a gateway
//! whose `RLIMIT_NOFILE` is lowered to 256 in the child is pushed towards it with idle TCP
//! connections. Past `shed_new_requests_percent` new requests get 503 `ServiceUnavailable` with
//! `Retry-After` while a watch admitted before keeps delivering events; past
//! `stop_accepting_percent` new connections wait in the backlog (the accept counter stays put);
//! when the connections close the process accepts and serves again. It never exits, and every
//! transition is in `/metrics` and in the log. The tunnel's external endpoint (UNAVAILABLE while
//! a server stream admitted before completes) and the control plane (503, watches go on) are
//! pushed the same way; a node whose memory limit is below its resident memory shows the memory
//! side.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

mod common;

use common::{agents_yaml, client_args, start_agent, wait_for_idle_tunnels, Secrets, BIN};
use test_support::{
    gateway_curl, http_get, on_both_drivers, run_on_driver, spawn_tunnel_client, tunnel_client,
    upstream_cluster_yaml, wait_until, write_clusters_dir, ApiServer, Certificates, ClientCert,
    ControlPlane, CurlWatch, GrpcBackend, SluiceLauncher, SluiceProcess, HEALTH_CHECK_FAST,
};
const HOST: &str = "kube.sluice.test";
/// The child's descriptor limit: low enough that a test reaches it with a few hundred idle
/// connections, high enough for the gateway's own descriptors (rings, listeners, upstreams).
const NOFILE: u64 = 256;

// The accept loops and the gateway's request path are driver code: every case runs on both.
on_both_drivers!(
    a_gateway_near_its_descriptor_limit_sheds_then_stops_accepting_then_recovers,
    a_node_near_its_descriptor_limit_sheds_new_calls_while_a_stream_admitted_before_completes,
    a_node_over_its_memory_limit_is_unready_and_serves_nothing_new_but_keeps_running,
);

/// Lowers the child's `RLIMIT_NOFILE` to [`NOFILE`] before it runs.
fn limit_descriptors(launcher: &mut SluiceLauncher) {
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        launcher.command_mut().pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: NOFILE,
                rlim_max: NOFILE,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn metric(process: &SluiceProcess, series: &str) -> f64 {
    let text = http_get(process.address("admin"), "/metrics").unwrap().body;
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
}

fn state(process: &SluiceProcess, action: &str) -> f64 {
    metric(
        process,
        &format!("sluice_overload_state{{action=\"{action}\"}}"),
    )
}

/// Opens idle connections to `listener` (in batches) until `action` is active; panics past the
/// limit.
fn push_until(process: &SluiceProcess, listener: &str, action: &str, idle: &mut Vec<TcpStream>) {
    let address = process.address(listener);
    while state(process, action) == 0.0 {
        assert!(
            idle.len() < NOFILE as usize,
            "{} idle connections and {action} still off",
            idle.len()
        );
        for _ in 0..4 {
            idle.push(TcpStream::connect(address).unwrap());
        }
        wait_until(Duration::from_millis(200), || state(process, action) == 1.0);
    }
}

struct Gateway {
    certs: Certificates,
    server: ApiServer,
    process: SluiceProcess,
    alice: ClientCert,
    _identity: ClientCert,
}

fn start(driver: &str) -> Gateway {
    let certs = Certificates::generate(&[HOST]).unwrap();
    let identity = certs.client("sluice-gateway", &[]).unwrap();
    let server = ApiServer::start_with(test_support::apiserver_options(&certs)).unwrap();
    let mut launcher = SluiceLauncher::new(BIN).unwrap();
    let pool = "  connectionPool: {maxConnectionsPerServer: 2}\n";
    let rest = format!("{HEALTH_CHECK_FAST}{pool}");
    let cluster = upstream_cluster_yaml(HOST, &[server.url()], &certs, &identity, "", &rest);
    let clusters = write_clusters_dir(launcher.dir(), &cluster);
    // Shedding first (60%), then no accepting (80%), each off again 10 points lower; idle
    // connections get a minute for their handshake so only the test decides when they go.
    let config = launcher
        .write_file(
            "gateway.yaml",
            &format!(
                "runtime:\n  workers: 2\n  drain_timeout: 2s\n  driver: {driver}\n  overload: {{interval: 50ms, max_memory_bytes: off, shed_new_requests_percent: 60, stop_accepting_percent: 80, recover_margin_percent: 10}}\nlisteners:\n  admin: {{address: '127.0.0.1:0'}}\n  gateway: {{address: '127.0.0.1:0', handshake_timeout: 60s}}\ngateway: {{clusters_dir: '{}'}}\n",
                clusters.display()
            ),
        )
        .unwrap();
    limit_descriptors(&mut launcher);
    let process = run_on_driver(launcher, &config, driver);
    let alice = certs.client("alice", &["dev-team"]).unwrap();
    Gateway {
        certs,
        server,
        process,
        alice,
        _identity: identity,
    }
}

impl Gateway {
    fn metric(&self, series: &str) -> f64 {
        metric(&self.process, series)
    }

    fn state(&self, action: &str) -> f64 {
        state(&self.process, action)
    }

    fn accepted(&self) -> f64 {
        self.metric("sluice_connections_accepted_total{listener=\"gateway\"}")
    }

    fn curl(&self, max_time: &str, path: &str) -> Command {
        let options = ["--silent", "--http2", "--max-time", max_time];
        let alice = Some(&self.alice);
        gateway_curl(&self.process, HOST, &self.certs, alice, &options, path)
    }

    /// (status, headers, body) of a GET; status 0 when curl got no answer in `max_time`.
    fn get(&self, max_time: &str, path: &str) -> (u16, String, String) {
        let output = self
            .curl(max_time, path)
            .args([
                "--dump-header",
                "/dev/stderr",
                "--write-out",
                "\n%{http_code}",
            ])
            .output()
            .expect("curl is installed");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        let headers = String::from_utf8_lossy(&output.stderr).to_ascii_lowercase();
        (code.trim().parse().unwrap_or(0), headers, body.to_string())
    }
}

/// A watch through the gateway whose lines arrive on the receiver.
fn watch(gateway: &Gateway) -> (std::process::Child, Receiver<String>) {
    let mut child = gateway
        .curl("120", "/api/v1/namespaces/default/pods?watch=true")
        .arg("--no-buffer")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (sender, received) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    (child, received)
}

fn next_event(events: &Receiver<String>, name: &str) {
    let event = events.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(event.contains(name), "{event}");
}

fn a_gateway_near_its_descriptor_limit_sheds_then_stops_accepting_then_recovers(driver: &str) {
    let gateway = start(driver);
    assert_eq!(
        gateway.metric("sluice_overload_resource{resource=\"file_descriptors\",kind=\"limit\"}"),
        NOFILE as f64
    );
    assert_eq!(gateway.get("10", "/api/v1/namespaces/default/pods").0, 200);
    assert_eq!(gateway.state("shed_new_requests"), 0.0);

    // Admitted before any pressure: a watch, seen to be delivering.
    gateway.server.create_pod("default", "before");
    let (mut watch_process, events) = watch(&gateway);
    next_event(&events, "before");

    // Past 60%: new requests are shed with the documented answer.
    let mut idle = Vec::new();
    push_until(&gateway.process, "gateway", "shed_new_requests", &mut idle);
    let (code, headers, body) = gateway.get("10", "/api/v1/namespaces/default/pods");
    assert_eq!(code, 503, "{body}");
    assert!(headers.contains("retry-after: 1"), "{headers}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "ServiceUnavailable");
    assert_eq!(status["code"], 503);
    assert_eq!(status["details"]["retryAfterSeconds"], 1);
    assert!(
        status["message"].as_str().unwrap().contains("overloaded"),
        "{body}"
    );
    assert!(gateway.metric("sluice_overload_shed_total{role=\"gateway\"}") >= 1.0);
    assert!(gateway.metric("sluice_gateway_rejected_total{reason=\"overloaded\"}") >= 1.0);
    let readyz = http_get(gateway.process.address("admin"), "/readyz").unwrap();
    assert_eq!(readyz.status, 503, "load balancers move traffic away");
    assert_eq!(
        http_get(gateway.process.address("admin"), "/healthz")
            .unwrap()
            .status,
        200
    );
    // ...while the watch admitted before keeps delivering.
    gateway.emit_event("during-shedding");
    next_event(&events, "during-shedding");

    // Past 80%: nothing more is accepted. A few more connections first take any accept each
    // worker had already posted when the state flipped.
    push_until(&gateway.process, "gateway", "stop_accepting", &mut idle);
    let address = gateway.process.address("gateway");
    for _ in 0..16 {
        idle.push(TcpStream::connect(address).unwrap());
    }
    // A check that nothing more is accepted cannot wait for an event: how many accepts the
    // workers had posted is not visible. 300 ms is many times what those take to complete on
    // loopback, so the count below is settled and a later accept would show.
    std::thread::sleep(Duration::from_millis(300));
    let accepted = gateway.accepted();
    let (code, _, _) = gateway.get("3", "/api/v1/namespaces/default/pods");
    assert_eq!(
        code, 0,
        "a connection made while not accepting is not served"
    );
    assert_eq!(gateway.accepted(), accepted, "no connection was accepted");

    // Pressure falls: both actions turn off, new connections are accepted and served.
    drop(idle);
    assert!(
        wait_until(Duration::from_secs(10), || gateway.state("stop_accepting")
            == 0.0
            && gateway.state("shed_new_requests") == 0.0),
        "overload did not clear"
    );
    assert!(wait_until(Duration::from_secs(10), || gateway
        .get("10", "/api/v1/namespaces/default/pods")
        .0
        == 200));
    assert_eq!(
        http_get(gateway.process.address("admin"), "/readyz")
            .unwrap()
            .status,
        200
    );
    gateway.emit_event("after");
    next_event(&events, "after");

    for action in ["stop_accepting", "shed_new_requests"] {
        for to in ["active", "inactive"] {
            let series =
                format!("sluice_overload_transitions_total{{action=\"{action}\",to=\"{to}\"}}");
            assert!(gateway.metric(&series) >= 1.0, "{series}");
        }
    }
    let log = gateway.process.stderr();
    for line in ["overload action on", "overload action off"] {
        assert!(log.contains(line), "{line:?} not logged:\n{log}");
    }
    assert!(
        log.contains("stop_accepting") && log.contains("open_fds"),
        "{log}"
    );
    let _ = watch_process.kill();
    let _ = watch_process.wait();
}

impl Gateway {
    /// A new pod: the simulator sends its ADDED event to every watch.
    fn emit_event(&self, name: &str) {
        self.server.create_pod("default", name);
    }
}

fn a_node_near_its_descriptor_limit_sheds_new_calls_while_a_stream_admitted_before_completes(
    driver: &str,
) {
    let secrets = Secrets::on(driver);
    let backend = GrpcBackend::start().unwrap();
    let mut launcher = SluiceLauncher::new(BIN).unwrap();
    let config = launcher
        .write_file(
            "node.yaml",
            &format!(
                "runtime:\n  workers: 2\n  drain_timeout: 2s\n  driver: {driver}\n  overload: {{interval: 50ms, max_memory_bytes: off, shed_new_requests_percent: 60, stop_accepting_percent: 90, recover_margin_percent: 10}}\nlisteners:\n  admin: {{address: '127.0.0.1:0'}}\n  agent: {{address: '127.0.0.1:0'}}\n  external: {{address: '127.0.0.1:0', handshake_timeout: 60s}}\ntunnel:\n  node_name: overload-node\n  max_wait: 5s\n  agents:\n{agents}  jwt: {{secret_file: '{secret}'}}\n",
                agents = agents_yaml(&secrets),
                secret = secrets.jwt_secret.display(),
            ),
        )
        .unwrap();
    limit_descriptors(&mut launcher);
    let node = run_on_driver(launcher, &config, driver);
    let _agent = start_agent(&secrets, 7, &node, backend.address, 8, None);
    wait_for_idle_tunnels(&node, 2.0);
    let args = client_args(&node, &secrets, 7);
    assert_eq!(tunnel_client("unary", &args)["code"], "OK");

    // Admitted before any pressure: a stream of 400 messages 50 ms apart (20 s).
    let mut stream_args = args.clone();
    stream_args.extend(["--stream", "400:10:50"].map(String::from));
    let mut stream = spawn_tunnel_client("slow-stream", &stream_args);
    let mut lines = BufReader::new(stream.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains("streaming"), "{first}");

    // Past 60%: a new call is UNAVAILABLE with a message saying why.
    let mut idle = Vec::new();
    push_until(&node, "external", "shed_new_requests", &mut idle);
    let shed = tunnel_client("unary", &args);
    assert_eq!(shed["code"], "UNAVAILABLE", "{shed}");
    assert!(
        shed["details"].as_str().unwrap().contains("overloaded"),
        "{shed}"
    );
    assert!(metric(&node, "sluice_overload_shed_total{role=\"tunnel\"}") >= 1.0);
    assert!(
        stream.try_wait().unwrap().is_none(),
        "the stream admitted before must still be running while calls are shed"
    );

    // Pressure falls: calls are served again, and the stream completes whole.
    drop(idle);
    assert!(
        wait_until(Duration::from_secs(10), || state(
            &node,
            "shed_new_requests"
        ) == 0.0),
        "overload did not clear"
    );
    assert_eq!(tunnel_client("unary", &args)["code"], "OK");
    let last = lines.last().unwrap().unwrap();
    let done: serde_json::Value = serde_json::from_str(&last).unwrap();
    assert_eq!(done["code"], "OK", "{done}");
    assert_eq!(done["received"], 400, "{done}");
    let _ = stream.wait();
}

/// The control plane runs on tokio, not on the data plane's monoio drivers: one case. Its
/// `/metrics` is on the API port, so while it does not accept the log says so instead.
#[test]
fn a_control_plane_near_its_descriptor_limit_sheds_then_stops_accepting_then_recovers() {
    const AGENTS: &str = "/apis/tunnel.sluice.dev/v1alpha1/agents";
    let agent = |name: &str, id: u32| {
        serde_json::json!({"apiVersion": "tunnel.sluice.dev/v1alpha1", "kind": "Agent",
            "metadata": {"name": name}, "spec": {"id": id, "tokenSha256": "0".repeat(64)}})
        .to_string()
    };
    // `ControlPlane` starts a binary by path: a wrapper lowers the descriptor limit first.
    let dir = tempfile::tempdir().unwrap();
    let wrapper = dir.path().join("sluice-nofile");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nulimit -n {NOFILE} || exit 1\nexec '{BIN}' \"$@\"\n"),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let cp = ControlPlane::start(
        wrapper.to_str().unwrap(),
        &[
            "--overload-interval=50ms",
            "--overload-max-memory-bytes=off",
            "--overload-shed-new-requests-percent=60",
            "--overload-stop-accepting-percent=80",
            "--overload-recover-margin-percent=10",
            "--handshake-timeout=60s",
            "--max-unauthenticated-connections-per-address=1000",
        ],
    )
    .unwrap();
    let cp_metric = |series: &str| -> f64 {
        let (code, text) = cp.curl("GET", "/metrics", None);
        assert_eq!(code, 200, "{text}");
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
    };
    let cp_state =
        |action: &str| cp_metric(&format!("sluice_overload_state{{action=\"{action}\"}}"));
    let logged_on = |action: &str| {
        cp.process.stderr().lines().any(|line| {
            line.contains("overload action on") && line.contains(&format!("\"{action}\""))
        })
    };
    let (code, body) = cp.curl("POST", AGENTS, Some(&agent("agent-1", 1)));
    assert_eq!(code, 201, "{body}");
    // Admitted before any pressure: a watch.
    let watch = CurlWatch::start(&cp, &cp.admin_token(), &format!("{AGENTS}?watch=1")).unwrap();
    let first = watch.next_event(Duration::from_secs(10)).unwrap();
    assert_eq!(first["object"]["metadata"]["name"], "agent-1", "{first}");

    // Past 60%: new requests get 503 ServiceUnavailable with Retry-After.
    let mut idle = Vec::new();
    while cp_state("shed_new_requests") == 0.0 {
        assert!(
            idle.len() < NOFILE as usize,
            "{} idle connections",
            idle.len()
        );
        for _ in 0..4 {
            idle.push(TcpStream::connect(cp.address).unwrap());
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    let output = Command::new("curl")
        .args(["--silent", "--max-time", "10", "--cacert"])
        .arg(cp.ca_file())
        .args(["-H", &format!("Authorization: Bearer {}", cp.admin_token())])
        .args(["--dump-header", "/dev/stderr"])
        .arg(format!("{}{AGENTS}", cp.url()))
        .output()
        .unwrap();
    let headers = String::from_utf8_lossy(&output.stderr).to_ascii_lowercase();
    let body = String::from_utf8_lossy(&output.stdout);
    assert!(
        headers.starts_with("http/2 503") || headers.starts_with("http/1.1 503"),
        "{headers}"
    );
    assert!(headers.contains("retry-after: 1"), "{headers}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["reason"], "ServiceUnavailable", "{body}");
    assert!(
        status["message"].as_str().unwrap().contains("overloaded"),
        "{body}"
    );
    assert_eq!(cp.curl("GET", "/readyz", None).0, 503);
    assert_eq!(cp.curl("GET", "/healthz", None).0, 200);
    assert!(cp_metric("sluice_overload_shed_total{role=\"apiserver\"}") >= 1.0);

    // Past 80%: nothing more is accepted (the log says so; /metrics is on the same port).
    let address = cp.address;
    assert!(
        wait_until(Duration::from_secs(20), || {
            if !logged_on("stop_accepting") {
                for _ in 0..4 {
                    idle.push(TcpStream::connect(address).unwrap());
                }
            }
            logged_on("stop_accepting")
        }),
        "stop_accepting never turned on with {} idle connections",
        idle.len()
    );
    // tokio's accept loop checks the state before each accept: one more connection takes the
    // accept already waiting when the state flipped.
    idle.push(TcpStream::connect(address).unwrap());
    // A check that nothing more is served cannot wait for an event: 300 ms is many times what
    // the waiting accept takes to complete, so the next connection meets the state as it is.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        cp.curl("GET", AGENTS, None).0,
        0,
        "a connection made while not accepting is not served"
    );

    // Pressure falls: accepting and serving again; the watch admitted before is still open.
    drop(idle);
    assert!(wait_until(Duration::from_secs(20), || cp
        .curl("GET", "/readyz", None)
        .0
        == 200));
    assert_eq!(cp_state("stop_accepting"), 0.0);
    assert_eq!(cp_state("shed_new_requests"), 0.0);
    let (code, body) = cp.curl("POST", AGENTS, Some(&agent("agent-2", 2)));
    assert_eq!(code, 201, "{body}");
    let second = watch.next_event(Duration::from_secs(10)).unwrap();
    assert_eq!(second["object"]["metadata"]["name"], "agent-2", "{second}");
    for action in ["stop_accepting", "shed_new_requests"] {
        for to in ["active", "inactive"] {
            let series =
                format!("sluice_overload_transitions_total{{action=\"{action}\",to=\"{to}\"}}");
            assert!(cp_metric(&series) >= 1.0, "{series}");
        }
    }
    assert!(cp.process.stderr().contains("overload action off"));
}

/// The memory side of the monitor in the real binary: a node whose `max_memory_bytes` (16 MiB,
/// the least the config allows) is below its resident memory from the start reports the figures,
/// turns both actions on, answers `/readyz` 503 and leaves a new connection unserved, and keeps
/// running (the admin endpoint answers throughout).
fn a_node_over_its_memory_limit_is_unready_and_serves_nothing_new_but_keeps_running(driver: &str) {
    let secrets = Secrets::on(driver);
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let config = launcher
        .write_file(
            "node.yaml",
            &format!(
                "runtime:\n  workers: 2\n  drain_timeout: 2s\n  driver: {driver}\n  overload: {{interval: 50ms, max_memory_bytes: 16777216}}\nlisteners:\n  admin: {{address: '127.0.0.1:0'}}\n  agent: {{address: '127.0.0.1:0'}}\n  external: {{address: '127.0.0.1:0'}}\ntunnel:\n  node_name: memory-node\n  agents:\n{agents}  jwt: {{secret_file: '{secret}'}}\n",
                agents = agents_yaml(&secrets),
                secret = secrets.jwt_secret.display(),
            ),
        )
        .unwrap();
    let node = run_on_driver(launcher, &config, driver);
    assert!(wait_until(Duration::from_secs(5), || state(
        &node,
        "shed_new_requests"
    ) == 1.0));
    assert_eq!(state(&node, "stop_accepting"), 1.0);
    let used = metric(
        &node,
        "sluice_overload_resource{resource=\"memory_bytes\",kind=\"used\"}",
    );
    let limit = metric(
        &node,
        "sluice_overload_resource{resource=\"memory_bytes\",kind=\"limit\"}",
    );
    assert_eq!(limit, 16_777_216.0);
    assert!(used > limit, "resident {used} bytes, limit {limit}");
    let readyz = http_get(node.address("admin"), "/readyz").unwrap();
    assert_eq!(readyz.status, 503);
    assert!(readyz.body.contains("overloaded"), "{}", readyz.body);
    // A new connection waits in the backlog: the node never sends its SETTINGS.
    let mut client = TcpStream::connect(node.address("external")).unwrap();
    client
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let mut buffer = [0u8; 64];
    assert!(
        client.read(&mut buffer).is_err(),
        "a connection was served while not accepting"
    );
    let log = node.stderr();
    assert!(
        log.contains("overload action on") && log.contains("rss_bytes"),
        "{log}"
    );
    assert_eq!(
        http_get(node.address("admin"), "/healthz").unwrap().status,
        200
    );
}
