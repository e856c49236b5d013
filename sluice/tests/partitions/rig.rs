//! Two tunnel nodes, a redis-server and the clients (agents, their grpcio backend, the Python
//! callers), each in its own namespace of a [`Network`]: every byte between them crosses the hub,
//! where a test cuts or slows links.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use test_support::{
    http_get, spawn_tunnel_client, tunnel_client, wait_for_tcp, wait_until, GrpcBackend, Network,
    SluiceLauncher, SluiceProcess,
};

use crate::common::{agents_yaml, Secrets, BIN};

pub const REDIS: &str = "redis";
pub const NODE_A: &str = "node-a";
pub const NODE_B: &str = "node-b";
pub const CLIENTS: &str = "clients";
const REDIS_PORT: u16 = 6379;

/// `redis-server` in its namespace, killed on drop.
struct RedisChild(Child);

impl Drop for RedisChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub struct Rig {
    pub secrets: Secrets,
    /// Node A and node B.
    pub nodes: Vec<SluiceProcess>,
    agents: Vec<SluiceProcess>,
    backend: GrpcBackend,
    _redis: RedisChild,
    // Last: the processes above die before their namespaces go.
    pub net: Network,
}

impl Rig {
    /// The network, redis, both nodes (with `tunnel_extra` under `tunnel:`), the backend, agent 7
    /// on node A and agent 8 on node B, each with idle tunnels.
    pub fn start(tunnel_extra: &str) -> Self {
        let net = Network::new(&[REDIS, NODE_A, NODE_B, CLIENTS]).unwrap();
        let redis = start_redis(&net);
        let secrets = Secrets::new();
        let private_secret = secrets.private_secret();
        let nodes = [NODE_A, NODE_B]
            .map(|name| start_node(&net, &secrets, &private_secret, name, tunnel_extra))
            .into_iter()
            .collect::<Vec<_>>();
        let backend = net.host(CLIENTS).run(|| GrpcBackend::start().unwrap());
        let mut rig = Self {
            secrets,
            nodes,
            agents: Vec::new(),
            backend,
            _redis: redis,
            net,
        };
        rig.start_agent(7, 0);
        rig.start_agent(8, 1);
        for node in 0..2 {
            let at_least = |rig: &Rig| rig.metric(node, "sluice_tunnel_idle_tunnels") >= 2.0;
            assert!(
                wait_until(Duration::from_secs(20), || at_least(&rig)),
                "no idle tunnels on node {node}: {}",
                rig.nodes[node].stderr()
            );
        }
        rig
    }

    fn start_agent(&mut self, agent: i64, node: usize) {
        let yaml = format!(
            "runtime: {{workers: 1, drain_timeout: 2s}}\n\
             listeners:\n  admin: {{address: '127.0.0.1:0'}}\n\
             agent:\n  token_file: '{}'\n  nodes: ['http://{}']\n  forward_to: 'http://{}'\n  pool: {{min_idle: 2, max: 20, grow_by: 10}}\n  reconnect: {{initial_backoff: 100ms, max_backoff: 1s}}\n",
            self.secrets.tokens[&agent].1.display(),
            self.nodes[node].address("agent"),
            self.backend.address,
        );
        let launcher = SluiceLauncher::new(BIN).unwrap();
        let config = launcher.write_file("agent.yaml", &yaml).unwrap();
        let process = self.net.host(CLIENTS).run(move || {
            launcher
                .arg("agent")
                .arg("--config")
                .arg(config)
                .spawn()
                .expect("agent starts")
        });
        self.agents.push(process);
    }

    /// The value of one series on node `node`'s `/metrics` (0 when absent).
    pub fn metric(&self, node: usize, series: &str) -> f64 {
        let admin = self.nodes[node].address("admin");
        let text = self
            .net
            .host(CLIENTS)
            .run(move || http_get(admin, "/metrics").map(|response| response.body))
            .unwrap_or_default();
        let series = series.to_string();
        text.lines()
            .find_map(|line| {
                line.strip_prefix(series.as_str())
                    .and_then(|rest| rest.trim().parse().ok())
            })
            .unwrap_or(0.0)
    }

    /// `tunnel_client.py` arguments for a call to node `node` for `agent`, plus `extra`.
    pub fn client_args<S: ToString>(
        &self,
        node: usize,
        agent: i64,
        extra: impl IntoIterator<Item = S>,
    ) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "--node".into(),
            self.nodes[node].address("external").to_string(),
            "--agent-id".into(),
            agent.to_string(),
            "--secret-file".into(),
            self.secrets.jwt_secret.display().to_string(),
        ];
        args.extend(extra.into_iter().map(|arg| arg.to_string()));
        args
    }

    /// Runs a check of `tunnel_client.py` from the clients' namespace and returns its JSON.
    pub fn call(&self, check: &str, args: Vec<String>) -> Value {
        let check = check.to_string();
        self.net
            .host(CLIENTS)
            .run(move || tunnel_client(&check, &args))
    }

    /// Starts a check in the clients' namespace; read it with [`read_client`].
    pub fn spawn_call(&self, check: &str, args: Vec<String>) -> Child {
        let check = check.to_string();
        self.net
            .host(CLIENTS)
            .run(move || spawn_tunnel_client(&check, &args))
    }

    /// Whether a node's log shows a panic (checked at the end of every case).
    pub fn assert_no_panics(&self) {
        for node in &self.nodes {
            assert!(!node.stderr().contains("panicked"), "{}", node.stderr());
        }
    }
}

/// The JSON a spawned check printed last.
pub fn read_client(child: Child) -> Value {
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|error| panic!("client output: {error}: {output:?}"))
}

fn start_redis(net: &Network) -> RedisChild {
    let host = net.host(REDIS);
    let child = host.run(|| {
        Command::new("redis-server")
            .args(["--port", &REDIS_PORT.to_string(), "--bind", "0.0.0.0"])
            .args(["--protected-mode", "no", "--save", "", "--appendonly", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts")
    });
    let address = SocketAddr::from((host.ip, REDIS_PORT));
    let up = net
        .host(CLIENTS)
        .run(move || wait_for_tcp(address, Duration::from_secs(10)));
    assert!(up, "redis-server never listened on {address}");
    RedisChild(child)
}

fn start_node(
    net: &Network,
    secrets: &Secrets,
    private_secret: &std::path::Path,
    name: &str,
    tunnel_extra: &str,
) -> SluiceProcess {
    let ip = net.host(name).ip;
    let redis = net.host(REDIS).ip;
    let yaml = format!(
        "runtime: {{workers: 2, drain_timeout: 2s}}\n\
         listeners:\n  admin: {{address: '{ip}:0'}}\n  agent: {{address: '{ip}:0'}}\n  external: {{address: '{ip}:0'}}\n  private: {{address: '{ip}:0'}}\n\
         tunnel:\n  node_name: {name}\n  max_wait: 10s\n  agents:\n{agents}  jwt: {{secret_file: '{jwt}'}}\n  private_jwt: {{secret_file: '{private}', issuer: sluice-node, audience: sluice-private}}\n{tunnel_extra}\
         redis:\n  url: 'redis://{redis}:{REDIS_PORT}'\n  key_prefix: part\n  unregister_delay: 500ms\n",
        agents = agents_yaml(secrets),
        jwt = secrets.jwt_secret.display(),
        private = private_secret.display(),
    );
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let config = launcher.write_file("node.yaml", &yaml).unwrap();
    net.host(name).run(move || {
        launcher
            .arg("run")
            .arg("--config")
            .arg(config)
            .spawn()
            .expect("node starts")
    })
}
