//! What one measured run produced (written as raw JSON) and the medians over repeated runs.

use serde::Serialize;

use crate::loadgen::{H2loadSummary, Percentiles};
use crate::measure::ProcessUsage;

/// One h2load run against one case, as written to `raw/*.json`.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    pub scenario: String,
    pub case: String,
    /// What was sent (`grpc unary`, `h2 get`, `h1 list`, ...); rows are compared within one.
    pub workload: String,
    pub clients: u32,
    pub streams: u32,
    pub repeat: u32,
    pub h2load: H2loadSummary,
    pub latency_us: Option<Percentiles>,
    /// Calls answered with a gRPC status other than OK, where the entry proxy counts them.
    pub grpc_errors: Option<u64>,
    /// Every process of the proxy side (empty for direct-to-upstream).
    pub proxy: Vec<ProcessUsage>,
    pub proxy_cpu_us_per_request: Option<f64>,
    /// The user-time part of `proxy_cpu_us_per_request`.
    pub proxy_user_us_per_request: Option<f64>,
    /// The system-time (kernel) part of `proxy_cpu_us_per_request`.
    pub proxy_system_us_per_request: Option<f64>,
    pub proxy_rss_kib: u64,
    /// CPU of the upstream (echo backend, apiserver simulator) per request, same interval.
    pub upstream_cpu_us_per_request: Option<f64>,
    /// CPU of the load generator (h2load) per request, same interval.
    pub client_cpu_us_per_request: Option<f64>,
    /// TCP segments sent on the machine per request (all hops), over the counted part.
    pub segments_per_request: Option<f64>,
}

impl RunRecord {
    /// Calls per second answered with HTTP 2xx and (where counted) gRPC status OK: h2load's
    /// req/s counts every answer, and a gRPC error is an HTTP 200 too.
    pub fn ok_per_second(&self) -> f64 {
        let total = self.h2load.total;
        if total == 0 {
            return 0.0;
        }
        let ok = total.saturating_sub(self.h2load.errors() + self.grpc_errors.unwrap_or(0));
        self.h2load.requests_per_second * ok as f64 / total as f64
    }

    /// Fills in the segments per request from the machine's TCP counter.
    pub fn with_segments(mut self, segments: Option<u64>) -> Self {
        let served = self.h2load.done;
        self.segments_per_request = segments
            .filter(|_| served > 0)
            .map(|segments| segments as f64 / served as f64);
        self
    }

    /// Fills in the per-request CPU (all, user, system) and total RSS from the proxy's usage.
    pub fn with_proxy(mut self, proxy: Vec<ProcessUsage>) -> Self {
        let served = self.h2load.done;
        let per_request = |part: fn(&ProcessUsage) -> u64| {
            let cpu: u64 = proxy.iter().map(part).sum();
            (!proxy.is_empty() && served > 0).then(|| cpu as f64 / served as f64)
        };
        self.proxy_cpu_us_per_request = per_request(|usage| usage.cpu_us);
        self.proxy_user_us_per_request = per_request(|usage| usage.user_us);
        self.proxy_system_us_per_request = per_request(|usage| usage.system_us);
        self.proxy_rss_kib = proxy.iter().map(|usage| usage.rss_kib).sum();
        self.proxy = proxy;
        self
    }

    /// Fills in the upstream's CPU per request.
    pub fn with_upstream(mut self, upstream: &[ProcessUsage]) -> Self {
        let served = self.h2load.done;
        let cpu: u64 = upstream.iter().map(|usage| usage.cpu_us).sum();
        self.upstream_cpu_us_per_request =
            (cpu > 0 && served > 0).then(|| cpu as f64 / served as f64);
        self
    }

    /// Fills in the load generator's CPU per request.
    pub fn with_client(mut self, cpu_us: u64) -> Self {
        let served = self.h2load.done;
        self.client_cpu_us_per_request =
            (cpu_us > 0 && served > 0).then(|| cpu_us as f64 / served as f64);
        self
    }

    /// The proxy's CPU per request in units of the load generator's CPU per request in the same
    /// run.
    ///
    /// Why: this VM's speed drifts up to 1.6x between runs minutes apart, and a proxy's CPU per
    /// request drifts with it. h2load sends every case the same requests over the same protocol
    /// in the same seconds, so its CPU drifts alike and the quotient cancels most of the drift
    /// (HAProxy's stayed within 0.91-1.02 over rounds whose own CPU ranged 31.1-42.9 us;
    /// docs/PERFORMANCE.md, "Issue 17: which HTTP/2 stack"). The upstream's CPU would cancel it
    /// as well, but its work depends on the proxy: one multiplexed connection costs the
    /// simulator less per request than many.
    pub fn cpu_per_client_cpu(&self) -> Option<f64> {
        self.proxy_cpu_us_per_request
            .zip(self.client_cpu_us_per_request)
            .map(|(proxy, client)| proxy / client)
    }
}

/// Medians over the repeats of one case at one concurrency.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaseSummary {
    pub case: String,
    pub workload: String,
    pub concurrency: u32,
    pub clients: u32,
    pub streams: u32,
    pub runs: usize,
    pub requests_per_second: f64,
    pub ok_per_second: f64,
    pub mean_us: u64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub proxy_cpu_us_per_request: Option<f64>,
    /// Medians of the user and system parts (each over the runs, so they need not add up to
    /// the median of the whole exactly).
    pub proxy_user_us_per_request: Option<f64>,
    pub proxy_system_us_per_request: Option<f64>,
    pub proxy_rss_kib: u64,
    pub upstream_cpu_us_per_request: Option<f64>,
    pub client_cpu_us_per_request: Option<f64>,
    /// Median over the runs of each run's [`RunRecord::cpu_per_client_cpu`].
    pub cpu_per_client_cpu: Option<f64>,
    pub segments_per_request: Option<f64>,
    pub errors: u64,
}

fn median_f64(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some(values[values.len() / 2])
}

fn median_u64(mut values: Vec<u64>) -> u64 {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or(0)
}

/// Groups runs by (case, workload, concurrency) in first-seen order and takes medians; RSS is the largest
/// seen and errors are summed, so one bad repeat is not hidden.
pub fn summarize(records: &[RunRecord]) -> Vec<CaseSummary> {
    let mut keys: Vec<(String, String, u32, u32)> = Vec::new();
    for record in records {
        let key = (
            record.case.clone(),
            record.workload.clone(),
            record.clients,
            record.streams,
        );
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .map(|(case, workload, clients, streams)| {
            let runs: Vec<&RunRecord> = records
                .iter()
                .filter(|r| {
                    r.case == case
                        && r.workload == workload
                        && r.clients == clients
                        && r.streams == streams
                })
                .collect();
            let latency = |pick: fn(&Percentiles) -> u64| {
                median_u64(
                    runs.iter()
                        .filter_map(|r| r.latency_us.as_ref().map(pick))
                        .collect(),
                )
            };
            CaseSummary {
                concurrency: clients.saturating_mul(streams),
                clients,
                streams,
                runs: runs.len(),
                requests_per_second: median_f64(
                    runs.iter().map(|r| r.h2load.requests_per_second).collect(),
                )
                .unwrap_or(0.0),
                ok_per_second: median_f64(runs.iter().map(|r| r.ok_per_second()).collect())
                    .unwrap_or(0.0),
                mean_us: latency(|p| p.mean),
                p50_us: latency(|p| p.p50),
                p90_us: latency(|p| p.p90),
                p99_us: latency(|p| p.p99),
                p999_us: latency(|p| p.p999),
                proxy_cpu_us_per_request: median_f64(
                    runs.iter()
                        .filter_map(|r| r.proxy_cpu_us_per_request)
                        .collect(),
                ),
                proxy_user_us_per_request: median_f64(
                    runs.iter()
                        .filter_map(|r| r.proxy_user_us_per_request)
                        .collect(),
                ),
                proxy_system_us_per_request: median_f64(
                    runs.iter()
                        .filter_map(|r| r.proxy_system_us_per_request)
                        .collect(),
                ),
                proxy_rss_kib: runs.iter().map(|r| r.proxy_rss_kib).max().unwrap_or(0),
                upstream_cpu_us_per_request: median_f64(
                    runs.iter()
                        .filter_map(|r| r.upstream_cpu_us_per_request)
                        .collect(),
                ),
                client_cpu_us_per_request: median_f64(
                    runs.iter()
                        .filter_map(|r| r.client_cpu_us_per_request)
                        .collect(),
                ),
                cpu_per_client_cpu: median_f64(
                    runs.iter().filter_map(|r| r.cpu_per_client_cpu()).collect(),
                ),
                segments_per_request: median_f64(
                    runs.iter().filter_map(|r| r.segments_per_request).collect(),
                ),
                errors: runs
                    .iter()
                    .map(|r| r.h2load.errors() + r.grpc_errors.unwrap_or(0))
                    .sum(),
                case,
                workload,
            }
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn record(case: &str, streams: u32, rps: f64, cpu_us: u64) -> RunRecord {
        let h2load = H2loadSummary {
            requests_per_second: rps,
            total: 1000,
            done: 1000,
            succeeded: 1000,
            status_2xx: 1000,
            ..Default::default()
        };
        let proxy = if cpu_us == 0 {
            Vec::new()
        } else {
            // A quarter of it in the kernel.
            let cpu = crate::measure::CpuTime {
                user_us: cpu_us - cpu_us / 4,
                system_us: cpu_us / 4,
            };
            vec![ProcessUsage::new("proxy", 1, cpu, 2048)]
        };
        RunRecord {
            scenario: "tunnel".into(),
            case: case.into(),
            workload: "grpc unary".into(),
            clients: 1,
            streams,
            repeat: 0,
            h2load,
            latency_us: Percentiles::of(vec![rps as u64]),
            grpc_errors: Some(0),
            proxy: Vec::new(),
            proxy_cpu_us_per_request: None,
            proxy_user_us_per_request: None,
            proxy_system_us_per_request: None,
            proxy_rss_kib: 0,
            upstream_cpu_us_per_request: None,
            client_cpu_us_per_request: None,
            segments_per_request: None,
        }
        .with_proxy(proxy)
    }

    fn usage(cpu_us: u64) -> ProcessUsage {
        let cpu = crate::measure::CpuTime {
            user_us: cpu_us,
            system_us: 0,
        };
        ProcessUsage::new("upstream", 2, cpu, 1024)
    }

    #[test]
    fn the_upstreams_cpu_per_request_is_summed_over_its_processes() {
        let run = record("sluice", 1, 100.0, 70_000).with_upstream(&[usage(20_000), usage(15_000)]);
        assert_eq!(run.upstream_cpu_us_per_request, Some(35.0));
        let idle = record("sluice", 1, 100.0, 70_000).with_upstream(&[usage(0)]);
        assert_eq!(idle.upstream_cpu_us_per_request, None);
    }

    #[test]
    fn proxy_cpu_in_units_of_the_clients_cpu() {
        // 1000 requests: the proxy spent 70 us each, h2load 35.
        let run = record("sluice", 1, 100.0, 70_000).with_client(35_000);
        assert_eq!(run.client_cpu_us_per_request, Some(35.0));
        assert_eq!(run.cpu_per_client_cpu(), Some(2.0));
        // Nothing to divide by: the client not measured.
        assert_eq!(
            record("sluice", 1, 100.0, 70_000).cpu_per_client_cpu(),
            None
        );
        let unmeasured = record("sluice", 1, 100.0, 70_000).with_client(0);
        assert_eq!(unmeasured.cpu_per_client_cpu(), None);
        // Direct has no proxy, so no quotient either.
        let direct = record("direct", 1, 100.0, 0).with_client(20_000);
        assert_eq!(direct.client_cpu_us_per_request, Some(20.0));
        assert_eq!(direct.cpu_per_client_cpu(), None);
    }

    #[test]
    fn the_quotient_is_a_median_of_each_runs_quotient() {
        // Each run's own quotient (4, 2, 3), not median proxy over median client (2 / 1).
        let runs = vec![
            record("a", 1, 100.0, 4000).with_client(1000),
            record("a", 1, 100.0, 2000).with_client(1000),
            record("a", 1, 100.0, 1500).with_client(500),
        ];
        let summary = &summarize(&runs)[0];
        assert_eq!(summary.cpu_per_client_cpu, Some(3.0));
        assert_eq!(summary.client_cpu_us_per_request, Some(1.0));
        assert_eq!(summary.proxy_cpu_us_per_request, Some(2.0));
    }

    #[test]
    fn user_and_system_cpu_are_summed_over_the_proxys_processes() {
        // Two processes (a node and its agent): 1,000 requests done.
        let time = |user_us, system_us| crate::measure::CpuTime { user_us, system_us };
        let run = record("sluice", 1, 100.0, 0).with_proxy(vec![
            ProcessUsage::new("node", 1, time(30_000, 10_000), 1024),
            ProcessUsage::new("agent", 2, time(20_000, 4_000), 1024),
        ]);
        assert_eq!(run.proxy_cpu_us_per_request, Some(64.0));
        assert_eq!(run.proxy_user_us_per_request, Some(50.0));
        assert_eq!(run.proxy_system_us_per_request, Some(14.0));
        let summary = &summarize(&[run])[0];
        assert_eq!(summary.proxy_user_us_per_request, Some(50.0));
        assert_eq!(summary.proxy_system_us_per_request, Some(14.0));
    }

    #[test]
    fn cpu_per_request_is_total_cpu_over_requests_done() {
        let run = record("sluice", 1, 100.0, 70_000);
        assert_eq!(run.proxy_cpu_us_per_request, Some(70.0));
        assert_eq!(run.proxy_user_us_per_request, Some(52.5));
        assert_eq!(run.proxy_system_us_per_request, Some(17.5));
        assert_eq!(run.proxy_rss_kib, 2048);
        let direct = record("direct", 1, 100.0, 0);
        assert_eq!(direct.proxy_cpu_us_per_request, None);
        assert_eq!(direct.proxy_system_us_per_request, None);
    }

    #[test]
    fn medians_per_case_and_concurrency() {
        let runs = vec![
            record("a", 1, 100.0, 1000),
            record("a", 1, 300.0, 3000),
            record("a", 1, 200.0, 2000),
            record("a", 10, 900.0, 1000),
            record("b", 1, 50.0, 0),
        ];
        let summaries = summarize(&runs);
        assert_eq!(summaries.len(), 3);
        assert_eq!(summaries[0].case, "a");
        assert_eq!(summaries[0].runs, 3);
        assert_eq!(summaries[0].requests_per_second, 200.0);
        assert_eq!(summaries[0].proxy_cpu_us_per_request, Some(2.0));
        assert_eq!(summaries[0].p50_us, 200);
        assert_eq!(summaries[1].concurrency, 10);
        assert_eq!(summaries[2].proxy_cpu_us_per_request, None);
        assert_eq!(summaries[2].errors, 0);
        let mut failing = record("b", 1, 50.0, 0);
        failing.grpc_errors = Some(3);
        failing.h2load.status_2xx = 998;
        failing.h2load.status_5xx = 2;
        failing.h2load.failed = 2;
        assert_eq!(failing.ok_per_second(), 50.0 * 995.0 / 1000.0);
        let summary = &summarize(&[failing])[0];
        assert_eq!(summary.errors, 5);
        assert_eq!(summary.requests_per_second, 50.0);
    }
}
