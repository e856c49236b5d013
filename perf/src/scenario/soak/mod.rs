//! The soak scenario: mixed tunnel (unary gRPC) and gateway (Kubernetes API GET over TLS)
//! load on one Sluice process for minutes, at half of the capacity measured at its start,
//! while one of two agents is restarted every few windows and every window's load generators
//! open and close their connections. After each window it samples RSS and open fds of every
//! Sluice process, and p99 and errors of the window, then reports growth after the warm-up.
//!
//! The load is open loop (h2load `--rps`): a fixed request rate, so a leak shows as growth at
//! a constant amount of work rather than being hidden by a falling rate.

mod plot;
mod rig;
pub mod summary;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use super::{write_output, Harness};
use crate::loadgen::{
    parse_log_latencies, parse_summary, H2load, H2loadSummary, Load, Percentiles,
};
use crate::measure::rss_kib;
use crate::process::wait_until;
use crate::sluice::driver_of;
use rig::{fd_count, Rig};
use summary::{ProcessSample, Sample, WindowLoad};

const TUNNEL_METHOD: &str = "/sluice.demo.Echo/Say";
/// One gRPC message: not compressed, 5 bytes long, "hello".
const TUNNEL_BODY: &[u8] = b"\x00\x00\x00\x00\x05hello";
/// The share of the measured capacity the two workloads use together (half each of it).
const LOAD_FRACTION: f64 = 0.5;
/// Open-loop connections per workload and window.
const CLIENTS: u32 = 8;
/// Streams per tunnel connection.
const TUNNEL_STREAMS: u32 = 8;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Plan {
    minutes: f64,
    window: Duration,
    warm_up_windows: usize,
    /// An agent restart every this many windows.
    churn_every: u32,
    calibration: Duration,
}

fn plan(harness: &Harness) -> Plan {
    let minutes = harness
        .minutes
        .unwrap_or(if harness.smoke { 1.0 } else { 30.0 });
    let window = if minutes <= 2.0 {
        Duration::from_secs(5)
    } else {
        Duration::from_secs(10)
    };
    let windows = (minutes * 60.0 / window.as_secs_f64()).ceil().max(2.0) as usize;
    // A sixth of the run, at most 5 minutes: start-up allocations, pools and caches fill then.
    let warm_up_windows = (windows / 6).clamp(1, (300 / window.as_secs()) as usize);
    Plan {
        minutes,
        window,
        warm_up_windows,
        churn_every: if minutes <= 2.0 { 2 } else { 3 },
        calibration: if harness.smoke {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(5)
        },
    }
}

/// The two workloads' request shapes at a given load.
struct Workloads<'a> {
    harness: &'a Harness,
    rig: &'a Rig,
    body_file: std::path::PathBuf,
}

impl Workloads<'_> {
    fn tunnel(
        &self,
        load: Load,
        clients: u32,
        streams: u32,
        rps: Option<u32>,
    ) -> anyhow::Result<H2load> {
        let jwt = self.rig.secrets.client_jwt()?;
        Ok(H2load {
            url: format!(
                "http://{}{TUNNEL_METHOD}",
                self.rig.node.address("external")?
            ),
            load,
            clients,
            streams,
            body_file: Some(self.body_file.clone()),
            h1: false,
            rps_per_client: rps,
            headers: vec![
                "content-type: application/grpc".to_string(),
                "te: trailers".to_string(),
                format!("authorization: Bearer {jwt}"),
                "sluice-agent-id: 1".to_string(),
            ],
            cpu: self.harness.client_cpu.clone(),
        })
    }

    fn gateway(
        &self,
        load: Load,
        clients: u32,
        streams: u32,
        rps: Option<u32>,
    ) -> anyhow::Result<H2load> {
        Ok(H2load {
            url: format!(
                "https://{}{}",
                self.rig.node.address("gateway")?,
                super::gateway::GET_PATH
            ),
            load,
            clients,
            streams,
            body_file: None,
            h1: false,
            rps_per_client: rps,
            headers: vec![format!("authorization: Bearer {}", self.rig.token)],
            cpu: self.harness.client_cpu.clone(),
        })
    }
}

/// A running h2load and where its per-request log goes.
struct Running {
    child: Child,
    log: std::path::PathBuf,
    url: String,
}

fn spawn(h2load: &H2load, log: std::path::PathBuf) -> anyhow::Result<Running> {
    let child = h2load
        .command(&log)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run h2load (nghttp2-client)")?;
    Ok(Running {
        child,
        log,
        url: h2load.url.clone(),
    })
}

fn finish(running: Running) -> anyhow::Result<(H2loadSummary, Option<Percentiles>)> {
    let output = running.child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary = parse_summary(&stdout).with_context(|| {
        format!(
            "h2load {} printed:\n{stdout}\n{}",
            running.url,
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    let log = std::fs::read_to_string(&running.log).unwrap_or_default();
    let _ = std::fs::remove_file(&running.log);
    Ok((summary, Percentiles::of(parse_log_latencies(&log))))
}

/// Requests per second each workload sustains alone, closed loop.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Calibration {
    tunnel_capacity: f64,
    gateway_capacity: f64,
    tunnel_rate: u32,
    gateway_rate: u32,
}

fn calibrate(work: &Workloads, plan: &Plan, dir: &Path) -> anyhow::Result<Calibration> {
    let timed = Load::Timed {
        warm_up: Duration::from_millis(500),
        duration: plan.calibration,
    };
    let capacity = |h2load: H2load| -> anyhow::Result<f64> {
        let (summary, _) = finish(spawn(&h2load, dir.join("calibrate.log"))?)?;
        if summary.status_2xx == 0 || summary.errors() > 0 {
            bail!("calibration of {}: {summary:?}", h2load.url);
        }
        Ok(summary.requests_per_second)
    };
    let tunnel_capacity = capacity(work.tunnel(timed, 10, 10, None)?)?;
    let gateway_capacity = capacity(work.gateway(timed, 16, 4, None)?)?;
    // Both run at once on the same node: each takes half of the fraction.
    let rate = |capacity: f64| ((capacity * LOAD_FRACTION / 2.0).round() as u32).max(CLIENTS);
    Ok(Calibration {
        tunnel_capacity,
        gateway_capacity,
        tunnel_rate: rate(tunnel_capacity),
        gateway_rate: rate(gateway_capacity),
    })
}

fn window_load(
    (summary, latency): (H2loadSummary, Option<Percentiles>),
    grpc_codes: BTreeMap<String, u64>,
) -> WindowLoad {
    WindowLoad {
        done: summary.done,
        errors: summary.errors() + grpc_codes.values().sum::<u64>(),
        requests_per_second: summary.requests_per_second,
        p50_us: latency.map(|p| p.p50),
        p99_us: latency.map(|p| p.p99),
        failed: summary.errors(),
        grpc_codes,
    }
}

/// `sluice_tunnel_requests_total` by gRPC status other than OK, summed over methods.
fn error_codes(metrics: &str) -> BTreeMap<String, u64> {
    let mut codes = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("sluice_tunnel_requests_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once('}') else {
            continue;
        };
        let Some(code) = labels
            .split(',')
            .find_map(|label| label.strip_prefix("code=\""))
            .map(|code| code.trim_end_matches('"'))
        else {
            continue;
        };
        let value = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        if code != "OK" {
            *codes.entry(code.to_string()).or_insert(0) += value;
        }
    }
    codes
}

/// What `after` counts beyond `before`, per code (codes that did not grow left out).
fn code_delta(
    before: &BTreeMap<String, u64>,
    after: BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .into_iter()
        .map(|(code, n)| {
            let grown = n.saturating_sub(before.get(&code).copied().unwrap_or(0));
            (code, grown)
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn sample_processes(rig: &Rig) -> anyhow::Result<Vec<ProcessSample>> {
    rig.watched()
        .into_iter()
        .map(|(name, pid)| {
            Ok(ProcessSample {
                rss_kib: rss_kib(pid)?,
                fds: fd_count(pid)?,
                name,
                pid,
            })
        })
        .collect()
}

/// One window: both workloads open loop for `plan.window`, an agent restart half-way when due.
fn run_window(
    harness: &Harness,
    rig: &mut Rig,
    work_body: &Path,
    plan: &Plan,
    rates: &Calibration,
    window: u32,
) -> anyhow::Result<(WindowLoad, WindowLoad, Option<String>)> {
    let load = Load::Timed {
        warm_up: Duration::from_millis(1),
        duration: plan.window,
    };
    let per_client = |rate: u32| rate.div_ceil(CLIENTS).max(1);
    let codes_before = error_codes(&rig.metrics()?);
    let (tunnel, gateway) = {
        let work = Workloads {
            harness,
            rig,
            body_file: work_body.to_path_buf(),
        };
        let tunnel = work.tunnel(
            load,
            CLIENTS,
            TUNNEL_STREAMS,
            Some(per_client(rates.tunnel_rate)),
        )?;
        let gateway = work.gateway(load, CLIENTS, 4, Some(per_client(rates.gateway_rate)))?;
        (
            spawn(&tunnel, rig.dir.join("window-tunnel.log"))?,
            spawn(&gateway, rig.dir.join("window-gateway.log"))?,
        )
    };
    let churn = if window.is_multiple_of(plan.churn_every) {
        std::thread::sleep(plan.window / 2);
        rig.restart_churned_agent(harness)?;
        Some(format!("agent-churn restarted (#{})", rig.churn_generation))
    } else {
        None
    };
    let tunnel = finish(tunnel)?;
    let gateway = finish(gateway)?;
    let codes = code_delta(&codes_before, error_codes(&rig.metrics()?));
    Ok((
        window_load(tunnel, codes),
        window_load(gateway, BTreeMap::new()),
        churn,
    ))
}

/// The report of an earlier run, from what it left in `harness.out`.
fn resummarize(harness: &Harness) -> anyhow::Result<()> {
    let read = |name: &str| -> anyhow::Result<serde_json::Value> {
        let path = harness.out.join(name);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        Ok(serde_json::from_str(&text)?)
    };
    let samples: Vec<Sample> = serde_json::from_value(read("raw/samples.json")?)?;
    let earlier = read("summary.json")?;
    let plan: Plan = serde_json::from_value(earlier["plan"].clone())?;
    let rates: Calibration = serde_json::from_value(earlier["calibration"].clone())?;
    let driver = earlier["driver"].as_str().map(str::to_string);
    report(harness, &plan, &rates, &samples, driver.as_deref())
}

pub fn run(harness: &Harness) -> anyhow::Result<()> {
    if harness.resummarize {
        return resummarize(harness);
    }
    let plan = plan(harness);
    let mut rig = Rig::start(harness)?;
    let body_file = rig.dir.join("body.bin");
    std::fs::write(&body_file, TUNNEL_BODY)?;
    super::fresh_raw_dir(&harness.out)?;
    let driver = rig.metrics().ok().and_then(|m| driver_of(&m));
    wait_until("both agents' tunnels", Duration::from_secs(60), || {
        rig.check_alive()?;
        Ok(rig.connected_tunnels()? >= 2 * 64)
    })?;
    let rates = {
        let work = Workloads {
            harness,
            rig: &rig,
            body_file: body_file.clone(),
        };
        calibrate(&work, &plan, &rig.dir)?
    };
    eprintln!(
        "soak: capacity tunnel {:.0}/s, gateway {:.0}/s alone; soaking at {}/s + {}/s for {} min",
        rates.tunnel_capacity,
        rates.gateway_capacity,
        rates.tunnel_rate,
        rates.gateway_rate,
        plan.minutes
    );
    let windows = (plan.minutes * 60.0 / plan.window.as_secs_f64())
        .ceil()
        .max(2.0) as u32;
    let started = Instant::now();
    let mut samples = Vec::new();
    for window in 1..=windows {
        let (tunnel, gateway, churn) =
            run_window(harness, &mut rig, &body_file, &plan, &rates, window)?;
        rig.check_alive()?;
        let sample = Sample {
            window,
            elapsed_s: started.elapsed().as_secs_f64(),
            processes: sample_processes(&rig)?,
            tunnel,
            gateway,
            connected_tunnels: rig.connected_tunnels()?,
            churn,
        };
        eprintln!(
            "  window {window}/{windows}: node RSS {} KiB, {} fds; p99 tunnel {:?} us, gateway {:?} us; errors {}",
            sample.processes[0].rss_kib,
            sample.processes[0].fds,
            sample.tunnel.p99_us,
            sample.gateway.p99_us,
            sample.tunnel.errors + sample.gateway.errors
        );
        samples.push(sample);
        // Rewritten every window: an interrupted soak keeps what it sampled.
        write_output(
            &harness.out,
            "raw/samples.json",
            &serde_json::to_string_pretty(&samples)?,
        )?;
    }
    report(harness, &plan, &rates, &samples, driver.as_deref())
}

fn report(
    harness: &Harness,
    plan: &Plan,
    rates: &Calibration,
    samples: &[Sample],
    driver: Option<&str>,
) -> anyhow::Result<()> {
    let window_s = plan.window.as_secs_f64();
    let summary = summary::summarize(samples, plan.warm_up_windows, window_s)
        .context("the soak took no sample")?;
    write_output(
        &harness.out,
        "summary.json",
        &serde_json::to_string_pretty(&serde_json::json!({
            "plan": plan,
            "calibration": rates,
            "driver": driver,
            "summary": summary,
        }))?,
    )?;
    let warm_up_min = summary.warm_up_windows as f64 * window_s / 60.0;
    plot::over_time(
        &harness.out.join("soak-over-time.svg"),
        samples,
        warm_up_min,
    )?;
    let machine = crate::machine::describe();
    let mut markdown = format!(
        "# Soak{smoke}\n\n{machine}\
         One Sluice process is tunnel node and Kubernetes API gateway at once (1 worker, CPU {proxy}); \
         two agents of the same agent id (CPU {proxy}) hold its tunnels to the echo backend, and the \
         apiserver simulator is the gateway's upstream (CPU {upstream}). Capacity measured alone at the start \
         (closed loop, {calibration:.0} s each): tunnel {tunnel_capacity:.0} calls/s, gateway \
         {gateway_capacity:.0} GETs/s. The soak runs both at once, open loop (h2load `--rps`, {clients} \
         connections each, CPU {client}), at {LOAD_FRACTION} of that capacity together: {tunnel_rate} \
         calls/s + {gateway_rate} GETs/s. Each window's load generators open new connections and close \
         them at its end; every {churn} windows the agent `agent-churn` is stopped (SIGTERM) and a new \
         one started half-way through the window. Samples at the end of every window.\n\n",
        smoke = if harness.smoke { " (smoke: not a measurement)" } else { "" },
        machine = machine.markdown(driver),
        proxy = harness.proxy_cpu,
        upstream = harness.upstream_cpu,
        client = harness.client_cpu,
        calibration = plan.calibration.as_secs_f64(),
        tunnel_capacity = rates.tunnel_capacity,
        gateway_capacity = rates.gateway_capacity,
        clients = CLIENTS,
        tunnel_rate = rates.tunnel_rate,
        gateway_rate = rates.gateway_rate,
        churn = plan.churn_every,
    );
    markdown.push_str(&summary::markdown(&summary));
    markdown.push_str("\n![RSS, fds and p99 over time](soak-over-time.svg)\n\n## Windows\n\n");
    markdown.push_str(&summary::window_table(samples));
    write_output(&harness.out, "summary.md", &markdown)?;
    println!("{}", summary::markdown(&summary));
    println!("wrote {}", harness.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sluice::SluiceBinary;

    fn harness(smoke: bool, minutes: Option<f64>) -> Harness {
        Harness {
            sluice: SluiceBinary("sluice".into()),
            apiserver_sim: "sim".into(),
            pingora: None,
            out: "out".into(),
            workspace: ".".into(),
            smoke,
            client_cpu: "1".into(),
            proxy_cpu: "0".into(),
            upstream_cpu: "0".into(),
            only: Vec::new(),
            levels: Vec::new(),
            requests: None,
            workloads: Vec::new(),
            seconds: None,
            minutes,
            resummarize: false,
        }
    }

    #[test]
    fn plans_scale_with_the_duration() {
        let full = plan(&harness(false, None));
        assert_eq!(full.minutes, 30.0);
        assert_eq!(full.window, Duration::from_secs(10));
        // 180 windows: a sixth would be 30, which is also the 5-minute cap.
        assert_eq!(full.warm_up_windows, 30);
        let smoke = plan(&harness(true, None));
        assert_eq!((smoke.minutes, smoke.window.as_secs()), (1.0, 5));
        assert_eq!((smoke.warm_up_windows, smoke.churn_every), (2, 2));
        let long = plan(&harness(false, Some(120.0)));
        assert_eq!(long.warm_up_windows, 30);
    }

    #[test]
    fn error_codes_are_counted_per_window() {
        let before = error_codes(
            "sluice_tunnel_requests_total{method=\"/a/B\",code=\"OK\"} 90\n\
             sluice_tunnel_requests_total{method=\"/a/B\",code=\"UNAVAILABLE\"} 7\n",
        );
        let after = error_codes(
            "sluice_tunnel_requests_total{method=\"/a/B\",code=\"OK\"} 99\n\
             sluice_tunnel_requests_total{method=\"/a/B\",code=\"UNAVAILABLE\"} 9\n\
             sluice_tunnel_requests_total{method=\"/a/C\",code=\"UNAVAILABLE\"} 1\n\
             sluice_tunnel_requests_total{method=\"/a/B\",code=\"CANCELLED\"} 4\n",
        );
        let delta = code_delta(&before, after);
        assert_eq!(delta.get("UNAVAILABLE"), Some(&3));
        assert_eq!(delta.get("CANCELLED"), Some(&4));
        assert!(!delta.contains_key("OK"));
    }
}
