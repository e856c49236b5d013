//! `perf/run.sh scale`: the seeds' scale questions (issue 36), each answered by a harness of
//! cheap simulated peers that speak the real protocols. Built so far: `vms` (seed 004's 5,000
//! VMs on one control plane). `--smoke` runs each with small counts for CI and fails if any
//! simulated peer saw an error.

mod fleet;
mod vms;

use anyhow::bail;

use super::{write_output, Harness};

pub fn run(harness: &Harness) -> anyhow::Result<()> {
    let dir = super::fresh_work_dir(&harness.out)?;
    super::fresh_raw_dir(&harness.out)?;
    let machine = crate::machine::describe();
    let plan = vms::Plan::new(harness.smoke);
    let vm_dir = dir.join("vms");
    std::fs::create_dir_all(&vm_dir)?;
    let record = vms::run(harness, &vm_dir, plan)?;
    write_output(
        &harness.out,
        "raw/vms.json",
        &serde_json::to_string_pretty(&record)?,
    )?;
    let markdown = markdown(harness, &machine, &record);
    write_output(&harness.out, "summary.md", &markdown)?;
    println!("{markdown}");
    println!("wrote {}", harness.out.display());
    if record.errors() > 0 {
        bail!(
            "{} error(s) seen by the simulated VM agents",
            record.errors()
        );
    }
    Ok(())
}

fn markdown(harness: &Harness, machine: &crate::machine::Machine, r: &vms::VmRecord) -> String {
    let plan = &r.plan;
    format!(
        "# Scale scenario{smoke}\n\n{machine}\
         ## VMs on one control plane (embedded store)\n\n\
         {vms} VMs, each with its own vm-agent token and a simulated agent in the harness on CPU \
         {client} (a runtime-info report, then a heartbeat every {beat:?}; the agent's four watches \
         run by `sluice-watch-client`); {policies} NetworkPolicies, each applied to an \
         AppliedToGroup of every {policies}th VM and naming an AddressGroup of 10 to 1,000 \
         members; `sluice controlplane` on CPU {proxy}.\n\n\
         | measure | value |\n|---|--:|\n\
         | set-up (tokens, VMs, policies stored) | {setup:.1} s |\n\
         | every VM AgentedConnected after its agent started | {connect:.1} s |\n\
         | control-plane CPU at steady state ({steady:?}, heartbeats only) | {cpu:.1} % of a core |\n\
         | control-plane RSS at steady state | {rss:.0} MiB |\n\
         | policy write to affected agent: p50 / p99 / max | {p50:.1} / {p99:.1} / {max:.1} ms |\n\
         | deliveries seen / expected | {seen} / {expected} |\n\
         | VMs that left AgentedConnected while reporting | {misjudged} |\n\
         | restart to every agent seeing a write made after it | {resync:.1} s |\n\
         | heartbeats accepted | {beats} |\n\
         | agent write errors | {errors} |\n",
        smoke = if harness.smoke { " (smoke: not a measurement)" } else { "" },
        machine = machine.markdown(None),
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
