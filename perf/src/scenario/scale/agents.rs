//! `scale --only agents`: many idle tunnel agents across nodes that share a Redis (issue 36,
//! seed kas). The agents are simulated in the harness (`agent_sim.rs`: a real HTTP/2
//! connection, token and Connect stream each); per layout (1, 2 and 4 nodes on one
//! redis-server, 2 nodes on a 3-master Redis Cluster) it measures node RSS and CPU per idle
//! agent, Redis memory and commands per agent, then restarts one node gracefully and times
//! how long until every agent of it is connected again and listed in Redis (what every other
//! node's lookup reads), with calls through another node running all along.
//! `--levels 5000x1,10000x1` replaces the layouts (agents per node x nodes, one Redis) and
//! `--seconds` the idle window, for short runs at a chosen size.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use tokio::sync::watch;

use super::agent_sim::{self, calls_for, Calls, SimStats};
use super::redis_probe::{self, Endpoint, RedisFigures};
use crate::measure::{cpu_micros, rss_kib, CpuMeter};
use crate::process::{free_port, wait_until};
use crate::scenario::Harness;
use crate::sluice::{admin_get, metric_value, random_hex, Secrets, SluiceProcess};

pub use super::agents_model::{paper_model, PaperModel};

const PREFIX: &str = "sluice-perf";

/// Which Redis the nodes share.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum RedisKind {
    Single,
    Cluster,
}

#[derive(Debug, Clone, Serialize)]
pub struct Layout {
    pub name: &'static str,
    pub redis: RedisKind,
    pub nodes: usize,
    /// Agents per node at each measured point (cumulative; the last is the restart's).
    pub steps: Vec<usize>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub layouts: Vec<Layout>,
    pub idle_window: Duration,
    pub call_rate: u32,
    pub steady_calls: Duration,
}

impl Plan {
    pub fn new(smoke: bool) -> Self {
        let layout = |name, redis, nodes, steps: &[usize]| Layout {
            name,
            redis,
            nodes,
            steps: steps.to_vec(),
        };
        if smoke {
            return Self {
                layouts: vec![layout("2-nodes", RedisKind::Single, 2, &[100])],
                idle_window: Duration::from_secs(2),
                call_rate: 50,
                steady_calls: Duration::from_secs(2),
            };
        }
        // The harness holds every agent's connection, the node its share: this machine's hard
        // open-file limit (20,000 per process) bounds both at 15,000 with room to spare.
        Self {
            layouts: vec![
                layout("1-node", RedisKind::Single, 1, &[5_000, 10_000, 15_000]),
                layout("2-nodes", RedisKind::Single, 2, &[7_500]),
                layout("4-nodes", RedisKind::Single, 4, &[3_750]),
                layout("2-nodes-cluster", RedisKind::Cluster, 2, &[7_500]),
            ],
            idle_window: Duration::from_secs(20),
            call_rate: 100,
            steady_calls: Duration::from_secs(5),
        }
    }
}

impl Plan {
    /// The plan with `--levels AGENTSxNODES,...` (one layout on one Redis per node count, its
    /// steps the agents per node given for it) and `--seconds` (the idle window) when given:
    /// a short run at a chosen size, for example before and after a change to what a
    /// connection holds.
    pub fn with_overrides(mut self, levels: &[(u32, u32)], seconds: Option<Duration>) -> Self {
        if let Some(window) = seconds {
            self.idle_window = window;
        }
        if levels.is_empty() {
            return self;
        }
        let mut layouts: Vec<Layout> = Vec::new();
        for &(agents, nodes) in levels {
            let nodes = nodes as usize;
            match layouts.iter_mut().find(|l| l.nodes == nodes) {
                Some(layout) => layout.steps.push(agents as usize),
                None => layouts.push(Layout {
                    name: if nodes == 1 { "1-node" } else { "n-nodes" },
                    redis: RedisKind::Single,
                    nodes,
                    steps: vec![agents as usize],
                }),
            }
        }
        for layout in &mut layouts {
            layout.steps.sort_unstable();
            layout.steps.dedup();
            if layout.nodes > 1 {
                layout.name = NODE_NAMES[layout.nodes.min(NODE_NAMES.len()) - 1];
            }
        }
        self.layouts = layouts;
        self
    }
}

/// Layout names (and so output directories) by node count, from `--levels`.
const NODE_NAMES: [&str; 8] = [
    "1-node", "2-nodes", "3-nodes", "4-nodes", "5-nodes", "6-nodes", "7-nodes", "8-nodes",
];

/// One measured point: every agent connected and listed, then idle.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Point {
    pub agents_per_node: usize,
    pub agents_total: usize,
    pub seconds_to_connect: f64,
    pub node_rss_kib: Vec<u64>,
    /// Mean over the nodes of (RSS - RSS before any agent) / agents it holds.
    pub node_rss_kib_per_agent: f64,
    pub node_cpu_percent: f64,
    /// Every Redis process together, while the agents idled.
    pub redis_cpu_percent: f64,
    pub redis: RedisFigures,
    /// (used_memory - before any agent) / agents.
    pub redis_bytes_per_agent: f64,
    /// Commands Redis processed since before any agent, per agent (registration).
    pub redis_commands_per_agent: f64,
    /// Commands per second while the agents idled (refresh, GC, INFO of this harness).
    pub redis_ops_per_s_idle: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Restart {
    pub agents_on_node: usize,
    pub seconds_to_node_up: f64,
    pub seconds_to_all_connected: f64,
    /// Until every agent of the node is in its Redis field again: reachable from every node.
    pub seconds_to_all_listed: f64,
    pub agents_unreachable: usize,
    pub redis_ops_per_s: f64,
    pub redis_commands: f64,
    pub redis_peak_used_memory: f64,
    pub node_cpu_ms: f64,
    /// The kernel's TcpExt ListenOverflows and ListenDrops over the restart (whole machine):
    /// connects the accept queue had no room for, retried by the client's SYN retransmits.
    pub listen_overflows: u64,
    pub listen_drops: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LayoutRecord {
    pub layout: Layout,
    pub points: Vec<Point>,
    pub restart: Restart,
    pub steady_calls: Calls,
    pub restart_calls: Calls,
    pub agent_errors: u64,
    pub agent_last_error: Option<String>,
    /// Connections lost outside the restart: none expected.
    pub disconnects_outside_restart: u64,
    pub calls_answered_by_agents: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct AgentsRecord {
    pub plan: Plan,
    pub layouts: Vec<LayoutRecord>,
    pub model: Option<PaperModel>,
    pub load_average: String,
}

impl AgentsRecord {
    pub fn errors(&self) -> u64 {
        self.layouts
            .iter()
            .map(|l| {
                l.agent_errors
                    + l.disconnects_outside_restart
                    + l.restart.agents_unreachable as u64
                    + (l.steady_calls.errors + l.restart_calls.errors) as u64
            })
            .sum()
    }
}

pub fn run(harness: &Harness, dir: &Path, plan: Plan) -> anyhow::Result<AgentsRecord> {
    let plan = plan.with_overrides(&harness.levels, harness.seconds);
    super::vms::raise_fd_limit(19_500)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("perf-agents")
        .enable_all()
        .build()?;
    let load_before = load_average();
    let mut layouts = Vec::new();
    for layout in &plan.layouts {
        let layout_dir = dir.join(layout.name);
        std::fs::create_dir_all(&layout_dir)?;
        let record = run_layout(harness, &runtime, &layout_dir, layout, &plan)
            .with_context(|| format!("layout {}", layout.name))?;
        layouts.push(record);
    }
    let model = layouts
        .iter()
        .find(|l| l.layout.nodes == 1)
        .or(layouts.first())
        .and_then(|one| paper_model(one.points.last()?, &one.restart));
    Ok(AgentsRecord {
        plan,
        layouts,
        model,
        load_average: format!("{load_before} before, {} after", load_average()),
    })
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The Redis a layout's nodes share, stopped on drop.
struct SharedRedis {
    _single: Option<crate::peers::Redis>,
    _cluster: Option<redis_probe::Cluster>,
    endpoints: Vec<Endpoint>,
    /// The node config's `redis` section.
    yaml: String,
    pids: Vec<(String, u32)>,
}

fn start_redis(dir: &Path, kind: RedisKind, cpu: &str) -> anyhow::Result<SharedRedis> {
    let common = format!("  key_prefix: {PREFIX}\n  unregister_delay: 1s\n");
    Ok(match kind {
        RedisKind::Single => {
            let redis = crate::peers::start_redis(dir, cpu)?;
            SharedRedis {
                endpoints: vec![Endpoint::Unix(redis.socket.clone())],
                yaml: format!(
                    "redis:\n  url: 'redis+unix://{}'\n{common}",
                    redis.socket.display()
                ),
                pids: vec![("redis".into(), redis.process.pid())],
                _single: Some(redis),
                _cluster: None,
            }
        }
        RedisKind::Cluster => {
            let cluster = redis_probe::start_cluster(dir, cpu)?;
            let urls: Vec<String> = cluster
                .addresses
                .iter()
                .map(|a| format!("'redis://{a}'"))
                .collect();
            SharedRedis {
                endpoints: cluster
                    .addresses
                    .iter()
                    .map(|a| Endpoint::Tcp(*a))
                    .collect(),
                yaml: format!("redis:\n  cluster: [{}]\n{common}", urls.join(", ")),
                pids: cluster
                    .processes
                    .iter()
                    .map(|p| (p.name.clone(), p.pid()))
                    .collect(),
                _single: None,
                _cluster: Some(cluster),
            }
        }
    })
}

/// One node: fixed agent and private ports, so a restarted node is where agents and peers
/// look for it.
struct Node {
    name: String,
    yaml: String,
    agent: SocketAddr,
    process: Option<SluiceProcess>,
    rss_before_kib: u64,
}

fn node_yaml(name: &str, agent_port: u16, private_port: u16, secrets: &Secrets) -> String {
    format!(
        "# Generated by sluice-perf (scale agents).\n\
         runtime: {{workers: 1, drain_timeout: 1s}}\n\
         logging: {{level: warn}}\n\
         listeners:\n\
         \x20 admin: {{address: '127.0.0.1:0'}}\n\
         \x20 agent: {{address: '127.0.0.1:{agent_port}', backlog: 4096, max_connections_per_worker: 20000}}\n\
         \x20 external: {{address: '127.0.0.1:0'}}\n\
         \x20 private: {{address: '127.0.0.1:{private_port}'}}\n\
         tunnel:\n  node_name: {name}\n  jwt: {{secret_file: '{jwt}'}}\n\
         \x20 private_jwt: {{secret_file: '{private}'}}\n  agents:\n",
        jwt = secrets.jwt_secret_file.display(),
        private = secrets.private_secret_file.display(),
    )
}

fn run_layout(
    harness: &Harness,
    runtime: &tokio::runtime::Runtime,
    dir: &Path,
    layout: &Layout,
    plan: &Plan,
) -> anyhow::Result<LayoutRecord> {
    let redis = start_redis(dir, layout.redis, &harness.upstream_cpu)?;
    let secrets = Secrets::create(dir, 0)?;
    let seed = random_hex(16)?;
    let per_node = layout.steps.last().copied().unwrap_or(0);
    let total = per_node * layout.nodes;
    let mut agent_lines = String::with_capacity(total * 96);
    for id in 1..=total as u64 {
        let sha = agent_sim::token_sha256(&agent_sim::token(&seed, id));
        agent_lines.push_str(&format!("    - {{id: {id}, token_sha256: '{sha}'}}\n"));
    }
    let mut nodes = Vec::new();
    for index in 0..layout.nodes {
        let name = format!("node-{index}");
        let agent_port = free_port()?;
        let yaml = format!(
            "{}{agent_lines}{}",
            node_yaml(&name, agent_port, free_port()?, &secrets),
            redis.yaml
        );
        let process = harness
            .sluice
            .start(dir, &name, "run", &yaml, &harness.proxy_cpu)?;
        nodes.push(Node {
            name,
            yaml,
            agent: SocketAddr::from(([127, 0, 0, 1], agent_port)),
            process: Some(process),
            rss_before_kib: 0,
        });
    }
    std::thread::sleep(Duration::from_millis(500));
    for node in &mut nodes {
        node.rss_before_kib = rss_kib(pid(node)?)?;
    }
    let redis_before = redis_probe::figures(&redis.endpoints)?;

    let stats = Arc::new(SimStats::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let addresses: Vec<_> = nodes.iter().map(|n| watch::channel(n.agent)).collect();
    let mut spawned = 0usize;
    let mut points = Vec::new();
    for &step in &layout.steps {
        let started = Instant::now();
        // Agent `id` lives on node `id % nodes`; each step adds agents to every node.
        let _guard = runtime.enter();
        while spawned < step * layout.nodes {
            spawned += 1;
            let id = spawned as u64;
            let node = &addresses[spawned % layout.nodes].1;
            runtime.spawn(agent_sim::run_agent(
                id,
                agent_sim::token(&seed, id),
                node.clone(),
                stats.clone(),
                stop_rx.clone(),
            ));
            // Paced so the accept queues are not what is measured.
            if spawned.is_multiple_of(500) {
                wait_connected(&stats, spawned - 250, Duration::from_secs(60))?;
            }
        }
        wait_connected(&stats, spawned, Duration::from_secs(120))?;
        wait_listed(&redis, &nodes, step, Duration::from_secs(120))?;
        let seconds_to_connect = started.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_secs(1));
        points.push(measure_point(
            &nodes,
            &redis,
            redis_before,
            step,
            seconds_to_connect,
            plan.idle_window,
        )?);
    }
    let jwt = secrets.client_jwt()?;
    let caller_node = &nodes[1 % layout.nodes];
    let external = caller_node
        .process
        .as_ref()
        .context("caller node")?
        .address("external")?;
    let steady_calls = if layout.nodes > 1 {
        runtime.block_on(calls_for(
            external,
            jwt.clone(),
            total,
            plan.call_rate,
            plan.steady_calls,
            None,
        ))?
    } else {
        Calls::default()
    };
    let (restart, restart_calls, disconnects_in_restart) = restart_node(
        harness, runtime, dir, &mut nodes, &redis, &stats, layout, plan, external, &jwt,
    )?;
    let disconnects_outside_restart = stats
        .disconnects
        .load(Ordering::Relaxed)
        .saturating_sub(disconnects_in_restart);
    let _ = stop_tx.send(true);
    let record = LayoutRecord {
        layout: layout.clone(),
        points,
        restart,
        steady_calls,
        restart_calls,
        agent_errors: stats.errors.load(Ordering::Relaxed),
        agent_last_error: stats.last_error.lock().ok().and_then(|l| l.clone()),
        disconnects_outside_restart,
        calls_answered_by_agents: stats.calls.load(Ordering::Relaxed),
    };
    // Stop the agents before the nodes, so no node sees its agents leave as a failure.
    std::thread::sleep(Duration::from_millis(300));
    drop(nodes);
    drop(redis);
    Ok(record)
}

fn pid(node: &Node) -> anyhow::Result<u32> {
    Ok(node
        .process
        .as_ref()
        .context("node not running")?
        .process
        .pid())
}

fn wait_connected(stats: &SimStats, want: usize, timeout: Duration) -> anyhow::Result<()> {
    wait_until(&format!("{want} agents connected"), timeout, || {
        Ok(stats.connected.load(Ordering::Relaxed) >= want)
    })
}

/// Every node's first `per_node` agents listed under its name in Redis.
fn wait_listed(
    redis: &SharedRedis,
    nodes: &[Node],
    per_node: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    wait_until("every agent listed in redis", timeout, || {
        for (index, node) in nodes.iter().enumerate() {
            let agents = agents_of(index, nodes.len(), per_node);
            if redis_probe::agents_listed(&redis.endpoints, PREFIX, &node.name, &agents)?
                < agents.len()
            {
                return Ok(false);
            }
        }
        Ok(true)
    })
}

/// The agent ids of node `index`: `id % nodes == index`, the first `per_node` of them.
pub fn agents_of(index: usize, nodes: usize, per_node: usize) -> Vec<u64> {
    (1..=(per_node * nodes) as u64)
        .filter(|id| *id as usize % nodes == index)
        .collect()
}

fn measure_point(
    nodes: &[Node],
    redis: &SharedRedis,
    redis_before: RedisFigures,
    per_node: usize,
    seconds_to_connect: f64,
    window: Duration,
) -> anyhow::Result<Point> {
    let mut watched = Vec::new();
    for node in nodes {
        watched.push((node.name.clone(), pid(node)?));
    }
    watched.extend(redis.pids.iter().cloned());
    let idle_start = redis_probe::figures(&redis.endpoints)?;
    let meter = CpuMeter::start(&watched)?;
    let started = Instant::now();
    std::thread::sleep(window);
    let all_usage = meter.finish()?;
    let (usage, redis_usage) = all_usage.split_at(nodes.len());
    let elapsed = started.elapsed().as_secs_f64();
    let idle_end = redis_probe::figures(&redis.endpoints)?;
    let total = per_node * nodes.len();
    let per_agent: Vec<f64> = nodes
        .iter()
        .zip(usage)
        .map(|(node, u)| u.rss_kib.saturating_sub(node.rss_before_kib) as f64 / per_node as f64)
        .collect();
    let cpu: f64 = usage.iter().map(|u| u.cpu_us as f64).sum::<f64>() / nodes.len() as f64;
    let redis_cpu: f64 = redis_usage.iter().map(|u| u.cpu_us as f64).sum();
    Ok(Point {
        agents_per_node: per_node,
        agents_total: total,
        seconds_to_connect,
        node_rss_kib: usage.iter().map(|u| u.rss_kib).collect(),
        node_rss_kib_per_agent: per_agent.iter().sum::<f64>() / per_agent.len().max(1) as f64,
        node_cpu_percent: cpu / 1e6 / elapsed * 100.0,
        redis_cpu_percent: redis_cpu / 1e6 / elapsed * 100.0,
        redis: idle_end,
        redis_bytes_per_agent: (idle_start.used_memory - redis_before.used_memory) / total as f64,
        redis_commands_per_agent: (idle_start.commands - redis_before.commands) / total as f64,
        redis_ops_per_s_idle: (idle_end.commands - idle_start.commands) / elapsed,
    })
}

/// Stops node 0 gracefully (it drains and removes its entries), starts it again on the same
/// ports, and times its agents' return; calls through another node run all along.
#[allow(clippy::too_many_arguments)]
fn restart_node(
    harness: &Harness,
    runtime: &tokio::runtime::Runtime,
    dir: &Path,
    nodes: &mut [Node],
    redis: &SharedRedis,
    stats: &SimStats,
    layout: &Layout,
    plan: &Plan,
    external: SocketAddr,
    jwt: &str,
) -> anyhow::Result<(Restart, Calls, u64)> {
    let per_node = layout.steps.last().copied().unwrap_or(0);
    let agents = agents_of(0, layout.nodes, per_node);
    let total = per_node * layout.nodes;
    let (done_tx, done_rx) = watch::channel(false);
    let calls = (layout.nodes > 1).then(|| {
        runtime.spawn(calls_for(
            external,
            jwt.to_string(),
            total,
            plan.call_rate,
            Duration::from_secs(120),
            Some(done_rx),
        ))
    });
    std::thread::sleep(Duration::from_millis(500));
    let disconnects_at_start = stats.disconnects.load(Ordering::Relaxed);
    let before = redis_probe::figures(&redis.endpoints)?;
    let listen_before = listen_counters();
    let started = Instant::now();
    drop(nodes[0].process.take());
    let process = harness.sluice.start(
        dir,
        "node-0-restarted",
        "run",
        &nodes[0].yaml,
        &harness.proxy_cpu,
    )?;
    let seconds_to_node_up = started.elapsed().as_secs_f64();
    let admin = process.address("admin")?;
    let new_pid = process.process.pid();
    nodes[0].process = Some(process);
    let mut restart = Restart {
        agents_on_node: agents.len(),
        seconds_to_node_up,
        ..Restart::default()
    };
    let deadline = started + Duration::from_secs(if harness.smoke { 60 } else { 180 });
    let mut listed = 0;
    while Instant::now() < deadline {
        let figures = redis_probe::figures(&redis.endpoints)?;
        restart.redis_peak_used_memory = restart.redis_peak_used_memory.max(figures.used_memory);
        if restart.seconds_to_all_connected == 0.0 {
            let connected = admin_get(admin, "/metrics")
                .ok()
                .and_then(|m| metric_value(&m, "sluice_tunnel_connected_agents"))
                .unwrap_or(0.0);
            if connected as usize >= agents.len() {
                restart.seconds_to_all_connected = started.elapsed().as_secs_f64();
            }
        }
        listed = redis_probe::agents_listed(&redis.endpoints, PREFIX, &nodes[0].name, &agents)?;
        if listed >= agents.len() && restart.seconds_to_all_connected > 0.0 {
            restart.seconds_to_all_listed = started.elapsed().as_secs_f64();
            let after = redis_probe::figures(&redis.endpoints)?;
            restart.redis_commands = after.commands - before.commands;
            restart.redis_ops_per_s = restart.redis_commands / restart.seconds_to_all_listed;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    restart.agents_unreachable = agents.len().saturating_sub(listed);
    let listen_after = listen_counters();
    restart.listen_overflows = listen_after.0.saturating_sub(listen_before.0);
    restart.listen_drops = listen_after.1.saturating_sub(listen_before.1);
    restart.node_cpu_ms = cpu_micros(new_pid)? as f64 / 1_000.0;
    let disconnects = stats.disconnects.load(Ordering::Relaxed) - disconnects_at_start;
    std::thread::sleep(Duration::from_secs(1));
    let _ = done_tx.send(true);
    let calls = match calls {
        Some(handle) => runtime.block_on(handle)??,
        None => Calls::default(),
    };
    Ok((restart, calls, disconnects))
}

/// TcpExt ListenOverflows and ListenDrops from /proc/net/netstat (zeros if unreadable).
fn listen_counters() -> (u64, u64) {
    std::fs::read_to_string("/proc/net/netstat")
        .map(|text| parse_listen_counters(&text))
        .unwrap_or((0, 0))
}

/// The TcpExt header line names the fields of the value line after it.
pub fn parse_listen_counters(netstat: &str) -> (u64, u64) {
    let lines: Vec<&str> = netstat
        .lines()
        .filter(|l| l.starts_with("TcpExt:"))
        .collect();
    let [names, values, ..] = lines.as_slice() else {
        return (0, 0);
    };
    let field = |wanted: &str| {
        names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(name, _)| *name == wanted)
            .and_then(|(_, value)| value.parse().ok())
            .unwrap_or(0)
    };
    (field("ListenOverflows"), field("ListenDrops"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_counters_are_read_by_name() {
        let netstat = "TcpExt: SyncookiesSent ListenOverflows ListenDrops\n\
                       TcpExt: 0 12 15\nIpExt: InNoRoutes\nIpExt: 0\n";
        assert_eq!(parse_listen_counters(netstat), (12, 15));
        assert_eq!(parse_listen_counters(""), (0, 0));
    }

    #[test]
    fn levels_replace_the_layouts_one_per_node_count() {
        let plan = Plan::new(false).with_overrides(
            &[(5_000, 1), (2_000, 2), (1_000, 1)],
            Some(Duration::from_secs(7)),
        );
        let layouts: Vec<_> = plan
            .layouts
            .iter()
            .map(|l| (l.name, l.nodes, l.steps.clone(), l.redis))
            .collect();
        assert_eq!(
            layouts,
            vec![
                ("1-node", 1, vec![1_000, 5_000], RedisKind::Single),
                ("2-nodes", 2, vec![2_000], RedisKind::Single),
            ]
        );
        assert_eq!(plan.idle_window, Duration::from_secs(7));
        let unchanged = Plan::new(false).with_overrides(&[], None);
        assert_eq!(unchanged.layouts.len(), 4);
        assert_eq!(unchanged.idle_window, Duration::from_secs(20));
    }

    #[test]
    fn agents_are_spread_over_the_nodes_without_overlap() {
        let all: Vec<Vec<u64>> = (0..4).map(|i| agents_of(i, 4, 3)).collect();
        assert!(all.iter().all(|a| a.len() == 3));
        let mut flat: Vec<u64> = all.concat();
        flat.sort_unstable();
        assert_eq!(flat, (1..=12).collect::<Vec<_>>());
        assert_eq!(agents_of(0, 1, 5), vec![1, 2, 3, 4, 5]);
    }
}
