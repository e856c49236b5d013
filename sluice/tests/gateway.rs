//! The Kubernetes API gateway end to end: the `sluice` binary in front of apiserver simulators
//! (real HTTP/2 + TLS, see test-support), driven by kubectl, curl and h2load.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use test_support::{
    wait_until, ApiServer, ApiServerOptions, Certificates, ClientCert, SluiceLauncher,
    SluiceProcess, SubjectAccessRule, TokenUser,
};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
/// The cluster's name: clients reach it with this TLS server name.
const HOST: &str = "kube.sluice.test";

struct Gateway {
    certs: Certificates,
    servers: Vec<ApiServer>,
    clusters_dir: PathBuf,
    process: SluiceProcess,
    alice: ClientCert,
}

/// The cluster YAML for `servers`, with `spec_extra` appended under `spec:`.
fn cluster_yaml(
    certs: &Certificates,
    gateway: &ClientCert,
    servers: &[ApiServer],
    spec_extra: &str,
) -> String {
    let endpoints: String = servers
        .iter()
        .map(|server| format!("  - endpoint: {}\n", server.url()))
        .collect();
    format!(
        "apiVersion: proxy.sluice.dev/v1alpha1\nkind: UpstreamCluster\nmetadata:\n  name: {HOST}\nspec:\n  servers:\n{endpoints}  clientConfig:\n    certFile: {gw_cert}\n    keyFile: {gw_key}\n    caFile: {ca}\n  secureServing:\n    certFile: {cert}\n    keyFile: {key}\n    clientCAFile: {ca}\n    extraHostnames: ['127.0.0.1']\n  healthCheck: {{interval: 200ms, timeout: 1s}}\n  connectionPool: {{maxConnectionsPerServer: 2}}\n{spec_extra}",
        gw_cert = gateway.cert.display(),
        gw_key = gateway.key.display(),
        ca = certs.ca_cert.display(),
        cert = certs.server_cert.display(),
        key = certs.server_key.display(),
    )
}

fn start(servers: usize, spec_extra: &str) -> Gateway {
    let certs = Certificates::generate(&[HOST]).unwrap();
    let gateway_identity = certs.client("sluice-gateway", &[]).unwrap();
    let servers: Vec<ApiServer> = (0..servers)
        .map(|_| ApiServer::start_with(ApiServerOptions::new(&certs)).unwrap())
        .collect();
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let clusters_dir = launcher.dir().join("clusters");
    std::fs::create_dir_all(&clusters_dir).unwrap();
    std::fs::write(
        clusters_dir.join("cluster.yaml"),
        cluster_yaml(&certs, &gateway_identity, &servers, spec_extra),
    )
    .unwrap();
    let config = launcher
        .write_file(
            "gateway.yaml",
            &format!(
                "runtime: {{workers: 2, drain_timeout: 2s}}\nlisteners:\n  admin: {{address: '127.0.0.1:0'}}\n  gateway: {{address: '127.0.0.1:0'}}\ngateway: {{clusters_dir: '{}', reload_interval: 200ms}}\n",
                clusters_dir.display()
            ),
        )
        .unwrap();
    let process = launcher
        .arg("run")
        .arg("--config")
        .arg(config)
        .spawn()
        .expect("gateway starts");
    let alice = certs.client("alice", &["dev-team", "qa"]).unwrap();
    Gateway {
        certs,
        servers,
        clusters_dir,
        process,
        alice,
    }
}

impl Gateway {
    fn url(&self) -> String {
        format!("https://{}", self.process.address("gateway"))
    }

    /// A kubeconfig for the gateway, with a client certificate or a bearer token.
    fn kubeconfig(&self, name: &str, user: &str) -> PathBuf {
        let path = self.certs.dir().join(format!("kubeconfig-{name}"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: gw\n  cluster:\n    server: {}\n    certificate-authority: {}\n    tls-server-name: {HOST}\nusers:\n- name: u\n  user:\n{user}contexts:\n- name: gw\n  context: {{cluster: gw, user: u, namespace: default}}\ncurrent-context: gw\n",
                self.url(),
                self.certs.ca_cert.display(),
            ),
        )
        .unwrap();
        path
    }

    fn alice_kubeconfig(&self) -> PathBuf {
        self.kubeconfig(
            "alice",
            &format!(
                "    client-certificate: {}\n    client-key: {}\n",
                self.alice.cert.display(),
                self.alice.key.display()
            ),
        )
    }

    fn token_kubeconfig(&self, token: &str) -> PathBuf {
        self.kubeconfig("token", &format!("    token: {token}\n"))
    }

    /// curl over HTTP/2 to the gateway as `HOST`; returns (HTTP status, body). A TLS failure
    /// gives status 0.
    fn curl(&self, extra: &[&str], path: &str) -> (u16, String) {
        let address = self.process.address("gateway");
        let output = Command::new("curl")
            .args(["--silent", "--http2", "--max-time", "10"])
            .arg("--cacert")
            .arg(&self.certs.ca_cert)
            .args(["--resolve", &format!("{HOST}:{}:127.0.0.1", address.port())])
            .args(["--write-out", "\n%{http_code}"])
            .args(extra)
            .arg(format!("https://{HOST}:{}{path}", address.port()))
            .output()
            .expect("curl is installed");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    fn alice_curl(&self, extra: &[&str], path: &str) -> (u16, String) {
        let mut args = vec![
            "--cert".to_string(),
            self.alice.cert.display().to_string(),
            "--key".to_string(),
            self.alice.key.display().to_string(),
        ];
        args.extend(extra.iter().map(|arg| arg.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.curl(&args, path)
    }

    fn upstream_requests(&self) -> usize {
        self.servers
            .iter()
            .map(|server| server.requests().len())
            .sum()
    }
}

fn kubectl(kubeconfig: &PathBuf, args: &[&str]) -> Output {
    Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--request-timeout", "10s"])
        .args(args)
        .output()
        .expect("kubectl is installed")
}

fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "kubectl failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn kubectl_with_a_client_certificate_gets_creates_and_watches_as_itself() {
    let gateway = start(1, "");
    let server = &gateway.servers[0];
    server.create_pod("default", "web-1");
    let kubeconfig = gateway.alice_kubeconfig();

    let listed = ok(&kubectl(&kubeconfig, &["get", "pods"]));
    assert!(listed.contains("web-1"), "{listed}");
    let health = ok(&kubectl(&kubeconfig, &["get", "--raw", "/healthz"]));
    assert_eq!(health.trim(), "ok");
    let manifest = gateway.certs.dir().join("pod.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: created-1}\nspec:\n  containers: [{name: c, image: busybox}]\n",
    )
    .unwrap();
    let created = ok(&kubectl(
        &kubeconfig,
        &["create", "-f", manifest.to_str().unwrap()],
    ));
    assert!(created.contains("created-1"), "{created}");

    // A watch: events reach kubectl as the simulator emits them.
    let mut watch = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["get", "pods", "-w", "-o", "name"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (sender, received) = std::sync::mpsc::channel();
    let stdout = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    assert!(wait_until(Duration::from_secs(10), || server.watchers("pods") >= 1));
    server.emit_pod_event("MODIFIED", "default", "web-1");
    let mut seen = Vec::new();
    // The initial list names web-1 once; the event names it again.
    while let Ok(line) = received.recv_timeout(Duration::from_secs(10)) {
        seen.push(line);
        if seen.iter().filter(|line| line.contains("web-1")).count() >= 2 {
            break;
        }
    }
    let _ = watch.kill();
    let stderr = watch.wait_with_output().map(|output| output.stderr).unwrap_or_default();
    assert!(
        seen.iter().filter(|line| line.contains("web-1")).count() >= 2,
        "{seen:?} {}",
        String::from_utf8_lossy(&stderr)
    );

    // The apiserver saw the gateway's certificate, acting as alice with her groups, and never
    // alice's own credentials.
    let requests = server.requests();
    let pods: Vec<_> = requests
        .iter()
        .filter(|request| request.uri.contains("/pods"))
        .collect();
    assert!(pods.len() >= 3, "{requests:?}");
    for request in pods {
        assert_eq!(
            request.caller.as_ref().map(|caller| caller.name()),
            Some("sluice-gateway")
        );
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
        assert_eq!(request.authorization, None);
        assert_eq!(format!("{:?}", request.version), "HTTP/2.0");
    }
}

#[test]
fn a_bearer_token_is_reviewed_once_and_cached() {
    let gateway = start(1, "");
    let server = &gateway.servers[0];
    server.add_token("token-bob", TokenUser::new("bob", &["ops"]));
    let kubeconfig = gateway.token_kubeconfig("token-bob");
    for _ in 0..3 {
        ok(&kubectl(&kubeconfig, &["get", "pods"]));
    }
    let pods: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|request| request.uri.contains("/pods"))
        .collect();
    assert_eq!(pods.len(), 3);
    for request in &pods {
        assert_eq!(request.impersonate_user.as_deref(), Some("bob"));
        assert_eq!(request.impersonate_groups, vec!["ops"]);
        // The client's token never goes upstream.
        assert_eq!(request.authorization, None);
    }
    // One TokenReview per core at most (two workers), not one per request.
    assert!(
        (1..=2).contains(&server.token_review_calls()),
        "{}",
        server.token_review_calls()
    );

    // A rejected token: 401 Status, and nothing but the review reached the apiserver.
    let before = gateway.upstream_requests();
    let (code, body) = gateway.curl(
        &["-H", "authorization: Bearer wrong"],
        "/api/v1/namespaces/default/pods",
    );
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("\"kind\":\"Status\""), "{body}");
    let after: Vec<_> = server.requests().into_iter().skip(before).collect();
    assert!(
        after
            .iter()
            .all(|request| request.uri.contains("tokenreviews")),
        "{after:?}"
    );
}

#[test]
fn client_impersonation_needs_a_subject_access_review() {
    let gateway = start(1, "");
    let server = &gateway.servers[0];
    let (code, body) = gateway.alice_curl(
        &["-H", "Impersonate-User: carol"],
        "/api/v1/namespaces/default/pods",
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("cannot impersonate"), "{body}");
    assert!(!server
        .requests()
        .iter()
        .any(|request| request.uri.contains("/pods")));

    server.allow(SubjectAccessRule::impersonate("alice", "users", "carol"));
    // The denial above is cached briefly per core; a fresh name is checked anew, so grant a
    // second user and use it.
    server.allow(SubjectAccessRule::impersonate("alice", "users", "dave"));
    let (code, body) = gateway.alice_curl(
        &["-H", "Impersonate-User: dave"],
        "/api/v1/namespaces/default/pods",
    );
    assert_eq!(code, 200, "{body}");
    let last = server
        .requests()
        .into_iter()
        .rev()
        .find(|request| request.uri.contains("/pods"))
        .unwrap();
    assert_eq!(last.impersonate_user.as_deref(), Some("dave"));
    assert!(server.subject_access_review_calls() >= 2);
}

#[test]
fn unknown_hosts_and_untrusted_certificates_never_reach_an_apiserver() {
    let gateway = start(1, "");
    let address = gateway.process.address("gateway");
    // A TLS server name no cluster serves: the handshake is refused.
    let output = Command::new("curl")
        .args(["--silent", "--max-time", "10", "--insecure"])
        .args([
            "--resolve",
            &format!("other.example:{}:127.0.0.1", address.port()),
        ])
        .arg(format!("https://other.example:{}/api", address.port()))
        .output()
        .unwrap();
    assert!(!output.status.success());
    // A client certificate from another CA: refused in the handshake.
    let stranger_ca = Certificates::generate(&[]).unwrap();
    let stranger = stranger_ca.client("mallory", &["system:masters"]).unwrap();
    let (code, _) = gateway.curl(
        &[
            "--cert",
            stranger.cert.to_str().unwrap(),
            "--key",
            stranger.key.to_str().unwrap(),
        ],
        "/api/v1/namespaces/default/pods",
    );
    assert_eq!(code, 0, "TLS refused");
    // No credentials at all: 401.
    let (code, _) = gateway.curl(&[], "/api/v1/namespaces/default/pods");
    assert_eq!(code, 401);
    assert_eq!(
        gateway.upstream_requests(),
        gateway.servers[0]
            .requests()
            .iter()
            .filter(|request| request.uri.contains("readyz"))
            .count()
    );
    let metrics = test_support::http_get(gateway.process.address("admin"), "/metrics").unwrap();
    assert!(
        metrics
            .body
            .contains("sluice_gateway_rejected_total{reason=\"unknown_host\"} 1"),
        "{}",
        metrics.body
    );
}
