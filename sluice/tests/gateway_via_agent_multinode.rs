//! The gateway's agent servers beyond one node, and its checks on both server kinds, with real
//! processes (`sluice run`, `sluice agent`, redis-server, the apiserver simulator):
//! - kubectl -> node A's gateway -> A's tunnel router -> Redis says node C holds the agent ->
//!   C's private endpoint -> the agent's reverse tunnel -> the simulator, which sees the user the
//!   gateway vouched for and the agent's own credential;
//! - one table of gateway checks (a DispatchPolicy deny rule, a flow-control limit, client
//!   impersonation without a SubjectAccessReview) run against a cluster of a direct server and
//!   against one whose policies send to an agent server: each must hold the same on both.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

#[path = "via_agent/shared.rs"]
mod shared;
use shared::{lines_of, metric, ok, sha256_hex, write, AGENT_SA_TOKEN, AGENT_TOKEN};

use test_support::{
    apiserver_options, gateway_curl, on_both_drivers, wait_until, ApiServer, Caller, Certificates,
    ClientCert, Ed25519Keys, RecordedRequest, RedisServer, SluiceLauncher, SluiceProcess,
    SubjectAccessRule, HEALTH_CHECK_FAST,
};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const AGENT: u64 = 7;
/// The name the simulator records for requests carrying the agent's credential.
const AGENT_CALLER: &str = "agent-7";
/// The gateway's own client certificate's name: the caller of its direct requests.
const GATEWAY_CALLER: &str = "sluice-gateway";
/// The cluster behind node C's agent, reached through node A.
const NAT: &str = "nat.sluice.test";
/// The table's two clusters on one simulator: one dials it, one reaches it through the agent.
const DIRECT: &str = "direct.sluice.test";
const TUNNEL: &str = "tunnel.sluice.test";

on_both_drivers!(
    kubectl_through_node_a_reaches_the_agent_held_by_node_c,
    deny_rules_flow_control_and_impersonation_hold_on_direct_and_agent_servers,
);

fn spawn(command: &str, name: &str, yaml: &str) -> SluiceProcess {
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let config = launcher.write_file(name, yaml).unwrap();
    launcher
        .arg(command)
        .arg("--config")
        .arg(config)
        .spawn()
        .unwrap_or_else(|error| panic!("sluice {command} starts: {error}"))
}

/// Keys, secrets and the simulator every rig shares; files live in `dir`.
struct Base {
    dir: tempfile::TempDir,
    certs: Certificates,
    apiserver: ApiServer,
    alice: ClientCert,
    gateway_identity: ClientCert,
    driver: String,
}

impl Base {
    fn new(driver: &str, hosts: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let certs = Certificates::generate(hosts).unwrap();
        let apiserver = ApiServer::start_with(
            apiserver_options(&certs).caller_token(AGENT_SA_TOKEN, AGENT_CALLER),
        )
        .unwrap();
        let keys = Ed25519Keys::generate().unwrap();
        write(dir.path(), "gateway-signing.pem", &keys.private_pem);
        write(dir.path(), "gateway-signing.pub.pem", &keys.public_pem);
        write(
            dir.path(),
            "jwt.secret",
            "test-secret-0123456789abcdef0123456789\n",
        );
        write(
            dir.path(),
            "private.secret",
            "private-node-secret-0123456789abcdef0123\n",
        );
        write(dir.path(), "agent.token", AGENT_TOKEN);
        write(dir.path(), "sa.token", AGENT_SA_TOKEN);
        std::fs::create_dir_all(dir.path().join("clusters")).unwrap();
        Self {
            alice: certs.client("alice", &["dev-team", "qa"]).unwrap(),
            gateway_identity: certs.client(GATEWAY_CALLER, &[]).unwrap(),
            dir,
            certs,
            apiserver,
            driver: driver.to_string(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// An UpstreamCluster file named after `host`: `servers` and `rest` lines under `spec:`.
    fn cluster(&self, host: &str, servers: &str, rest: &str) {
        let yaml = format!(
            "apiVersion: proxy.sluice.dev/v1alpha1\nkind: UpstreamCluster\nmetadata:\n  name: {host}\nspec:\n  servers:\n{servers}{HEALTH_CHECK_FAST}  clientConfig:\n    certFile: {gw_cert}\n    keyFile: {gw_key}\n    caFile: {ca}\n  secureServing:\n    certFile: {cert}\n    keyFile: {key}\n    clientCAFile: {ca}\n{rest}",
            gw_cert = self.gateway_identity.cert.display(),
            gw_key = self.gateway_identity.key.display(),
            ca = self.certs.ca_cert.display(),
            cert = self.certs.server_cert.display(),
            key = self.certs.server_key.display(),
        );
        write(&self.path("clusters"), &format!("{host}.yaml"), yaml);
    }

    /// A `sluice run` tunnel node named `name` on `workers` cores; `listeners` and `extra`
    /// (top-level sections, such as `redis` and `gateway`) add to what every node has.
    fn node(
        &self,
        name: &str,
        workers: usize,
        listeners: &str,
        tunnel: &str,
        extra: &str,
    ) -> SluiceProcess {
        let yaml = format!(
            "runtime: {{workers: {workers}, drain_timeout: 2s, driver: {driver}}}\n\
             listeners:\n  admin: {{address: '127.0.0.1:0'}}\n  agent: {{address: '127.0.0.1:0'}}\n  external: {{address: '127.0.0.1:0'}}\n{listeners}\
             tunnel:\n  node_name: {name}\n  max_wait: 5s\n  agents:\n  - {{id: {AGENT}, token_sha256: '{sha}'}}\n  jwt: {{secret_file: '{jwt}'}}\n{tunnel}{extra}",
            driver = self.driver,
            sha = sha256_hex(AGENT_TOKEN),
            jwt = self.path("jwt.secret").display(),
        );
        let node = spawn("run", &format!("{name}.yaml"), &yaml);
        let metrics = test_support::http_get(node.address("admin"), "/metrics").unwrap();
        test_support::assert_driver(&metrics.body, &self.driver);
        node
    }

    /// The `gateway` section of a node that serves this base's clusters.
    fn gateway_yaml(&self) -> String {
        format!(
            "gateway: {{clusters_dir: '{}', agent_assertion_key_file: '{}'}}\n",
            self.path("clusters").display(),
            self.path("gateway-signing.pem").display(),
        )
    }

    /// `sluice agent` with a `kubernetes_api` section for the simulator, its tunnels on `node`
    /// only; returns once they are there.
    fn agent(&self, node: &SluiceProcess) -> SluiceProcess {
        let yaml = format!(
            "runtime: {{workers: 1, drain_timeout: 2s, driver: {driver}}}\n\
             listeners:\n  admin: {{address: '127.0.0.1:0'}}\n\
             agent:\n  token_file: '{token}'\n  nodes: ['http://{node}']\n  forward_to: 'http://127.0.0.1:9'\n  pool: {{min_idle: 2, max: 20, grow_by: 4}}\n  reconnect: {{initial_backoff: 100ms, max_backoff: 500ms}}\n\
             \x20 kubernetes_api:\n    agent_id: {AGENT}\n    url: '{url}'\n    ca_file: '{ca}'\n    token_file: '{sa}'\n    gateway_keys: ['{public}']\n",
            driver = self.driver,
            token = self.path("agent.token").display(),
            node = node.address("agent"),
            url = self.apiserver.url(),
            ca = self.certs.ca_cert.display(),
            sa = self.path("sa.token").display(),
            public = self.path("gateway-signing.pub.pem").display(),
        );
        let agent = spawn("agent", "agent.yaml", &yaml);
        assert!(
            wait_until(Duration::from_secs(10), || metric(
                node,
                "sluice_tunnel_idle_tunnels"
            ) >= 1.0),
            "the agent's tunnels reach its node"
        );
        agent
    }

    /// curl as alice to `host` on `gateway`'s gateway listener, `count` times `path` one after
    /// another on one HTTP/2 connection: each answer's status and its head and body.
    fn alice_curls(
        &self,
        gateway: &SluiceProcess,
        host: &str,
        extra: &[&str],
        path: &str,
        count: usize,
    ) -> Vec<(u16, String)> {
        let options = ["--silent", "--http2", "--max-time", "10", "--include"];
        let mut command = gateway_curl(
            gateway,
            host,
            &self.certs,
            Some(&self.alice),
            &options,
            path,
        );
        let url = command.get_args().last().unwrap().to_owned();
        let output = command
            .args(std::iter::repeat_n(&url, count - 1))
            .args(["--write-out", "\n@@status %{http_code}@@\n"])
            .args(extra)
            .output()
            .expect("curl is installed");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let answers: Vec<(u16, String)> = text
            .split("@@\n")
            .filter_map(|part| {
                let (answer, code) = part.rsplit_once("\n@@status ")?;
                Some((code.trim().parse().unwrap_or(0), answer.to_string()))
            })
            .collect();
        assert_eq!(answers.len(), count, "{text}");
        answers
    }

    /// What the simulator saw whose path and query contain `part`, from `caller` only.
    fn seen(&self, caller: &str, part: &str) -> Vec<RecordedRequest> {
        self.apiserver
            .requests()
            .into_iter()
            .filter(|request| request.uri.contains(part))
            .filter(|request| request.caller.as_ref().map(Caller::name) == Some(caller))
            .collect()
    }
}

/// kubectl as alice to `host` on `gateway`'s gateway listener, not yet run.
fn kubectl_command(base: &Base, gateway: &SluiceProcess, host: &str, args: &[&str]) -> Command {
    let kubeconfig = write(
        base.dir.path(),
        "alice.kubeconfig",
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{}\n    certificate-authority: {}\n    tls-server-name: {host}\nusers:\n- name: alice\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: alice, namespace: default}}\ncurrent-context: c\n",
            gateway.address("gateway"),
            base.certs.ca_cert.display(),
            base.alice.cert.display(),
            base.alice.key.display(),
        ),
    );
    let mut command = Command::new("kubectl");
    command
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    command
}

fn kubectl(base: &Base, gateway: &SluiceProcess, host: &str, args: &[&str]) -> Output {
    let mut command = kubectl_command(base, gateway, host, &["--request-timeout", "10s"]);
    command.args(args).stderr(Stdio::piped());
    command.output().expect("kubectl is installed")
}

/// Whether a line containing `wanted` comes within 10 s.
fn lines_of_until(lines: &std::sync::mpsc::Receiver<String>, wanted: &str) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(wanted) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    false
}

/// Node A (gateway and tunnel node) and node C (tunnel node), both with private endpoints and
/// sharing `redis`.
fn two_nodes(base: &Base, redis: &RedisServer) -> (SluiceProcess, SluiceProcess) {
    let redis_yaml = format!(
        "redis:\n  url: '{}'\n  key_prefix: kube\n  unregister_delay: 500ms\n",
        redis.unix_url()
    );
    let private = "  private: {address: '127.0.0.1:0'}\n";
    let private_jwt = format!(
        "  private_jwt: {{secret_file: '{}', issuer: sluice-node, audience: sluice-private}}\n",
        base.path("private.secret").display()
    );
    let listeners = format!("{private}  gateway: {{address: '127.0.0.1:0'}}\n");
    let gateway = redis_yaml.clone() + &base.gateway_yaml();
    let a = base.node("node-a", 2, &listeners, &private_jwt, &gateway);
    let c = base.node("node-c", 2, private, &private_jwt, &redis_yaml);
    (a, c)
}

/// `kubectl get pods -w` through `gateway`: once the simulator holds the watch, whether a new
/// pod's event comes out.
fn a_watch_sees_a_new_pod(base: &Base, gateway: &SluiceProcess) -> bool {
    let mut watch = kubectl_command(base, gateway, NAT, &["get", "pods", "-w", "-o", "name"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(watch.stdout.take().unwrap());
    let held = wait_until(Duration::from_secs(10), || {
        base.apiserver.watchers("pods") >= 1
    });
    assert!(held, "the watch reaches the simulator");
    base.apiserver.create_pod("default", "watched-1");
    let seen = lines_of_until(&lines, "pod/watched-1");
    let _ = watch.kill();
    let _ = watch.wait();
    seen
}

fn kubectl_through_node_a_reaches_the_agent_held_by_node_c(driver: &str) {
    let base = Base::new(driver, &[NAT]);
    base.cluster(NAT, &format!("  - agent: {{id: {AGENT}}}\n"), "");
    let redis = RedisServer::start().unwrap();
    let (a, c) = two_nodes(&base, &redis);
    let _agent = base.agent(&c);
    base.apiserver.create_pod("default", "web-1");

    let listed = ok(&kubectl(&base, &a, NAT, &["get", "pods"]));
    assert!(listed.contains("web-1"), "{listed}");
    let got = ok(&kubectl(
        &base,
        &a,
        NAT,
        &["get", "pod", "web-1", "-o", "name"],
    ));
    assert_eq!(got.trim(), "pod/web-1");
    let manifest = write(
        base.dir.path(),
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: created-1}\nspec:\n  containers: [{name: c, image: busybox}]\n",
    );
    let applied = ok(&kubectl(
        &base,
        &a,
        NAT,
        &["apply", "-f", manifest.to_str().unwrap()],
    ));
    assert!(applied.contains("created-1"), "{applied}");
    assert!(
        a_watch_sees_a_new_pod(&base, &a),
        "the watch event crossed both nodes"
    );

    let requests = base.seen(AGENT_CALLER, "/pods");
    assert!(requests.len() >= 4, "{requests:?}");
    for request in &requests {
        assert_eq!(
            request.impersonate_user.as_deref(),
            Some("alice"),
            "{request:?}"
        );
        assert_eq!(
            request.impersonate_groups,
            ["dev-team", "qa"],
            "{request:?}"
        );
        let bearer = format!("Bearer {AGENT_SA_TOKEN}");
        assert_eq!(request.authorization.as_deref(), Some(bearer.as_str()));
    }
    // Every pod request came from the agent, none from anywhere else.
    let all = base
        .apiserver
        .requests()
        .into_iter()
        .filter(|request| request.uri.contains("/pods"));
    assert_eq!(all.count(), requests.len());
    // A routed them remotely (it holds no tunnel of the agent), C carried them for A.
    assert!(metric(&a, "sluice_tunnel_routes_total{decision=\"remote\"}") >= 4.0);
    assert_eq!(
        metric(&a, "sluice_tunnel_routes_total{decision=\"local\"}"),
        0.0
    );
    assert!(metric(&c, "sluice_tunnel_private_requests_total{code=\"OK\"}") >= 4.0);
    assert!(metric(&a, &answered(NAT, "agent")) >= 4.0);
}

/// The series counting `cluster`'s requests answered by servers of `kind`.
fn answered(cluster: &str, kind: &str) -> String {
    format!(
        "sluice_gateway_forwarded_total{{cluster=\"{cluster}\",server_kind=\"{kind}\",result=\"answered\"}}"
    )
}

/// The policies both table clusters share; `subset` is where they send.
fn table_policies(subset: &str) -> String {
    format!(
        "  flowControl:\n    schemas:\n    - {{name: slow, tokenBucket: {{qps: 1, burst: 3}}}}\n  dispatchPolicies:\n  - name: configmaps\n    upstreamSubset: ['{subset}']\n    flowControlSchemaName: slow\n    rules:\n    - {{verbs: [get, list], apiGroups: ['*'], resources: [configmaps]}}\n  - name: pods-but-secret\n    upstreamSubset: ['{subset}']\n    rules:\n    - {{verbs: [get], apiGroups: ['*'], resources: [pods], resourceNames: ['-secret-pod']}}\n"
    )
}

fn deny_rules_flow_control_and_impersonation_hold_on_direct_and_agent_servers(driver: &str) {
    let base = Base::new(driver, &[DIRECT, TUNNEL]);
    let direct = format!("  - endpoint: {}\n", base.apiserver.url());
    base.cluster(DIRECT, &direct, &table_policies(&base.apiserver.url()));
    // The direct server answers the gateway's reviews; every policy sends to the agent.
    let mixed = format!("{direct}  - agent: {{id: {AGENT}}}\n");
    base.cluster(TUNNEL, &mixed, &table_policies(&format!("agent:{AGENT}")));
    // One core: the token bucket is not split between cores.
    let node = base.node(
        "node-a",
        1,
        "  gateway: {address: '127.0.0.1:0'}\n",
        "",
        &base.gateway_yaml(),
    );
    let _agent = base.agent(&node);
    base.apiserver.create_pod("default", "web-1");
    base.apiserver.create_pod("default", "secret-pod");

    // The table: every check against each kind, named by the caller the simulator sees.
    for (host, caller) in [(DIRECT, GATEWAY_CALLER), (TUNNEL, AGENT_CALLER)] {
        let kind = Kind {
            base: &base,
            node: &node,
            host,
            caller,
        };
        kind.a_deny_rule_refuses_before_the_apiserver();
        kind.a_token_bucket_answers_429_with_retry_after();
        kind.impersonation_needs_a_subject_access_review();
    }
    // Reviews went to the direct server only, as the gateway itself.
    assert!(base.apiserver.subject_access_review_calls() >= 2);
    assert!(base.seen(AGENT_CALLER, "subjectaccessreviews").is_empty());
    assert!(metric(&node, &answered(TUNNEL, "agent")) >= 5.0);
    assert!(metric(&node, &answered(DIRECT, "apiserver")) >= 5.0);
    assert_eq!(metric(&node, &answered(DIRECT, "agent")), 0.0);
}

/// One server kind of the table: the cluster `host` on `node`, whose requests the simulator
/// sees from `caller` (the gateway itself, or the agent).
struct Kind<'a> {
    base: &'a Base,
    node: &'a SluiceProcess,
    host: &'a str,
    caller: &'a str,
}

impl Kind<'_> {
    fn curl(&self, extra: &[&str], path: &str) -> (u16, String) {
        let answers = self.base.alice_curls(self.node, self.host, extra, path, 1);
        answers.into_iter().next().unwrap()
    }

    fn seen(&self, part: &str) -> usize {
        self.base.seen(self.caller, part).len()
    }

    /// `-secret-pod` is every pod but that one: it reaches the apiserver by this kind, and
    /// secret-pod gets 403 from the gateway with nothing sent on.
    fn a_deny_rule_refuses_before_the_apiserver(&self) {
        let host = self.host;
        let before = self.seen("/pods/web-1");
        let (code, body) = self.curl(&[], "/api/v1/namespaces/default/pods/web-1");
        assert_eq!(code, 200, "{host}: {body}");
        assert_eq!(self.seen("/pods/web-1"), before + 1, "{host}");

        let (code, body) = self.curl(&[], "/api/v1/namespaces/default/pods/secret-pod");
        assert_eq!(code, 403, "{host}: {body}");
        assert!(body.contains("no dispatch policy"), "{host}: {body}");
        let requests = self.base.apiserver.requests();
        let leaked = requests
            .iter()
            .any(|request| request.uri.contains("secret-pod"));
        assert!(!leaked, "{host}: {requests:?}");
    }

    /// A bucket of 3 refilled once a second; five requests in a few milliseconds on one
    /// connection: the last two are refused before the apiserver, with Retry-After.
    fn a_token_bucket_answers_429_with_retry_after(&self) {
        let host = self.host;
        let path = "/api/v1/namespaces/default/configmaps";
        let before = self.seen(path);
        let answers = self.base.alice_curls(self.node, host, &[], path, 5);
        let codes: Vec<u16> = answers.iter().map(|(code, _)| *code).collect();
        assert_eq!(codes, [200, 200, 200, 429, 429], "{host}: {answers:?}");
        for (_, text) in &answers[3..] {
            assert!(
                text.to_ascii_lowercase().contains("retry-after: 1\r\n"),
                "{host}: {text}"
            );
            assert!(text.contains("TooManyRequests"), "{host}: {text}");
        }
        assert_eq!(self.seen(path), before + 3, "{host}");
    }

    /// Impersonating without a SubjectAccessReview allowing it: 403 and nothing reaches the
    /// apiserver; allowed, the apiserver sees the impersonated user. Fresh names per kind
    /// (denials are cached briefly).
    fn impersonation_needs_a_subject_access_review(&self) {
        let (host, caller) = (self.host, self.caller);
        let pods = "/api/v1/namespaces/default/pods/web-1";
        let refused = format!("carol-{caller}");
        let (code, body) = self.curl(&["-H", &format!("Impersonate-User: {refused}")], pods);
        assert_eq!(code, 403, "{host}: {body}");
        assert!(body.contains("cannot impersonate"), "{host}: {body}");
        let as_refused = |request: &RecordedRequest| {
            request.impersonate_user.as_deref() == Some(refused.as_str())
        };
        assert!(
            !self.base.apiserver.requests().iter().any(as_refused),
            "{host}"
        );

        let allowed = format!("dave-{caller}");
        let rule = SubjectAccessRule::impersonate("alice", "users", &allowed);
        self.base.apiserver.allow(rule);
        let (code, body) = self.curl(&["-H", &format!("Impersonate-User: {allowed}")], pods);
        assert_eq!(code, 200, "{host}: {body}");
        let last = self.base.seen(caller, pods).pop().unwrap();
        let user = last.impersonate_user.as_deref();
        assert_eq!(user, Some(allowed.as_str()), "{host}: {last:?}");
    }
}
