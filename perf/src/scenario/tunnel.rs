//! The tunnel scenario: unary gRPC calls (h2load with a prepared 5-byte message) through
//! client -> node -> tunnel -> agent -> echo backend, on one node and across two nodes (Redis),
//! next to direct client -> backend and HAProxy, nginx (`grpc_pass`) and Pingora (when
//! `perf/run.sh` could build it) as a plain h2 hop in front of the same backend.

use std::path::Path;
use std::time::Duration;

use anyhow::bail;

use super::{write_output, Harness};
use crate::loadgen::{measure, H2load, H2loadSummary, Load, Measured, Percentiles};
use crate::measure::ProcessUsage;
use crate::peers::{
    nginx_grpc_config, start_haproxy, start_nginx_with, start_pingora, start_redis, PingoraHop,
};
use crate::process::{wait_until, Managed};
use crate::record::{summarize, RunRecord};
use crate::sluice::{
    admin_get, agent_yaml, driver_of, node_yaml, tunnel_calls, NodeSpec, Pool, Secrets,
};

/// The demo echo backend's unary method.
const METHOD: &str = "/sluice.demo.Echo/Say";
/// One gRPC message: not compressed, 5 bytes long, "hello".
const BODY: &[u8] = b"\x00\x00\x00\x00\x05hello";
const AGENT_ID: i64 = 1;

const DIRECT: &str = "direct";
const HAPROXY: &str = "haproxy";
const NGINX: &str = "nginx";
const PINGORA: &str = "pingora";
const SLUICE_ONE_NODE: &str = "sluice-1-node";
const SLUICE_TWO_NODES: &str = "sluice-2-nodes";
const CASES: [&str; 6] = [
    DIRECT,
    HAPROXY,
    NGINX,
    PINGORA,
    SLUICE_ONE_NODE,
    SLUICE_TWO_NODES,
];

/// Concurrency levels (clients, streams per client), requests per run, repeats, warm-up.
#[derive(Debug, Clone)]
struct Plan {
    levels: Vec<(u32, u32)>,
    requests: u64,
    repeats: u32,
    warmup: u64,
}

fn plan(smoke: bool) -> Plan {
    if smoke {
        Plan {
            levels: vec![(10, 10)],
            requests: 2_000,
            repeats: 1,
            warmup: 200,
        }
    } else {
        Plan {
            levels: vec![(1, 1), (10, 1), (10, 10), (50, 10)],
            requests: 50_000,
            repeats: 3,
            warmup: 10_000,
        }
    }
}

/// One case's running processes: the URL the client calls and the proxy side to measure.
struct CaseSetup {
    url: String,
    /// The admin endpoint of the node clients call, whose metrics count gRPC statuses.
    entry_admin: Option<std::net::SocketAddr>,
    proxy: Vec<Managed>,
    /// Processes that must live but are not on the request path (Redis).
    _support: Vec<Managed>,
}

fn url(address: std::net::SocketAddr) -> String {
    format!("http://{address}{METHOD}")
}

fn set_up(
    case: &str,
    harness: &Harness,
    dir: &Path,
    secrets: &Secrets,
    backend: std::net::SocketAddr,
) -> anyhow::Result<CaseSetup> {
    let cpu = &harness.proxy_cpu;
    // Enough idle tunnels that the highest concurrency never waits for one to open.
    let pool = Pool {
        min_idle: 600,
        max: 1000,
        grow_by: 100,
    };
    let case_dir = dir.join(case);
    std::fs::create_dir_all(&case_dir)?;
    match case {
        DIRECT => Ok(CaseSetup {
            url: url(backend),
            entry_admin: None,
            proxy: Vec::new(),
            _support: Vec::new(),
        }),
        HAPROXY => {
            let haproxy = start_haproxy(&case_dir, backend, cpu)?;
            Ok(CaseSetup {
                url: url(haproxy.address),
                entry_admin: None,
                proxy: vec![haproxy.process],
                _support: Vec::new(),
            })
        }
        NGINX => {
            let nginx = start_nginx_with(&case_dir, cpu, |listen| {
                nginx_grpc_config(&case_dir, listen, backend)
            })?;
            Ok(CaseSetup {
                url: url(nginx.address),
                entry_admin: None,
                proxy: vec![nginx.process],
                _support: Vec::new(),
            })
        }
        PINGORA => {
            let Some(program) = &harness.pingora else {
                bail!("the pingora case needs --pingora (perf/run.sh builds it on full runs)");
            };
            let pingora = start_pingora(&case_dir, program, cpu, backend, PingoraHop::Grpc)?;
            Ok(CaseSetup {
                url: url(pingora.address),
                entry_admin: None,
                proxy: vec![pingora.process],
                _support: Vec::new(),
            })
        }
        SLUICE_ONE_NODE => {
            let spec = NodeSpec {
                name: "node-1",
                agents: &secrets.agents,
                redis_socket: None,
            };
            let node =
                harness
                    .sluice
                    .start(&case_dir, "node", "run", &node_yaml(&spec, secrets), cpu)?;
            let agent_config =
                agent_yaml(&secrets.agents[0], node.address("agent")?, backend, pool);
            let agent = harness
                .sluice
                .start(&case_dir, "agent", "agent", &agent_config, cpu)?;
            Ok(CaseSetup {
                url: url(node.address("external")?),
                entry_admin: Some(node.address("admin")?),
                proxy: vec![node.process, agent.process],
                _support: Vec::new(),
            })
        }
        SLUICE_TWO_NODES => {
            let redis = start_redis(&case_dir, cpu)?;
            let spec = |name| NodeSpec {
                name,
                agents: &secrets.agents,
                redis_socket: Some(&redis.socket),
            };
            let node_a = harness.sluice.start(
                &case_dir,
                "node-a",
                "run",
                &node_yaml(&spec("node-a"), secrets),
                cpu,
            )?;
            let node_b = harness.sluice.start(
                &case_dir,
                "node-b",
                "run",
                &node_yaml(&spec("node-b"), secrets),
                cpu,
            )?;
            // The agent holds its tunnels on node B; clients call node A, which finds the agent
            // through Redis and forwards to node B's private endpoint.
            let agent_config =
                agent_yaml(&secrets.agents[0], node_b.address("agent")?, backend, pool);
            let agent = harness
                .sluice
                .start(&case_dir, "agent", "agent", &agent_config, cpu)?;
            Ok(CaseSetup {
                url: url(node_a.address("external")?),
                entry_admin: Some(node_a.address("admin")?),
                proxy: vec![node_a.process, node_b.process, agent.process],
                _support: vec![redis.process],
            })
        }
        other => bail!("unknown tunnel case {other}"),
    }
}

fn load(
    harness: &Harness,
    secrets: &Secrets,
    body_file: &Path,
    url: &str,
    (clients, streams): (u32, u32),
    requests: u64,
) -> anyhow::Result<H2load> {
    let jwt = secrets.client_jwt()?;
    Ok(H2load {
        url: url.to_string(),
        load: Load::Requests(requests),
        clients,
        streams,
        body_file: Some(body_file.to_path_buf()),
        h1: false,
        rps_per_client: None,
        headers: vec![
            "content-type: application/grpc".to_string(),
            "te: trailers".to_string(),
            format!("authorization: Bearer {jwt}"),
            format!("sluice-agent-id: {AGENT_ID}"),
        ],
        cpu: harness.client_cpu.clone(),
    })
}

/// (all, OK) tunnel calls the entry node has answered so far; `None` without a Sluice node.
fn grpc_calls(admin: Option<std::net::SocketAddr>) -> anyhow::Result<Option<(u64, u64)>> {
    admin
        .map(|admin| Ok(tunnel_calls(&admin_get(admin, "/metrics")?)))
        .transpose()
}

/// Calls that ended with a gRPC status other than OK: the larger of two counts, so that no
/// case goes uncounted. The client's: the echo backend answers every call it gets with the
/// request's one message, and a hop that fails a call (Sluice, HAProxy or nginx) answers
/// trailers-only, without it — so every HTTP 2xx answer whose message did not come back is
/// an error (h2load cannot read trailers, but it counts the DATA bytes). The entry node's, where
/// there is one (the status it counted between two readings of its metrics).
fn grpc_errors(
    summary: &H2loadSummary,
    before: Option<(u64, u64)>,
    after: Option<(u64, u64)>,
) -> u64 {
    let echoed = summary.data_bytes / BODY.len() as u64;
    let without_message = summary.status_2xx.saturating_sub(echoed);
    let counted_by_node = match (before, after) {
        (Some((all_before, ok_before)), Some((all_after, ok_after))) => all_after
            .saturating_sub(all_before)
            .saturating_sub(ok_after.saturating_sub(ok_before)),
        _ => 0,
    };
    without_message.max(counted_by_node)
}

/// Runs h2load; the summary and the latency percentiles of its successful requests.
fn run_h2load(h2load: &H2load, dir: &Path) -> anyhow::Result<(H2loadSummary, Option<Percentiles>)> {
    let measured = measure(h2load, dir, &[], &[])?;
    Ok((measured.summary, measured.latency))
}

pub fn run(harness: &Harness) -> anyhow::Result<()> {
    let mut plan = plan(harness.smoke);
    if !harness.levels.is_empty() {
        plan.levels = harness.levels.clone();
    }
    if let Some(requests) = harness.requests {
        plan.requests = requests;
    }
    let dir = &super::fresh_work_dir(&harness.out)?;
    let secrets = Secrets::create(dir, 1)?;
    let body_file = dir.join("body.bin");
    std::fs::write(&body_file, BODY)?;
    super::fresh_raw_dir(&harness.out)?;

    // The echo backend every case ends at: the demo backend of a `sluice up` process.
    let backend_process = harness.sluice.start_demo(dir, &harness.upstream_cpu)?;
    let backend = backend_process.address("demo-backend")?;
    let upstream = [(
        backend_process.process.name.clone(),
        backend_process.process.pid(),
    )];
    let driver = admin_get(backend_process.address("admin")?, "/metrics")
        .ok()
        .and_then(|metrics| driver_of(&metrics));

    let mut records = Vec::new();
    let cases = CASES;
    if let Some(unknown) = harness.only.iter().find(|c| !cases.contains(&c.as_str())) {
        bail!(
            "--only {unknown}: the tunnel cases are {}",
            cases.join(", ")
        );
    }
    for case in cases {
        if !harness.only.is_empty() && !harness.only.iter().any(|c| c == case) {
            continue;
        }
        if case == PINGORA && harness.pingora.is_none() {
            eprintln!(
                "tunnel: {PINGORA} skipped: no --pingora binary ({})",
                super::gateway::PINGORA_SKIPPED
            );
            continue;
        }
        eprintln!("tunnel: {case}");
        let mut setup = set_up(case, harness, dir, &secrets, backend)?;
        wait_until(
            &format!("{case} to answer calls"),
            Duration::from_secs(30),
            || {
                for process in &mut setup.proxy {
                    process.check_alive()?;
                }
                let before = grpc_calls(setup.entry_admin)?;
                let probe = load(harness, &secrets, &body_file, &setup.url, (1, 1), 20)?;
                let (summary, _) = run_h2load(&probe, dir)?;
                let after = grpc_calls(setup.entry_admin)?;
                Ok(summary.status_2xx == 20 && grpc_errors(&summary, before, after) == 0)
            },
        )?;
        let warmup = load(
            harness,
            &secrets,
            &body_file,
            &setup.url,
            (10, 10),
            plan.warmup,
        )?;
        run_h2load(&warmup, dir)?;
        let proxy: Vec<(String, u32)> = setup
            .proxy
            .iter()
            .map(|p| (p.name.clone(), p.pid()))
            .collect();
        for &level in &plan.levels {
            for repeat in 0..plan.repeats {
                let h2load = load(
                    harness,
                    &secrets,
                    &body_file,
                    &setup.url,
                    level,
                    plan.requests,
                )?;
                let calls_before = grpc_calls(setup.entry_admin)?;
                let Measured {
                    summary,
                    latency,
                    usage,
                    upstream_usage,
                    client_cpu_us,
                    tcp_out_segments,
                } = measure(&h2load, dir, &proxy, &upstream)?;
                let calls_after = grpc_calls(setup.entry_admin)?;
                let failed_grpc = grpc_errors(&summary, calls_before, calls_after);
                let record = RunRecord {
                    scenario: "tunnel".to_string(),
                    case: case.to_string(),
                    workload: "grpc unary".to_string(),
                    clients: level.0,
                    streams: level.1,
                    repeat,
                    h2load: summary,
                    latency_us: latency,
                    grpc_errors: Some(failed_grpc),
                    proxy: Vec::new(),
                    proxy_cpu_us_per_request: None,
                    proxy_user_us_per_request: None,
                    proxy_system_us_per_request: None,
                    proxy_rss_kib: 0,
                    upstream_cpu_us_per_request: None,
                    client_cpu_us_per_request: None,
                    segments_per_request: None,
                }
                .with_proxy(usage)
                .with_upstream(&upstream_usage)
                .with_client(client_cpu_us)
                .with_segments(tcp_out_segments);
                eprintln!(
                    "  {}x{} #{repeat}: {:.0} req/s, p50 {} us, proxy {} us/req, {} errors",
                    level.0,
                    level.1,
                    record.h2load.requests_per_second,
                    record.latency_us.map_or(0, |p| p.p50),
                    record
                        .proxy_cpu_us_per_request
                        .map_or_else(|| "-".to_string(), |c| format!("{c:.1}")),
                    record.h2load.errors() + record.grpc_errors.unwrap_or(0),
                );
                let answered = record
                    .h2load
                    .status_2xx
                    .saturating_sub(record.grpc_errors.unwrap_or(0));
                if answered == 0 {
                    bail!(
                        "{case}: no call succeeded; see the logs in {}",
                        dir.display()
                    );
                }
                let name = format!("raw/{case}-c{}-m{}-r{repeat}.json", level.0, level.1);
                write_output(&harness.out, &name, &serde_json::to_string_pretty(&record)?)?;
                records.push(record);
            }
        }
    }
    drop(backend_process);
    report(harness, &plan, &records, driver.as_deref())
}

/// CPU per call of the hop itself, the measure issue 7's target names: for Sluice the node
/// processes only (the agent runs beside the backend, in the private network), for a peer the
/// whole proxy. Medians over the repeats.
fn hop_cpu_per_call(record: &RunRecord) -> Option<f64> {
    hop_per_call(record, |usage| usage.cpu_us)
}

/// The user-time part of [`hop_cpu_per_call`].
fn hop_user_per_call(record: &RunRecord) -> Option<f64> {
    hop_per_call(record, |usage| usage.user_us)
}

/// The system-time (kernel) part of [`hop_cpu_per_call`].
fn hop_system_per_call(record: &RunRecord) -> Option<f64> {
    hop_per_call(record, |usage| usage.system_us)
}

fn hop_per_call(record: &RunRecord, part: fn(&ProcessUsage) -> u64) -> Option<f64> {
    let nodes: Vec<_> = record
        .proxy
        .iter()
        .filter(|usage| usage.name.starts_with("node"))
        .collect();
    let cpu_us: u64 = if nodes.is_empty() {
        record.proxy.iter().map(part).sum()
    } else {
        nodes.into_iter().map(part).sum()
    };
    (!record.proxy.is_empty() && record.h2load.done > 0)
        .then(|| cpu_us as f64 / record.h2load.done as f64)
}

/// Hop CPU per call in units of h2load's CPU per call in the same run (see
/// `RunRecord::cpu_per_client_cpu` for why).
fn hop_per_client_cpu(record: &RunRecord) -> Option<f64> {
    hop_cpu_per_call(record)
        .zip(record.client_cpu_us_per_request)
        .map(|(hop, client)| hop / client)
}

/// The median of `value` for one case at one level, over its repeats.
fn median_of(
    records: &[RunRecord],
    value: fn(&RunRecord) -> Option<f64>,
    (case, clients, streams): (&str, u32, u32),
) -> Option<f64> {
    let mut values: Vec<f64> = records
        .iter()
        .filter(|r| r.case == case && r.clients == clients && r.streams == streams)
        .filter_map(value)
        .collect();
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

/// The median hop CPU per call of one case at one level, over its repeats.
fn median_hop_cpu(records: &[RunRecord], case: &str, clients: u32, streams: u32) -> Option<f64> {
    median_of(records, hop_cpu_per_call, (case, clients, streams))
}

fn hop_cpu_table(records: &[RunRecord]) -> String {
    let mut rows: Vec<(String, u32, u32)> = Vec::new();
    for record in records {
        let key = (record.case.clone(), record.clients, record.streams);
        if !record.proxy.is_empty() && !rows.contains(&key) {
            rows.push(key);
        }
    }
    let median =
        |case: &str, clients: u32, streams: u32| median_hop_cpu(records, case, clients, streams);
    let per_client = |case: &str, clients: u32, streams: u32| {
        median_of(records, hop_per_client_cpu, (case, clients, streams))
    };
    let user = |case: &str, clients: u32, streams: u32| {
        median_of(records, hop_user_per_call, (case, clients, streams))
    };
    let system = |case: &str, clients: u32, streams: u32| {
        median_of(records, hop_system_per_call, (case, clients, streams))
    };
    let us = |value: Option<f64>| value.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
    let mut out = String::from(
        "\nHop CPU per call (issue 7's measure: Sluice's node process(es) without the agent; \
         HAProxy, nginx and Pingora whole), split into user and system (kernel) time, and the same in \
         units of h2load's CPU per call in the same run (steadier when the machine's speed \
         drifts between runs):\n\n\
         | case | clients x streams | hop CPU us/call | vs haproxy | vs nginx | vs pingora | user us/call | sys us/call | sys vs haproxy | hop CPU/client CPU | vs haproxy | vs nginx | vs pingora |\n\
         |---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for (case, clients, streams) in &rows {
        let value = median(case, *clients, *streams);
        let quotient = per_client(case, *clients, *streams);
        let kernel = system(case, *clients, *streams);
        out.push_str(&format!(
            "| {case} | {clients} x {streams} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            us(value),
            crate::report::ratio(value, median(HAPROXY, *clients, *streams)),
            crate::report::ratio(value, median(NGINX, *clients, *streams)),
            crate::report::ratio(value, median(PINGORA, *clients, *streams)),
            us(user(case, *clients, *streams)),
            us(kernel),
            crate::report::ratio(kernel, system(HAPROXY, *clients, *streams)),
            crate::report::quotient(quotient),
            crate::report::ratio(quotient, per_client(HAPROXY, *clients, *streams)),
            crate::report::ratio(quotient, per_client(NGINX, *clients, *streams)),
            crate::report::ratio(quotient, per_client(PINGORA, *clients, *streams)),
        ));
    }
    out
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**missed**"
    }
}

/// Issue 17's tunnel goals, from this run's medians: hop CPU per call <= 0.8x HAProxy's at
/// every level, OK/s at 10 x 10 >= 0.5x direct (one node) and >= 0.4x (two nodes), p99 at
/// 50 x 10 within 2x HAProxy's.
fn targets(records: &[RunRecord], summaries: &[crate::record::CaseSummary]) -> String {
    let hop =
        |case: &str, clients: u32, streams: u32| median_hop_cpu(records, case, clients, streams);
    let mut out = String::from("| target | level | measured | status |\n|---|---|---|---|\n");
    for s in summaries.iter().filter(|s| s.case.starts_with("sluice")) {
        let level = format!("{} {} x {}", s.case, s.clients, s.streams);
        if let (Some(sluice), Some(haproxy)) = (
            hop(&s.case, s.clients, s.streams),
            hop(HAPROXY, s.clients, s.streams),
        ) {
            let per_client =
                |case| median_of(records, hop_per_client_cpu, (case, s.clients, s.streams));
            let quotients = match (per_client(&s.case), per_client(HAPROXY)) {
                (Some(sluice), Some(haproxy)) if haproxy > 0.0 => format!(
                    "; per client CPU {sluice:.2} vs {haproxy:.2} ({:.2}x)",
                    sluice / haproxy
                ),
                _ => String::new(),
            };
            out.push_str(&format!(
                "| hop CPU/call <= 0.8x HAProxy | {level} | {sluice:.1} vs {haproxy:.1} us ({:.2}x){quotients} | {} |\n",
                sluice / haproxy,
                met(sluice <= 0.8 * haproxy)
            ));
        }
        if let (Some(sluice), Some(pingora)) = (
            hop(&s.case, s.clients, s.streams),
            hop(PINGORA, s.clients, s.streams),
        ) {
            out.push_str(&format!(
                "| hop CPU/call <= Pingora's (issue 37) | {level} | {sluice:.1} vs {pingora:.1} us ({:.2}x) | {} |\n",
                sluice / pingora,
                met(sluice <= pingora)
            ));
        }
        let direct = crate::report::find(summaries, DIRECT, s);
        let floor = match s.case.as_str() {
            SLUICE_ONE_NODE => 0.5,
            _ => 0.4,
        };
        if let (Some(direct), (10, 10)) = (direct, (s.clients, s.streams)) {
            let share = s.ok_per_second / direct.ok_per_second.max(1.0);
            out.push_str(&format!(
                "| OK/s >= {floor}x direct | {level} | {:.0} vs {:.0} ({share:.2}x) | {} |\n",
                s.ok_per_second,
                direct.ok_per_second,
                met(share >= floor)
            ));
        }
        let haproxy = crate::report::find(summaries, HAPROXY, s);
        if let (Some(haproxy), (50, 10)) = (haproxy, (s.clients, s.streams)) {
            out.push_str(&format!(
                "| p99 <= 2x HAProxy | {level} | {} vs {} us | {} |\n",
                s.p99_us,
                haproxy.p99_us,
                met(s.p99_us <= 2 * haproxy.p99_us)
            ));
        }
    }
    out
}

fn report(
    harness: &Harness,
    plan: &Plan,
    records: &[RunRecord],
    driver: Option<&str>,
) -> anyhow::Result<()> {
    let summaries = summarize(records);
    write_output(
        &harness.out,
        "summary.json",
        &serde_json::to_string_pretty(&summaries)?,
    )?;
    let machine = crate::machine::describe();
    let mut markdown = format!(
        "# Tunnel scenario{}\n\n{}\
         Unary gRPC (5-byte message) with h2load; {} requests per run, {} run(s) per row (medians), \
         warm-up {} requests. CPUs: client {}, proxy side {}, echo backend {}. \
         HAProxy, nginx (`grpc_pass`, one process) and Pingora 0.9 (`perf/peers/pingora/`: one thread on its \
         single-threaded runtime, h2c with up to 1,000 streams per upstream connection) are plain h2 hops. Proxy CPU is utime+stime of every proxy-side process (node(s) and agent for Sluice) \
         divided by requests done, also shown apart as user (utime) and sys (stime, the kernel's time); upstream and client CPU the same of the echo backend and of h2load. \"Proxy CPU/client CPU\" \
         divides the proxy's by h2load's within each run: h2load does the same work for every case, so the quotient cancels \
         most of this machine's drift in speed between runs. \
         req/s counts every answer (h2load); OK/s only calls answered with gRPC status OK \
         (the entry node's sluice_tunnel_requests_total{{code}}; a gRPC error is an HTTP 200 as well), and the ratios use OK/s.\n\n",
        if harness.smoke { " (smoke: not a measurement)" } else { "" },
        machine.markdown(driver),
        plan.requests,
        plan.repeats,
        plan.warmup,
        harness.client_cpu,
        harness.proxy_cpu,
        harness.upstream_cpu,
    );
    let mut peers = vec![HAPROXY, NGINX];
    if summaries.iter().any(|s| s.case == PINGORA) {
        peers.push(PINGORA);
    } else {
        markdown.push_str(&format!(
            "Pingora: not run ({}).\n\n",
            super::gateway::PINGORA_SKIPPED
        ));
    }
    markdown.push_str(&crate::report::results_table(&summaries, DIRECT, &peers));
    markdown.push_str(&hop_cpu_table(records));
    markdown.push_str("\n## Against the targets of issue 17\n\n");
    markdown.push_str(&targets(records, &summaries));
    markdown.push_str("\n![throughput](throughput.svg)\n\n![p99 latency](latency-p99.svg)\n");
    write_output(&harness.out, "summary.md", &markdown)?;

    let series = |value: fn(&crate::record::CaseSummary) -> f64| -> Vec<crate::plot::Series> {
        CASES
            .iter()
            .filter(|case| summaries.iter().any(|s| s.case == **case))
            .map(|case| {
                let points = summaries
                    .iter()
                    .filter(|s| s.case == *case)
                    .map(|s| (f64::from(s.concurrency), value(s)))
                    .collect();
                (case.to_string(), points)
            })
            .collect()
    };
    crate::plot::by_concurrency(
        &harness.out.join("throughput.svg"),
        "Unary gRPC calls answered OK per second",
        "OK calls/s",
        &series(|s| s.ok_per_second),
    )?;
    crate::plot::by_concurrency(
        &harness.out.join("latency-p99.svg"),
        "Unary gRPC p99 latency",
        "p99 latency (us)",
        &series(|s| s.p99_us as f64),
    )?;
    println!("{markdown}");
    println!("wrote {}", harness.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::record;

    #[test]
    fn grpc_errors_are_counted_without_a_sluice_node() {
        // 100 answers with HTTP 200, 97 of them carrying the echoed message back.
        let summary = H2loadSummary {
            status_2xx: 100,
            data_bytes: 97 * BODY.len() as u64,
            ..H2loadSummary::default()
        };
        assert_eq!(grpc_errors(&summary, None, None), 3);
        let all_echoed = H2loadSummary {
            data_bytes: 100 * BODY.len() as u64,
            ..summary.clone()
        };
        assert_eq!(grpc_errors(&all_echoed, None, None), 0);
        // The node's count wins where it saw more (all, OK): 5 calls, 1 failed.
        assert_eq!(grpc_errors(&all_echoed, Some((10, 10)), Some((15, 14))), 1);
        assert_eq!(grpc_errors(&summary, Some((10, 10)), Some((15, 14))), 3);
    }

    /// A fifth of `cpu_us` in the kernel.
    fn usage(name: &str, cpu_us: u64) -> ProcessUsage {
        let cpu = crate::measure::CpuTime {
            user_us: cpu_us - cpu_us / 5,
            system_us: cpu_us / 5,
        };
        ProcessUsage::new(name, 1, cpu, 1)
    }

    #[test]
    fn the_hop_is_the_nodes_for_sluice_and_the_whole_proxy_for_a_peer() {
        // 1,000 calls done per record.
        let sluice = record(SLUICE_TWO_NODES, 1, 100.0, 1).with_proxy(vec![
            usage("node-a", 9_000),
            usage("node-b", 6_000),
            usage("agent", 20_000),
        ]);
        assert_eq!(hop_cpu_per_call(&sluice), Some(15.0));
        assert_eq!(hop_user_per_call(&sluice), Some(12.0));
        assert_eq!(hop_system_per_call(&sluice), Some(3.0));
        let haproxy = record(HAPROXY, 1, 100.0, 10_000);
        assert_eq!(hop_cpu_per_call(&haproxy), Some(10.0));
        assert_eq!(hop_cpu_per_call(&record(DIRECT, 1, 100.0, 0)), None);
        let table = hop_cpu_table(&[haproxy, sluice]);
        assert!(
            table.contains("| sluice-2-nodes | 1 x 1 | 15.0 | 1.50x |"),
            "{table}"
        );
        assert!(!table.contains("| direct"), "{table}");
    }

    #[test]
    fn the_hop_in_units_of_the_clients_cpu() {
        // The node spent 15 us a call and h2load 5 in Sluice's run; HAProxy 10 us while h2load,
        // on a slower minute of the machine, spent 8.
        let sluice = record(SLUICE_ONE_NODE, 1, 100.0, 1)
            .with_proxy(vec![usage("node-1", 15_000), usage("agent", 20_000)])
            .with_client(5_000);
        let haproxy = record(HAPROXY, 1, 100.0, 10_000).with_client(8_000);
        let pingora = record(PINGORA, 1, 100.0, 30_000).with_client(6_000);
        assert_eq!(hop_per_client_cpu(&sluice), Some(3.0));
        assert_eq!(hop_per_client_cpu(&haproxy), Some(1.25));
        assert_eq!(hop_per_client_cpu(&record(HAPROXY, 1, 100.0, 10_000)), None);
        let runs = [haproxy, pingora, sluice];
        let table = hop_cpu_table(&runs);
        assert!(
            table.contains(
                "| sluice-1-node | 1 x 1 | 15.0 | 1.50x | - | 0.50x | 12.0 | 3.0 | 1.20x | 3.00 | 2.40x | - | 0.60x |"
            ),
            "{table}"
        );
        let targets = targets(&runs, &summarize(&runs));
        assert!(
            targets.contains(
                "| hop CPU/call <= Pingora's (issue 37) | sluice-1-node 1 x 1 | 15.0 vs 30.0 us (0.50x) | met |"
            ),
            "{targets}"
        );
    }
}
