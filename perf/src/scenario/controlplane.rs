//! The control-plane scenario: many concurrent watchers of one resource and writes at a
//! steady rate through the API, on the embedded store and on etcd (one member, started here).
//!
//! Every watcher is a raw HTTPS watch stream (`sluice-watch-client`'s `Transport`, one TLS
//! connection each, a `node` token), all in this process on a small tokio runtime pinned to
//! the client CPUs. The writer creates Agent objects at a fixed rate, open loop (a slow answer
//! does not delay the next write), each on its own connection as the admin; every object
//! carries the wall-clock time its request was sent in an annotation, and each watcher records
//! receipt time minus that: the event delivery latency, from the writer's send to the
//! watcher's read, including the write's own TLS handshake and store commit.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde::Serialize;
use sluice_watch_client::{decode_event, LineDecoder, Transport, WatchClientConfig, WatchEvent};

use super::{write_output, Harness};
use crate::measure::CpuMeter;
use crate::process::{free_port, wait_until, Managed};

/// The annotation holding the write's send time, nanoseconds since the Unix epoch.
const SENT_ANNOTATION: &str = "perf.sluice.dev/sent-unix-nanos";
const AGENTS: &str = "/apis/tunnel.sluice.dev/v1alpha1/agents";
/// Writes in flight at once at most; a write beyond it counts as not sent in time.
const MAX_IN_FLIGHT: usize = 256;

/// One run: a store, a watcher count and a write rate.
#[derive(Debug, Serialize)]
struct RunRecord {
    case: String,
    watchers: usize,
    target_writes_per_s: u32,
    seconds: f64,
    writes_sent: usize,
    writes_acked: usize,
    write_errors: usize,
    writes_per_s: f64,
    write_ack_p50_ms: f64,
    write_ack_p99_ms: f64,
    events_expected: usize,
    events_delivered: usize,
    events_missing: usize,
    watch_errors: usize,
    delivery_p50_ms: f64,
    delivery_p99_ms: f64,
    delivery_max_ms: f64,
    controlplane_cpu_percent: f64,
    controlplane_rss_mib: f64,
    etcd_cpu_percent: Option<f64>,
    seconds_to_connect_watchers: f64,
}

#[derive(Debug, Serialize)]
struct SummaryRow {
    case: String,
    watchers: usize,
    target_writes_per_s: u32,
    writes_per_s: f64,
    delivery_p50_ms: f64,
    delivery_p99_ms: f64,
    errors: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Store {
    Embedded,
    Etcd,
}

impl Store {
    fn name(self) -> &'static str {
        match self {
            Store::Embedded => "embedded",
            Store::Etcd => "etcd",
        }
    }
}

pub fn run(harness: &Harness) -> anyhow::Result<()> {
    let (watchers, rates, seconds): (usize, Vec<u32>, u64) = if harness.smoke {
        (20, vec![50], 3)
    } else {
        (1_000, vec![50, 200], 20)
    };
    let stores: Vec<Store> = [Store::Embedded, Store::Etcd]
        .into_iter()
        .filter(|store| harness.only.is_empty() || harness.only.iter().any(|o| o == store.name()))
        .collect();
    let dir = &super::fresh_work_dir(&harness.out)?;
    super::fresh_raw_dir(&harness.out)?;
    // Described before pinning: the machine's CPUs, not the harness's share of them.
    let machine = crate::machine::describe();
    let cpus = crate::affinity::parse_cpus(&harness.client_cpu)?;
    crate::affinity::pin_this_thread(&cpus)
        .with_context(|| format!("cannot pin the harness to CPUs {}", harness.client_cpu))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("perf-watchers")
        .enable_all()
        .build()?;
    let mut records = Vec::new();
    for store in stores {
        for &rate in &rates {
            let case_dir = dir.join(format!("{}-{rate}", store.name()));
            std::fs::create_dir_all(&case_dir)?;
            let record = run_case(harness, &runtime, &case_dir, store, watchers, rate, seconds)
                .with_context(|| format!("case {} at {rate} writes/s", store.name()))?;
            println!(
                "{} {rate}/s: {:.1} writes/s acked, delivery p50 {:.2} ms p99 {:.2} ms, {} missing, {} write errors",
                record.case,
                record.writes_per_s,
                record.delivery_p50_ms,
                record.delivery_p99_ms,
                record.events_missing,
                record.write_errors
            );
            write_output(
                &harness.out,
                &format!("raw/{}-{rate}.json", store.name()),
                &serde_json::to_string_pretty(&record)?,
            )?;
            records.push(record);
        }
    }
    let rows: Vec<SummaryRow> = records
        .iter()
        .map(|r| SummaryRow {
            case: r.case.clone(),
            watchers: r.watchers,
            target_writes_per_s: r.target_writes_per_s,
            writes_per_s: r.writes_per_s,
            delivery_p50_ms: r.delivery_p50_ms,
            delivery_p99_ms: r.delivery_p99_ms,
            errors: r.write_errors + r.events_missing + r.watch_errors,
        })
        .collect();
    write_output(
        &harness.out,
        "summary.json",
        &serde_json::to_string_pretty(&rows)?,
    )?;
    let markdown = markdown(harness, &machine, &records, watchers, seconds);
    write_output(&harness.out, "summary.md", &markdown)?;
    println!("{markdown}");
    println!("wrote {}", harness.out.display());
    Ok(())
}

fn markdown(
    harness: &Harness,
    machine: &crate::machine::Machine,
    records: &[RunRecord],
    watchers: usize,
    seconds: u64,
) -> String {
    let mut text = format!(
        "# Control-plane scenario{smoke}\n\n{machine}\
         {watchers} watchers of Agent objects (raw HTTPS watch streams, `node` token) in the harness \
         on CPU {client}; `sluice controlplane` on CPU {proxy}; etcd (one member) on CPU {upstream}. \
         Open-loop creates for {seconds} s at each rate, one TLS connection per write. Delivery latency: \
         a watcher's receipt time minus the write's send time (annotation), over every (write, watcher) pair.\n\n\
         | store | target writes/s | writes/s acked | write ack p50 ms | p99 ms | delivery p50 ms | p99 ms | max ms | events missing | write errors | control plane CPU % | RSS MiB | etcd CPU % |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        smoke = if harness.smoke { " (smoke: not a measurement)" } else { "" },
        machine = machine.markdown(None),
        client = harness.client_cpu,
        proxy = harness.proxy_cpu,
        upstream = harness.upstream_cpu,
    );
    for r in records {
        text.push_str(&format!(
            "| {} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {:.0} | {:.0} | {} |\n",
            r.case,
            r.target_writes_per_s,
            r.writes_per_s,
            r.write_ack_p50_ms,
            r.write_ack_p99_ms,
            r.delivery_p50_ms,
            r.delivery_p99_ms,
            r.delivery_max_ms,
            r.events_missing,
            r.write_errors,
            r.controlplane_cpu_percent,
            r.controlplane_rss_mib,
            r.etcd_cpu_percent
                .map_or_else(|| "-".to_string(), |cpu| format!("{cpu:.0}")),
        ));
    }
    text
}

pub(crate) struct Etcd {
    pub process: Managed,
    pub endpoint: String,
}

pub(crate) fn start_etcd(dir: &Path, cpu: &str) -> anyhow::Result<Etcd> {
    let client = free_port()?;
    let peer = free_port()?;
    let endpoint = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let data = dir.join("etcd-data");
    let args: Vec<std::ffi::OsString> = vec![
        "--name".into(),
        "perf".into(),
        "--data-dir".into(),
        data.into_os_string(),
        "--listen-client-urls".into(),
        endpoint.clone().into(),
        "--advertise-client-urls".into(),
        endpoint.clone().into(),
        "--listen-peer-urls".into(),
        peer_url.clone().into(),
        "--initial-advertise-peer-urls".into(),
        peer_url.clone().into(),
        "--initial-cluster".into(),
        format!("perf={peer_url}").into(),
    ];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let mut process = Managed::spawn("etcd", cpu, dir, "etcd", &args)
        .context("starting etcd (apt-get install etcd-server)")?;
    let address: SocketAddr = format!("127.0.0.1:{client}").parse()?;
    wait_until("etcd healthy", Duration::from_secs(30), || {
        process.check_alive()?;
        Ok(http_get(address, "/health").is_ok_and(|body| body.contains("\"health\":\"true\"")))
    })?;
    Ok(Etcd { process, endpoint })
}

fn http_get(address: SocketAddr, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// Per-watcher results: delivery latencies (microseconds) and how many events arrived.
#[derive(Default)]
struct WatcherTally {
    latencies_us: Vec<u32>,
    delivered: usize,
}

#[allow(clippy::too_many_arguments)]
fn run_case(
    harness: &Harness,
    runtime: &tokio::runtime::Runtime,
    dir: &Path,
    store: Store,
    watchers: usize,
    rate: u32,
    seconds: u64,
) -> anyhow::Result<RunRecord> {
    let etcd = match store {
        Store::Embedded => None,
        Store::Etcd => Some(start_etcd(dir, &harness.upstream_cpu)?),
    };
    let data = dir.join("controlplane");
    let addresses = dir.join("controlplane-addresses.json");
    let mut args: Vec<std::ffi::OsString> = vec![
        "--addresses-file".into(),
        addresses.clone().into_os_string(),
        "controlplane".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--data-dir".into(),
        data.clone().into_os_string(),
    ];
    if let Some(etcd) = &etcd {
        args.extend(["--etcd-endpoints".into(), etcd.endpoint.clone().into()]);
    }
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let mut controlplane = Managed::spawn(
        "controlplane",
        &harness.proxy_cpu,
        dir,
        &harness.sluice.0,
        &args,
    )?;
    let listening = controlplane.wait_for_addresses(&addresses, Duration::from_secs(30))?;
    let address = crate::process::address(&listening, "controlplane")?;
    let url = format!("https://{address}");
    let ca = data.join("pki/ca.crt");
    let kubeconfig = data.join("admin.kubeconfig");
    let admin_token = dir.join("admin.token");
    std::fs::write(&admin_token, kubeconfig_token(&kubeconfig)?)?;
    let node_token = dir.join("node.token");
    std::fs::write(&node_token, create_token(harness, &kubeconfig)?)?;

    let mut watcher_config = WatchClientConfig::new(url.clone(), ca.clone());
    watcher_config.token_file = Some(node_token);
    // One connection per watcher, as in a fleet of separate processes (h2 would fold them all
    // onto one connection of the shared Transport).
    watcher_config.http2 = false;
    let watch_transport = Arc::new(Transport::new(&watcher_config)?);
    let mut writer_config = WatchClientConfig::new(url, ca);
    writer_config.token_file = Some(admin_token);
    writer_config.http2 = false;
    let write_transport = Arc::new(Transport::new(&writer_config)?);

    let result = runtime.block_on(async {
        let resource_version = list_version(&write_transport).await?;
        // Open every watch (a few handshakes at a time), then wait until all are streaming.
        let connected = Arc::new(AtomicUsize::new(0));
        let watch_errors = Arc::new(AtomicUsize::new(0));
        let tallies: Vec<Arc<Mutex<WatcherTally>>> = (0..watchers)
            .map(|_| Arc::new(Mutex::new(WatcherTally::default())))
            .collect();
        let handshakes = Arc::new(tokio::sync::Semaphore::new(32));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for tally in &tallies {
            tasks.push(tokio::spawn(watch(
                watch_transport.clone(),
                resource_version.clone(),
                handshakes.clone(),
                connected.clone(),
                watch_errors.clone(),
                tally.clone(),
            )));
        }
        while connected.load(Ordering::Relaxed) < watchers {
            if started.elapsed() > Duration::from_secs(120)
                || watch_errors.load(Ordering::Relaxed) > 0
            {
                bail!(
                    "only {} of {watchers} watches opened ({} failed)",
                    connected.load(Ordering::Relaxed),
                    watch_errors.load(Ordering::Relaxed)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let seconds_to_connect = started.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_millis(500)).await;

        let mut watched = vec![("controlplane".to_string(), controlplane.pid())];
        if let Some(etcd) = &etcd {
            watched.push(("etcd".to_string(), etcd.process.pid()));
        }
        let meter = CpuMeter::start(&watched)?;
        let metered = Instant::now();
        let writes = write_steadily(&write_transport, rate, Duration::from_secs(seconds)).await;
        // Every acknowledged write must reach every watcher; give stragglers a while.
        let expected = writes.acked;
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline
            && tallies
                .iter()
                .any(|tally| tally.lock().map_or(true, |t| t.delivered < expected))
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let usage = meter.finish()?;
        let metered = metered.elapsed();
        for task in tasks {
            task.abort();
        }
        anyhow::Ok((
            writes,
            tallies,
            (usage, metered),
            seconds_to_connect,
            watch_errors.load(Ordering::Relaxed),
        ))
    });
    let (writes, tallies, (usage, metered), seconds_to_connect, watch_errors) = result?;
    controlplane.check_alive()?;
    let mut latencies: Vec<u32> = Vec::new();
    let mut delivered = 0;
    for tally in &tallies {
        let tally = tally
            .lock()
            .map_err(|_| anyhow::anyhow!("a watcher panicked"))?;
        delivered += tally.delivered;
        latencies.extend_from_slice(&tally.latencies_us);
    }
    latencies.sort_unstable();
    let mut acks = writes.ack_us.clone();
    acks.sort_unstable();
    let window = writes.elapsed.as_secs_f64();
    let expected = writes.acked * watchers;
    // Over the writes and the wait for their delivery, which is when the meter ran.
    let cpu_percent = |cpu_us: u64| cpu_us as f64 / 1e6 / metered.as_secs_f64() * 100.0;
    Ok(RunRecord {
        case: store.name().to_string(),
        watchers,
        target_writes_per_s: rate,
        seconds: window,
        writes_sent: writes.sent,
        writes_acked: writes.acked,
        write_errors: writes.errors,
        writes_per_s: writes.acked as f64 / window,
        write_ack_p50_ms: percentile_ms(&acks, 0.50),
        write_ack_p99_ms: percentile_ms(&acks, 0.99),
        events_expected: expected,
        events_delivered: delivered,
        events_missing: expected.saturating_sub(delivered),
        watch_errors,
        delivery_p50_ms: percentile_ms(&latencies, 0.50),
        delivery_p99_ms: percentile_ms(&latencies, 0.99),
        delivery_max_ms: latencies.last().map_or(0.0, |us| f64::from(*us) / 1000.0),
        controlplane_cpu_percent: cpu_percent(usage[0].cpu_us),
        controlplane_rss_mib: usage[0].rss_kib as f64 / 1024.0,
        etcd_cpu_percent: usage.get(1).map(|etcd| cpu_percent(etcd.cpu_us)),
        seconds_to_connect_watchers: seconds_to_connect,
    })
}

pub(crate) fn percentile_ms(sorted_us: &[u32], quantile: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let index = ((sorted_us.len() - 1) as f64 * quantile).round() as usize;
    f64::from(sorted_us[index]) / 1000.0
}

pub(crate) fn kubeconfig_token(kubeconfig: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let document: serde_json::Value = serde_json::from_str(&text)?;
    document["users"][0]["user"]["token"]
        .as_str()
        .map(str::to_string)
        .context("no token in the admin kubeconfig")
}

fn create_token(harness: &Harness, kubeconfig: &Path) -> anyhow::Result<String> {
    let output = std::process::Command::new(&harness.sluice.0)
        .args([
            "controlplane",
            "token",
            "create",
            "--role",
            "node",
            "--subject",
            "perf",
        ])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()?;
    if !output.status.success() {
        bail!(
            "token create failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

async fn read_all(answer: &mut hyper::body::Incoming) -> anyhow::Result<Vec<u8>> {
    let mut body = Vec::new();
    while let Some(frame) = answer.frame().await {
        if let Ok(data) = frame?.into_data() {
            body.extend_from_slice(&data);
        }
    }
    Ok(body)
}

/// The resourceVersion of a LIST of Agents: where the watches start.
async fn list_version(transport: &Transport) -> anyhow::Result<String> {
    let mut answer = transport.get(&format!("{AGENTS}?limit=1")).await?;
    let body = read_all(&mut answer.body).await?;
    let list: serde_json::Value = serde_json::from_slice(&body)?;
    list["metadata"]["resourceVersion"]
        .as_str()
        .map(str::to_string)
        .context("no resourceVersion in the list")
}

fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos())
}

/// One watcher: opens the watch from `resource_version` and records every ADDED event's
/// delivery latency until aborted. Any failure is counted; the watch is not resumed (a
/// benchmark run with a broken watch is reported as such, not hidden by a re-list).
async fn watch(
    transport: Arc<Transport>,
    resource_version: String,
    handshakes: Arc<tokio::sync::Semaphore>,
    connected: Arc<AtomicUsize>,
    errors: Arc<AtomicUsize>,
    tally: Arc<Mutex<WatcherTally>>,
) {
    let path = format!("{AGENTS}?watch=1&timeoutSeconds=3600&resourceVersion={resource_version}");
    let answer = {
        let _permit = handshakes.acquire().await;
        transport.get(&path).await
    };
    let mut answer = match answer {
        Ok(answer) => answer,
        Err(error) => {
            eprintln!("watch: {error}");
            errors.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    connected.fetch_add(1, Ordering::Relaxed);
    let mut lines = LineDecoder::new(1 << 20);
    while let Some(frame) = answer.body.frame().await {
        let Ok(frame) = frame else { break };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let received = unix_nanos();
        let Ok(lines) = lines.push(&data) else { break };
        for line in lines {
            match decode_event(&line) {
                Ok(WatchEvent::Upsert {
                    added: true,
                    object,
                    ..
                }) => {
                    let sent = object["metadata"]["annotations"][SENT_ANNOTATION]
                        .as_str()
                        .and_then(|text| text.parse::<u128>().ok());
                    let Ok(mut tally) = tally.lock() else { return };
                    tally.delivered += 1;
                    if let Some(sent) = sent {
                        let micros = received.saturating_sub(sent) / 1000;
                        tally
                            .latencies_us
                            .push(u32::try_from(micros).unwrap_or(u32::MAX));
                    }
                }
                Ok(_) => {}
                Err(error) => {
                    eprintln!("watch event: {error}");
                    errors.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        }
    }
    // The stream ended before the run did.
    errors.fetch_add(1, Ordering::Relaxed);
}

struct Writes {
    sent: usize,
    acked: usize,
    errors: usize,
    ack_us: Vec<u32>,
    elapsed: Duration,
}

/// Creates Agents at `rate` per second for `duration`, open loop; waits for the answers.
async fn write_steadily(transport: &Arc<Transport>, rate: u32, duration: Duration) -> Writes {
    let total = (u64::from(rate) * duration.as_secs()) as usize;
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let outcomes: Arc<Mutex<BTreeMap<usize, Option<u32>>>> = Arc::default();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(total);
    let run = unix_nanos();
    for index in 0..total {
        ticker.tick().await;
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            if let Ok(mut outcomes) = outcomes.lock() {
                outcomes.insert(index, None);
            }
            continue;
        };
        let transport = transport.clone();
        let outcomes = outcomes.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let sent = Instant::now();
            let object = serde_json::json!({
                "apiVersion": "tunnel.sluice.dev/v1alpha1",
                "kind": "Agent",
                "metadata": {
                    "name": format!("perf-{run}-{index}"),
                    "annotations": {SENT_ANNOTATION: unix_nanos().to_string()},
                },
                "spec": {"id": index + 1, "tokenSha256": "0".repeat(64)},
            });
            let body = Bytes::from(object.to_string());
            let outcome = match transport.post_json(AGENTS, body, 1 << 20).await {
                Ok(_) => Some(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX)),
                Err(error) => {
                    eprintln!("write {index}: {error}");
                    None
                }
            };
            if let Ok(mut outcomes) = outcomes.lock() {
                outcomes.insert(index, outcome);
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let elapsed = started.elapsed();
    let outcomes = outcomes.lock().map(|o| o.clone()).unwrap_or_default();
    let ack_us: Vec<u32> = outcomes.values().filter_map(|o| *o).collect();
    Writes {
        sent: total,
        acked: ack_us.len(),
        errors: total - ack_us.len(),
        ack_us,
        elapsed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_sorted_micros() {
        let values: Vec<u32> = (1..=100).map(|ms| ms * 1000).collect();
        assert_eq!(percentile_ms(&values, 0.5), 51.0);
        assert_eq!(percentile_ms(&values, 0.99), 99.0);
        assert_eq!(percentile_ms(&[], 0.99), 0.0);
    }
}
