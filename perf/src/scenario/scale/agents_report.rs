//! The agents part's Markdown: one row per measured point, one per restart, and the paper
//! model computed from the measured figures.

use super::agents::{AgentsRecord, LayoutRecord};
use crate::scenario::Harness;

pub fn markdown(harness: &Harness, record: &AgentsRecord) -> String {
    let mut out = format!(
        "\n## Idle tunnel agents across nodes sharing a Redis\n\n\
         Simulated agents in the harness (CPU {client}; one agent id, token, HTTP/2 connection \
         and Connect stream each, echoing calls), `sluice run` nodes (one worker each, CPU \
         {proxy}), Redis on CPU {upstream}. Load average {load}.\n\n\
         | layout | agents per node | total | connect s | node RSS MiB | node KiB per agent | \
         node CPU % idle | Redis CPU % idle | Redis used MiB | Redis bytes per agent | Redis commands per agent | \
         Redis ops/s idle |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        client = harness.client_cpu,
        proxy = harness.proxy_cpu,
        upstream = harness.upstream_cpu,
        load = record.load_average,
    );
    for layout in &record.layouts {
        for p in &layout.points {
            let rss =
                p.node_rss_kib.iter().sum::<u64>() as f64 / p.node_rss_kib.len().max(1) as f64;
            out.push_str(&format!(
                "| {name} | {per} | {total} | {connect:.1} | {rss:.1} | {kib:.2} | {cpu:.2} | \
                 {redis_cpu:.2} | {used:.1} | {bytes:.0} | {commands:.1} | {ops:.1} |\n",
                name = layout.layout.name,
                per = p.agents_per_node,
                total = p.agents_total,
                connect = p.seconds_to_connect,
                rss = rss / 1024.0,
                kib = p.node_rss_kib_per_agent,
                cpu = p.node_cpu_percent,
                redis_cpu = p.redis_cpu_percent,
                used = p.redis.used_memory / 1_048_576.0,
                bytes = p.redis_bytes_per_agent,
                commands = p.redis_commands_per_agent,
                ops = p.redis_ops_per_s_idle,
            ));
        }
    }
    out.push_str(
        "\nA graceful restart of node-0 (it drains and removes its entries, then starts again \
         on the same ports), with calls through node-1 to agents spread over all nodes:\n\n\
         | layout | agents on node-0 | node up s | all connected s | all listed in Redis s | \
         unreachable | listen overflows / drops | Redis ops/s | Redis commands | new node CPU ms | calls steady p50 / p99 ms | \
         calls during restart p50 / p99 / max ms | call errors | agent errors | lost \
         connections outside the restart |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for layout in &record.layouts {
        out.push_str(&restart_row(layout));
    }
    if let Some(m) = &record.model {
        out.push_str(&format!(
            "\nPaper model (from the 1-node layout's largest point and its restart): \
             {kib:.2} KiB of node RSS, {bytes:.0} bytes of Redis and {commands:.1} Redis commands \
             per agent connection, {rate:.0} agents listed again per second after a restart.\n\n\
             | 100 nodes x 100,000 agents x 3 replicas | value |\n|---|--:|\n\
             | agent connections / per node | {conns:.0} / {per:.0} |\n\
             | node RSS for its agents | {node:.1} MiB |\n\
             | one node holding 100,000 agents: RSS for them (goal < 300 MiB) | {node100k:.1} MiB |\n\
             | Redis memory | {gib:.2} GiB |\n\
             | Redis ops/s for refresh (every {refresh:.0} s) | {refresh_ops:.0} |\n\
             | restart of one node: its agents listed again in | {storm:.1} s at {storm_ops:.0} ops/s |\n\
             | restart of a node of 100,000 agents: listed again in | {storm100k:.1} s |\n",
            kib = m.node_kib_per_agent,
            bytes = m.redis_bytes_per_agent,
            commands = m.redis_commands_per_agent,
            rate = m.reregistered_per_s,
            conns = m.connections,
            per = m.connections_per_node,
            node = m.node_mib_for_agents_per_node,
            node100k = m.node_mib_for_100k_agents,
            gib = m.redis_gib,
            refresh = super::agents_model::REFRESH_S,
            refresh_ops = m.refresh_ops_per_s,
            storm = m.storm_seconds_per_node,
            storm_ops = m.storm_ops_per_s,
            storm100k = m.storm_seconds_100k,
        ));
    }
    out
}

fn restart_row(layout: &LayoutRecord) -> String {
    let r = &layout.restart;
    let (s, c) = (&layout.steady_calls, &layout.restart_calls);
    format!(
        "| {name} | {agents} | {up:.1} | {connected:.1} | {listed:.1} | {unreachable} | \
         {overflows} / {drops} | {ops:.0} | {commands:.0} | {cpu:.0} | {s50:.1} / {s99:.1} | {c50:.1} / {c99:.1} / \
         {cmax:.1} | {call_errors} | {agent_errors} | {lost} |\n",
        name = layout.layout.name,
        agents = r.agents_on_node,
        up = r.seconds_to_node_up,
        connected = r.seconds_to_all_connected,
        listed = r.seconds_to_all_listed,
        unreachable = r.agents_unreachable,
        overflows = r.listen_overflows,
        drops = r.listen_drops,
        ops = r.redis_ops_per_s,
        commands = r.redis_commands,
        cpu = r.node_cpu_ms,
        s50 = s.p50_ms,
        s99 = s.p99_ms,
        c50 = c.p50_ms,
        c99 = c.p99_ms,
        cmax = c.max_ms,
        call_errors = s.errors + c.errors,
        agent_errors = layout.agent_errors,
        lost = layout.disconnects_outside_restart,
    )
}
