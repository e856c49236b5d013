//! Seed 003's claim, "as the cluster gets larger, e.g. up to 10,000 nodes, the number of TCP
//! connections that each kube-apiserver originally needs to maintain is reduced from a few
//! thousand to dozens", asked of `sluice run` with a `gateway` section in front of
//! `sluice-apiserver-sim` (TLS both ways, the gateway's client certificate upstream, as the
//! gateway scenario starts them).
//!
//! The clients live in this process on its tokio runtime, each a TCP + TLS + HTTP/2 connection
//! of its own (hyper, rustls), all with the same bearer token (one user: the gateway reviews it
//! once and answers from its cache, so the figures are the connections' cost, not
//! authentication's). Phases: (a) a small GET's latency at a fixed rate on a few connections;
//! (b) `clients` idle connections, each after one GET: the gateway's RSS growth per
//! connection; (c) a pod watch on each of them: RSS per watch, and the small GET's latency
//! again; (d) the gateway's TCP connections to the simulator. The watches share the idle
//! clients' connections (as a kubelet's watches share its one connection) because this
//! machine's hard open-file limit (20,000) leaves no room for 20,000 client connections in
//! the harness, nor in the gateway.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde::Serialize;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_rustls::TlsConnector;

use crate::measure::rss_kib;
use crate::scenario::controlplane::percentile_ms;
use crate::scenario::gateway::{cluster_yaml, start_simulator, GET_PATH, HOST};
use crate::scenario::{write_output, Harness};
use crate::sluice::{admin_get, metric_value, random_hex};

/// A watch the simulator serves: pods of namespace `default` (one pod, so each watch starts
/// with one ADDED event: the sign it is open end to end).
const WATCH_PATH: &str = "/api/v1/namespaces/default/pods?watch=true";
/// Connections opened at once (TLS handshakes in flight).
const OPENING: usize = 64;
/// Longest wait for one connection's set-up and first answer.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest body a small GET may answer.
const ANSWER_LIMIT: usize = 64 << 10;

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Plan {
    /// Client connections, each idle after one GET, then each holding a watch.
    pub clients: usize,
    /// Connections carrying the timed small GETs.
    pub probe_connections: usize,
    /// Small GETs a second, all probe connections together.
    pub probe_rate: u32,
    pub probe: Duration,
}

impl Plan {
    pub fn new(smoke: bool) -> Self {
        Self {
            clients: if smoke { 200 } else { 10_000 },
            probe_connections: 4,
            probe_rate: 200,
            probe: Duration::from_secs(if smoke { 2 } else { 15 }),
        }
    }
}

#[derive(Debug, Default, Serialize)]
pub struct GatewayRecord {
    pub plan: Option<Plan>,
    pub baseline_get_p50_ms: f64,
    pub baseline_get_p99_ms: f64,
    pub gateway_rss_start_mib: f64,
    pub idle_connections: usize,
    pub seconds_to_open_idle: f64,
    pub rss_kib_per_idle_connection: f64,
    pub watches_open: usize,
    pub seconds_to_open_watches: f64,
    /// RSS growth per watch opened on an idle client connection.
    pub rss_kib_per_watch: f64,
    pub gateway_rss_end_mib: f64,
    pub watching_get_p50_ms: f64,
    pub watching_get_p99_ms: f64,
    /// Watching p99 over baseline p99.
    pub get_p99_ratio: f64,
    /// The gateway's ESTABLISHED TCP connections to the simulator (client traffic, reviews
    /// and health checks together), with the idle clients open, then with the watches too.
    pub upstream_sockets_idle: usize,
    pub upstream_sockets_watching: usize,
    /// `sluice_gateway_upstream_connections` with the watches open.
    pub upstream_connections_metric: f64,
    pub probe_requests: usize,
    /// Client requests that failed or were not answered 200, and watches that never started.
    pub client_errors: usize,
}

impl GatewayRecord {
    pub fn errors(&self) -> usize {
        let plan = self.plan.map_or(0, |plan| plan.clients);
        self.client_errors
            + plan.saturating_sub(self.idle_connections)
            + plan.saturating_sub(self.watches_open)
    }
}

/// Where clients connect and how.
struct Clients {
    address: SocketAddr,
    tls: TlsConnector,
    token: String,
}

type Sender = SendRequest<Empty<Bytes>>;

impl Clients {
    /// A new TCP + TLS + HTTP/2 connection; its driver runs until the sender is dropped.
    async fn connect(&self) -> anyhow::Result<Sender> {
        let tcp = TcpStream::connect(self.address).await?;
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from(HOST)?;
        let tls = self.tls.connect(name, tcp).await?;
        let (sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }

    async fn send(&self, sender: &mut Sender, path: &str) -> anyhow::Result<Incoming> {
        let request = http::Request::get(path)
            .header(http::header::HOST, HOST)
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", self.token),
            )
            .body(Empty::new())?;
        sender.ready().await?;
        let response = sender.send_request(request).await?;
        ensure!(
            response.status() == http::StatusCode::OK,
            "GET {path}: {}",
            response.status()
        );
        Ok(response.into_body())
    }

    /// The small GET, its body read whole.
    async fn get(&self, sender: &mut Sender) -> anyhow::Result<()> {
        let body = self.send(sender, GET_PATH).await?;
        let body = http_body_util::Limited::new(body, ANSWER_LIMIT)
            .collect()
            .await
            .map_err(|error| anyhow::anyhow!("reading the answer: {error}"))?;
        ensure!(!body.to_bytes().is_empty(), "GET {GET_PATH}: empty answer");
        Ok(())
    }

    /// An idle client: connected, one small GET answered.
    async fn idle(self: Arc<Self>) -> anyhow::Result<Sender> {
        let mut sender = self.connect().await?;
        self.get(&mut sender).await?;
        Ok(sender)
    }

    /// A watch on a client's connection, open and its first event (the pod's ADDED) received.
    async fn watch(self: Arc<Self>, mut sender: Sender) -> anyhow::Result<Incoming> {
        let mut body = self.send(&mut sender, WATCH_PATH).await?;
        loop {
            let frame = body
                .frame()
                .await
                .context("the watch ended before its first event")??;
            if frame.data_ref().is_some_and(|data| !data.is_empty()) {
                return Ok(body);
            }
        }
    }
}

fn tls_connector(ca: &Path) -> anyhow::Result<TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca)? {
        roots.add(cert?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// Runs the `openings` with [`OPENING`] at a time; returns what succeeded and the number that
/// failed (the first few failures printed).
async fn open_many<T, Fut>(openings: impl IntoIterator<Item = Fut>) -> (Vec<T>, usize)
where
    T: Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<T>> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(OPENING));
    let mut tasks = JoinSet::new();
    for opening in openings {
        let permits = permits.clone();
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await?;
            tokio::time::timeout(STEP_TIMEOUT, opening)
                .await
                .context("timed out")?
        });
    }
    let (mut opened, mut failed) = (Vec::new(), 0);
    while let Some(done) = tasks.join_next().await {
        match done.map_err(anyhow::Error::from).and_then(|result| result) {
            Ok(item) => opened.push(item),
            Err(error) => {
                failed += 1;
                if failed <= 5 {
                    eprintln!("scale gateway: a client failed: {error:#}");
                }
            }
        }
    }
    (opened, failed)
}

/// Small GETs at `plan.probe_rate` a second for `plan.probe`, spread round-robin over the
/// probe connections, each started on its tick whatever the others do (open loop); returns
/// the sorted latencies in microseconds and the failures.
async fn probe(clients: &Arc<Clients>, senders: &[Sender], plan: &Plan) -> (Vec<u32>, usize) {
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / plan.probe_rate.max(1));
    let deadline = Instant::now() + plan.probe;
    let mut tasks = JoinSet::new();
    let mut next = 0;
    while Instant::now() < deadline {
        ticks.tick().await;
        let (clients, mut sender) = (clients.clone(), senders[next % senders.len()].clone());
        next += 1;
        tasks.spawn(async move {
            let started = Instant::now();
            tokio::time::timeout(STEP_TIMEOUT, clients.get(&mut sender))
                .await
                .context("timed out")??;
            anyhow::Ok(u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX))
        });
    }
    let (mut latencies, mut failed) = (Vec::new(), 0);
    while let Some(done) = tasks.join_next().await {
        match done.map_err(anyhow::Error::from).and_then(|result| result) {
            Ok(us) => latencies.push(us),
            Err(_) => failed += 1,
        }
    }
    latencies.sort_unstable();
    (latencies, failed)
}

/// The gateway's config: one worker, as the gateway scenario; room for every client
/// connection; idle clients kept for the whole run.
fn gateway_yaml(clusters_dir: &Path, plan: &Plan) -> String {
    format!(
        "# Generated by sluice-perf (scale scenario, gateway part).\n\
         runtime: {{workers: 1, drain_timeout: 1s}}\n\
         logging: {{level: warn}}\n\
         listeners:\n\
         \x20 admin: {{address: '127.0.0.1:0'}}\n\
         \x20 gateway: {{address: '127.0.0.1:0', backlog: 4096, max_connections_per_worker: {max},\n\
         \x20   idle_timeout: 30m}}\n\
         gateway: {{clusters_dir: '{dir}'}}\n",
        max = plan.clients + 1_000,
        dir = clusters_dir.display()
    )
}

/// The gateway scenario's cluster, with a pool sized for the watches: the simulator allows
/// 1,000 streams per connection (kube-apiserver's `--http2-max-streams-per-connection` is
/// of that order), so 10,000 watches need ten connections' worth of streams at least; and one
/// user holds them all here, where real watchers would be many users.
fn cluster(
    tls: &crate::certs::TlsFiles,
    upstream: SocketAddr,
    plan: &Plan,
) -> anyhow::Result<String> {
    let default = "connectionPool: {connectionsPerServer: 1}";
    let yaml = cluster_yaml(tls, upstream);
    ensure!(
        yaml.contains(default),
        "the gateway scenario's cluster has changed its pool"
    );
    let streams = plan.clients + 1_000;
    let pool = format!(
        "connectionPool: {{connectionsPerServer: 1, maxConnectionsPerServer: {}, \
         maxConcurrentStreams: 1000, maxLongRunningPerUser: {streams}}}",
        (streams * 2).div_ceil(1_000).max(2)
    );
    Ok(yaml.replace(default, &pool))
}

fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    Ok(rss_kib(pid)? as f64 / 1024.0)
}

/// RSS after a short settle: the allocator and the kernel's page accounting catch up, and the
/// last client opened has passed its first idle check (a quarter of the default 10 s header
/// timeout after its handshake), whose wake-up lets h2 drop the room its GET's stream grew.
fn settled_rss_kib(pid: u32) -> anyhow::Result<f64> {
    std::thread::sleep(Duration::from_secs(3));
    Ok(rss_kib(pid)? as f64)
}

pub fn run(harness: &Harness, dir: &Path, plan: Plan) -> anyhow::Result<GatewayRecord> {
    super::vms::raise_fd_limit(plan.clients + 4_096)?;
    let tls = crate::certs::generate(dir, &["127.0.0.1", "localhost", HOST])?;
    let token = random_hex(24)?;
    let simulator = start_simulator(harness, dir, &tls, &token)?;
    let clusters_dir = dir.join("clusters");
    std::fs::create_dir_all(&clusters_dir)?;
    write_output(
        &clusters_dir,
        "cluster.yaml",
        &cluster(&tls, simulator.address, &plan)?,
    )?;
    let gateway = harness.sluice.start(
        dir,
        "gateway",
        "run",
        &gateway_yaml(&clusters_dir, &plan),
        &harness.proxy_cpu,
    )?;
    let (pid, admin) = (gateway.process.pid(), gateway.address("admin")?);
    let clients = Arc::new(Clients {
        address: gateway.address("gateway")?,
        tls: tls_connector(&tls.ca)?,
        token,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("perf-clients")
        .enable_all()
        .build()?;
    let mut record = GatewayRecord {
        plan: Some(plan),
        ..GatewayRecord::default()
    };
    let result = runtime.block_on(phases(
        &clients,
        &plan,
        pid,
        admin,
        simulator.address,
        &mut record,
    ));
    let mut gateway_process = gateway.process;
    gateway_process.check_alive()?;
    drop(runtime);
    drop(simulator);
    result?;
    Ok(record)
}

/// Phases (a) to (d); the connections stay open until the end.
async fn phases(
    clients: &Arc<Clients>,
    plan: &Plan,
    pid: u32,
    admin: SocketAddr,
    upstream: SocketAddr,
    record: &mut GatewayRecord,
) -> anyhow::Result<()> {
    let (probes, failed) =
        open_many((0..plan.probe_connections).map(|_| clients.clone().idle())).await;
    ensure!(
        failed == 0,
        "{failed} probe connection(s) failed; see the gateway's log"
    );
    let (baseline, failed) = probe(clients, &probes, plan).await;
    record.client_errors += failed;
    record.baseline_get_p50_ms = percentile_ms(&baseline, 0.50);
    record.baseline_get_p99_ms = percentile_ms(&baseline, 0.99);
    println!(
        "scale gateway: baseline small GET p50 {:.2} ms, p99 {:.2} ms ({} requests)",
        record.baseline_get_p50_ms,
        record.baseline_get_p99_ms,
        baseline.len()
    );

    let before = settled_rss_kib(pid)?;
    record.gateway_rss_start_mib = before / 1024.0;
    let started = Instant::now();
    let (idle, failed) = open_many((0..plan.clients).map(|_| clients.clone().idle())).await;
    record.seconds_to_open_idle = started.elapsed().as_secs_f64();
    record.client_errors += failed;
    record.idle_connections = idle.len();
    let with_idle = settled_rss_kib(pid)?;
    record.rss_kib_per_idle_connection = (with_idle - before) / idle.len().max(1) as f64;
    record.upstream_sockets_idle = upstream_sockets(pid, upstream.port())?;
    println!(
        "scale gateway: {} idle connections in {:.1} s, {:.1} KiB each",
        idle.len(),
        record.seconds_to_open_idle,
        record.rss_kib_per_idle_connection
    );

    let started = Instant::now();
    let openings = idle
        .iter()
        .map(|sender| clients.clone().watch(sender.clone()));
    let (watches, failed) = open_many(openings.collect::<Vec<_>>()).await;
    record.seconds_to_open_watches = started.elapsed().as_secs_f64();
    record.client_errors += failed;
    record.watches_open = watches.len();
    let with_watches = settled_rss_kib(pid)?;
    record.rss_kib_per_watch = (with_watches - with_idle) / watches.len().max(1) as f64;
    println!(
        "scale gateway: {} watches in {:.1} s, {:.1} KiB each",
        watches.len(),
        record.seconds_to_open_watches,
        record.rss_kib_per_watch
    );

    let (watching, failed) = probe(clients, &probes, plan).await;
    record.client_errors += failed;
    record.watching_get_p50_ms = percentile_ms(&watching, 0.50);
    record.watching_get_p99_ms = percentile_ms(&watching, 0.99);
    record.get_p99_ratio = record.watching_get_p99_ms / record.baseline_get_p99_ms.max(1e-3);
    record.probe_requests = baseline.len() + watching.len();
    record.upstream_sockets_watching = upstream_sockets(pid, upstream.port())?;
    let metrics = admin_get(admin, "/metrics")?;
    record.upstream_connections_metric =
        metric_value(&metrics, "sluice_gateway_upstream_connections").unwrap_or(-1.0);
    record.gateway_rss_end_mib = rss_mib(pid)?;
    println!(
        "scale gateway: with the watches open small GET p50 {:.2} ms, p99 {:.2} ms; {} upstream sockets",
        record.watching_get_p50_ms, record.watching_get_p99_ms, record.upstream_sockets_watching
    );
    drop((idle, watches, probes));
    Ok(())
}

/// ESTABLISHED TCP connections process `pid` holds to `port` (its sockets' inodes matched
/// against the kernel's table of its network namespace).
fn upstream_sockets(pid: u32, port: u16) -> anyhow::Result<usize> {
    let mut inodes = HashSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        if let Ok(link) = std::fs::read_link(entry?.path()) {
            if let Some(inode) = socket_inode(&link.to_string_lossy()) {
                inodes.insert(inode);
            }
        }
    }
    let mut count = 0;
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}"))
            .with_context(|| format!("reading /proc/{pid}/net/{table}"))?;
        count += established_to(&text, port, &inodes);
    }
    Ok(count)
}

/// The inode of a descriptor link `socket:[12345]`.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// Rows of a `/proc/net/tcp` table in state ESTABLISHED (01) whose remote port is `port` and
/// whose inode is one of `inodes`.
fn established_to(table: &str, port: u16, inodes: &HashSet<u64>) -> usize {
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(state), Some(inode)) =
                (fields.get(2), fields.get(3), fields.get(9))
            else {
                return false;
            };
            let remote_port = remote
                .rsplit_once(':')
                .and_then(|(_, hex)| u16::from_str_radix(hex, 16).ok());
            *state == "01"
                && remote_port == Some(port)
                && inode.parse().is_ok_and(|inode| inodes.contains(&inode))
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:A1B2 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 111 1 0 20 4 30 10 -1\n\
   1: 0100007F:A1B3 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 222 1 0 20 4 30 10 -1\n\
   2: 0100007F:A1B4 0100007F:1F90 06 00000000:00000000 00:00000000 00000000     0        0 333 1 0 20 4 30 10 -1\n\
   3: 0100007F:A1B5 0100007F:1F91 01 00000000:00000000 00:00000000 00000000     0        0 444 1 0 20 4 30 10 -1\n\
   4: 0100007F:1F90 0100007F:A1B6 01 00000000:00000000 00:00000000 00000000     0        0 555 1 0 20 4 30 10 -1\n\
   5: garbage\n";

    #[test]
    fn counts_only_established_connections_of_the_process_to_the_port() {
        let inodes: HashSet<u64> = [111, 333, 444, 555].into_iter().collect();
        // 111: counted; 222: another process's; 333: TIME_WAIT; 444: another port; 555: the
        // port is local (an accepted connection), not remote.
        assert_eq!(established_to(TABLE, 0x1F90, &inodes), 1);
        let all: HashSet<u64> = [111, 222, 333, 444, 555].into_iter().collect();
        assert_eq!(established_to(TABLE, 0x1F90, &all), 2);
        assert_eq!(established_to("", 0x1F90, &all), 0);
    }

    #[test]
    fn socket_links_name_their_inode() {
        assert_eq!(socket_inode("socket:[4242]"), Some(4242));
        assert_eq!(socket_inode("pipe:[4242]"), None);
        assert_eq!(socket_inode("socket:[x]"), None);
        assert_eq!(socket_inode("/dev/null"), None);
    }

    #[test]
    fn a_record_counts_missing_clients_as_errors() {
        let mut record = GatewayRecord {
            plan: Some(Plan::new(true)),
            idle_connections: 200,
            watches_open: 200,
            ..GatewayRecord::default()
        };
        assert_eq!(record.errors(), 0);
        record.watches_open = 197;
        record.client_errors = 1;
        assert_eq!(record.errors(), 4);
    }
}
