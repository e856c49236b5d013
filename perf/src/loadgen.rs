//! The load generator: h2load (nghttp2) command lines and the parsing of what it prints.
//!
//! h2load prints throughput and request counts but no latency percentiles, so every run also
//! writes h2load's per-request log (`--log-file`) and the percentiles are computed from it.
//! Parsers never panic: odd lines are skipped or reported as a typed error.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Serialize;

/// What h2load's summary says about one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct H2loadSummary {
    pub duration_s: f64,
    pub requests_per_second: f64,
    pub total: u64,
    pub started: u64,
    pub done: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub errored: u64,
    pub timeout: u64,
    pub status_2xx: u64,
    pub status_4xx: u64,
    pub status_5xx: u64,
    /// Response body bytes received (the `traffic:` line's `data`; 0 if absent).
    pub data_bytes: u64,
}

impl H2loadSummary {
    /// Requests h2load counts as failed: connection errors and timeouts (`errored`, `timeout`)
    /// and answers with a status other than 2xx/3xx all count there. Not `total - 2xx`: in a
    /// timed run h2load resets its request counts after the warm-up but not quite in step with
    /// its status counts, so that difference is a few dozen either way with nothing failing.
    pub fn errors(&self) -> u64 {
        self.failed
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ParseError {
    #[error("h2load output has no `{0}` line")]
    MissingLine(&'static str),
    #[error("h2load line `{line}`: cannot read {what}")]
    BadValue { line: String, what: &'static str },
}

/// Reads `1.5s`, `12.3ms` or `850us` (h2load's duration notation).
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let (number, scale) = if let Some(n) = text.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else {
        return None;
    };
    let value: f64 = number.trim().parse().ok()?;
    if !value.is_finite() || value < 0.0 {
        return None;
    }
    Duration::try_from_secs_f64(value * scale).ok()
}

/// The number before `word` in a comma-separated list such as `100 total, 99 started`.
fn count_before(line: &str, word: &str) -> Option<u64> {
    line.split(',').find_map(|part| {
        let mut words = part.split_whitespace().rev();
        let last = words.next()?;
        let number = words.next()?;
        (last == word).then(|| number.parse().ok()).flatten()
    })
}

/// The exact byte count of `... 1001.77KB (1025814) data` in h2load's `traffic:` line.
fn traffic_data_bytes(traffic: &str) -> Option<u64> {
    let part = traffic
        .split(',')
        .find(|part| part.trim_end().ends_with(" data"))?;
    let inner = part.split_once('(')?.1.split_once(')')?.0;
    inner.trim().parse().ok()
}

/// Parses h2load's standard output (the `finished in`, `requests:` and `status codes:` lines).
pub fn parse_summary(output: &str) -> Result<H2loadSummary, ParseError> {
    let mut summary = H2loadSummary::default();
    let finished = output
        .lines()
        .find_map(|line| line.trim().strip_prefix("finished in "))
        .ok_or(ParseError::MissingLine("finished in"))?;
    let bad = |what| ParseError::BadValue {
        line: finished.to_string(),
        what,
    };
    let mut parts = finished.split(',');
    summary.duration_s = parts
        .next()
        .and_then(parse_duration)
        .ok_or_else(|| bad("the duration"))?
        .as_secs_f64();
    summary.requests_per_second = parts
        .next()
        .and_then(|part| part.trim().strip_suffix("req/s"))
        .and_then(|number| number.trim().parse().ok())
        .ok_or_else(|| bad("req/s"))?;

    let requests = output
        .lines()
        .find_map(|line| line.trim().strip_prefix("requests:"))
        .ok_or(ParseError::MissingLine("requests:"))?;
    let count = |word: &'static str| {
        count_before(requests, word).ok_or_else(|| ParseError::BadValue {
            line: requests.to_string(),
            what: word,
        })
    };
    summary.total = count("total")?;
    summary.started = count("started")?;
    summary.done = count("done")?;
    summary.succeeded = count("succeeded")?;
    summary.failed = count("failed")?;
    summary.errored = count("errored")?;
    summary.timeout = count("timeout")?;

    let statuses = output
        .lines()
        .find_map(|line| line.trim().strip_prefix("status codes:"))
        .ok_or(ParseError::MissingLine("status codes:"))?;
    summary.status_2xx = count_before(statuses, "2xx").unwrap_or(0);
    summary.status_4xx = count_before(statuses, "4xx").unwrap_or(0);
    summary.status_5xx = count_before(statuses, "5xx").unwrap_or(0);
    summary.data_bytes = output
        .lines()
        .find_map(|line| line.trim().strip_prefix("traffic:"))
        .and_then(traffic_data_bytes)
        .unwrap_or(0);
    Ok(summary)
}

/// Request durations (microseconds) from h2load's `--log-file`: tab-separated start time,
/// status, duration. Lines that do not have that shape are skipped.
pub fn parse_log_latencies(log: &str) -> Vec<u64> {
    log.lines()
        .filter_map(|line| {
            let mut columns = line.split('\t');
            let _start = columns.next()?;
            let status: u16 = columns.next()?.trim().parse().ok()?;
            let micros: u64 = columns.next()?.trim().parse().ok()?;
            (200..300).contains(&status).then_some(micros)
        })
        .collect()
}

/// Latency percentiles in microseconds (nearest rank).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub mean: u64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
}

impl Percentiles {
    /// `None` without samples.
    pub fn of(mut samples: Vec<u64>) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let mean = samples.iter().sum::<u64>() / samples.len() as u64;
        let rank = |fraction: f64| {
            let index = ((fraction * samples.len() as f64).ceil() as usize).saturating_sub(1);
            samples[index.min(samples.len() - 1)]
        };
        Some(Self {
            mean,
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            p999: rank(0.999),
        })
    }
}

/// How long one h2load invocation runs.
#[derive(Debug, Clone, Copy)]
pub enum Load {
    /// `-n`: this many requests, connection set-up included.
    Requests(u64),
    /// `--warm-up-time` then `-D`: h2load counts (and logs) only the requests of the main
    /// duration, so TLS handshakes and connection set-up stay out of the figures.
    Timed {
        warm_up: Duration,
        duration: Duration,
    },
}

/// One h2load invocation: `clients` connections with `streams` concurrent streams each.
#[derive(Debug, Clone)]
pub struct H2load {
    pub url: String,
    pub load: Load,
    pub clients: u32,
    pub streams: u32,
    /// Request body (`-d`); without it, GET.
    pub body_file: Option<PathBuf>,
    pub headers: Vec<String>,
    /// HTTP/1.1 (`--h1`) instead of HTTP/2.
    pub h1: bool,
    /// Open loop: each client starts this many requests per second (`--rps`).
    pub rps_per_client: Option<u32>,
    /// CPU list for `taskset -c`.
    pub cpu: String,
}

/// h2load's duration notation with millisecond precision.
fn h2load_duration(duration: Duration) -> String {
    format!("{}ms", duration.as_millis().max(1))
}

impl H2load {
    pub fn command(&self, log_file: &Path) -> Command {
        let mut command = Command::new("taskset");
        command.args(["-c", &self.cpu, "h2load"]);
        match self.load {
            Load::Requests(requests) => {
                command.args(["-n", &requests.to_string()]);
            }
            Load::Timed { warm_up, duration } => {
                command
                    .args(["--warm-up-time", &h2load_duration(warm_up)])
                    .args(["-D", &h2load_duration(duration)]);
            }
        }
        command
            .args(["-c", &self.clients.to_string()])
            .args(["-m", &self.streams.to_string()])
            .args(["-t", "1"]);
        if self.h1 {
            command.arg("--h1");
        }
        if let Some(rps) = self.rps_per_client {
            command.args(["--rps", &rps.to_string()]);
        }
        if let Some(body) = &self.body_file {
            command.arg("-d").arg(body);
        }
        command.arg("--log-file").arg(log_file);
        for header in &self.headers {
            command.args(["-H", header]);
        }
        command.arg(&self.url);
        command
    }
}

/// What one measured h2load run produced.
#[derive(Debug)]
pub struct Measured {
    pub summary: H2loadSummary,
    /// Percentiles of the successful requests (`None` without any).
    pub latency: Option<Percentiles>,
    /// CPU and RSS of the proxy's processes, over the counted part of the run.
    pub usage: Vec<crate::measure::ProcessUsage>,
    /// The same of the upstream's processes (the echo backend, the apiserver simulator).
    pub upstream_usage: Vec<crate::measure::ProcessUsage>,
    /// h2load's own CPU over the same part, in microseconds.
    pub client_cpu_us: u64,
    /// TCP segments every process on this machine sent over the same part (`/proc/net/snmp`
    /// `Tcp: OutSegs`): client, proxy and upstream hops together.
    pub tcp_out_segments: Option<u64>,
}

/// `OutSegs` of the `Tcp:` lines of `/proc/net/snmp` (a header line of names, then values).
pub fn parse_tcp_out_segments(snmp: &str) -> Option<u64> {
    let mut tcp = snmp.lines().filter(|line| line.starts_with("Tcp:"));
    let names = tcp.next()?.split_whitespace();
    let values = tcp.next()?.split_whitespace();
    names
        .zip(values)
        .find(|(name, _)| *name == "OutSegs")
        .and_then(|(_, value)| value.parse().ok())
}

fn tcp_out_segments() -> Option<u64> {
    parse_tcp_out_segments(&std::fs::read_to_string("/proc/net/snmp").ok()?)
}

/// Runs `h2load` and measures the CPU of the `proxy` and `upstream` processes over the part
/// h2load counts: the whole run with [`Load::Requests`], the main duration (after the warm-up)
/// with [`Load::Timed`].
pub fn measure(
    h2load: &H2load,
    dir: &Path,
    proxy: &[(String, u32)],
    upstream: &[(String, u32)],
) -> anyhow::Result<Measured> {
    use anyhow::Context;

    let processes: Vec<(String, u32)> = proxy.iter().chain(upstream).cloned().collect();
    let processes = processes.as_slice();
    let log_file = dir.join("h2load-requests.log");
    let mut command = h2load.command(&log_file);
    command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let children_before = crate::measure::waited_children_cpu_micros();
    let (child, meter, client_warm_up) = match h2load.load {
        Load::Requests(_) => {
            let meter = crate::measure::CpuMeter::start(processes)?;
            (command.spawn(), meter, 0)
        }
        Load::Timed { warm_up, .. } => {
            let child = command.spawn();
            std::thread::sleep(warm_up);
            let meter = crate::measure::CpuMeter::start(processes)?;
            // What h2load spent warming up (handshakes included) is left out, as for the proxy.
            let spent = child.as_ref().map_or(0, |child| {
                crate::measure::cpu_micros(child.id()).unwrap_or(0)
            });
            (child, meter, spent)
        }
    };
    let segments_before = tcp_out_segments();
    let output = child
        .and_then(|child| child.wait_with_output())
        .context("cannot run h2load (nghttp2-client)")?;
    let client_cpu_us = crate::measure::waited_children_cpu_micros()
        .saturating_sub(children_before)
        .saturating_sub(client_warm_up);
    let mut usage = meter.finish()?;
    let upstream_usage = usage.split_off(proxy.len().min(usage.len()));
    let tcp_out_segments = segments_before
        .zip(tcp_out_segments())
        .map(|(before, after)| after.saturating_sub(before));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary = parse_summary(&stdout).with_context(|| {
        format!(
            "h2load {} printed:\n{stdout}\n{}",
            h2load.url,
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    let log = std::fs::read_to_string(&log_file).unwrap_or_default();
    let _ = std::fs::remove_file(&log_file);
    Ok(Measured {
        summary,
        latency: Percentiles::of(parse_log_latencies(&log)),
        usage,
        upstream_usage,
        client_cpu_us,
        tcp_out_segments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Captured from `h2load -n 20000 -c 10 -m 10` against the demo echo backend (nghttp2 1.52),
    /// and from `h2load -n 20 -c 2` against a closed port.
    const SAMPLE: &str = include_str!("../testdata/h2load.txt");
    const SAMPLE_FAILURES: &str = include_str!("../testdata/h2load-failures.txt");

    #[test]
    fn parses_a_captured_run() {
        let summary = parse_summary(SAMPLE).unwrap();
        assert_eq!(summary.total, 20000);
        assert_eq!(summary.succeeded, 20000);
        assert_eq!(summary.status_2xx, 20000);
        assert_eq!(summary.errors(), 0);
        assert!(summary.requests_per_second > 1000.0);
        assert!(summary.duration_s > 0.0 && summary.duration_s < 60.0);
        assert!(summary.data_bytes > 0);
    }

    #[test]
    fn out_segments_come_from_the_tcp_lines_of_snmp() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
                    Tcp: RtoAlgorithm RtoMin OutSegs RetransSegs\nTcp: 1 200 123456 7\n\
                    Udp: InDatagrams\nUdp: 5\n";
        assert_eq!(parse_tcp_out_segments(snmp), Some(123_456));
        assert_eq!(parse_tcp_out_segments("Tcp: OutSegs\n"), None);
    }

    #[test]
    fn percentiles_carry_the_mean() {
        let percentiles = Percentiles::of(vec![100, 200, 600]).unwrap();
        assert_eq!(percentiles.mean, 300);
        assert_eq!(percentiles.p50, 200);
    }

    #[test]
    fn traffic_line_data_bytes() {
        let line = " 95.36KB (97650) total, 531.91KB (544680) headers (space savings 0.00%), 1001.77KB (1025814) data";
        assert_eq!(traffic_data_bytes(line), Some(1_025_814));
        assert_eq!(traffic_data_bytes(" 1KB (10) total"), None);
        assert_eq!(traffic_data_bytes(" 1KB (x) data"), None);
    }

    #[test]
    fn counts_failures_of_a_captured_run() {
        let summary = parse_summary(SAMPLE_FAILURES).unwrap();
        assert_eq!((summary.total, summary.done, summary.failed), (20, 0, 20));
        assert_eq!(summary.errors(), 20);
        assert_eq!(summary.requests_per_second, 0.0);
    }

    #[test]
    fn reports_what_is_missing() {
        assert_eq!(
            parse_summary("starting benchmark...\n"),
            Err(ParseError::MissingLine("finished in"))
        );
        let broken = "finished in 1.2 parsecs, 12 req/s, 1KB/s\n";
        assert!(matches!(
            parse_summary(broken),
            Err(ParseError::BadValue { .. })
        ));
    }

    #[test]
    fn durations_in_each_unit() {
        assert_eq!(parse_duration("850us"), Some(Duration::from_micros(850)));
        assert_eq!(
            parse_duration("12.5ms"),
            Some(Duration::from_micros(12_500))
        );
        assert_eq!(parse_duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("-2s"), None);
        assert_eq!(parse_duration("2h"), None);
        assert_eq!(parse_duration("NaNs"), None);
    }

    #[test]
    fn latencies_keep_successes_only() {
        let log = "1700000000000000\t200\t120\n1700000000000100\t503\t90\ngarbage\n1\t200\tx\n1700000000000200\t200\t80\n";
        assert_eq!(parse_log_latencies(log), vec![120, 80]);
    }

    fn arguments(h2load: &H2load) -> Vec<String> {
        h2load
            .command(Path::new("/tmp/log"))
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn command_lines_per_mode() {
        let mut h2load = H2load {
            url: "https://127.0.0.1:1/x".into(),
            load: Load::Requests(100),
            clients: 4,
            streams: 2,
            body_file: Some("/tmp/body".into()),
            headers: vec!["te: trailers".into()],
            h1: false,
            rps_per_client: None,
            cpu: "1".into(),
        };
        let args = arguments(&h2load).join(" ");
        assert!(
            args.starts_with("-c 1 h2load -n 100 -c 4 -m 2 -t 1 -d /tmp/body"),
            "{args}"
        );
        assert!(!args.contains("--h1") && !args.contains("--rps"));
        h2load.load = Load::Timed {
            warm_up: Duration::from_millis(1500),
            duration: Duration::from_secs(4),
        };
        h2load.h1 = true;
        h2load.rps_per_client = Some(100);
        h2load.body_file = None;
        let args = arguments(&h2load).join(" ");
        assert!(
            args.contains("--warm-up-time 1500ms -D 4000ms") && !args.contains(" -n "),
            "{args}"
        );
        assert!(
            args.contains("--h1 --rps 100") && !args.contains(" -d "),
            "{args}"
        );
        assert!(
            args.ends_with("-H te: trailers https://127.0.0.1:1/x"),
            "{args}"
        );
    }

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<u64> = (1..=1000).collect();
        let p = Percentiles::of(samples).unwrap();
        assert_eq!((p.p50, p.p90, p.p99, p.p999), (500, 900, 990, 999));
        assert_eq!(Percentiles::of(Vec::new()), None);
        let one = Percentiles::of(vec![7]).unwrap();
        assert_eq!((one.p50, one.p999), (7, 7));
    }

    proptest! {
        #[test]
        fn summary_parser_never_panics(text in "(?s).{0,400}") {
            let _ = parse_summary(&text);
        }

        #[test]
        fn summary_parser_survives_mangled_captures(cut in 0usize..2000, junk in ".{0,40}") {
            let mut text: String = SAMPLE.chars().take(cut).collect();
            text.push_str(&junk);
            let _ = parse_summary(&text);
        }

        #[test]
        fn log_parser_never_panics(text in "(?s)[0-9\\t\\n a-z-]{0,400}") {
            let latencies = parse_log_latencies(&text);
            prop_assert!(latencies.len() <= text.lines().count());
        }

        #[test]
        fn percentiles_are_ordered(samples in proptest::collection::vec(0u64..1_000_000, 1..500)) {
            let p = Percentiles::of(samples.clone()).unwrap();
            prop_assert!(p.p50 <= p.p90 && p.p90 <= p.p99 && p.p99 <= p.p999);
            prop_assert!(p.p999 <= *samples.iter().max().unwrap());
        }
    }
}
