//! What a soak run records per window and what its summary computes from those records: RSS
//! and fd counts at the end of the warm-up and at the end, growth between them, the p99 range
//! of the windows after the warm-up, and errors (split by whether an agent restart happened in
//! the window, which is the one event that may explain a failed call). Pure: no I/O here.

use serde::{Deserialize, Serialize};

/// One Sluice process at the end of a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessSample {
    pub name: String,
    pub pid: u32,
    pub rss_kib: u64,
    /// Entries of `/proc/PID/fd`.
    pub fds: u64,
}

/// One workload (tunnel or gateway) during one window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowLoad {
    /// Requests h2load finished.
    pub done: u64,
    /// Requests that failed: h2load's failed count plus, for the tunnel, calls the node
    /// answered with a gRPC status other than OK.
    pub errors: u64,
    pub requests_per_second: f64,
    pub p50_us: Option<u64>,
    pub p99_us: Option<u64>,
    /// Of `errors`: h2load's failed requests (resets, timeouts, non-2xx answers).
    #[serde(default)]
    pub failed: u64,
    /// Of `errors`: calls the node answered with each gRPC status other than OK.
    #[serde(default)]
    pub grpc_codes: std::collections::BTreeMap<String, u64>,
}

/// Everything sampled at the end of one window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub window: u32,
    /// Seconds since the first window started.
    pub elapsed_s: f64,
    pub processes: Vec<ProcessSample>,
    pub tunnel: WindowLoad,
    pub gateway: WindowLoad,
    /// Tunnels connected on the node at the sample.
    pub connected_tunnels: u64,
    /// What churned during the window (an agent restart), if anything.
    pub churn: Option<String>,
}

/// One process over the run, from the samples after the warm-up.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessSummary {
    pub name: String,
    pub rss_kib_warm: u64,
    pub rss_kib_end: u64,
    pub rss_kib_max_after_warm_up: u64,
    /// (end - warm) / warm, in percent; `None` when the process was restarted in between
    /// (different pid), where the figure would compare two processes.
    pub rss_growth_percent: Option<f64>,
    pub fds_warm: u64,
    pub fds_end: u64,
    pub fds_min_after_warm_up: u64,
    pub fds_max_after_warm_up: u64,
    pub restarted: bool,
}

/// p99 over the windows after the warm-up (microseconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct P99Range {
    pub min_us: Option<u64>,
    pub median_us: Option<u64>,
    pub max_us: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SoakSummary {
    pub windows: usize,
    pub warm_up_windows: usize,
    pub window_s: f64,
    pub elapsed_s: f64,
    pub processes: Vec<ProcessSummary>,
    pub tunnel_calls: u64,
    pub gateway_requests: u64,
    pub tunnel_p99: P99Range,
    pub gateway_p99: P99Range,
    pub errors: u64,
    /// Calls the node ended CANCELLED: the client reset them, which h2load does to the calls
    /// still in flight when it closes its connections at the end of a window (client churn).
    pub errors_cancelled_by_client: u64,
    /// Other errors, in windows during which an agent was restarted.
    pub errors_in_churn_windows: u64,
    /// Other errors, in windows with no restart: nothing explains them.
    pub errors_unexplained: u64,
    pub churn_events: usize,
}

/// Calls of a window the node ended CANCELLED because the client reset them.
fn cancelled_by_client(sample: &Sample) -> u64 {
    sample
        .tunnel
        .grpc_codes
        .get("CANCELLED")
        .copied()
        .unwrap_or(0)
        .min(sample.tunnel.errors)
}

fn p99_range(values: impl Iterator<Item = Option<u64>>) -> P99Range {
    let mut values: Vec<u64> = values.flatten().collect();
    values.sort_unstable();
    P99Range {
        min_us: values.first().copied(),
        median_us: values.get(values.len() / 2).copied(),
        max_us: values.last().copied(),
    }
}

fn growth_percent(warm: u64, end: u64) -> Option<f64> {
    (warm > 0).then(|| (end as f64 - warm as f64) / warm as f64 * 100.0)
}

/// The sample that closes the warm-up: the last of the first `warm_up` windows (the first
/// sample if the run is shorter).
fn warm_index(samples: &[Sample], warm_up: usize) -> usize {
    warm_up.clamp(1, samples.len().max(1)) - 1
}

fn process_summary(samples: &[Sample], warm: usize, name: &str) -> Option<ProcessSummary> {
    let find = |sample: &Sample| sample.processes.iter().find(|p| p.name == name).cloned();
    let at_warm = find(&samples[warm])?;
    let after: Vec<ProcessSample> = samples[warm..].iter().filter_map(find).collect();
    let end = after.last()?.clone();
    let restarted = after.iter().any(|p| p.pid != at_warm.pid);
    Some(ProcessSummary {
        name: name.to_string(),
        rss_kib_warm: at_warm.rss_kib,
        rss_kib_end: end.rss_kib,
        rss_kib_max_after_warm_up: after.iter().map(|p| p.rss_kib).max().unwrap_or(0),
        rss_growth_percent: if restarted {
            None
        } else {
            growth_percent(at_warm.rss_kib, end.rss_kib)
        },
        fds_warm: at_warm.fds,
        fds_end: end.fds,
        fds_min_after_warm_up: after.iter().map(|p| p.fds).min().unwrap_or(0),
        fds_max_after_warm_up: after.iter().map(|p| p.fds).max().unwrap_or(0),
        restarted,
    })
}

/// The summary of `samples` with the first `warm_up` windows as warm-up; `None` without any
/// sample.
pub fn summarize(samples: &[Sample], warm_up: usize, window_s: f64) -> Option<SoakSummary> {
    let first = samples.first()?;
    let warm = warm_index(samples, warm_up);
    let processes = first
        .processes
        .iter()
        .filter_map(|p| process_summary(samples, warm, &p.name))
        .collect();
    let after = &samples[warm..];
    let errors: u64 = samples
        .iter()
        .map(|s| s.tunnel.errors + s.gateway.errors)
        .sum();
    let cancelled: u64 = samples.iter().map(cancelled_by_client).sum();
    let errors_in_churn_windows = samples
        .iter()
        .filter(|s| s.churn.is_some())
        .map(|s| s.tunnel.errors + s.gateway.errors - cancelled_by_client(s))
        .sum();
    Some(SoakSummary {
        windows: samples.len(),
        warm_up_windows: warm + 1,
        window_s,
        elapsed_s: samples.last().map_or(0.0, |s| s.elapsed_s),
        processes,
        tunnel_calls: samples.iter().map(|s| s.tunnel.done).sum(),
        gateway_requests: samples.iter().map(|s| s.gateway.done).sum(),
        tunnel_p99: p99_range(after.iter().map(|s| s.tunnel.p99_us)),
        gateway_p99: p99_range(after.iter().map(|s| s.gateway.p99_us)),
        errors,
        errors_cancelled_by_client: cancelled,
        errors_in_churn_windows,
        errors_unexplained: errors - cancelled - errors_in_churn_windows,
        churn_events: samples.iter().filter(|s| s.churn.is_some()).count(),
    })
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn ms(us: Option<u64>) -> String {
    us.map_or_else(
        || "-".to_string(),
        |us| format!("{:.2}", us as f64 / 1000.0),
    )
}

/// The Markdown tables of a summary (the caller adds the title and the set-up).
pub fn markdown(summary: &SoakSummary) -> String {
    let mut out = format!(
        "{} windows of {:.0} s ({:.1} min); warm-up: the first {} windows ({:.1} min); figures \
         \"after warm-up\" compare the sample that ends the warm-up with the last one.\n\n\
         | process | RSS MiB at warm-up end | RSS MiB at end | growth % | RSS MiB max after warm-up | fds at warm-up end | fds at end | fds min / max after warm-up |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|\n",
        summary.windows,
        summary.window_s,
        summary.elapsed_s / 60.0,
        summary.warm_up_windows,
        summary.warm_up_windows as f64 * summary.window_s / 60.0,
    );
    for p in &summary.processes {
        let growth = match p.rss_growth_percent {
            Some(growth) => format!("{growth:+.1}"),
            None => "restarted".to_string(),
        };
        out.push_str(&format!(
            "| {} | {:.1} | {:.1} | {growth} | {:.1} | {} | {} | {} / {} |\n",
            p.name,
            mib(p.rss_kib_warm),
            mib(p.rss_kib_end),
            mib(p.rss_kib_max_after_warm_up),
            p.fds_warm,
            p.fds_end,
            p.fds_min_after_warm_up,
            p.fds_max_after_warm_up,
        ));
    }
    out.push_str(&format!(
        "\n| workload | requests | p99 ms per window after warm-up: min / median / max |\n\
         |---|--:|--:|\n\
         | tunnel (gRPC unary) | {} | {} / {} / {} |\n\
         | gateway (h2 GET over TLS) | {} | {} / {} / {} |\n\n\
         Errors: {} in all. {} CANCELLED: calls h2load reset because they were still in flight when it \
         closed its connections at the end of a window (client churn; the client gave them up, no \
         failure it saw). Of the others, {} in the {} windows with an agent restart and {} in other \
         windows (unexplained).\n",
        summary.tunnel_calls,
        ms(summary.tunnel_p99.min_us),
        ms(summary.tunnel_p99.median_us),
        ms(summary.tunnel_p99.max_us),
        summary.gateway_requests,
        ms(summary.gateway_p99.min_us),
        ms(summary.gateway_p99.median_us),
        ms(summary.gateway_p99.max_us),
        summary.errors,
        summary.errors_cancelled_by_client,
        summary.errors_in_churn_windows,
        summary.churn_events,
        summary.errors_unexplained,
    ));
    out
}

/// A window's errors with what they were: gRPC statuses the node answered, requests h2load
/// counted as failed.
fn error_cell(s: &Sample) -> String {
    let total = s.tunnel.errors + s.gateway.errors;
    if total == 0 {
        return "0".to_string();
    }
    let mut parts: Vec<String> = s
        .tunnel
        .grpc_codes
        .iter()
        .map(|(code, n)| format!("{code} {n}"))
        .collect();
    if s.tunnel.failed > 0 {
        parts.push(format!("tunnel failed {}", s.tunnel.failed));
    }
    if s.gateway.failed > 0 {
        parts.push(format!("gateway failed {}", s.gateway.failed));
    }
    format!("{total} ({})", parts.join(", "))
}

/// One line per window, for the end of the Markdown report.
pub fn window_table(samples: &[Sample]) -> String {
    let mut out = String::from(
        "| window | min | node RSS MiB | node fds | tunnels | tunnel req/s | tunnel p99 ms | gateway req/s | gateway p99 ms | errors | churn |\n\
         |--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n",
    );
    for s in samples {
        let node = s.processes.first();
        out.push_str(&format!(
            "| {} | {:.1} | {:.1} | {} | {} | {:.0} | {} | {:.0} | {} | {} | {} |\n",
            s.window,
            s.elapsed_s / 60.0,
            node.map_or(0.0, |p| mib(p.rss_kib)),
            node.map_or(0, |p| p.fds),
            s.connected_tunnels,
            s.tunnel.requests_per_second,
            ms(s.tunnel.p99_us),
            s.gateway.requests_per_second,
            ms(s.gateway.p99_us),
            error_cell(s),
            s.churn.as_deref().unwrap_or(""),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(window: u32, node: (u32, u64, u64), agent_pid: u32, errors: u64) -> Sample {
        Sample {
            window,
            elapsed_s: f64::from(window) * 10.0,
            processes: vec![
                ProcessSample {
                    name: "sluice".into(),
                    pid: node.0,
                    rss_kib: node.1,
                    fds: node.2,
                },
                ProcessSample {
                    name: "agent-churn".into(),
                    pid: agent_pid,
                    rss_kib: 5_000,
                    fds: 20,
                },
            ],
            tunnel: WindowLoad {
                done: 100,
                errors,
                requests_per_second: 10.0,
                p50_us: Some(500),
                p99_us: Some(1_000 + u64::from(window)),
                failed: 0,
                grpc_codes: [("UNAVAILABLE".to_string(), errors)]
                    .into_iter()
                    .filter(|(_, n)| *n > 0)
                    .collect(),
            },
            gateway: WindowLoad {
                done: 50,
                errors: 0,
                requests_per_second: 5.0,
                p50_us: Some(700),
                p99_us: None,
                ..WindowLoad::default()
            },
            connected_tunnels: 10,
            churn: agent_pid
                .is_multiple_of(2)
                .then(|| "restarted agent-churn".to_string()),
        }
    }

    #[test]
    fn growth_is_measured_from_the_end_of_the_warm_up() {
        let samples = vec![
            sample(1, (7, 10_000, 40), 1, 0),
            sample(2, (7, 20_000, 45), 1, 0),
            sample(3, (7, 20_500, 44), 3, 2),
            sample(4, (7, 21_000, 46), 4, 1),
        ];
        let summary = summarize(&samples, 2, 10.0).unwrap();
        assert_eq!(summary.warm_up_windows, 2);
        let node = &summary.processes[0];
        assert_eq!((node.rss_kib_warm, node.rss_kib_end), (20_000, 21_000));
        assert_eq!(node.rss_growth_percent, Some(5.0));
        assert_eq!(
            (node.fds_min_after_warm_up, node.fds_max_after_warm_up),
            (44, 46)
        );
        assert!(!node.restarted);
        // The churned agent's pid changed: no growth figure across two processes.
        let agent = &summary.processes[1];
        assert!(agent.restarted && agent.rss_growth_percent.is_none());
        assert_eq!(summary.errors, 3);
        assert_eq!(summary.errors_in_churn_windows, 1);
        assert_eq!(summary.errors_unexplained, 2);
        assert_eq!(summary.errors_cancelled_by_client, 0);
        let mut cancelled = samples.clone();
        cancelled[2].tunnel.grpc_codes = [("CANCELLED".to_string(), 2)].into();
        let summary = summarize(&cancelled, 2, 10.0).unwrap();
        assert_eq!(summary.errors_cancelled_by_client, 2);
        assert_eq!(summary.errors_unexplained, 0);
        assert_eq!(summary.tunnel_calls, 400);
        assert_eq!(summary.tunnel_p99.min_us, Some(1_002));
        assert_eq!(summary.tunnel_p99.max_us, Some(1_004));
        assert_eq!(summary.gateway_p99, P99Range::default());
        let text = markdown(&summary);
        assert!(text.contains("| sluice | 19.5 | 20.5 | +5.0 |"), "{text}");
        assert!(text.contains("| agent-churn |") && text.contains("restarted"));
        let table = window_table(&samples);
        assert!(table.contains("| 4 | 0.7 | 20.5 | 46 |"), "{table}");
        assert!(table.contains("| 2 (UNAVAILABLE 2) |"), "{table}");
    }

    #[test]
    fn short_runs_and_empty_runs() {
        assert!(summarize(&[], 3, 10.0).is_none());
        let one = vec![sample(1, (7, 10_000, 40), 1, 0)];
        let summary = summarize(&one, 30, 10.0).unwrap();
        assert_eq!(summary.warm_up_windows, 1);
        assert_eq!(summary.processes[0].rss_growth_percent, Some(0.0));
        assert_eq!(growth_percent(0, 5), None);
    }
}
