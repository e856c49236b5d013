//! The gateway scenario: HTTP/2 and HTTP/1.1 TLS clients -> proxy -> one HTTP/2 TLS upstream
//! (the apiserver simulator in its own process), next to direct client -> simulator, HAProxy
//! (h2 over TLS to the upstream), nginx (HTTP/1.1 keep-alive over TLS to the upstream: nginx
//! cannot proxy to an HTTP/2 upstream) and Pingora (h2 over TLS, many streams per connection;
//! when `perf/run.sh` could build it).
//!
//! Authentication: every client sends the same bearer token. The simulator accepts it as a
//! caller (direct, HAProxy and nginx pass it through); the Sluice gateway checks it with a
//! TokenReview against the simulator once and then answers from its per-core cache (the real
//! path for token clients), and forwards with its own client certificate plus
//! `Impersonate-User`. h2load cannot present client certificates, so certificate users are not
//! measured.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::bail;

use super::gateway_report::{issue37_goals, open_loop_table, targets};
use super::gateway_setup::{body_sizes, set_up, BodySizes};
pub(super) use super::gateway_setup::{
    cluster_yaml, gateway_yaml, h2load, start_simulator, Simulator,
};
use super::gateway_tunnel::{added_table, SLUICE_TUNNEL};
use super::{write_output, Harness};
use crate::loadgen::{measure, Load};
use crate::process::wait_until;
use crate::record::{summarize, CaseSummary, RunRecord};
use crate::sluice::{admin_get, driver_of, random_hex};

pub(super) const DIRECT: &str = "direct";
pub(super) const HAPROXY: &str = "haproxy";
pub(super) const NGINX: &str = "nginx";
pub(super) const PINGORA: &str = "pingora";
pub(super) const SLUICE: &str = "sluice-gateway";
const CASES: [&str; 6] = [DIRECT, HAPROXY, NGINX, PINGORA, SLUICE, SLUICE_TUNNEL];

/// Why a run has no Pingora rows.
pub(super) const PINGORA_SKIPPED: &str =
    "perf/run.sh builds perf/peers/pingora/ on full gateway and tunnel runs only, and skips it \
     when cargo cannot build it";

/// The cluster's name (TLS server name) in the gateway's config.
pub(super) const HOST: &str = "kube.perf.test";
/// A small GET: one pod, about 300 bytes of JSON.
pub(super) const GET_PATH: &str = "/api/v1/namespaces/default/pods/pod-00000";
/// A LIST-like answer: every pod of namespace `perf`.
const LIST_PATH: &str = "/api/v1/namespaces/perf/pods";
/// Pods in namespace `perf`: about 100 KB of JSON in one LIST answer.
pub(super) const LIST_PODS: usize = 372;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Protocol {
    H2,
    H1,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::H2 => "h2",
            Protocol::H1 => "h1",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RequestKind {
    Get,
    List,
}

impl RequestKind {
    fn name(self) -> &'static str {
        match self {
            RequestKind::Get => "get",
            RequestKind::List => "list",
        }
    }

    pub(super) fn path(self) -> &'static str {
        match self {
            RequestKind::Get => GET_PATH,
            RequestKind::List => LIST_PATH,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Workload {
    protocol: Protocol,
    request: RequestKind,
}

impl Workload {
    fn name(self) -> String {
        format!("{} {}", self.protocol.name(), self.request.name())
    }
}

/// The open-loop run: `clients` connections, each starting `rps_per_client` small GETs a second.
#[derive(Debug, Clone)]
struct OpenLoop {
    clients: u32,
    rps_per_client: u32,
    protocols: Vec<Protocol>,
    repeats: u32,
    duration: Duration,
}

impl OpenLoop {
    fn rate(&self) -> u32 {
        self.clients * self.rps_per_client
    }

    fn workload(&self, protocol: Protocol) -> String {
        format!("{} get @{}/s", protocol.name(), self.rate())
    }
}

#[derive(Debug, Clone)]
struct Plan {
    workloads: Vec<Workload>,
    /// Concurrent clients and the requests each keeps in flight (`CLIENTS x STREAMS`). Over
    /// HTTP/1.1 only one stream levels run: h2load would pipeline, which no proxy here speeds.
    levels: Vec<(u32, u32)>,
    repeats: u32,
    warm_up: Duration,
    duration: Duration,
    open_loop: OpenLoop,
}

fn plan(smoke: bool) -> Plan {
    let all = [Protocol::H2, Protocol::H1]
        .into_iter()
        .flat_map(|protocol| {
            [RequestKind::Get, RequestKind::List]
                .into_iter()
                .map(move |request| Workload { protocol, request })
        })
        .collect();
    if smoke {
        Plan {
            workloads: vec![
                Workload {
                    protocol: Protocol::H2,
                    request: RequestKind::Get,
                },
                Workload {
                    protocol: Protocol::H1,
                    request: RequestKind::List,
                },
            ],
            levels: vec![(8, 1)],
            repeats: 1,
            warm_up: Duration::from_millis(200),
            duration: Duration::from_millis(500),
            open_loop: OpenLoop {
                clients: 10,
                rps_per_client: 50,
                protocols: vec![Protocol::H2],
                repeats: 1,
                duration: Duration::from_millis(500),
            },
        }
    } else {
        Plan {
            workloads: all,
            // 64 x 10 is issue 37's saturation row: requests batch, as under a busy client.
            levels: vec![(1, 1), (64, 1), (512, 1), (64, 10)],
            repeats: 3,
            warm_up: Duration::from_secs(1),
            duration: Duration::from_secs(3),
            open_loop: OpenLoop {
                clients: 50,
                rps_per_client: 100,
                protocols: vec![Protocol::H2, Protocol::H1],
                repeats: 3,
                duration: Duration::from_secs(5),
            },
        }
    }
}

pub fn run(harness: &Harness) -> anyhow::Result<()> {
    let mut plan = plan(harness.smoke);
    if let Some(seconds) = harness.seconds {
        plan.duration = seconds;
        plan.open_loop.duration = seconds;
    }
    if !harness.levels.is_empty() {
        plan.levels = harness.levels.clone();
    }
    let dir = &super::fresh_work_dir(&harness.out)?;
    let tls = crate::certs::generate(dir, &["127.0.0.1", "localhost", HOST])?;
    let token = random_hex(24)?;
    super::fresh_raw_dir(&harness.out)?;

    let simulator = start_simulator(harness, dir, &tls, &token)?;
    let mut simulator_process = simulator.process;
    let upstream = [(simulator_process.name.clone(), simulator_process.pid())];
    let mut closed = Vec::new();
    let mut open = Vec::new();
    let mut driver = None;
    let mut sizes_by_case: Vec<(&str, BodySizes)> = Vec::new();
    let cases = CASES
        .into_iter()
        .filter(|case| harness.only.is_empty() || harness.only.iter().any(|only| only == case));
    for case in cases {
        if case == PINGORA && harness.pingora.is_none() {
            eprintln!("gateway: {PINGORA} skipped: no --pingora binary ({PINGORA_SKIPPED})");
            continue;
        }
        eprintln!("gateway: {case}");
        let mut setup = set_up(case, harness, dir, &tls, (simulator.address, &token))?;
        wait_until(
            &format!("{case} to answer requests"),
            Duration::from_secs(30),
            || {
                simulator_process.check_alive()?;
                for process in &mut setup.proxy {
                    process.check_alive()?;
                }
                let probe = h2load(
                    harness,
                    &token,
                    setup.address,
                    Protocol::H2,
                    RequestKind::Get,
                    (1, 1),
                    Load::Requests(20),
                    None,
                );
                Ok(measure(&probe, dir, &[], &[])?.summary.status_2xx == 20)
            },
        )?;
        let sizes = body_sizes(&tls, &token, setup.address)?;
        if let Some((_, direct)) = sizes_by_case.first() {
            if sizes != *direct {
                bail!("{case} answers {sizes:?}, the simulator itself {direct:?}");
            }
        }
        sizes_by_case.push((case, sizes));
        if let Some(admin) = setup.admin {
            driver = admin_get(admin, "/metrics")
                .ok()
                .and_then(|metrics| driver_of(&metrics));
        }
        let proxy: Vec<(String, u32)> = setup
            .proxy
            .iter()
            .map(|p| (p.name.clone(), p.pid()))
            .collect();
        let timed = Load::Timed {
            warm_up: plan.warm_up,
            duration: plan.duration,
        };
        let mut runs = Vec::new();
        for workload in &plan.workloads {
            for &(clients, streams) in &plan.levels {
                if streams > 1 && workload.protocol == Protocol::H1 {
                    continue;
                }
                for repeat in 0..plan.repeats {
                    runs.push((
                        workload.name(),
                        h2load(
                            harness,
                            &token,
                            setup.address,
                            workload.protocol,
                            workload.request,
                            (clients, streams),
                            timed,
                            None,
                        ),
                        repeat,
                        false,
                    ));
                }
            }
        }
        let open_loop = &plan.open_loop;
        for &protocol in &open_loop.protocols {
            for repeat in 0..open_loop.repeats {
                runs.push((
                    open_loop.workload(protocol),
                    h2load(
                        harness,
                        &token,
                        setup.address,
                        protocol,
                        RequestKind::Get,
                        (open_loop.clients, 1),
                        Load::Timed {
                            warm_up: plan.warm_up,
                            duration: open_loop.duration,
                        },
                        Some(open_loop.rps_per_client),
                    ),
                    repeat,
                    true,
                ));
            }
        }
        runs.retain(|(workload, ..)| {
            harness.workloads.is_empty()
                || harness
                    .workloads
                    .iter()
                    .any(|wanted| workload.contains(wanted.as_str()))
        });
        for (workload, load, repeat, is_open_loop) in runs {
            let measured = measure(&load, dir, &proxy, &upstream)?;
            let record = RunRecord {
                scenario: "gateway".to_string(),
                case: case.to_string(),
                workload: workload.clone(),
                clients: load.clients,
                streams: load.streams,
                repeat,
                h2load: measured.summary,
                latency_us: measured.latency,
                grpc_errors: None,
                proxy: Vec::new(),
                proxy_cpu_us_per_request: None,
                proxy_user_us_per_request: None,
                proxy_system_us_per_request: None,
                proxy_rss_kib: 0,
                upstream_cpu_us_per_request: None,
                client_cpu_us_per_request: None,
                segments_per_request: None,
            }
            .with_proxy(measured.usage)
            .with_upstream(&measured.upstream_usage)
            .with_client(measured.client_cpu_us)
            .with_segments(measured.tcp_out_segments);
            eprintln!(
                "  {workload} c{} #{repeat}: {:.0} req/s, p50 {} us, p99 {} us, proxy {} us/req, {} errors",
                load.clients,
                record.h2load.requests_per_second,
                record.latency_us.map_or(0, |p| p.p50),
                record.latency_us.map_or(0, |p| p.p99),
                record
                    .proxy_cpu_us_per_request
                    .map_or_else(|| "-".to_string(), |c| format!("{c:.1}")),
                record.h2load.errors(),
            );
            if record.h2load.status_2xx == 0 {
                bail!(
                    "{case} {workload}: no request succeeded; see the logs in {}",
                    dir.display()
                );
            }
            let name = format!(
                "raw/{case}-{}-c{}-r{repeat}.json",
                workload.replace([' ', '@', '/'], "_"),
                load.clients
            );
            write_output(&harness.out, &name, &serde_json::to_string_pretty(&record)?)?;
            if is_open_loop {
                open.push(record);
            } else {
                closed.push(record);
            }
        }
        simulator_process.check_alive()?;
    }
    drop(simulator_process);
    report(
        harness,
        &plan,
        (&closed, &open),
        &sizes_by_case,
        driver.as_deref(),
    )
}

/// The peers to compare with: HAProxy and nginx, and Pingora where it ran.
fn peers_in(summaries: &[CaseSummary]) -> Vec<&'static str> {
    let mut peers = vec![HAPROXY, NGINX];
    if summaries.iter().any(|s| s.case == PINGORA) {
        peers.push(PINGORA);
    }
    peers
}

/// What a plot shows of a row (`None`: no point).
type Metric = fn(&CaseSummary) -> Option<f64>;

/// `value - reference` in microseconds, signed.
fn report(
    harness: &Harness,
    plan: &Plan,
    (closed, open): (&[RunRecord], &[RunRecord]),
    body_sizes: &[(&str, BodySizes)],
    driver: Option<&str>,
) -> anyhow::Result<()> {
    let closed = summarize(closed);
    let open = summarize(open);
    write_output(
        &harness.out,
        "summary.json",
        &serde_json::to_string_pretty(
            &serde_json::json!({"closed_loop": closed, "open_loop": open}),
        )?,
    )?;
    let machine = crate::machine::describe();
    let mut markdown = format!(
        "# Gateway scenario{}\n\n{}\
         Clients -> proxy -> apiserver simulator (HTTP/2 over TLS, its own process). h2load over TLS, \
         HTTP/2 (`h2`) or HTTP/1.1 (`--h1`), one request in flight per client (and, over HTTP/2 only, 64 clients with 10 \
         each: the saturation row, where requests batch); small GET `{GET_PATH}` and \
         LIST `{LIST_PATH}` ({LIST_PODS} pods, see the response bytes column). Each run: {} ms warm-up \
         (connections and TLS handshakes), then {} ms counted; {} run(s) per row (medians). Open loop: \
         {} clients x {} req/s each = {} req/s of small GETs, {} ms counted. CPUs: client {}, proxy {}, \
         simulator {}. HAProxy: h2 over TLS to the upstream, `http-reuse always`, one thread. \
         nginx: one process (`master_process off`, one worker), HTTP/2 on the client side but \
         **HTTP/1.1 keep-alive to the upstream** (nginx cannot proxy to an HTTP/2 upstream), \
         `proxy_buffering off`. Pingora 0.9 (`perf/peers/pingora/`, openssl): one thread on its \
         single-threaded runtime, h2 over TLS to the upstream with up to 1,000 streams per \
         connection. Sluice: one worker, one upstream connection; clients authenticate \
         with a bearer token checked by TokenReview once and then cached (HAProxy and nginx pass the \
         token through and do no authentication). Proxy CPU is utime+stime of the proxy process over \
         the counted part of a run divided by the requests done in it, also shown apart as user \
         (utime) and sys (stime, the kernel's time); upstream and client CPU the same \
         of the simulator and of h2load. \"Proxy CPU/client CPU\" divides the proxy's by h2load's \
         within each run: h2load does the same work for every case, so the quotient cancels most of \
         this machine's drift in speed between runs (the simulator's work depends on how the proxy \
         talks to it).\n\n",
        if harness.smoke { " (smoke: not a measurement)" } else { "" },
        machine.markdown(driver),
        plan.warm_up.as_millis(),
        plan.duration.as_millis(),
        plan.repeats,
        plan.open_loop.clients,
        plan.open_loop.rps_per_client,
        plan.open_loop.rate(),
        plan.open_loop.duration.as_millis(),
        harness.client_cpu,
        harness.proxy_cpu,
        harness.upstream_cpu,
    );
    if !closed.iter().chain(&open).any(|s| s.case == PINGORA) {
        let _ = writeln!(markdown, "Pingora: not run ({PINGORA_SKIPPED}).\n");
    }
    markdown.push_str("## Closed loop\n\n");
    markdown.push_str(&crate::report::results_table(
        &closed,
        DIRECT,
        &peers_in(&closed),
    ));
    markdown.push_str("\nResponse bodies (curl through each case, HTTP/2 and HTTP/1.1 alike):\n\n");
    for (case, sizes) in body_sizes {
        let _ = writeln!(
            markdown,
            "- {case}: get {} bytes, list {} bytes",
            sizes.get, sizes.list
        );
    }
    markdown.push_str(&format!(
        "\n## Open loop, {} req/s\n\n",
        plan.open_loop.rate()
    ));
    markdown.push_str(&open_loop_table(&open));
    if open.iter().chain(&closed).any(|s| s.case == SLUICE_TUNNEL) {
        markdown.push_str(
            "\n## Through an agent's tunnel (issue 34)\n\nThe cluster's server is an agent: client -> gateway -> its process's tunnel node -> the agent's tunnel -> `sluice agent` -> simulator; its CPU is both Sluice processes'. Closed loop, then open loop:\n\n",
        );
        markdown.push_str(&added_table(&closed));
        markdown.push('\n');
        markdown.push_str(&added_table(&open));
    }
    markdown.push_str("\n## Against the targets of issue 17\n\n");
    markdown.push_str(&targets(&closed, &open));
    markdown.push_str("\n## Against the goals of issue 37\n\n");
    markdown.push_str(&issue37_goals(&closed, &open));
    markdown.push('\n');

    let mut plots = Vec::new();
    for request in [RequestKind::Get, RequestKind::List] {
        let series = |value: Metric| -> Vec<crate::plot::Series> {
            CASES
                .iter()
                .flat_map(|case| [(case, Protocol::H2), (case, Protocol::H1)])
                .filter_map(|(case, protocol)| {
                    let workload = Workload { protocol, request }.name();
                    let points: Vec<(f64, f64)> = closed
                        .iter()
                        .filter(|s| s.case == *case && s.workload == workload)
                        .filter_map(|s| value(s).map(|v| (f64::from(s.concurrency), v)))
                        .collect();
                    (!points.is_empty()).then(|| (format!("{case} {}", protocol.name()), points))
                })
                .collect()
        };
        let name = request.name();
        let charts: [(&str, &str, &str, Metric); 3] = [
            ("throughput", "Requests per second", "req/s", |s| {
                Some(s.requests_per_second)
            }),
            ("latency-p99", "p99 latency", "p99 latency (us)", |s| {
                Some(s.p99_us as f64)
            }),
            (
                "cpu",
                "Proxy CPU per request",
                "proxy CPU (us/request)",
                |s| s.proxy_cpu_us_per_request,
            ),
        ];
        for (prefix, title, y_label, value) in charts {
            let file = format!("{prefix}-{name}.svg");
            crate::plot::by_concurrency(
                &harness.out.join(&file),
                &format!("{title}, {name}"),
                y_label,
                &series(value),
            )?;
            plots.push(file);
        }
    }
    for file in &plots {
        let _ = writeln!(markdown, "![{file}]({file})\n");
    }
    write_output(&harness.out, "summary.md", &markdown)?;
    println!("{markdown}");
    println!("wrote {}", harness.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::gateway_report::added;
    use super::*;
    use crate::record::tests::record;

    #[test]
    fn full_plan_covers_the_issue() {
        let plan = plan(false);
        assert_eq!(plan.levels, vec![(1, 1), (64, 1), (512, 1), (64, 10)]);
        assert_eq!(plan.workloads.len(), 4);
        assert_eq!(plan.open_loop.rate(), 5_000);
        assert_eq!(plan.open_loop.protocols.len(), 2);
        let smoke = plan_smoke_duration();
        assert!(smoke < Duration::from_secs(30), "{smoke:?}");
    }

    /// Upper bound of the smoke run's load time across all cases.
    fn plan_smoke_duration() -> Duration {
        let smoke = plan(true);
        let closed = (smoke.workloads.len() * smoke.levels.len()) as u32 * smoke.repeats;
        let open = smoke.open_loop.protocols.len() as u32 * smoke.open_loop.repeats;
        (smoke.warm_up + smoke.duration) * closed * CASES.len() as u32
            + (smoke.warm_up + smoke.open_loop.duration) * open * CASES.len() as u32
    }

    #[test]
    fn cluster_config_points_at_the_simulator() {
        let dir = tempfile::tempdir().unwrap();
        let tls = crate::certs::generate(dir.path(), &["127.0.0.1"]).unwrap();
        let yaml = cluster_yaml(&tls, "127.0.0.1:6443".parse().unwrap());
        assert!(yaml.contains("- endpoint: https://127.0.0.1:6443"));
        assert!(yaml.contains(&format!("name: {HOST}")));
        assert!(yaml.contains("connectionsPerServer: 1"));
        assert!(gateway_yaml(dir.path(), 1).contains("runtime: {workers: 1"));
    }

    #[test]
    fn targets_compare_within_one_workload() {
        let mut runs = vec![
            record(HAPROXY, 1, 1000.0, 20_000),
            record(SLUICE, 1, 1000.0, 8_000),
        ];
        for run in &mut runs {
            run.workload = "h2 get".into();
            run.clients = 64;
        }
        let mut other = record(HAPROXY, 1, 1000.0, 4_000);
        other.workload = "h1 get".into();
        other.clients = 64;
        runs.push(other);
        let mut single = record(SLUICE, 1, 1000.0, 30_000);
        single.workload = "h2 get".into();
        runs.push(single);
        let closed = summarize(&runs);
        let table = targets(&closed, &[]);
        assert!(
            table.contains("<= 0.6x HAProxy | h2 get c64 | 8.0 vs 20.0 us (0.40x) | met"),
            "{table}"
        );
        assert!(!table.contains("h1 get"), "{table}");
        assert!(
            !table.contains("c1 "),
            "one client is not a target row: {table}"
        );

        let mut open = vec![
            record(DIRECT, 1, 200.0, 0),
            record(HAPROXY, 1, 400.0, 1000),
            record(SLUICE, 1, 450.0, 1000),
        ];
        for run in &mut open {
            run.workload = "h2 get @5000/s".into();
        }
        let table = targets(&[], &summarize(&open));
        assert!(
            table.contains("+250 us (450 vs 200 us direct) | **missed**"),
            "{table}"
        );
        assert!(
            table.contains("p50 450 vs 400 us, mean 450 vs 400 us | **missed**"),
            "{table}"
        );
        assert_eq!(added(90, Some(100)), "-10");
    }
}
