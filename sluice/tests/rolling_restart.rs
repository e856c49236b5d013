//! Rolling restart of three nodes under steady load from real grpcio clients: each node in
//! turn gets SIGTERM, drains (its Redis entries go first, its agents move their tunnels, calls
//! in flight finish), exits, and comes back on the same ports. Not one call may fail.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{agents_yaml, assert_driver, metric, run_node, start_agent_on, Secrets, BIN};
use test_support::{
    on_both_drivers, wait_until, GrpcBackend, RedisServer, RollingLoad, SluiceLauncher,
    SluiceProcess, TcpBalancer,
};

on_both_drivers!(three_nodes_restarted_in_turn_under_load_fail_no_call);

/// The fewest calls the load must complete across the rollout: a test that ran idle (load
/// stuck, or every call failing before it counted) cannot pass.
const MIN_CALLS: u64 = 300;

/// The settings one node is started with, kept to start it again on the same ports.
struct NodeSpec {
    name: &'static str,
    /// `None`: any free port (first start); then the ports the first process bound.
    ports: Option<[SocketAddr; 4]>,
}

const LISTENERS: [&str; 4] = ["admin", "agent", "external", "private"];

fn node_yaml(secrets: &Secrets, spec: &NodeSpec, redis_url: &str, private_secret: &str) -> String {
    let address = |index: usize| match spec.ports {
        Some(ports) => ports[index].to_string(),
        None => "127.0.0.1:0".to_string(),
    };
    format!(
        "runtime: {{workers: 2, drain_timeout: 10s, driver: {driver}}}\n\
         listeners:\n  admin: {{address: '{admin}'}}\n  agent: {{address: '{agent}'}}\n  external: {{address: '{external}'}}\n  private: {{address: '{private}'}}\n\
         tunnel:\n  node_name: {name}\n  max_wait: 10s\n  agents:\n{agents}  jwt: {{secret_file: '{jwt}'}}\n  private_jwt: {{secret_file: '{private_secret}', issuer: sluice-node, audience: sluice-private}}\n\
         redis:\n  url: '{redis_url}'\n  key_prefix: rolling\n  unregister_delay: 500ms\n",
        driver = secrets.driver,
        admin = address(0),
        agent = address(1),
        external = address(2),
        private = address(3),
        name = spec.name,
        agents = agents_yaml(secrets),
        jwt = secrets.jwt_secret.display(),
    )
}

fn ports_of(node: &SluiceProcess) -> [SocketAddr; 4] {
    LISTENERS.map(|listener| node.address(listener))
}

/// An agent that lists one address only: the balancer in front of every node's agent port.
fn start_balanced_agent(
    secrets: &Secrets,
    agent: i64,
    balancer: SocketAddr,
    backend: SocketAddr,
) -> SluiceProcess {
    let yaml = format!(
        "runtime: {{workers: 1, drain_timeout: 2s, driver: {driver}}}\n\
         listeners:\n  admin: {{address: '127.0.0.1:0'}}\n\
         agent:\n  token_file: '{token}'\n  nodes: ['http://{balancer}']\n  forward_to: 'http://{backend}'\n  pool: {{min_idle: 2, max: 50, grow_by: 10}}\n  reconnect: {{initial_backoff: 100ms, max_backoff: 1s}}\n",
        driver = secrets.driver,
        token = secrets.tokens[&agent].1.display(),
    );
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let config = launcher.write_file("agent.yaml", &yaml).unwrap();
    let agent = launcher
        .arg("agent")
        .arg("--config")
        .arg(config)
        .spawn()
        .expect("agent starts");
    assert_driver(&agent, &secrets.driver);
    agent
}

fn idle_tunnels(node: &SluiceProcess) -> f64 {
    metric(node, "sluice_tunnel_idle_tunnels").unwrap_or(0.0)
}

/// How many nodes hold tunnels of `agent`, by the Redis entries the nodes write.
fn holders(redis: &RedisServer, agent: i64) -> usize {
    let reply = redis
        .command(&["HLEN", &format!("rolling:tunnel:agent:{{{agent}}}")])
        .unwrap_or_default();
    reply.trim_start_matches(':').trim().parse().unwrap_or(0)
}

fn three_nodes_restarted_in_turn_under_load_fail_no_call(driver: &str) {
    let redis = RedisServer::start().unwrap();
    let secrets = Secrets::on(driver);
    let private_secret = secrets.private_secret();
    let private_secret = private_secret.display().to_string();
    // Every node, first started or restarted, is checked to run on `driver` (as the agents are).
    let start = |spec: &NodeSpec| {
        let node = run_node(&node_yaml(
            &secrets,
            spec,
            &redis.unix_url(),
            &private_secret,
        ));
        assert_driver(&node, driver);
        node
    };
    let mut specs = ["node-a", "node-b", "node-c"].map(|name| NodeSpec { name, ports: None });
    let mut nodes: Vec<SluiceProcess> = specs.iter().map(&start).collect();
    for (spec, node) in specs.iter_mut().zip(&nodes) {
        spec.ports = Some(ports_of(node));
    }
    let backend = GrpcBackend::start().unwrap();
    // Agent 7 keeps tunnels on every node; agent 8 lists one address, a TCP balancer in front
    // of all three, so it is on one node at a time and must move when that node drains.
    let all: Vec<&SluiceProcess> = nodes.iter().collect();
    let agent_everywhere = start_agent_on(&secrets, 7, &all, backend.address, 50, None);
    let balancer =
        TcpBalancer::start(nodes.iter().map(|node| node.address("agent")).collect()).unwrap();
    let agent_balanced = start_balanced_agent(&secrets, 8, balancer.address(), backend.address);
    assert!(
        wait_until(Duration::from_secs(20), || nodes
            .iter()
            .all(|node| idle_tunnels(node) >= 2.0)
            && holders(&redis, 7) == 3
            && holders(&redis, 8) == 1),
        "agents not connected everywhere; agent stderr:\n{}",
        agent_everywhere.stderr()
    );

    let externals: Vec<SocketAddr> = nodes.iter().map(|node| node.address("external")).collect();
    let load = RollingLoad::start(&externals, &[7, 8], &secrets.jwt_secret, 4).unwrap();
    assert!(
        load.wait_for_more(100, Duration::from_secs(30)),
        "the load does not get going: {}",
        load.progress()
    );

    let mut retired = Vec::new();
    for index in 0..nodes.len() {
        let spec = &specs[index];
        let node = &mut nodes[index];
        let before = load.ok();
        assert_eq!(
            metric(node, "sluice_lifecycle_phase{phase=\"ready\"}"),
            Some(1.0)
        );
        node.signal(libc::SIGTERM);
        let status = node
            .wait_exit(Duration::from_secs(30))
            .expect("the node exits after its drain");
        assert!(
            status.success(),
            "{} exited {status}; stderr:\n{}",
            spec.name,
            node.stderr()
        );
        let stderr = node.stderr();
        assert!(
            stderr.contains("removed this node's agents from redis"),
            "{} did not withdraw from redis at drain start:\n{stderr}",
            spec.name
        );
        // Calls went on while the node was away (other nodes, agent 8 moved).
        assert!(
            load.wait_for_more(50, Duration::from_secs(30)),
            "no calls served with {} down: {}",
            spec.name,
            load.progress()
        );
        // Kept (stopped) so a failure can show what the drained node logged.
        retired.push(std::mem::replace(node, start(spec)));
        let node = &nodes[index];
        assert_eq!(
            ports_of(node),
            spec.ports.unwrap(),
            "started again on the same ports"
        );
        assert!(
            wait_until(Duration::from_secs(30), || idle_tunnels(&nodes[index])
                >= 2.0
                && holders(&redis, 7) == 3),
            "agent 7 did not come back to {}: {}",
            spec.name,
            agent_everywhere.stderr()
        );
        assert!(
            load.wait_for_more(50, Duration::from_secs(30)),
            "no calls after {} came back: {}",
            spec.name,
            load.progress()
        );
        println!(
            "{}: restarted; {} calls OK during its restart, {} so far",
            spec.name,
            load.ok() - before,
            load.ok()
        );
    }

    let counts = load.finish().unwrap();
    println!("rolling restart on {driver}: {counts}");
    if counts["failed"] != 0 {
        for process in retired.iter().chain(&nodes) {
            eprintln!("--- node {}:\n{}", process.pid(), process.stderr());
        }
        eprintln!("--- agent 8:\n{}", agent_balanced.stderr());
    }
    let ok = counts["ok"].as_u64().unwrap();
    assert_eq!(
        counts["failed"], 0,
        "calls failed during the rollout: {counts}"
    );
    assert!(ok >= MIN_CALLS, "too few calls to mean anything: {counts}");
    for agent in ["7", "8"] {
        assert!(
            counts["per_agent"][agent].as_u64().unwrap() >= MIN_CALLS / 4,
            "agent {agent} saw too few calls: {counts}"
        );
    }
    // Agent 7 moved once per node; agent 8 at least once (from the node it was on).
    let moves =
        |agent: &SluiceProcess| metric(agent, "sluice_agent_node_moves_total").unwrap_or(0.0);
    assert!(
        moves(&agent_everywhere) >= 3.0,
        "agent 7 moves: {}",
        moves(&agent_everywhere)
    );
    assert!(
        moves(&agent_balanced) >= 1.0,
        "agent 8 moves: {}",
        moves(&agent_balanced)
    );
    assert!(
        balancer
            .relayed()
            .iter()
            .filter(|count| **count > 0)
            .count()
            >= 2,
        "agent 8 reached a second node through the balancer: {:?}",
        balancer.relayed()
    );
    assert!(backend.unary_calls() as u64 >= ok);
}
