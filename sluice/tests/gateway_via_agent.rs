//! A cluster behind NAT, end to end with real processes: kubectl -> `sluice run` (gateway and
//! tunnel node in one process) -> the agent's reverse tunnel -> `sluice agent` with a
//! `kubernetes_api` section -> the apiserver simulator, which only the agent can reach. The
//! simulator must see the user the gateway authenticated as Impersonate-* headers and the
//! agent's own credential, never the client's.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "via_agent/shared.rs"]
mod shared;
use shared::{lines_of, metric, ok, sha256_hex, write, AGENT_SA_TOKEN, AGENT_TOKEN};

use test_support::{
    apiserver_options, assert_driver, on_both_drivers, wait_until, ApiServer, Caller, Certificates,
    ClientCert, Ed25519Keys, SluiceLauncher, SluiceProcess, SubjectAccessRule, TokenUser,
};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const HOST: &str = "nat.sluice.test";
const AGENT: i64 = 7;

on_both_drivers!(
    kubectl_reaches_a_cluster_behind_nat_as_its_user_through_the_agent,
    an_agent_that_leaves_ends_watches_and_requests_wait_then_get_503_naming_it,
    exec_upgrades_go_through_the_tunnel_and_carry_bytes_both_ways_as_the_user,
    a_watch_its_client_leaves_frees_the_agents_slot,
    the_python_kubernetes_client_lists_and_watches_through_the_agent,
);

struct Rig {
    dir: tempfile::TempDir,
    certs: Certificates,
    apiserver: ApiServer,
    node: SluiceProcess,
    agent: Option<SluiceProcess>,
    driver: String,
    alice: ClientCert,
    _gateway_identity: ClientCert,
}

impl Rig {
    fn start(driver: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let certs = Certificates::generate(&[HOST]).unwrap();
        let gateway_identity = certs.client("sluice-gateway", &[]).unwrap();
        let apiserver = ApiServer::start_with(
            apiserver_options(&certs).caller_token(AGENT_SA_TOKEN, "agent-7"),
        )
        .unwrap();
        let keys = Ed25519Keys::generate().unwrap();
        let signing_key = write(dir.path(), "gateway-signing.pem", &keys.private_pem);
        write(dir.path(), "gateway-signing.pub.pem", &keys.public_pem);
        write(
            dir.path(),
            "jwt.secret",
            "test-secret-0123456789abcdef0123456789\n",
        );
        write(dir.path(), "agent.token", AGENT_TOKEN);
        write(dir.path(), "sa.token", AGENT_SA_TOKEN);
        let clusters = dir.path().join("clusters");
        std::fs::create_dir_all(&clusters).unwrap();
        write(
            &clusters,
            "behind-nat.yaml",
            format!(
                "apiVersion: proxy.sluice.dev/v1alpha1\nkind: UpstreamCluster\nmetadata:\n  name: {HOST}\nspec:\n  servers:\n  - agent: {{id: {AGENT}}}\n  healthCheck: {{interval: 200ms, timeout: 1s}}\n  clientConfig:\n    certFile: {gw_cert}\n    keyFile: {gw_key}\n    caFile: {ca}\n  secureServing:\n    certFile: {cert}\n    keyFile: {key}\n    clientCAFile: {ca}\n    extraHostnames: ['127.0.0.1']\n",
                gw_cert = gateway_identity.cert.display(),
                gw_key = gateway_identity.key.display(),
                ca = certs.ca_cert.display(),
                cert = certs.server_cert.display(),
                key = certs.server_key.display(),
            ),
        );
        let node_yaml = format!(
            "runtime: {{workers: 2, drain_timeout: 2s, driver: {driver}}}\n\
             listeners:\n  admin: {{address: '127.0.0.1:0'}}\n  agent: {{address: '127.0.0.1:0'}}\n  external: {{address: '127.0.0.1:0'}}\n  gateway: {{address: '127.0.0.1:0'}}\n\
             tunnel:\n  node_name: node-a\n  max_wait: 2s\n  agents:\n  - {{id: {AGENT}, token_sha256: '{sha}'}}\n  jwt: {{secret_file: '{jwt}'}}\n\
             gateway: {{clusters_dir: '{clusters}', agent_assertion_key_file: '{key}'}}\n",
            sha = sha256_hex(AGENT_TOKEN),
            jwt = dir.path().join("jwt.secret").display(),
            clusters = clusters.display(),
            key = signing_key.display(),
        );
        let launcher = SluiceLauncher::new(BIN).unwrap();
        let config = launcher.write_file("node.yaml", &node_yaml).unwrap();
        let node = launcher
            .arg("run")
            .arg("--config")
            .arg(config)
            .spawn()
            .expect("the node with its gateway starts");
        let metrics = test_support::http_get(node.address("admin"), "/metrics")
            .unwrap()
            .body;
        assert_driver(&metrics, driver);
        let alice = certs.client("alice", &["dev-team", "qa"]).unwrap();
        let mut rig = Self {
            dir,
            certs,
            apiserver,
            node,
            agent: None,
            driver: driver.to_string(),
            alice,
            _gateway_identity: gateway_identity,
        };
        rig.start_agent();
        rig
    }

    fn start_agent(&mut self) {
        let dir = self.dir.path();
        let yaml = format!(
            "runtime: {{workers: 1, drain_timeout: 2s, driver: {driver}}}\n\
             listeners:\n  admin: {{address: '127.0.0.1:0'}}\n\
             agent:\n  token_file: '{token}'\n  nodes: ['http://{node}']\n  forward_to: 'http://127.0.0.1:9'\n  pool: {{min_idle: 2, max: 20, grow_by: 4}}\n  reconnect: {{initial_backoff: 100ms, max_backoff: 500ms}}\n\
             \x20 kubernetes_api:\n    agent_id: {AGENT}\n    url: '{url}'\n    ca_file: '{ca}'\n    token_file: '{sa}'\n    gateway_keys: ['{public}']\n",
            driver = self.driver,
            token = dir.join("agent.token").display(),
            node = self.node.address("agent"),
            url = self.apiserver.url(),
            ca = self.certs.ca_cert.display(),
            sa = dir.join("sa.token").display(),
            public = dir.join("gateway-signing.pub.pem").display(),
        );
        let launcher = SluiceLauncher::new(BIN).unwrap();
        let config = launcher.write_file("agent.yaml", &yaml).unwrap();
        let agent = launcher
            .arg("agent")
            .arg("--config")
            .arg(config)
            .spawn()
            .expect("the agent starts");
        self.agent = Some(agent);
        let idle = "sluice_tunnel_idle_tunnels";
        assert!(
            wait_until(Duration::from_secs(10), || metric(&self.node, idle) >= 1.0),
            "the agent's tunnels reach the node"
        );
    }

    fn kubeconfig(&self) -> PathBuf {
        write(
            self.dir.path(),
            "alice.kubeconfig",
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: nat\n  cluster:\n    server: https://{}\n    certificate-authority: {}\n    tls-server-name: {HOST}\nusers:\n- name: alice\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: nat\n  context: {{cluster: nat, user: alice, namespace: default}}\ncurrent-context: nat\n",
                self.node.address("gateway"),
                self.certs.ca_cert.display(),
                self.alice.cert.display(),
                self.alice.key.display(),
            ),
        )
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(["--request-timeout", "10s"])
            .args(args)
            .output()
            .expect("kubectl is installed")
    }

    /// curl as alice to the gateway by the cluster's name; the URL is the caller's.
    fn curl(&self, options: &[&str]) -> Command {
        let port = self.node.address("gateway").port();
        let mut command = Command::new("curl");
        command
            .args(options)
            .arg("--cacert")
            .arg(&self.certs.ca_cert)
            .arg("--cert")
            .arg(&self.alice.cert)
            .arg("--key")
            .arg(&self.alice.key)
            .args(["--resolve", &format!("{HOST}:{port}:127.0.0.1")]);
        command
    }

    /// A GET as alice: (HTTP status, body).
    fn get(&self, path: &str) -> (u16, String) {
        let port = self.node.address("gateway").port();
        let output = self
            .curl(&[
                "--silent",
                "--http2",
                "--max-time",
                "10",
                "--write-out",
                "\n%{http_code}",
            ])
            .arg(format!("https://{HOST}:{port}{path}"))
            .output()
            .unwrap();
        test_support::code_and_body(&output)
    }

    /// What the simulator saw of pod requests (the health checker never calls it: the agent
    /// server's health is the agent's connection).
    fn pod_requests(&self) -> Vec<test_support::RecordedRequest> {
        self.apiserver
            .requests()
            .into_iter()
            .filter(|request| request.uri.contains("/pods"))
            .collect()
    }
}

/// `kubectl get -w -o name` as alice; its output lines as they come.
fn watch(rig: &Rig) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(rig.kubeconfig())
        .args(["get", "pods", "-w", "-o", "name"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = lines_of(child.stdout.take().unwrap());
    (child, lines)
}

/// Creates pods until the watch reports one: an event created between kubectl's list and its
/// watch is not replayed by the simulator, so one pod alone could be missed.
fn see_an_event(rig: &Rig, lines: &std::sync::mpsc::Receiver<String>, prefix: &str) -> bool {
    for attempt in 0..10 {
        let name = format!("{prefix}-{attempt}");
        rig.apiserver.create_pod("default", &name);
        let deadline = Instant::now() + Duration::from_secs(2);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match lines.recv_timeout(left) {
                Ok(line) if line.contains(&name) => return true,
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
    false
}

fn kubectl_reaches_a_cluster_behind_nat_as_its_user_through_the_agent(driver: &str) {
    let rig = Rig::start(driver);
    rig.apiserver.create_pod("default", "web-1");

    let listed = ok(&rig.kubectl(&["get", "pods"]));
    assert!(listed.contains("web-1"), "{listed}");
    let manifest = write(
        rig.dir.path(),
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: created-1}\nspec:\n  containers: [{name: c, image: busybox}]\n",
    );
    let created = ok(&rig.kubectl(&["apply", "-f", manifest.to_str().unwrap()]));
    assert!(created.contains("created-1"), "{created}");

    let (mut child, lines) = watch(&rig);
    let first = lines.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(first.contains("pod/"), "{first}");
    assert!(
        see_an_event(&rig, &lines, "watched"),
        "watch events cross the tunnel"
    );
    let _ = child.kill();
    let _ = child.wait();

    let deleted = ok(&rig.kubectl(&["delete", "pod", "created-1", "--wait=false"]));
    assert!(deleted.contains("created-1"), "{deleted}");

    let requests = rig.pod_requests();
    assert!(requests.len() >= 4, "{requests:?}");
    for request in &requests {
        assert_eq!(
            request.impersonate_user.as_deref(),
            Some("alice"),
            "{request:?}"
        );
        assert_eq!(
            request.impersonate_groups,
            vec!["dev-team", "qa"],
            "{request:?}"
        );
        // The agent's own credential, never the client's (alice used a certificate; the
        // gateway's own identity never reaches an apiserver it cannot dial).
        assert_eq!(
            request.authorization.as_deref(),
            Some(format!("Bearer {AGENT_SA_TOKEN}").as_str())
        );
        assert_eq!(request.caller, Some(Caller::Token("agent-7".into())));
    }
    let answered = format!(
        "sluice_gateway_forwarded_total{{cluster=\"{HOST}\",server_kind=\"agent\",result=\"answered\"}}"
    );
    assert!(metric(&rig.node, &answered) >= 4.0);
    let heads = format!(
        "sluice_gateway_answer_head_seconds_count{{cluster=\"{HOST}\",server_kind=\"agent\"}}"
    );
    assert!(metric(&rig.node, &heads) >= 4.0);
    reviews_of_a_cluster_of_agents_alone_go_through_the_agent(&rig);
}

/// The cluster has agent servers only: the gateway's TokenReviews and SubjectAccessReviews go
/// through the agent too, sent by the agent as itself (no impersonation), and the requests they
/// admit go as the reviewed user.
fn reviews_of_a_cluster_of_agents_alone_go_through_the_agent(rig: &Rig) {
    rig.apiserver
        .add_token("bob-token", TokenUser::new("bob", &["qa"]));
    let pods = "/api/v1/namespaces/default/pods";
    let as_bob = |token: &str| {
        let port = rig.node.address("gateway").port();
        let output = Command::new("curl")
            .args([
                "--silent",
                "--max-time",
                "10",
                "--write-out",
                "\n%{http_code}",
            ])
            .arg("--cacert")
            .arg(&rig.certs.ca_cert)
            .args(["--resolve", &format!("{HOST}:{port}:127.0.0.1")])
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .arg(format!("https://{HOST}:{port}{pods}"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap();
        (code.parse::<u16>().unwrap(), body.to_string())
    };
    let reviews = |path: &str| {
        rig.apiserver
            .requests()
            .into_iter()
            .filter(|request| request.uri.ends_with(path))
            .collect::<Vec<_>>()
    };
    let (code, body) = as_bob("bob-token");
    assert_eq!(code, 200, "{body}");
    let last = rig.pod_requests().pop().unwrap();
    assert_eq!(last.impersonate_user.as_deref(), Some("bob"), "{last:?}");
    let token_reviews = reviews("/tokenreviews");
    assert_eq!(token_reviews.len(), 1, "{token_reviews:?}");
    assert_eq!(
        token_reviews[0].caller,
        Some(Caller::Token("agent-7".into()))
    );
    assert_eq!(token_reviews[0].impersonate_user, None, "{token_reviews:?}");
    let (code, body) = as_bob("not-a-token");
    assert_eq!(code, 401, "{body}");

    // Impersonation: the SubjectAccessReview crosses the agent the same way.
    rig.apiserver
        .allow(SubjectAccessRule::impersonate("alice", "users", "dave"));
    let output = rig
        .curl(&[
            "--silent",
            "--max-time",
            "10",
            "-H",
            "Impersonate-User: dave",
        ])
        .arg(format!(
            "https://{HOST}:{}{pods}",
            rig.node.address("gateway").port()
        ))
        .output()
        .unwrap();
    assert!(output.status.success());
    let last = rig.pod_requests().pop().unwrap();
    assert_eq!(last.impersonate_user.as_deref(), Some("dave"), "{last:?}");
    let access_reviews = reviews("/subjectaccessreviews");
    assert!(!access_reviews.is_empty());
    assert!(access_reviews
        .iter()
        .all(|review| review.impersonate_user.is_none()
            && review.caller == Some(Caller::Token("agent-7".into()))));
}

fn an_agent_that_leaves_ends_watches_and_requests_wait_then_get_503_naming_it(driver: &str) {
    let mut rig = Rig::start(driver);
    rig.apiserver.create_pod("default", "web-1");
    // curl, not kubectl: client-go re-watches and retries 503s by itself, which would hide
    // how the stream ended.
    let mut curl = rig
        .curl(&["--silent", "--http2", "--no-buffer", "--max-time", "30"])
        .arg(format!(
            "https://{HOST}:{}/api/v1/namespaces/default/pods?watch=true",
            rig.node.address("gateway").port()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(curl.stdout.take().unwrap());
    assert!(see_an_event(&rig, &lines, "before"), "the watch is open");

    // The agent goes away: the watch ends cleanly (END_STREAM, as at an apiserver's watch
    // timeout, so clients watch again), and a new request waits for the agent up to
    // tunnel.max_wait (2 s) and gets a 503 Status naming it.
    drop(rig.agent.take());
    assert!(
        wait_until(Duration::from_secs(10), || curl
            .try_wait()
            .unwrap()
            .is_some()),
        "the watch ended with the agent"
    );
    assert!(
        curl.wait().unwrap().success(),
        "the watch ended cleanly, not reset"
    );
    let started = Instant::now();
    let (code, body) = rig.get("/api/v1/namespaces/default/pods");
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "waited for the agent"
    );
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("\"kind\":\"Status\""), "{body}");
    assert!(body.contains("agent 7"), "{body}");
    let refusals = "sluice_gateway_rejected_total{reason=\"agent_not_connected\"}";
    assert!(metric(&rig.node, refusals) >= 1.0);
    let per_cluster = format!(
        "sluice_gateway_forwarded_total{{cluster=\"{HOST}\",server_kind=\"agent\",result=\"agent_not_connected\"}}"
    );
    assert!(metric(&rig.node, &per_cluster) >= 1.0);

    // The agent returns: requests succeed again within a second of its tunnels arriving.
    rig.start_agent();
    let back = Instant::now();
    assert!(
        wait_until(Duration::from_secs(5), || rig
            .get("/api/v1/namespaces/default/pods")
            .0
            == 200),
        "requests succeed once the agent is back"
    );
    assert!(
        back.elapsed() < Duration::from_secs(1),
        "{:?}",
        back.elapsed()
    );
}

fn exec_upgrades_go_through_the_tunnel_and_carry_bytes_both_ways_as_the_user(driver: &str) {
    let rig = Rig::start(driver);
    rig.apiserver.create_pod("default", "web-1");
    let script = r#"
import socket, ssl, sys
port, sni, ca, cert, key, target = sys.argv[1:7]
context = ssl.create_default_context(cafile=ca)
context.load_cert_chain(cert, key)
context.set_alpn_protocols(["http/1.1"])
conn = context.wrap_socket(socket.create_connection(("127.0.0.1", int(port))), server_hostname=sni)
conn.settimeout(10)
conn.sendall(("POST " + target + " HTTP/1.1\r\nHost: " + sni
              + "\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n").encode())
head = b""
while b"\r\n\r\n" not in head:
    chunk = conn.recv(4096)
    if not chunk:
        break
    head += chunk
print(head.split(b"\r\n")[0].decode(), flush=True)
if b" 101 " in head.split(b"\r\n")[0]:
    conn.sendall(b"ping-through-exec")
    echoed = head.split(b"\r\n\r\n", 1)[1]
    while len(echoed) < 17:
        echoed += conn.recv(4096)
    print(echoed.decode(), flush=True)
else:
    # Any other answer is passed on whole and the connection closed.
    rest = head
    while True:
        chunk = conn.recv(4096)
        if not chunk:
            break
        rest += chunk
    print(rest.split(b"\r\n\r\n", 1)[1].decode(), flush=True)
"#;
    let run = |target: &str| {
        let output = Command::new(test_support::python())
            .arg("-c")
            .arg(script)
            .arg(rig.node.address("gateway").port().to_string())
            .arg(HOST)
            .arg(&rig.certs.ca_cert)
            .arg(&rig.alice.cert)
            .arg(&rig.alice.key)
            .arg(target)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let upgraded = run("/api/v1/namespaces/default/pods/web-1/exec?command=sh");
    assert_eq!(
        upgraded.lines().collect::<Vec<_>>(),
        vec!["HTTP/1.1 101 Switching Protocols", "ping-through-exec"],
        "{upgraded}"
    );
    let execs = || {
        rig.pod_requests()
            .into_iter()
            .filter(|request| request.uri.contains("/exec"))
            .collect::<Vec<_>>()
    };
    let exec = execs().pop().unwrap();
    assert_eq!(exec.impersonate_user.as_deref(), Some("alice"), "{exec:?}");
    assert_eq!(exec.impersonate_groups, vec!["dev-team", "qa"], "{exec:?}");
    assert_eq!(
        exec.authorization.as_deref(),
        Some(format!("Bearer {AGENT_SA_TOKEN}").as_str())
    );
    assert_eq!(exec.caller, Some(Caller::Token("agent-7".into())));
    assert_eq!(format!("{:?}", exec.version), "HTTP/1.1");
    // Any other answer reaches the client as it is, and nothing after it is relayed.
    let refused = run("/api/v1/namespaces/default/pods/web-1");
    assert_eq!(
        refused.lines().next(),
        Some("HTTP/1.1 405 Method Not Allowed"),
        "{refused}"
    );
    assert!(refused.contains("\"kind\":\"Status\""), "{refused}");
    assert_eq!(execs().len(), 1);

    // kubectl streams exec over WebSocket (the Kubernetes channel protocol; the default from
    // 1.31, asked for here because the simulator's version picks an older kubectl); the
    // simulator answers only that with what `echo` would print (its SPDY path echoes bytes).
    let websocket_exec = |args: &[&str]| {
        let mut command = Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(rig.kubeconfig())
            .env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "true")
            .arg("exec")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        command.spawn().unwrap()
    };
    let echo = websocket_exec(&["web-1", "--", "echo", "hello", "through", "nat"]);
    assert_eq!(ok(&echo.wait_with_output().unwrap()), "hello through nat\n");
    // stdin crosses too: `-i` sends it on channel 0 and the simulated `cat` echoes it.
    let mut cat = websocket_exec(&["-i", "web-1", "--", "cat"]);
    use std::io::Write as _;
    cat.stdin
        .take()
        .unwrap()
        .write_all(b"ping over a websocket\n")
        .unwrap();
    assert_eq!(
        ok(&cat.wait_with_output().unwrap()),
        "ping over a websocket\n"
    );
    let websocket = execs().pop().unwrap();
    assert_eq!(websocket.impersonate_user.as_deref(), Some("alice"));
    assert_eq!(websocket.caller, Some(Caller::Token("agent-7".into())));
    assert_eq!(execs().len(), 3);
}

/// A client that walks away from an idle watch must not leave the agent holding it: the reset
/// crosses the gateway's link, the node and the tunnel, and the agent's in-flight slot (its
/// `max_in_flight` bound) is free again.
fn a_watch_its_client_leaves_frees_the_agents_slot(driver: &str) {
    let rig = Rig::start(driver);
    rig.apiserver.create_pod("default", "web-1");
    let port = rig.node.address("gateway").port();
    let mut curl = rig
        .curl(&["--silent", "--http2", "--no-buffer", "--max-time", "30"])
        .arg(format!(
            "https://{HOST}:{port}/api/v1/namespaces/default/pods?watch=true"
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(curl.stdout.take().unwrap());
    assert!(see_an_event(&rig, &lines, "open"), "the watch is open");
    let agent = rig.agent.as_ref().unwrap();
    let in_flight = "sluice_agent_kube_in_flight";
    assert_eq!(metric(agent, in_flight), 1.0, "the watch holds one slot");

    // The client goes away while the watch is idle.
    curl.kill().unwrap();
    curl.wait().unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || metric(agent, in_flight) == 0.0),
        "the agent still holds the abandoned watch: {}",
        metric(agent, in_flight)
    );
}

/// The Python `kubernetes` client, unchanged, through the tunnel: it dials 127.0.0.1 without a
/// server name (the cluster lists the address) and presents alice's certificate.
fn the_python_kubernetes_client_lists_and_watches_through_the_agent(driver: &str) {
    let rig = Rig::start(driver);
    rig.apiserver.create_pod("default", "py-1");
    let kubeconfig = write(
        rig.dir.path(),
        "python.kubeconfig",
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: nat\n  cluster:\n    server: https://{}\n    certificate-authority: {}\nusers:\n- name: alice\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: nat\n  context: {{cluster: nat, user: alice}}\ncurrent-context: nat\n",
            rig.node.address("gateway"),
            rig.certs.ca_cert.display(),
            rig.alice.cert.display(),
            rig.alice.key.display(),
        ),
    );
    let mut python = Command::new(test_support::python())
        .arg(test_support::python_script("kube_list_watch.py"))
        .arg(&kubeconfig)
        .args(["default", "py-2"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(python.stdout.take().unwrap());
    let next = || lines.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(next(), "list py-1");
    assert_eq!(next(), "event ADDED py-1");
    assert!(wait_until(Duration::from_secs(10), || rig
        .apiserver
        .watchers("pods")
        == 1));
    rig.apiserver.emit_pod_event("ADDED", "default", "py-2");
    assert_eq!(next(), "event ADDED py-2");
    assert!(python.wait().unwrap().success());
    let watched = rig
        .pod_requests()
        .into_iter()
        .find(|request| request.uri.contains("watch=true"))
        .unwrap();
    assert_eq!(watched.impersonate_user.as_deref(), Some("alice"));
    assert_eq!(watched.caller, Some(Caller::Token("agent-7".into())));
}
