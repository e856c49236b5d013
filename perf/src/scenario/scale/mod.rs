//! `perf/run.sh scale`: the seeds' scale questions (issue 36), each answered by a harness of
//! cheap simulated peers that speak the real protocols. Built so far: `vms` (seed 004's 5,000
//! VMs on one control plane) and `gateway` (seed 003's 10,000 clients folded by one gateway
//! onto a few apiserver connections) and `fanout` (10,000 gateway and node watchers of one
//! control plane under steady writes). `--only vms`, `--only gateway` or `--only fanout` runs
//! one part.
//! `agents` (seed kas's tunnel agents across nodes sharing a Redis, a node restart) runs with
//! `--only agents`.
//! `--smoke` runs each with small counts for CI and fails if any simulated peer saw an error.

mod agent_sim;
mod agents;
mod agents_model;
mod agents_report;
mod fanout;
mod fanout_peers;
mod fanout_plan;
mod fanout_raw;
mod fleet;
mod gateway_clients;
mod redis_probe;
mod size_spec;
mod vms;
mod vms_plan;

use anyhow::bail;

use super::{write_output, Harness};

pub fn run(harness: &Harness) -> anyhow::Result<()> {
    let dir = super::fresh_work_dir(&harness.out)?;
    super::fresh_raw_dir(&harness.out)?;
    let machine = crate::machine::describe();
    let wanted = |part: &str| harness.only.is_empty() || harness.only.iter().any(|o| o == part);
    let smoke = if harness.smoke {
        " (smoke: not a measurement)"
    } else {
        ""
    };
    let mut markdown = format!("# Scale scenario{smoke}\n\n{}", machine.markdown(None));
    let mut errors = Vec::new();
    if wanted("vms") {
        let vm_dir = dir.join("vms");
        std::fs::create_dir_all(&vm_dir)?;
        let record = vms::run(harness, &vm_dir, vms::Plan::from_env(harness.smoke)?)?;
        write_output(
            &harness.out,
            "raw/vms.json",
            &serde_json::to_string_pretty(&record)?,
        )?;
        markdown.push_str(&vms_markdown(harness, &record));
        if record.errors() > 0 {
            errors.push(format!(
                "{} error(s) seen by the simulated VM agents",
                record.errors()
            ));
        }
    }
    if wanted("gateway") {
        let gateway_dir = dir.join("gateway");
        std::fs::create_dir_all(&gateway_dir)?;
        let plan = gateway_clients::Plan::new(harness.smoke);
        let record = gateway_clients::run(harness, &gateway_dir, plan)?;
        write_output(
            &harness.out,
            "raw/gateway.json",
            &serde_json::to_string_pretty(&record)?,
        )?;
        markdown.push_str(&gateway_markdown(harness, &record));
        if record.errors() > 0 {
            errors.push(format!(
                "{} error(s) seen by the gateway's clients",
                record.errors()
            ));
        }
    }
    if wanted("fanout") {
        let fanout_dir = dir.join("fanout");
        std::fs::create_dir_all(&fanout_dir)?;
        let plan = fanout::Plan::from_env(harness.smoke)?;
        let records = fanout::run(harness, &fanout_dir, &plan)?;
        for record in &records {
            let light = match record.client {
                fanout_plan::Client::Raw if plan.client != fanout_plan::Client::Raw => "-light",
                _ => "",
            };
            let name = format!(
                "raw/fanout-{}-{}{light}.json",
                record.store.name(),
                record.target_writes_per_s
            );
            write_output(&harness.out, &name, &serde_json::to_string_pretty(record)?)?;
        }
        markdown.push_str(&fanout::markdown(harness, &plan, &records));
        let failed: u64 = records.iter().map(fanout::FanoutRecord::errors).sum();
        if failed > 0 {
            errors.push(format!(
                "{failed} write error(s), missed event(s) or watcher error(s) in the fan-out"
            ));
        }
    }
    if wanted("agents") {
        let agents_dir = dir.join("agents");
        std::fs::create_dir_all(&agents_dir)?;
        let record = agents::run(harness, &agents_dir, agents::Plan::new(harness.smoke))?;
        write_output(
            &harness.out,
            "raw/agents.json",
            &serde_json::to_string_pretty(&record)?,
        )?;
        markdown.push_str(&agents_report::markdown(harness, &record));
        if record.errors() > 0 {
            errors.push(format!(
                "{} error(s) seen by the simulated tunnel agents or their callers",
                record.errors()
            ));
        }
    }
    write_output(&harness.out, "summary.md", &markdown)?;
    println!("{markdown}");
    println!("wrote {}", harness.out.display());
    if !errors.is_empty() {
        bail!("{}", errors.join("; "));
    }
    Ok(())
}

fn gateway_markdown(harness: &Harness, r: &gateway_clients::GatewayRecord) -> String {
    let plan = r
        .plan
        .unwrap_or_else(|| gateway_clients::Plan::new(harness.smoke));
    format!(
        "\n## Clients through one gateway\n\n\
         `sluice run` (gateway, one worker, CPU {proxy}) in front of `sluice-apiserver-sim` (CPU \
         {upstream}, 1,000 streams per HTTP/2 connection); the clients in the harness, each a TCP \
         + TLS + HTTP/2 connection of its own, one bearer token for all; the watches open on \
         the idle clients' connections. Small GET: one pod, \
         {rate}/s for {probe:?} on {probes} connections.\n\n\
         | measure | value |\n|---|--:|\n\
         | small GET before: p50 / p99 | {b50:.2} / {b99:.2} ms |\n\
         | idle connections (one GET each) open / opened in | {idle} / {idle_s:.1} s |\n\
         | gateway RSS per idle client connection | {idle_kib:.1} KiB |\n\
         | watches open, one per client connection (first event seen) / opened in | {watches} / {watch_s:.1} s |\n\
         | gateway RSS per watch | {watch_kib:.1} KiB |\n\
         | small GET with the watches open: p50 / p99 | {w50:.2} / {w99:.2} ms |\n\
         | p99 with watches / before | {ratio:.2} |\n\
         | gateway TCP connections to the simulator: idle clients / with watches | {up_idle} / {up_watch} |\n\
         | `sluice_gateway_upstream_connections` with watches | {up_metric} |\n\
         | gateway RSS: start / end | {rss0:.0} / {rss1:.0} MiB |\n\
         | client errors | {errors} |\n",
        proxy = harness.proxy_cpu,
        upstream = harness.upstream_cpu,
        rate = plan.probe_rate,
        probe = plan.probe,
        probes = plan.probe_connections,
        b50 = r.baseline_get_p50_ms,
        b99 = r.baseline_get_p99_ms,
        idle = r.idle_connections,
        idle_s = r.seconds_to_open_idle,
        idle_kib = r.rss_kib_per_idle_connection,
        watches = r.watches_open,
        watch_s = r.seconds_to_open_watches,
        watch_kib = r.rss_kib_per_watch,
        w50 = r.watching_get_p50_ms,
        w99 = r.watching_get_p99_ms,
        ratio = r.get_p99_ratio,
        up_idle = r.upstream_sockets_idle,
        up_watch = r.upstream_sockets_watching,
        up_metric = r.upstream_connections_metric,
        rss0 = r.gateway_rss_start_mib,
        rss1 = r.gateway_rss_end_mib,
        errors = r.client_errors,
    )
}

fn vms_markdown(harness: &Harness, r: &vms::VmRecord) -> String {
    let plan = &r.plan;
    format!(
        "## VMs on one control plane ({store})\n\n\
         {vms} VMs, each with its own vm-agent token and a simulated agent in the harness on CPU \
         {client} (a runtime-info report, then a heartbeat every {beat:?}; the agent's four watches \
         run by `sluice-watch-client`); {policies} NetworkPolicies, each applied to an \
         AppliedToGroup of every {policies}th VM and naming an AddressGroup of 10 to 1,000 \
         members; `sluice controlplane` on CPU {proxy}.\n\n\
         | measure | value |\n|---|--:|\n\
         | set-up (tokens, VMs, policies stored) | {setup:.1} s |\n\
         | every VM AgentedConnected after its agent started | {connect:.1} s |\n\
         | control-plane CPU at steady state ({steady:?}, heartbeats only) | {cpu:.1} % of a core |\n\
         | etcd CPU over the same window | {etcd_cpu} |\n\
         | control-plane RSS at steady state | {rss:.0} MiB |\n\
         | policy write to affected agent: p50 / p99 / max | {p50:.1} / {p99:.1} / {max:.1} ms |\n\
         | deliveries seen / expected | {seen} / {expected} |\n\
         | VMs that left AgentedConnected while reporting | {misjudged} |\n\
         | restart to every agent seeing a write made after it | {resync:.1} s |\n\
         | heartbeats accepted | {beats} |\n\
         | agent write errors | {errors} |\n",
        store = if plan.etcd { "etcd, one member" } else { "embedded store" },
        etcd_cpu = r
            .steady_etcd_cpu_percent
            .map_or("-".to_string(), |cpu| format!("{cpu:.1} % of a core")),
        vms = plan.vms,
        client = harness.client_cpu,
        beat = plan.heartbeat,
        policies = plan.policies,
        proxy = harness.proxy_cpu,
        setup = r.seconds_to_set_up,
        connect = r.seconds_to_connect_all,
        steady = plan.steady,
        cpu = r.steady_controlplane_cpu_percent,
        rss = r.steady_controlplane_rss_mib,
        p50 = r.delivery_p50_ms,
        p99 = r.delivery_p99_ms,
        max = r.delivery_max_ms,
        seen = r.deliveries,
        expected = r.deliveries_expected,
        misjudged = r.misjudged_heartbeats,
        resync = r.seconds_to_resync_after_restart,
        beats = r.heartbeats,
        errors = r.agent_write_errors,
    )
}
