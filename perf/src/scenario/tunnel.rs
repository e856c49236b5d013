//! The tunnel scenario: unary gRPC calls (h2load with a prepared 5-byte message) through
//! client -> node -> tunnel -> agent -> echo backend, on one node and across two nodes (Redis),
//! next to direct client -> backend and HAProxy, nginx (`grpc_pass`) and Pingora (when
//! `perf/run.sh` could build it) as a plain h2 hop in front of the same backend.

use std::path::Path;
use std::time::Duration;

use anyhow::bail;

use super::{write_output, Harness};
use crate::loadgen::{measure, H2load, H2loadSummary, Load, Measured, Percentiles};
use crate::peers::{
    nginx_grpc_config, start_haproxy, start_nginx_with, start_pingora, start_redis, PingoraHop,
};
use crate::process::{wait_until, Managed};
use crate::record::RunRecord;
use crate::sluice::{
    admin_get, agent_yaml, driver_of, node_yaml, tunnel_calls, NodeSpec, Pool, Secrets,
};

/// The demo echo backend's unary method.
const METHOD: &str = "/sluice.demo.Echo/Say";
/// One gRPC message: not compressed, 5 bytes long, "hello".
const BODY: &[u8] = b"\x00\x00\x00\x00\x05hello";
const AGENT_ID: i64 = 1;

pub(super) const DIRECT: &str = "direct";
pub(super) const HAPROXY: &str = "haproxy";
pub(super) const NGINX: &str = "nginx";
pub(super) const PINGORA: &str = "pingora";
pub(super) const SLUICE_ONE_NODE: &str = "sluice-1-node";
pub(super) const SLUICE_TWO_NODES: &str = "sluice-2-nodes";
pub(super) const CASES: [&str; 6] = [
    DIRECT,
    HAPROXY,
    NGINX,
    PINGORA,
    SLUICE_ONE_NODE,
    SLUICE_TWO_NODES,
];

/// Concurrency levels (clients, streams per client), requests per run, repeats, warm-up.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    levels: Vec<(u32, u32)>,
    pub(super) requests: u64,
    pub(super) repeats: u32,
    pub(super) warmup: u64,
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
    super::tunnel_report::report(harness, &plan, &records, driver.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
