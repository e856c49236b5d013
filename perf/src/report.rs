//! The Markdown summary: medians per case and concurrency with ratios against direct-to-upstream
//! and against the peer proxy measured in the same run.

use std::fmt::Write;

use crate::record::CaseSummary;

/// The row of `case` for the same workload and concurrency as `like`.
pub fn find<'a>(
    summaries: &'a [CaseSummary],
    case: &str,
    like: &CaseSummary,
) -> Option<&'a CaseSummary> {
    summaries.iter().find(|s| {
        s.case == case && s.workload == like.workload && s.concurrency == like.concurrency
    })
}

/// `value / reference` as `0.42x`, or `-` when either is missing or the reference is zero.
pub fn ratio(value: Option<f64>, reference: Option<f64>) -> String {
    match (value, reference) {
        (Some(value), Some(reference)) if reference > 0.0 => format!("{:.2}x", value / reference),
        _ => "-".to_string(),
    }
}

fn cpu(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"))
}

/// The proxy's CPU per request over the client's (see `RunRecord::cpu_per_client_cpu`).
pub fn quotient(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"))
}

/// One table row per case and concurrency; throughput ratios against `baseline` (direct) and
/// every peer, CPU ratios against every peer: of CPU per request, of its system (kernel) part,
/// and of CPU per request in units of the client's CPU per request (steadier on a machine whose
/// speed drifts). CPU per request is also split into user and system time.
pub fn results_table(summaries: &[CaseSummary], baseline: &str, peers: &[&str]) -> String {
    let mut out = String::new();
    let ok_vs: String = peers.iter().map(|p| format!(" OK/s vs {p} |")).collect();
    let cpu_vs: String = peers.iter().map(|p| format!(" CPU vs {p} |")).collect();
    let sys_vs: String = peers.iter().map(|p| format!(" sys vs {p} |")).collect();
    let per_client_vs: String = peers
        .iter()
        .map(|p| format!(" CPU/client CPU vs {p} |"))
        .collect();
    let _ = writeln!(
        out,
        "| case | workload | clients x streams | req/s | OK/s | OK/s vs {baseline} |{ok_vs} mean us | p50 us | p90 us | p99 us | p99.9 us | proxy CPU us/req |{cpu_vs} proxy user us/req | proxy sys us/req |{sys_vs} upstream CPU us/req | client CPU us/req | proxy CPU/client CPU |{per_client_vs} proxy RSS MiB | TCP segments/req | errors | runs |"
    );
    let _ = writeln!(
        out,
        "|---|---|---|--:|--:|--:|{}--:|--:|--:|--:|--:|--:|{}--:|--:|{}--:|--:|--:|{}--:|--:|--:|--:|",
        "--:|".repeat(peers.len()),
        "--:|".repeat(peers.len()),
        "--:|".repeat(peers.len()),
        "--:|".repeat(peers.len())
    );
    for s in summaries {
        let base = find(summaries, baseline, s);
        let peer_rows: Vec<Option<&CaseSummary>> =
            peers.iter().map(|peer| find(summaries, peer, s)).collect();
        let ok_ratios: String = peer_rows
            .iter()
            .map(|p| {
                format!(
                    " {} |",
                    ratio(Some(s.ok_per_second), p.map(|p| p.ok_per_second))
                )
            })
            .collect();
        let cpu_ratios: String = peer_rows
            .iter()
            .map(|p| {
                format!(
                    " {} |",
                    ratio(
                        s.proxy_cpu_us_per_request,
                        p.and_then(|p| p.proxy_cpu_us_per_request)
                    )
                )
            })
            .collect();
        let sys_ratios: String = peer_rows
            .iter()
            .map(|p| {
                format!(
                    " {} |",
                    ratio(
                        s.proxy_system_us_per_request,
                        p.and_then(|p| p.proxy_system_us_per_request)
                    )
                )
            })
            .collect();
        let per_client_ratios: String = peer_rows
            .iter()
            .map(|p| {
                format!(
                    " {} |",
                    ratio(s.cpu_per_client_cpu, p.and_then(|p| p.cpu_per_client_cpu))
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} x {} | {:.0} | {:.0} | {} |{ok_ratios} {} | {} | {} | {} | {} | {} |{cpu_ratios} {} | {} |{sys_ratios} {} | {} | {} |{per_client_ratios} {} | {} | {} | {} |",
            s.case,
            s.workload,
            s.clients,
            s.streams,
            s.requests_per_second,
            s.ok_per_second,
            ratio(Some(s.ok_per_second), base.map(|b| b.ok_per_second)),
            s.mean_us,
            s.p50_us,
            s.p90_us,
            s.p99_us,
            s.p999_us,
            cpu(s.proxy_cpu_us_per_request),
            cpu(s.proxy_user_us_per_request),
            cpu(s.proxy_system_us_per_request),
            cpu(s.upstream_cpu_us_per_request),
            cpu(s.client_cpu_us_per_request),
            quotient(s.cpu_per_client_cpu),
            if s.proxy_rss_kib == 0 {
                "-".to_string()
            } else {
                format!("{:.1}", s.proxy_rss_kib as f64 / 1024.0)
            },
            segments(s.segments_per_request),
            s.errors,
            s.runs,
        );
    }
    out
}

/// Segments per request to one decimal, `-` where not measured.
pub fn segments(per_request: Option<f64>) -> String {
    per_request.map_or_else(|| "-".to_string(), |segments| format!("{segments:.1}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::summarize;
    use crate::record::tests::record;

    #[test]
    fn ratios_against_direct_and_peer() {
        let upstream = |cpu_us| {
            [crate::measure::ProcessUsage::new(
                "upstream",
                2,
                crate::measure::CpuTime {
                    user_us: cpu_us,
                    system_us: 0,
                },
                0,
            )]
        };
        let summaries = summarize(&[
            record("direct", 1, 1000.0, 0).with_upstream(&upstream(5_000)),
            record("haproxy", 1, 500.0, 10_000)
                .with_upstream(&upstream(5_000))
                .with_client(5_000),
            record("nginx", 1, 125.0, 20_000)
                .with_upstream(&upstream(10_000))
                .with_client(10_000),
            record("sluice", 1, 250.0, 40_000)
                .with_upstream(&upstream(9_000))
                .with_client(8_000),
        ]);
        let table = results_table(&summaries, "direct", &["haproxy", "nginx"]);
        let header: Vec<&str> = table
            .lines()
            .next()
            .unwrap()
            .split('|')
            .map(str::trim)
            .collect();
        let sluice = table.lines().find(|l| l.starts_with("| sluice")).unwrap();
        let cells: Vec<&str> = sluice.split('|').map(str::trim).collect();
        assert_eq!(header.len(), cells.len(), "{table}");
        assert_eq!(
            table.lines().nth(1).unwrap().split('|').count(),
            cells.len()
        );
        let cell = |name: &str| cells[header.iter().position(|h| *h == name).unwrap()];
        assert_eq!(cell("workload"), "grpc unary");
        assert_eq!(cell("req/s"), "250");
        assert_eq!(cell("OK/s vs direct"), "0.25x");
        assert_eq!(cell("OK/s vs haproxy"), "0.50x");
        assert_eq!(cell("OK/s vs nginx"), "2.00x");
        assert_eq!(cell("proxy CPU us/req"), "40.0");
        assert_eq!(cell("CPU vs haproxy"), "4.00x");
        assert_eq!(cell("CPU vs nginx"), "2.00x");
        // `record` puts a quarter of the proxy's CPU in the kernel.
        assert_eq!(cell("proxy user us/req"), "30.0");
        assert_eq!(cell("proxy sys us/req"), "10.0");
        assert_eq!(cell("sys vs haproxy"), "4.00x");
        assert_eq!(cell("sys vs nginx"), "2.00x");
        assert_eq!(cell("upstream CPU us/req"), "9.0");
        assert_eq!(cell("client CPU us/req"), "8.0");
        assert_eq!(cell("proxy CPU/client CPU"), "5.00");
        assert_eq!(cell("CPU/client CPU vs haproxy"), "2.50x");
        assert_eq!(cell("CPU/client CPU vs nginx"), "2.50x");
        let direct = table.lines().find(|l| l.starts_with("| direct")).unwrap();
        assert!(direct.contains("| - |"), "{direct}");
    }

    #[test]
    fn ratio_without_reference() {
        assert_eq!(ratio(Some(1.0), None), "-");
        assert_eq!(ratio(Some(1.0), Some(0.0)), "-");
        assert_eq!(ratio(None, Some(1.0)), "-");
        assert_eq!(ratio(Some(3.0), Some(2.0)), "1.50x");
    }
}
