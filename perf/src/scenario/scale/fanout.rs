//! Issue 36's watch fan-out: thousands of gateways and nodes watching one control plane while
//! it takes writes at a steady rate, on the embedded store and on etcd.
//!
//! Every watcher is a real `sluice-watch-client` `WatchClient` (LIST, then WATCH, its mirror
//! and snapshots) of the resource its role watches: half are gateways (UpstreamClusters,
//! `gateway` token), half nodes (Agents, `node` token). A simulated host's watchers share one
//! `Transport`, so one HTTP/2 connection carries `per_connection` watches. The writer patches a
//! send-time annotation (`SEQ NANOS`) onto a fixed set of objects of each kind, round-robin and
//! open loop, as the admin; a write reaches the watchers of its kind. A watcher's view takes in
//! a write when a snapshot first shows that object at that sequence number or a later one (a
//! consumer of coalesced snapshots sees no more than that): its delivery latency is that
//! instant minus the write's send time. A watcher that ends behind the last write of an object
//! missed events; a relist, reconnect or ERROR event counted by its client is a watcher error.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use serde::Serialize;
use serde_json::json;
use sluice_watch_client::{Resource, Transport, WatchClientConfig};
use tokio::sync::watch;

use crate::measure::CpuMeter;

use super::fanout_plan::Client;
use crate::process::Managed;

use super::fanout_peers::{
    object_name, start_watchers, wait_synced, write_steadily, Watchers, WriteLog,
};
use crate::scenario::controlplane::{kubeconfig_token, percentile_ms, start_etcd};
use crate::scenario::Harness;

/// The annotation each write sets: `SEQ NANOS` (the object's write count, the send time).
pub const SENT_ANNOTATION: &str = "perf.sluice.dev/fanout-sent";

/// The two kinds of watcher, as the roles run them (`sluice/src/daemon/feeds.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Kind {
    Gateway,
    Node,
}

impl Kind {
    pub fn of_host(host: usize) -> Self {
        if host.is_multiple_of(2) {
            Kind::Gateway
        } else {
            Kind::Node
        }
    }

    fn role(self) -> &'static str {
        match self {
            Kind::Gateway => "gateway",
            Kind::Node => "node",
        }
    }

    pub fn resource(self) -> Resource {
        match self {
            Kind::Gateway => Resource::new("proxy.sluice.dev", "v1alpha1", "upstreamclusters"),
            Kind::Node => Resource::new("tunnel.sluice.dev", "v1alpha1", "agents"),
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Store {
    Embedded,
    Etcd,
}

impl Store {
    pub fn name(self) -> &'static str {
        match self {
            Store::Embedded => "embedded",
            Store::Etcd => "etcd",
        }
    }
}

/// Sizes and durations of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub watchers: usize,
    /// Watches sharing one h2 connection (one simulated host).
    pub per_connection: usize,
    pub rates: Vec<u32>,
    pub window: Duration,
    /// Objects of each kind the writes go round.
    pub objects: usize,
    /// The stores run, in order (both unless `SLUICE_PERF_FANOUT` names some).
    pub stores: Vec<Store>,
    /// Which watchers the harness runs.
    pub client: Client,
    /// After the stores, the light watchers once more on the embedded store (smoke runs, so
    /// the watchers behind issue 36's 10,000-watcher figures do not rot unnoticed).
    pub light_too: bool,
}

impl Plan {
    pub fn new(smoke: bool) -> Self {
        if smoke {
            Self {
                watchers: 100,
                per_connection: 4,
                rates: vec![50],
                window: Duration::from_secs(3),
                objects: 10,
                stores: vec![Store::Embedded, Store::Etcd],
                client: Client::Product,
                light_too: true,
            }
        } else {
            Self {
                watchers: 10_000,
                per_connection: 4,
                rates: vec![50, 200],
                window: Duration::from_secs(20),
                objects: 20,
                stores: vec![Store::Embedded, Store::Etcd],
                client: Client::Product,
                light_too: false,
            }
        }
    }

    pub fn hosts(&self) -> usize {
        self.watchers.div_ceil(self.per_connection)
    }

    /// Write `n`'s kind, object and sequence number (1 for an object's first patch): the
    /// writes alternate kinds and go round the objects, so each object's sequence grows by one.
    pub fn write_target(&self, n: u64) -> (Kind, usize, u64) {
        let kind = if n.is_multiple_of(2) {
            Kind::Gateway
        } else {
            Kind::Node
        };
        let per_kind = n / 2;
        let objects = self.objects as u64;
        (kind, (per_kind % objects) as usize, per_kind / objects + 1)
    }

    /// The inverse of [`Plan::write_target`].
    pub fn write_index(&self, kind: Kind, object: usize, seq: u64) -> u64 {
        ((seq - 1) * self.objects as u64 + object as u64) * 2 + kind.index() as u64
    }

    /// The control plane's limits raised for the run (its defaults: 4,096 connections, 10,000
    /// watches, 64 per gateway or node identity, 100 requests in flight per admin): every
    /// watcher of a kind shares one token, and the writer keeps up to 256 writes in flight.
    pub fn controlplane_flags(&self) -> Vec<String> {
        let watches = self.watchers.div_ceil(2) + 64;
        let connections = self.hosts().div_ceil(2) + 64;
        let mut flags = vec![
            "--max-watches".to_string(),
            (self.watchers + 4_000).to_string(),
            "--max-connections".to_string(),
            (2 * connections + 4_096).to_string(),
            "--max-requests-in-flight".to_string(),
            "1000".to_string(),
        ];
        // The admin's writes: the writer's own cap on writes in flight, not the server's
        // per-identity default (100), decides when a slow commit becomes an error.
        flags.extend(["--request-share".to_string(), "admin=256/256".to_string()]);
        for role in ["gateway", "node"] {
            flags.extend([
                "--watch-share".to_string(),
                format!("{role}={watches}/{watches}"),
                "--connection-share".to_string(),
                format!("{role}={connections}/{connections}"),
                "--request-share".to_string(),
                format!("{role}=200/200"),
            ]);
        }
        flags
    }
}

/// One (store, rate) run.
#[derive(Debug, Serialize)]
pub struct FanoutRecord {
    /// Which watchers ran: the product's client or the light ones.
    pub client: Client,
    pub store: Store,
    pub watchers: usize,
    pub connections: usize,
    pub target_writes_per_s: u32,
    pub seconds: f64,
    pub writes_sent: usize,
    pub writes_acked: usize,
    pub write_errors: usize,
    pub writes_per_s: f64,
    pub write_ack_p50_ms: f64,
    pub write_ack_p99_ms: f64,
    /// (write, watcher of its kind) pairs.
    pub events_expected: u64,
    pub events_delivered: u64,
    pub events_missing: u64,
    /// MODIFIED events the watch clients decoded (coalescing happens after them).
    pub events_received: u64,
    /// Relists, reconnects and ERROR events counted by the watch clients.
    pub watcher_errors: u64,
    pub delivery_p50_ms: f64,
    pub delivery_p99_ms: f64,
    pub delivery_max_ms: f64,
    pub controlplane_cpu_percent: f64,
    pub controlplane_cpu_us_per_event: f64,
    pub controlplane_rss_mib: f64,
    pub etcd_cpu_percent: Option<f64>,
    /// The harness (watchers and writer) over the same window, and the CPUs it may use.
    pub client_cpu_percent: f64,
    pub client_cpus: usize,
    pub seconds_to_sync_watchers: f64,
    pub load_average_before: f64,
    pub load_average_after: f64,
    pub controlplane_flags: Vec<String>,
}

impl FanoutRecord {
    pub fn errors(&self) -> u64 {
        self.write_errors as u64 + self.events_missing + self.watcher_errors
    }
}

pub fn run(harness: &Harness, dir: &Path, plan: &Plan) -> anyhow::Result<Vec<FanoutRecord>> {
    super::vms::raise_fd_limit(plan.hosts() * 2 + 4_096)?;
    let client_cpus = crate::affinity::parse_cpus(&harness.client_cpu)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(client_cpus.len().max(2))
        .thread_name("perf-fanout")
        .on_thread_start({
            let cpus = client_cpus.clone();
            move || {
                let _ = crate::affinity::pin_this_thread(&cpus);
            }
        })
        .enable_all()
        .build()?;
    let mut records = Vec::new();
    for &store in &plan.stores {
        let store_dir = dir.join(store.name());
        std::fs::create_dir_all(&store_dir)?;
        let mut runs = run_store(
            harness,
            &runtime,
            &store_dir,
            store,
            plan,
            client_cpus.len(),
        )
        .with_context(|| format!("fan-out on the {} store", store.name()))?;
        records.append(&mut runs);
    }
    if plan.light_too && plan.client != Client::Raw {
        let light = Plan {
            client: Client::Raw,
            stores: vec![Store::Embedded],
            ..plan.clone()
        };
        let store_dir = dir.join("embedded-light");
        std::fs::create_dir_all(&store_dir)?;
        let store = Store::Embedded;
        let mut runs = run_store(
            harness,
            &runtime,
            &store_dir,
            store,
            &light,
            client_cpus.len(),
        )
        .context("fan-out of the light watchers on the embedded store")?;
        records.append(&mut runs);
    }
    Ok(records)
}

fn start_controlplane(
    harness: &Harness,
    dir: &Path,
    plan: &Plan,
    etcd: Option<&str>,
) -> anyhow::Result<(Managed, String)> {
    let addresses = dir.join("controlplane-addresses.json");
    let mut args: Vec<String> = vec![
        "--addresses-file".into(),
        addresses.display().to_string(),
        "controlplane".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--data-dir".into(),
        dir.join("controlplane").display().to_string(),
    ];
    args.extend(plan.controlplane_flags());
    if let Some(endpoint) = etcd {
        args.extend(["--etcd-endpoints".to_string(), endpoint.to_string()]);
    }
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let mut process = Managed::spawn(
        "controlplane",
        &harness.proxy_cpu,
        dir,
        &harness.sluice.0,
        &args,
    )?;
    let listening = process.wait_for_addresses(&addresses, Duration::from_secs(30))?;
    let address = crate::process::address(&listening, "controlplane")?;
    Ok((process, format!("https://{address}")))
}

fn role_token(harness: &Harness, kubeconfig: &Path, role: &str) -> anyhow::Result<String> {
    let output = std::process::Command::new(&harness.sluice.0)
        .args(["controlplane", "token", "create", "--role", role])
        .args(["--subject", &format!("perf-fanout-{role}")])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()?;
    if !output.status.success() {
        bail!(
            "token create --role {role}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// One control plane (and etcd member) per store; the watchers stay open across the rates.
fn run_store(
    harness: &Harness,
    runtime: &tokio::runtime::Runtime,
    dir: &Path,
    store: Store,
    plan: &Plan,
    client_cpus: usize,
) -> anyhow::Result<Vec<FanoutRecord>> {
    let etcd = match store {
        Store::Embedded => None,
        Store::Etcd => Some(start_etcd(dir, &harness.upstream_cpu)?),
    };
    let (mut controlplane, url) = start_controlplane(
        harness,
        dir,
        plan,
        etcd.as_ref().map(|e| e.endpoint.as_str()),
    )?;
    let ca = dir.join("controlplane/pki/ca.crt");
    let kubeconfig = dir.join("controlplane/admin.kubeconfig");
    let mut admin_config = WatchClientConfig::new(url.clone(), ca.clone());
    let admin_token = dir.join("admin.token");
    std::fs::write(&admin_token, kubeconfig_token(&kubeconfig)?)?;
    admin_config.token_file = Some(admin_token);
    let admin = Arc::new(Transport::new(&admin_config)?);
    let mut configs = Vec::new();
    for kind in [Kind::Gateway, Kind::Node] {
        let token = dir.join(format!("{}.token", kind.role()));
        std::fs::write(&token, role_token(harness, &kubeconfig, kind.role())?)?;
        let mut config = WatchClientConfig::new(url.clone(), ca.clone());
        config.token_file = Some(token);
        // Longer than the run: a watch the server ends would count as a reconnect.
        config.watch_timeout = Duration::from_secs(1_800);
        configs.push(config);
    }
    runtime.block_on(create_objects(&admin, plan))?;
    let total: u64 = plan
        .rates
        .iter()
        .map(|rate| u64::from(*rate) * plan.window.as_secs())
        .sum();
    let log = Arc::new(WriteLog {
        sent: (0..total).map(|_| AtomicU64::new(0)).collect(),
    });
    let (stop, stopping) = watch::channel(false);
    let started = Instant::now();
    let watchers = start_watchers(runtime, plan, &configs, &log, &stopping);
    runtime.block_on(wait_synced(&watchers, plan.watchers))?;
    let seconds_to_sync = started.elapsed().as_secs_f64();
    println!(
        "fanout {}: {} watchers on {} connections synced in {seconds_to_sync:.1} s",
        store.name(),
        plan.watchers,
        plan.hosts()
    );
    let mut processes = vec![
        ("controlplane".to_string(), controlplane.pid()),
        ("harness".to_string(), std::process::id()),
    ];
    if let Some(etcd) = &etcd {
        processes.push(("etcd".to_string(), etcd.process.pid()));
    }
    let mut records = Vec::new();
    let mut first = 0u64;
    for &rate in &plan.rates {
        let context = RateRun {
            runtime,
            plan,
            admin: &admin,
            log: &log,
            watchers: &watchers,
            processes: &processes,
        };
        let mut record = context.run(rate, first)?;
        first += u64::from(rate) * plan.window.as_secs();
        record.store = store;
        record.client_cpus = client_cpus;
        record.seconds_to_sync_watchers = seconds_to_sync;
        println!(
            "fanout {} {rate}/s: delivery p50 {:.1} ms p99 {:.1} ms max {:.1} ms, {} missing, {} watcher errors, {} write errors, control plane {:.0} % ({:.2} us/event), client {:.0} %",
            store.name(), record.delivery_p50_ms, record.delivery_p99_ms, record.delivery_max_ms,
            record.events_missing, record.watcher_errors, record.write_errors,
            record.controlplane_cpu_percent, record.controlplane_cpu_us_per_event,
            record.client_cpu_percent
        );
        records.push(record);
    }
    let _ = stop.send(true);
    controlplane.check_alive()?;
    Ok(records)
}

async fn create_objects(admin: &Transport, plan: &Plan) -> anyhow::Result<()> {
    for kind in [Kind::Gateway, Kind::Node] {
        for object in 0..plan.objects {
            let name = object_name(object);
            let metadata = json!({"name": name, "annotations": {SENT_ANNOTATION: "0 0"}});
            let body = match kind {
                Kind::Gateway => json!({"apiVersion": "proxy.sluice.dev/v1alpha1",
                    "kind": "UpstreamCluster", "metadata": metadata,
                    "spec": {"servers": [{"endpoint": format!("https://10.0.0.{}:6443", object + 1)}],
                        "secureServing": {"certFile": "serving.pem", "keyFile": "serving-key.pem"},
                        "clientConfig": {"certFile": "gateway.pem", "keyFile": "gateway-key.pem"}}}),
                Kind::Node => json!({"apiVersion": "tunnel.sluice.dev/v1alpha1",
                    "kind": "Agent", "metadata": metadata,
                    "spec": {"id": object + 1, "tokenSha256": "0".repeat(64)}}),
            };
            let (path, body) = (kind.resource().path(), Bytes::from(body.to_string()));
            // A control plane that has just started on etcd may still refuse a connection.
            super::fleet::retrying(|| admin.post_json(&path, body.clone(), 1 << 20))
                .await
                .with_context(|| format!("creating {} {name}", kind.role()))?;
        }
    }
    Ok(())
}

/// What one rate's run needs.
struct RateRun<'a> {
    runtime: &'a tokio::runtime::Runtime,
    plan: &'a Plan,
    admin: &'a Arc<Transport>,
    log: &'a Arc<WriteLog>,
    watchers: &'a Arc<Watchers>,
    processes: &'a [(String, u32)],
}

impl RateRun<'_> {
    /// Writes at `rate` for the plan's window from write index `first`, waits for every
    /// delivery (at most a minute), and records what the watchers saw and what it cost.
    fn run(&self, rate: u32, first: u64) -> anyhow::Result<FanoutRecord> {
        let load_before = load_average();
        let delivered_before = self.watchers.delivered();
        let received_before = self.watchers.received();
        let errors_before = self.watchers.errors();
        let meter = CpuMeter::start(self.processes)?;
        let metered = Instant::now();
        let writes = self.runtime.block_on(write_steadily(
            self.admin.clone(),
            self.plan.clone(),
            self.log.clone(),
            rate,
            first,
        ));
        let per_kind = self.watchers_per_kind();
        let expected: u64 = (first..first + writes.sent as u64)
            .filter(|n| self.log.sent[*n as usize].load(Ordering::Relaxed) != 0)
            .map(|n| per_kind[self.plan.write_target(n).0.index()])
            .sum();
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.watchers.delivered() - delivered_before < expected && Instant::now() < deadline {
            // The timer is made inside the runtime: `sleep` needs one when it is created.
            self.runtime
                .block_on(async { tokio::time::sleep(Duration::from_millis(50)).await });
        }
        let usage = meter.finish()?;
        let metered = metered.elapsed().as_secs_f64();
        let delivered = self.watchers.delivered() - delivered_before;
        let received = self.watchers.received() - received_before;
        let latencies = self.watchers.drain_latencies();
        let mut acks = writes.ack_us.clone();
        acks.sort_unstable();
        let window = writes.elapsed.as_secs_f64();
        let percent = |cpu_us: u64| cpu_us as f64 / 1e6 / metered * 100.0;
        Ok(FanoutRecord {
            client: self.plan.client,
            store: Store::Embedded,
            watchers: self.plan.watchers,
            connections: self.plan.hosts(),
            target_writes_per_s: rate,
            seconds: window,
            writes_sent: writes.sent,
            writes_acked: writes.ack_us.len(),
            write_errors: writes.sent - writes.ack_us.len(),
            writes_per_s: writes.ack_us.len() as f64 / window,
            write_ack_p50_ms: percentile_ms(&acks, 0.50),
            write_ack_p99_ms: percentile_ms(&acks, 0.99),
            events_expected: expected,
            events_delivered: delivered,
            events_missing: expected.saturating_sub(delivered),
            events_received: received,
            watcher_errors: self.watchers.errors() - errors_before,
            delivery_p50_ms: percentile_ms(&latencies, 0.50),
            delivery_p99_ms: percentile_ms(&latencies, 0.99),
            delivery_max_ms: latencies.last().map_or(0.0, |us| f64::from(*us) / 1000.0),
            controlplane_cpu_percent: percent(usage[0].cpu_us),
            controlplane_cpu_us_per_event: usage[0].cpu_us as f64 / delivered.max(1) as f64,
            controlplane_rss_mib: usage[0].rss_kib as f64 / 1024.0,
            etcd_cpu_percent: usage.get(2).map(|etcd| percent(etcd.cpu_us)),
            client_cpu_percent: percent(usage[1].cpu_us),
            client_cpus: 0,
            seconds_to_sync_watchers: 0.0,
            load_average_before: load_before,
            load_average_after: load_average(),
            controlplane_flags: self.plan.controlplane_flags(),
        })
    }

    fn watchers_per_kind(&self) -> [u64; 2] {
        let mut counts = [0u64; 2];
        for tally in &self.watchers.tallies {
            if let Ok(tally) = tally.lock() {
                counts[tally.kind.index()] += 1;
            }
        }
        counts
    }
}

/// The one-minute load average (0 when unreadable).
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// The part's section of summary.md.
pub fn markdown(harness: &Harness, plan: &Plan, records: &[FanoutRecord]) -> String {
    let mut text = format!(
        "\n## Watch fan-out\n\n\
         {watchers} watchers ({client_kind}: half gateways watching UpstreamClusters, half \
         nodes watching Agents, {per} watches per HTTP/2 connection, {hosts} connections) in the \
         harness on CPU {client}; `sluice controlplane` on CPU {proxy} with `{flags}`; etcd on CPU \
         {upstream}. Open-loop patches for {window:?} per rate, alternating kinds, round {objects} \
         objects of each; a write reaches the watchers of its kind. Delivery: a watcher first seeing \
         the write (its snapshot; a light watcher's event line), minus its send time.\n\n\
         | store | target writes/s | writes/s acked | write ack p50 / p99 ms | delivery p50 / p99 / max ms | events delivered | missing | watcher errors | write errors | control plane CPU % | us per event | RSS MiB | etcd CPU % | client CPU % | load avg before / after |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        watchers = plan.watchers,
        client_kind = plan.client.describe(),
        per = plan.per_connection,
        hosts = plan.hosts(),
        client = harness.client_cpu,
        proxy = harness.proxy_cpu,
        flags = plan.controlplane_flags().join(" "),
        upstream = harness.upstream_cpu,
        window = plan.window,
        objects = plan.objects,
    );
    for r in records {
        text.push_str(&format!(
            "| {}{} | {} | {:.1} | {:.1} / {:.1} | {:.1} / {:.1} / {:.1} | {} | {} | {} | {} | {:.0} | {:.2} | {:.0} | {} | {:.0} of {} CPU(s) | {:.1} / {:.1} |\n",
            r.store.name(),
            if r.client == plan.client { "" } else { " (light watchers)" },
            r.target_writes_per_s,
            r.writes_per_s,
            r.write_ack_p50_ms,
            r.write_ack_p99_ms,
            r.delivery_p50_ms,
            r.delivery_p99_ms,
            r.delivery_max_ms,
            r.events_delivered,
            r.events_missing,
            r.watcher_errors,
            r.write_errors,
            r.controlplane_cpu_percent,
            r.controlplane_cpu_us_per_event,
            r.controlplane_rss_mib,
            r.etcd_cpu_percent
                .map_or_else(|| "-".to_string(), |cpu| format!("{cpu:.0}")),
            r.client_cpu_percent,
            r.client_cpus,
            r.load_average_before,
            r.load_average_after,
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan {
            objects: 3,
            ..Plan::new(true)
        }
    }

    #[test]
    fn writes_alternate_kinds_and_go_round_the_objects() {
        let plan = plan();
        let targets: Vec<_> = (0..8).map(|n| plan.write_target(n)).collect();
        assert_eq!(targets[0], (Kind::Gateway, 0, 1));
        assert_eq!(targets[1], (Kind::Node, 0, 1));
        assert_eq!(targets[2], (Kind::Gateway, 1, 1));
        assert_eq!(targets[6], (Kind::Gateway, 0, 2));
        for n in 0..100 {
            let (kind, object, seq) = plan.write_target(n);
            assert_eq!(plan.write_index(kind, object, seq), n);
        }
    }

    #[test]
    fn the_limits_hold_every_watcher_and_connection_of_a_kind() {
        let plan = Plan::new(false);
        assert_eq!(plan.hosts(), 2_500);
        let flags = plan.controlplane_flags().join(" ");
        assert!(flags.contains("--max-watches 14000"), "{flags}");
        assert!(flags.contains("--watch-share gateway=5064/5064"), "{flags}");
        assert!(
            flags.contains("--connection-share node=1314/1314"),
            "{flags}"
        );
        assert!(flags.contains("--max-connections 6724"), "{flags}");
        assert!(flags.contains("--request-share admin=256/256"), "{flags}");
    }
}
