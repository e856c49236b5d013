//! A node, agents and a grpcio backend as real processes, for the tunnel tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use test_support::{
    http_get, wait_until, Certificates, ControlPlane, SluiceLauncher, SluiceProcess,
};

pub mod fed_gateway;

pub const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// The JWT secret and agent tokens of a test cluster, as files.
pub struct Secrets {
    pub dir: tempfile::TempDir,
    pub jwt_secret: PathBuf,
    pub tokens: BTreeMap<i64, (String, PathBuf)>,
    /// The monoio driver (`auto`, `uring`, `legacy`) every node and agent of this test runs on.
    pub driver: String,
}

impl Secrets {
    pub fn new() -> Self {
        Self::on("auto")
    }

    /// Writes the secret a test's nodes sign each other's node JWTs with
    /// (`tunnel.private_jwt`) beside the others, and returns its path.
    pub fn private_secret(&self) -> PathBuf {
        let path = self.dir.path().join("private.secret");
        std::fs::write(&path, "private-node-secret-0123456789abcdef0123\n").unwrap();
        path
    }

    /// Secrets for a test whose nodes and agents all run on `driver`.
    pub fn on(driver: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let jwt_secret = dir.path().join("jwt.secret");
        std::fs::write(&jwt_secret, "test-secret-0123456789abcdef0123456789\n").unwrap();
        let mut secrets = Self {
            dir,
            jwt_secret,
            tokens: BTreeMap::new(),
            driver: driver.to_string(),
        };
        secrets.add_agent(7);
        secrets.add_agent(8);
        secrets
    }

    /// Writes a token for one more agent id (7 and 8 have theirs from the start).
    pub fn add_agent(&mut self, agent: i64) {
        // Unique per Secrets (its temporary directory's name), so two clusters never share tokens.
        let unique = self.dir.path().file_name().unwrap().to_string_lossy();
        let token = format!("agent-{agent}-token-{unique}");
        let file = self.dir.path().join(format!("agent-{agent}.token"));
        std::fs::write(&file, &token).unwrap();
        self.tokens.insert(agent, (token, file));
    }

    pub fn token(&self, agent: i64) -> &str {
        &self.tokens[&agent].0
    }
}

fn tls_block(certs: Option<&Certificates>) -> String {
    match certs {
        Some(certs) => format!(
            ", tls: {{cert_file: '{}', key_file: '{}'}}",
            certs.server_cert.display(),
            certs.server_key.display()
        ),
        None => String::new(),
    }
}

/// The `tunnel.peer_tls` block for nodes whose private endpoints require TLS with client
/// certificates: every node presents a certificate from the test CA.
fn peer_tls(private_tls: Option<&Certificates>) -> String {
    let Some(certs) = private_tls else {
        return String::new();
    };
    let client = certs
        .client("sluice-node", &[])
        .expect("node client certificate");
    format!(
        "  peer_tls: {{ca_file: '{}', cert_file: '{}', key_file: '{}'}}\n",
        certs.ca_cert.display(),
        client.cert.display(),
        client.key.display()
    )
}

pub fn start_node(
    secrets: &Secrets,
    max_wait: &str,
    max_message_bytes: usize,
    tls: Option<&Certificates>,
) -> SluiceProcess {
    start_node_on(
        secrets,
        max_wait,
        max_message_bytes,
        tls,
        &secrets.driver,
        "",
        "",
        None,
    )
}

/// Asserts that every call of tunnel_client.py's `shapes` check came back as the test backend
/// answers it: metadata both ways, a 10,000-message stream in order, bidi, a 4 MiB echo and an
/// error status.
pub fn assert_shapes(result: &serde_json::Value) {
    assert_eq!(result["unary"], "hello", "{result}");
    assert_eq!(result["initial_metadata"], "r-42", "{result}");
    assert_eq!(result["trailing_metadata"], "done", "{result}");
    assert_eq!(result["server_stream_count"], 10_000, "{result}");
    assert_eq!(result["server_stream_in_order"], true, "{result}");
    assert_eq!(result["bidi"], true, "{result}");
    assert_eq!(result["big_echo"], true, "{result}");
    assert_eq!(result["fail"]["code"], "NOT_FOUND", "{result}");
}

/// A node on a given I/O driver (`auto`, `uring`, `legacy`).
#[allow(clippy::too_many_arguments)] // one knob per YAML setting the tests vary
pub fn start_node_on(
    secrets: &Secrets,
    max_wait: &str,
    max_message_bytes: usize,
    tls: Option<&Certificates>,
    driver: &str,
    tunnel_extra: &str,
    extra_yaml: &str,
    private_tls: Option<&Certificates>,
) -> SluiceProcess {
    let yaml = node_yaml(
        secrets,
        max_wait,
        max_message_bytes,
        tls,
        driver,
        tunnel_extra,
        extra_yaml,
        private_tls,
    );
    let node = run_node(&yaml);
    if driver != "auto" {
        assert_driver(&node, driver);
    }
    node
}

/// The YAML [`start_node_on`] runs a node with.
#[allow(clippy::too_many_arguments)] // one knob per YAML setting the tests vary
pub fn node_yaml(
    secrets: &Secrets,
    max_wait: &str,
    max_message_bytes: usize,
    tls: Option<&Certificates>,
    driver: &str,
    tunnel_extra: &str,
    extra_yaml: &str,
    private_tls: Option<&Certificates>,
) -> String {
    let agents = agents_yaml(secrets);
    let yaml = format!(
        "runtime: {{workers: 2, drain_timeout: 2s, driver: {driver}}}\n\
         listeners:\n  admin: {{address: '127.0.0.1:0'}}\n  agent: {{address: '127.0.0.1:0'{tls}}}\n  external: {{address: '127.0.0.1:0'{tls}}}\n{private}\
         tunnel:\n{node_name}  max_wait: {max_wait}\n  max_message_bytes: {max_message_bytes}\n  agents:\n{agents}  jwt: {{secret_file: '{}'}}\n{tunnel_extra}",
        secrets.jwt_secret.display(),
        tls = tls_block(tls),
        node_name = if tunnel_extra.contains("node_name:") { "" } else { "  node_name: test-node\n" },
        private = match (extra_yaml.contains("redis:"), private_tls) {
            (false, _) => String::new(),
            (true, None) => "  private: {address: '127.0.0.1:0'}\n".to_string(),
            (true, Some(certs)) => format!(
                "  private: {{address: '127.0.0.1:0', tls: {{cert_file: '{}', key_file: '{}', client_ca_file: '{}'}}}}\n",
                certs.server_cert.display(),
                certs.server_key.display(),
                certs.ca_cert.display()
            ),
        },
    ) + &peer_tls(private_tls) + extra_yaml;
    yaml
}

/// `sluice run` on `yaml` (written as `node.yaml` in the process's own directory), ready.
pub fn run_node(yaml: &str) -> SluiceProcess {
    run_node_with(BIN, yaml)
}

/// Starts `node-1` with `workers` workers, its agents fed by `cp`
/// (`tunnel.agents_from.controlplane`, a node token written beside `secrets`' files).
pub fn run_fed_node(cp: &ControlPlane, secrets: &Secrets, workers: usize) -> SluiceProcess {
    let token = secrets.dir.path().join("node.token");
    std::fs::write(&token, cp.token("node", "node-1")).unwrap();
    run_node(&format!(
        "runtime: {{workers: {workers}, drain_timeout: 2s}}\nlisteners:\n  admin: {{address: '127.0.0.1:0'}}\n  agent: {{address: '127.0.0.1:0'}}\n  external: {{address: '127.0.0.1:0'}}\ntunnel:\n  node_name: node-1\n  agents_from:\n    controlplane: {{url: '{}', ca_file: '{}', token_file: '{}'}}\n  jwt: {{secret_file: '{}'}}\n",
        cp.url(),
        cp.ca_file().display(),
        token.display(),
        secrets.jwt_secret.display()
    ))
}

/// [`run_node`] with another build of `sluice` (an older version, in compatibility tests).
pub fn run_node_with(binary: &str, yaml: &str) -> SluiceProcess {
    let launcher = SluiceLauncher::new(binary).unwrap();
    let config = launcher.write_file("node.yaml", yaml).unwrap();
    launcher
        .arg("run")
        .arg("--config")
        .arg(config)
        .spawn()
        .expect("node starts")
}

/// Stops the process with SIGTERM and asserts it exits with 0 within 5 s.
pub fn stop_cleanly(process: &mut SluiceProcess) {
    process.signal(libc::SIGTERM);
    let code = process
        .wait_exit(Duration::from_secs(5))
        .and_then(|status| status.code());
    assert_eq!(code, Some(0), "stderr: {}", process.stderr());
}

/// Asserts that the process runs on `driver` (its `sluice_build_info` series).
pub fn assert_driver(process: &SluiceProcess, driver: &str) {
    let metrics = http_get(process.address("admin"), "/metrics")
        .expect("metrics")
        .body;
    test_support::assert_driver(&metrics, driver);
}

pub fn start_agent(
    secrets: &Secrets,
    agent: i64,
    node: &SluiceProcess,
    backend: SocketAddr,
    pool_max: usize,
    ca: Option<&Path>,
) -> SluiceProcess {
    start_agent_on(secrets, agent, &[node], backend, pool_max, ca)
}

/// An agent keeping tunnels on several nodes at once.
pub fn start_agent_on(
    secrets: &Secrets,
    agent: i64,
    nodes: &[&SluiceProcess],
    backend: SocketAddr,
    pool_max: usize,
    ca: Option<&Path>,
) -> SluiceProcess {
    let scheme = if ca.is_some() { "https" } else { "http" };
    let node_url = nodes
        .iter()
        .map(|node| {
            let node_address = node.address("agent");
            match ca {
                Some(_) => format!("'{scheme}://localhost:{}'", node_address.port()),
                None => format!("'{scheme}://{node_address}'"),
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    let ca_line = ca
        .map(|ca| format!("  ca_file: '{}'\n", ca.display()))
        .unwrap_or_default();
    let yaml = format!(
        "runtime: {{workers: 1, drain_timeout: 2s, driver: {driver}}}\n\
         listeners:\n  admin: {{address: '127.0.0.1:0'}}\n\
         agent:\n  token_file: '{}'\n  nodes: [{node_url}]\n{ca_line}  forward_to: 'http://{backend}'\n  pool: {{min_idle: 2, max: {pool_max}, grow_by: 10}}\n  reconnect: {{initial_backoff: 100ms, max_backoff: 1s}}\n",
        secrets.tokens[&agent].1.display(),
        driver = secrets.driver,
    );
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let config = launcher.write_file("agent.yaml", &yaml).unwrap();
    let agent = launcher
        .arg("agent")
        .arg("--config")
        .arg(config)
        .spawn()
        .expect("agent starts");
    if secrets.driver != "auto" {
        assert_driver(&agent, &secrets.driver);
    }
    agent
}

/// The value of one metric series on a process's admin endpoint.
pub fn metric(process: &SluiceProcess, series: &str) -> Option<f64> {
    let text = http_get(process.address("admin"), "/metrics").ok()?.body;
    text.lines().find_map(|line| {
        line.strip_prefix(series)
            .and_then(|rest| rest.trim().parse().ok())
    })
}

pub fn wait_for_idle_tunnels(node: &SluiceProcess, at_least: f64) {
    assert!(
        wait_until(Duration::from_secs(20), || metric(
            node,
            "sluice_tunnel_idle_tunnels"
        )
        .unwrap_or(0.0)
            >= at_least),
        "no idle tunnels on the node; stderr:\n{}",
        node.stderr()
    );
}

/// Arguments for `tunnel_client.py` pointed at a node.
pub fn client_args(node: &SluiceProcess, secrets: &Secrets, agent: i64) -> Vec<String> {
    vec![
        "--node".into(),
        node.address("external").to_string(),
        "--agent-id".into(),
        agent.to_string(),
        "--secret-file".into(),
        secrets.jwt_secret.display().to_string(),
    ]
}

/// Arguments for `tunnel_client.py` calling `node`'s private endpoint itself, as a routing node
/// does, with a node JWT signed by `private_secret` (`Secrets::private_secret`).
pub fn private_args(
    node: &SluiceProcess,
    private_secret: &std::path::Path,
    agent: i64,
) -> Vec<String> {
    vec![
        "--node".into(),
        node.address("private").to_string(),
        "--agent-id".into(),
        agent.to_string(),
        "--secret-file".into(),
        private_secret.display().to_string(),
        "--issuer".into(),
        "sluice-node".into(),
        "--audience".into(),
        "sluice-private".into(),
        "--lifetime".into(),
        "5".into(),
    ]
}

/// The `tunnel.agents` list entries (indented for a block under `agents:`) for every token.
pub fn agents_yaml(secrets: &Secrets) -> String {
    secrets
        .tokens
        .iter()
        .map(|(id, (token, _))| {
            format!(
                "    - {{id: {id}, token_sha256: '{}'}}\n",
                hex::encode(Sha256::digest(token.as_bytes()))
            )
        })
        .collect()
}

/// A client JWT the test nodes accept (`iss: gitlab`, `aud: gitlab-kas`), valid for
/// `lifetime_secs` (the nodes refuse lifetimes over 60 s).
pub fn client_jwt(secrets: &Secrets, lifetime_secs: u64) -> String {
    let secret = std::fs::read_to_string(&secrets.jwt_secret).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = serde_json::json!({"iss": "gitlab", "aud": "gitlab-kas", "iat": now, "exp": now + lifetime_secs});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.trim_end().as_bytes()),
    )
    .unwrap()
}

/// A process's resident memory, from /proc.
pub fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The request head of a ListConnectedAgents call with the bearer `token`; its body (the
/// request message) is sent apart.
pub fn list_agents_request(token: &str) -> http::Request<()> {
    http::Request::post(format!(
        "http://node{}",
        sluice_tunnel::protocol::LIST_AGENTS_PATH
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .header("authorization", format!("Bearer {token}"))
    .body(())
    .unwrap()
}

/// The head of a client's unary call of `/test.Echo/{method}` for `agent` with `token`, as the
/// external endpoint takes it (the body is the caller's).
pub fn echo_call_head(token: &str, agent: i64, method: &str) -> http::Request<()> {
    http::Request::post(format!("http://node/test.Echo/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .header("sluice-agent-id", agent.to_string())
        .body(())
        .unwrap()
}
