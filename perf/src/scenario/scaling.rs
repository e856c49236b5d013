//! Thread-per-core scaling: the gateway with one worker on one CPU against two workers on two
//! CPUs, small HTTP/2 GETs in a closed loop, and what the per-core costs say about larger
//! machines.
//!
//! Two cores cannot show throughput scaling: the load generator and the apiserver simulator
//! need CPU too, so the second worker shares its core with the client. What they can show is
//! whether a second worker costs anything per request (shared state would show up as more CPU
//! per request, or a skewed split of connections and requests between the workers). The report
//! says so, and extrapolates to 16 and 64 cores from the per-request CPU only.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use super::gateway::{
    cluster_yaml, gateway_yaml, h2load, start_simulator, Protocol, RequestKind, HOST,
};
use super::{write_output, Harness};
use crate::loadgen::{measure, Load};
use crate::process::wait_until;
use crate::sluice::{admin_get, random_hex};

/// One case: how many workers, on which CPUs.
struct Case {
    name: &'static str,
    workers: usize,
    cpus: &'static str,
}

const CASES: [Case; 2] = [
    Case {
        name: "1-worker",
        workers: 1,
        cpus: "0",
    },
    Case {
        name: "2-workers",
        workers: 2,
        cpus: "0,1",
    },
];

/// One measured run of one case.
#[derive(Debug, Clone, Serialize)]
struct ScalingRun {
    case: String,
    workers: usize,
    clients: u32,
    ok_per_second: f64,
    cpu_us_per_request: f64,
    /// Requests each worker served during the run (`sluice_worker_requests_total`).
    requests_per_worker: Vec<u64>,
    errors: u64,
}

/// `sluice_worker_requests_total{worker="N"}` values, by worker index.
fn worker_requests(metrics: &str) -> BTreeMap<usize, u64> {
    metrics
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("sluice_worker_requests_total{worker=\"")?;
            let (worker, value) = rest.split_once("\"} ")?;
            Some((worker.parse().ok()?, value.trim().parse().ok()?))
        })
        .collect()
}

fn delta(before: &BTreeMap<usize, u64>, after: &BTreeMap<usize, u64>) -> Vec<u64> {
    after
        .iter()
        .map(|(worker, value)| value.saturating_sub(before.get(worker).copied().unwrap_or(0)))
        .collect()
}

pub fn run(harness: &Harness) -> anyhow::Result<()> {
    let (clients, repeats, warm_up, duration) = if harness.smoke {
        // SO_REUSEPORT hashes each connection onto a worker: with 8, both workers' share was
        // empty once in 128 smoke runs (a clean-clone CI run saw [0, 3817]); with 32, once in
        // two billion. check-smoke wants requests on every worker.
        (
            32,
            1,
            Duration::from_millis(200),
            Duration::from_millis(500),
        )
    } else {
        (64, 3, Duration::from_secs(1), Duration::from_secs(4))
    };
    let dir = &super::fresh_work_dir(&harness.out)?;
    let tls = crate::certs::generate(dir, &["127.0.0.1", "localhost", HOST])?;
    let token = random_hex(24)?;
    let mut simulator = start_simulator(harness, dir, &tls, &token)?;
    let mut runs = Vec::new();
    for case in &CASES {
        eprintln!("scaling: {}", case.name);
        let case_dir = dir.join(case.name);
        let clusters_dir = case_dir.join("clusters");
        std::fs::create_dir_all(&clusters_dir)?;
        write_output(
            &clusters_dir,
            "cluster.yaml",
            &cluster_yaml(&tls, simulator.address),
        )?;
        let mut gateway = harness.sluice.start(
            &case_dir,
            "gateway",
            "run",
            &gateway_yaml(&clusters_dir, case.workers),
            case.cpus,
        )?;
        let address = gateway.address("gateway")?;
        let admin = gateway.address("admin")?;
        let load = |clients: u32, load: Load| {
            h2load(
                harness,
                &token,
                address,
                Protocol::H2,
                RequestKind::Get,
                (clients, 1),
                load,
                None,
            )
        };
        wait_until(
            &format!("{} to answer", case.name),
            Duration::from_secs(30),
            || {
                simulator.process.check_alive()?;
                gateway.process.check_alive()?;
                let probe = load(1, Load::Requests(20));
                Ok(measure(&probe, dir, &[], &[])?.summary.status_2xx == 20)
            },
        )?;
        let proxy = [(gateway.process.name.clone(), gateway.process.pid())];
        for repeat in 0..repeats {
            let before = worker_requests(&admin_get(admin, "/metrics")?);
            let measured = measure(
                &load(clients, Load::Timed { warm_up, duration }),
                dir,
                &proxy,
                &[],
            )?;
            let after = worker_requests(&admin_get(admin, "/metrics")?);
            let run = scaling_run(case, clients, &measured, delta(&before, &after))
                .with_context(|| format!("{} run {repeat}", case.name))?;
            eprintln!(
                "  #{repeat}: {:.0} OK/s, {:.1} us CPU/req, per worker {:?}",
                run.ok_per_second, run.cpu_us_per_request, run.requests_per_worker
            );
            runs.push(run);
        }
    }
    write_output(
        &harness.out,
        "summary.json",
        &serde_json::to_string_pretty(&runs)?,
    )?;
    write_output(&harness.out, "summary.md", &report(harness, &runs))?;
    eprintln!("wrote {}", harness.out.display());
    Ok(())
}

fn scaling_run(
    case: &Case,
    clients: u32,
    measured: &crate::loadgen::Measured,
    requests_per_worker: Vec<u64>,
) -> anyhow::Result<ScalingRun> {
    let summary = &measured.summary;
    anyhow::ensure!(summary.done > 0, "no request completed");
    let cpu: u64 = measured.usage.iter().map(|usage| usage.cpu_us).sum();
    // Not `done - 2xx`: in a timed run h2load's status counts lag its request counts (see
    // `H2loadSummary::errors`).
    let ok = summary.done.saturating_sub(summary.errors());
    Ok(ScalingRun {
        case: case.name.to_string(),
        workers: case.workers,
        clients,
        ok_per_second: summary.requests_per_second * ok as f64 / summary.done as f64,
        cpu_us_per_request: cpu as f64 / summary.done as f64,
        requests_per_worker,
        errors: summary.errors(),
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// The largest worker's share of the requests, as a fraction (0.5 is an even split of two).
fn largest_share(runs: &[&ScalingRun]) -> f64 {
    let mut totals: Vec<u64> = Vec::new();
    for run in runs {
        for (worker, requests) in run.requests_per_worker.iter().enumerate() {
            if totals.len() <= worker {
                totals.resize(worker + 1, 0);
            }
            totals[worker] += requests;
        }
    }
    let sum: u64 = totals.iter().sum();
    totals
        .iter()
        .max()
        .map_or(0.0, |max| *max as f64 / sum.max(1) as f64)
}

fn report(harness: &Harness, runs: &[ScalingRun]) -> String {
    let machine = crate::machine::describe();
    let mut out = format!(
        "# Scaling scenario{}\n\n{}\
         The gateway in front of the apiserver simulator (CPU {}), small HTTP/2 GETs over TLS, \
         closed loop, h2load on CPU {}. `1-worker`: `workers: 1` pinned to CPU 0; `2-workers`: \
         `workers: 2` on CPUs 0 and 1, so the second worker shares its core with the client and \
         the simulator shares CPU 0 with the first. Throughput therefore cannot double here; \
         what this shows is the per-request CPU of one worker against two (shared state between \
         cores would raise it) and how evenly SO_REUSEPORT spreads the work.\n\n\
         | case | runs | OK/s (median) | gateway CPU us/req (median) | largest worker's share of requests | errors |\n\
         |---|--:|--:|--:|--:|--:|\n",
        if harness.smoke { " (smoke: not a measurement)" } else { "" },
        machine.markdown(None),
        harness.upstream_cpu,
        harness.client_cpu,
    );
    let mut per_request = Vec::new();
    for case in &CASES {
        let case_runs: Vec<&ScalingRun> = runs.iter().filter(|r| r.case == case.name).collect();
        if case_runs.is_empty() {
            continue;
        }
        let cpu = median(case_runs.iter().map(|r| r.cpu_us_per_request).collect());
        per_request.push((case.workers, cpu));
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {cpu:.1} | {:.0}% | {} |",
            case.name,
            case_runs.len(),
            median(case_runs.iter().map(|r| r.ok_per_second).collect()),
            100.0 * largest_share(&case_runs),
            case_runs.iter().map(|r| r.errors).sum::<u64>(),
        );
    }
    out.push_str(&estimate(&per_request));
    out
}

/// The paper estimate: a core that spends `cpu` us per request serves at most 1e6 / cpu
/// requests a second; N cores N times that if nothing is shared (the design's claim), scaled by
/// the measured change in per-request CPU from one worker to two.
fn estimate(per_request: &[(usize, f64)]) -> String {
    let (Some(&(_, one)), Some(&(_, two))) = (
        per_request.iter().find(|(workers, _)| *workers == 1),
        per_request.iter().find(|(workers, _)| *workers == 2),
    ) else {
        return String::new();
    };
    if one <= 0.0 || two <= 0.0 {
        return String::new();
    }
    let growth = two / one;
    let mut out = format!(
        "\nPer-request CPU with two workers is {growth:.2}x that of one. Paper estimate, from \
         per-core cost only (1e6 / CPU us per request per core, the two-worker cost, \
         no NIC, memory-bandwidth or kernel limits, which will bind first):\n\n\
         | cores | gateway requests/s if CPU-bound |\n|--:|--:|\n"
    );
    for cores in [1u32, 2, 16, 64] {
        let cost = if cores == 1 { one } else { two };
        let _ = writeln!(out, "| {cores} | {:.0} |", f64::from(cores) * 1e6 / cost);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_requests_are_read_by_index() {
        let metrics = "# TYPE sluice_worker_requests counter\n\
                       sluice_worker_requests_total{worker=\"0\"} 120\n\
                       sluice_worker_requests_total{worker=\"1\"} 80\n\
                       sluice_workers 2\n";
        let read = worker_requests(metrics);
        assert_eq!(read, BTreeMap::from([(0, 120), (1, 80)]));
        let before = BTreeMap::from([(0, 20), (1, 30)]);
        assert_eq!(delta(&before, &read), vec![100, 50]);
    }

    #[test]
    fn the_largest_share_is_of_all_runs_together() {
        let run = |split: Vec<u64>| ScalingRun {
            case: "2-workers".into(),
            workers: 2,
            clients: 64,
            ok_per_second: 1.0,
            cpu_us_per_request: 1.0,
            requests_per_worker: split,
            errors: 0,
        };
        let (a, b) = (run(vec![60, 40]), run(vec![40, 60]));
        assert!((largest_share(&[&a, &b]) - 0.5).abs() < 1e-9);
        assert!((largest_share(&[&a]) - 0.6).abs() < 1e-9);
    }

    #[test]
    fn the_estimate_uses_the_two_worker_cost_beyond_one_core() {
        let table = estimate(&[(1, 10.0), (2, 12.5)]);
        assert!(table.contains("1.25x"), "{table}");
        assert!(table.contains("| 1 | 100000 |"), "{table}");
        assert!(table.contains("| 16 | 1280000 |"), "{table}");
        assert!(estimate(&[(1, 10.0)]).is_empty());
    }
}
