//! The idle scenario: many connected agent tunnels on one node, then the node's RSS and CPU
//! while nothing is called. The agent keeps its tunnels as streams of one HTTP/2 connection per
//! node, limited to 1,024 concurrent streams, so 1,000 tunnels come from each agent process
//! (each with its own id and token).

use std::time::{Duration, Instant};

use serde::Serialize;

use super::{write_output, Harness};
use crate::measure::{rss_kib, CpuMeter};
use crate::process::{wait_until, Managed};
use crate::sluice::{
    admin_get, agent_yaml, driver_of, metric_value, node_yaml, NodeSpec, Pool, Secrets,
};

const TUNNELS_PER_AGENT: usize = 1_000;

#[derive(Debug, Serialize)]
struct IdleResult {
    tunnels: u64,
    agents: usize,
    node_rss_kib_before: u64,
    node_rss_kib: u64,
    rss_kib_per_tunnel: f64,
    idle_window_s: f64,
    node_cpu_us: u64,
    node_cpu_percent: f64,
    agents_rss_kib: u64,
    agents_cpu_us: u64,
    seconds_to_connect: f64,
}

pub fn run(harness: &Harness) -> anyhow::Result<()> {
    let (wanted, window) = if harness.smoke {
        (TUNNELS_PER_AGENT, Duration::from_secs(3))
    } else {
        (10_000, Duration::from_secs(30))
    };
    let agents = wanted.div_ceil(TUNNELS_PER_AGENT);
    let dir = &super::fresh_work_dir(&harness.out)?;
    let secrets = Secrets::create(dir, agents)?;
    let spec = NodeSpec {
        name: "idle-node",
        agents: &secrets.agents,
        redis_socket: None,
    };
    let node = harness.sluice.start(
        dir,
        "node",
        "run",
        &node_yaml(&spec, &secrets),
        &harness.proxy_cpu,
    )?;
    let admin = node.address("admin")?;
    let agent_listener = node.address("agent")?;
    // Let start-up allocations settle before the baseline.
    std::thread::sleep(Duration::from_millis(500));
    let node_rss_kib_before = rss_kib(node.process.pid())?;
    let driver = admin_get(admin, "/metrics")
        .ok()
        .and_then(|m| driver_of(&m));

    // Agents never forward anything here; their backend address is never dialled.
    let unused_backend = std::net::SocketAddr::from(([127, 0, 0, 1], 9));
    let pool = Pool {
        min_idle: TUNNELS_PER_AGENT,
        max: TUNNELS_PER_AGENT,
        grow_by: 100,
    };
    let started = Instant::now();
    let mut agent_processes: Vec<Managed> = Vec::new();
    for (index, identity) in secrets.agents.iter().enumerate() {
        let yaml = agent_yaml(identity, agent_listener, unused_backend, pool);
        let agent = harness.sluice.start(
            dir,
            &format!("agent-{}", index + 1),
            "agent",
            &yaml,
            &harness.client_cpu,
        )?;
        agent_processes.push(agent.process);
    }
    let tunnels = || -> anyhow::Result<f64> {
        let metrics = admin_get(admin, "/metrics")?;
        Ok(metric_value(&metrics, "sluice_tunnel_connected_tunnels").unwrap_or(0.0))
    };
    let target = (agents * TUNNELS_PER_AGENT) as f64;
    wait_until(
        &format!("{target} tunnels on the node"),
        Duration::from_secs(180),
        || {
            for agent in &mut agent_processes {
                agent.check_alive()?;
            }
            Ok(tunnels()? >= target)
        },
    )?;
    let seconds_to_connect = started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(2));

    let mut watched = vec![("node".to_string(), node.process.pid())];
    watched.extend(agent_processes.iter().map(|a| (a.name.clone(), a.pid())));
    let meter = CpuMeter::start(&watched)?;
    let window_start = Instant::now();
    std::thread::sleep(window);
    let usage = meter.finish()?;
    let idle_window_s = window_start.elapsed().as_secs_f64();
    let connected = tunnels()?;
    let (node_usage, agent_usage) = usage.split_at(1);
    let node_rss_kib = node_usage[0].rss_kib;
    let result = IdleResult {
        tunnels: connected as u64,
        agents,
        node_rss_kib_before,
        node_rss_kib,
        rss_kib_per_tunnel: node_rss_kib.saturating_sub(node_rss_kib_before) as f64
            / connected.max(1.0),
        idle_window_s,
        node_cpu_us: node_usage[0].cpu_us,
        node_cpu_percent: node_usage[0].cpu_us as f64 / 1e6 / idle_window_s * 100.0,
        agents_rss_kib: agent_usage.iter().map(|u| u.rss_kib).sum(),
        agents_cpu_us: agent_usage.iter().map(|u| u.cpu_us).sum(),
        seconds_to_connect,
    };
    write_output(
        &harness.out,
        "raw/idle.json",
        &serde_json::to_string_pretty(&result)?,
    )?;
    let machine = crate::machine::describe();
    let markdown = format!(
        "# Idle scenario{smoke}\n\n{machine}\
         {agents} agent process(es) x {per} tunnels on one node (1 worker); node on CPU {node_cpu}, agents on CPU {agent_cpu}; \
         CPU sampled over {window:.1} s of idleness.\n\n\
         | tunnels | node RSS MiB | node RSS before MiB | KiB per tunnel | node CPU % idle | agents RSS MiB | agents CPU us | seconds to connect |\n\
         |--:|--:|--:|--:|--:|--:|--:|--:|\n\
         | {tunnels} | {rss:.1} | {before:.1} | {per_tunnel:.2} | {cpu:.3} | {agents_rss:.1} | {agents_cpu} | {connect:.1} |\n",
        smoke = if harness.smoke { " (smoke: not a measurement)" } else { "" },
        machine = machine.markdown(driver.as_deref()),
        per = TUNNELS_PER_AGENT,
        node_cpu = harness.proxy_cpu,
        agent_cpu = harness.client_cpu,
        window = result.idle_window_s,
        tunnels = result.tunnels,
        rss = result.node_rss_kib as f64 / 1024.0,
        before = result.node_rss_kib_before as f64 / 1024.0,
        per_tunnel = result.rss_kib_per_tunnel,
        cpu = result.node_cpu_percent,
        agents_rss = result.agents_rss_kib as f64 / 1024.0,
        agents_cpu = result.agents_cpu_us,
        connect = result.seconds_to_connect,
    );
    write_output(&harness.out, "summary.md", &markdown)?;
    println!("{markdown}");
    println!("wrote {}", harness.out.display());
    Ok(())
}
