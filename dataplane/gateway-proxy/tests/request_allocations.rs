//! Allocations per request on the gateway's whole request path, counted where the gateway
//! runs: the real listener (`GatewayEndpoint` under the data-plane runtime, one worker core),
//! an HTTP/2 client over TLS with a client certificate, and an HTTP/2 apiserver over TLS behind
//! it, all in this process. Every allocation the gateway's worker thread makes while the
//! measured requests run is counted (TLS records, hyper's HTTP/2 server, `serve`, the
//! upstream pool, h2's client towards the apiserver, the response streamed back); the client
//! and the apiserver run on other threads and are not.
//!
//! A second, short pass records where each allocation came from (the first frame of a known
//! crate above the allocator), so the figure in docs/PERFORMANCE.md ("Allocations per request")
//! says how much of it is h2's and hyper's and how much Sluice's own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use rustls_pki_types::ServerName;
use sluice_config::ListenerConfig;
use sluice_gateway_proxy::{Gateway, GatewayEndpoint, GatewayMetrics};
use sluice_grpc::transport::{ClientConnection, H2Settings};
use sluice_runtime::{
    ConnectionHandler, ConnectionLimits, Driver, DriverSelection, HandlerFactory, Lifecycle,
    Placement, RunningServer, RuntimeOptions, ServerBuilder, WorkerContext,
};

/// The figures docs/PERFORMANCE.md prints: allocations the gateway's thread makes per proxied
/// request (a kubectl `get pods` answered 200 with a small JSON body, HTTP/2 both sides, a
/// client-certificate user in one group), and how many of them Sluice's own code makes (the
/// upstream request head h2 takes by value: its header map, 2, and the Impersonate-User and
/// Impersonate-Group values, 2). The rest: h2 6 (the two header blocks it decodes, the
/// request's pseudo-headers it copies), rustls 4 (a record buffer each way on each
/// connection), and the task hyper spawns per HTTP/2 stream, 1.
const DOCUMENTED_PER_REQUEST: f64 = 15.0;
const DOCUMENTED_SLUICE: f64 = 4.0;
/// How far a driver's figures may be from the documented ones, either way: the count is
/// deterministic (15.00-15.01 on both drivers) up to the odd buffer that grows or timer set
/// during the run.
const MARGIN: f64 = 1.0;
/// Requests before counting: connections, caches, counters and buffers made once.
const WARM_UP: usize = 300;
/// Requests counted.
const MEASURED: usize = 1_000;
/// Requests whose allocations are traced back to the crate that made them.
const TRACED: usize = 10;

const CLUSTER: &str = "gw.allocations.test";
const BODY: &[u8] =
    br#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}"#;

// --- the counting allocator ---------------------------------------------------------------

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);
static TRACING: AtomicBool = AtomicBool::new(false);
static TRACES: Mutex<Vec<Backtrace>> = Mutex::new(Vec::new());

thread_local! {
    /// Set on the gateway's worker thread when its handler is built there.
    static GATEWAY_THREAD: Cell<bool> = const { Cell::new(false) };
    /// Set while this thread records a trace (whose own allocations are not the gateway's).
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
}

fn note_allocation() {
    if !COUNTING.load(Ordering::Relaxed) {
        return;
    }
    // `try_with`: an allocation during thread teardown must not panic in the allocator.
    let on_gateway = GATEWAY_THREAD.try_with(Cell::get).unwrap_or(false);
    let in_trace = IN_TRACE.try_with(Cell::get).unwrap_or(true);
    if !on_gateway || in_trace {
        return;
    }
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    if TRACING.load(Ordering::Relaxed) {
        IN_TRACE.with(|flag| flag.set(true));
        let trace = Backtrace::force_capture();
        TRACES.lock().unwrap().push(trace);
        IN_TRACE.with(|flag| flag.set(false));
    }
}

struct CountingAllocator;

// SAFETY: forwards to the system allocator unchanged; only counts calls (const thread-locals
// without destructors, atomics; a trace is taken with counting turned off for its thread).
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(pointer, layout) }
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(pointer, layout, size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// The gateway's listener, marking the worker thread it is built on as the one counted.
struct Counted(GatewayEndpoint);

impl HandlerFactory for Counted {
    fn create(&self, worker: &WorkerContext) -> Rc<dyn ConnectionHandler> {
        GATEWAY_THREAD.with(|flag| flag.set(true));
        self.0.create(worker)
    }
}

// --- the rig ------------------------------------------------------------------------------

/// PEM files: a CA, a serving certificate (the gateway's cluster name, and the loopback
/// address the apiserver is dialled at), a client certificate for `alice` in `dev` and the
/// gateway's own identity towards the apiserver.
struct Files {
    _dir: tempfile::TempDir,
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    gateway_cert: PathBuf,
    gateway_key: PathBuf,
}

fn files() -> Files {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "test CA");
    let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let names = vec![CLUSTER.to_string(), "127.0.0.1".to_string()];
    let mut server = CertificateParams::new(names).unwrap();
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = KeyPair::generate().unwrap();
    let server_cert = server.signed_by(&server_key, &issuer).unwrap();
    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    client.distinguished_name.push(DnType::CommonName, "alice");
    client
        .distinguished_name
        .push(DnType::OrganizationName, "dev");
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate().unwrap();
    let client_cert = client.signed_by(&client_key, &issuer).unwrap();
    let mut gateway = CertificateParams::new(Vec::<String>::new()).unwrap();
    gateway
        .distinguished_name
        .push(DnType::CommonName, "sluice-gateway");
    gateway.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let gateway_key = KeyPair::generate().unwrap();
    let gateway_cert = gateway.signed_by(&gateway_key, &issuer).unwrap();
    Files {
        ca: write("ca.pem", issuer.pem()),
        server_cert: write("server.pem", server_cert.pem()),
        server_key: write("server-key.pem", server_key.serialize_pem()),
        client_cert: write("client.pem", client_cert.pem()),
        client_key: write("client-key.pem", client_key.serialize_pem()),
        gateway_cert: write("gateway.pem", gateway_cert.pem()),
        gateway_key: write("gateway-key.pem", gateway_key.serialize_pem()),
        _dir: dir,
    }
}

/// The cluster directory: one cluster in front of `apiserver`, client certificates verified
/// against the CA, one dispatch policy for everyone with a flow-control schema.
fn clusters_dir(files: &Files, apiserver: SocketAddr) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = (
        files.ca.display(),
        files.server_cert.display(),
        files.server_key.display(),
    );
    let (identity, identity_key) = (files.gateway_cert.display(), files.gateway_key.display());
    let yaml = format!(
        "apiVersion: proxy.sluice.dev/v1alpha1
kind: UpstreamCluster
metadata:
  name: {CLUSTER}
spec:
  servers:
  - endpoint: https://{apiserver}
  clientConfig: {{caFile: {ca}, certFile: {identity}, keyFile: {identity_key}}}
  secureServing: {{certFile: {cert}, keyFile: {key}, clientCAFile: {ca}}}
  flowControl:
    schemas:
    - name: everyone
      maxRequestsInflight: {{max: 100}}
  dispatchPolicies:
  - name: everyone
    flowControlSchemaName: everyone
    rules:
    - verbs: [\"*\"]
      apiGroups: [\"*\"]
      resources: [\"*\"]
"
    );
    std::fs::write(dir.path().join("cluster.yaml"), yaml).unwrap();
    dir
}

/// An HTTP/2 apiserver on its own thread answering every request with [`BODY`].
fn start_apiserver(cert: &Path, key: &Path) -> SocketAddr {
    let config = sluice_grpc::tls::server_config(cert, key, None).unwrap();
    let (bound, address) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            bound.send(listener.local_addr().unwrap()).unwrap();
            while let Ok((stream, _)) = listener.accept().await {
                monoio::spawn(serve_apiserver_connection(stream, config.clone()));
            }
        });
    });
    address.recv().unwrap()
}

async fn serve_apiserver_connection(
    stream: monoio::net::TcpStream,
    config: Arc<rustls::ServerConfig>,
) {
    let io = sluice_grpc::transport::compat(stream).unwrap();
    let Ok(tls) = tokio_rustls::TlsAcceptor::from(config).accept(io).await else {
        return;
    };
    let Ok(mut connection) = h2::server::handshake(tls).await else {
        return;
    };
    while let Some(Ok((_request, mut respond))) = connection.accept().await {
        let response = http::Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(())
            .unwrap();
        if let Ok(mut body) = respond.send_response(response, false) {
            let _ = body.send_data(Bytes::from_static(BODY), true);
        }
    }
}

/// The gateway on one worker core of `driver`, serving `clusters`.
fn start_gateway(driver: Driver, clusters: &Path) -> (RunningServer, SocketAddr) {
    let metrics =
        GatewayMetrics::register(&mut prometheus_client::registry::Registry::default(), 1);
    let gateway = Gateway::load(clusters, metrics).unwrap();
    let options = RuntimeOptions {
        workers: 1,
        driver: DriverSelection {
            driver,
            fallback_reason: None,
        },
        uring_entries: 256,
        drain_timeout: Duration::from_secs(2),
    };
    let mut server = ServerBuilder::new(options, Arc::new(Lifecycle::new()));
    let listener = ListenerConfig {
        address: "127.0.0.1:0".parse().unwrap(),
        backlog: 64,
        max_connections_per_worker: 64,
        limits: ConnectionLimits::default(),
        tls: None,
    };
    let id = server
        .bind("gateway", &listener, Placement::Workers)
        .unwrap();
    let address = server.local_addr(id);
    let endpoint = GatewayEndpoint {
        gateway,
        workers: 1,
    };
    server.serve(id, Counted(endpoint));
    let running = server
        .start()
        .unwrap_or_else(|error| panic!("{driver}: {error}"));
    (running, address)
}

/// One GET through the gateway, as kubectl sends it, its response read to the end.
async fn one_request(connection: &ClientConnection) {
    let mut send = connection.ready().await.unwrap();
    let request = http::Request::get(format!(
        "https://{CLUSTER}/api/v1/namespaces/default/pods?limit=500"
    ))
    // What kubectl sends with a `get pods`.
    .header(
        "accept",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )
    .header(
        "user-agent",
        "kubectl/v1.31.0 (linux/amd64) kubernetes/abcdef0",
    )
    .header("kubectl-command", "kubectl get")
    .header("kubectl-session", "0f4e6e5a-3c2b-4f44-9a7c-5b1d0c1e2f3a")
    .header("accept-encoding", "gzip")
    .body(())
    .unwrap();
    let (response, _) = send.send_request(request, true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200, "{response:?}");
    let mut body = response.into_body();
    let mut length = 0;
    while let Some(chunk) = sluice_grpc::transport::recv_data(&mut body).await {
        length += chunk.unwrap().len();
    }
    assert_eq!(length, BODY.len());
}

/// What one driver's run counted.
struct Counts {
    per_request: f64,
    /// Allocations of the traced requests by the crate that made them.
    by_crate: BTreeMap<String, usize>,
    /// The traced requests' allocations by the frame that made them.
    sites: BTreeMap<String, usize>,
}

/// Warms the gateway up, then counts [`MEASURED`] requests and traces [`TRACED`] more.
fn count_requests(gateway: SocketAddr, files: &Files) -> Counts {
    let client_tls = sluice_grpc::tls::client_config(
        Some(&files.ca),
        Some((&files.client_cert, &files.client_key)),
    )
    .unwrap();
    let name = ServerName::try_from(CLUSTER).unwrap();
    let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .unwrap();
    runtime.block_on(async {
        let settings = H2Settings::default();
        let connection =
            sluice_grpc::transport::connect(gateway, Some((client_tls, name)), &settings)
                .await
                .unwrap();
        for _ in 0..WARM_UP {
            one_request(&connection).await;
        }
        ALLOCATIONS.store(0, Ordering::Relaxed);
        COUNTING.store(true, Ordering::Relaxed);
        for _ in 0..MEASURED {
            one_request(&connection).await;
        }
        COUNTING.store(false, Ordering::Relaxed);
        let per_request = ALLOCATIONS.load(Ordering::Relaxed) as f64 / MEASURED as f64;
        TRACING.store(true, Ordering::Relaxed);
        COUNTING.store(true, Ordering::Relaxed);
        for _ in 0..TRACED {
            one_request(&connection).await;
        }
        COUNTING.store(false, Ordering::Relaxed);
        TRACING.store(false, Ordering::Relaxed);
        let traces = std::mem::take(&mut *TRACES.lock().unwrap());
        let mut by_crate = BTreeMap::new();
        let mut sites = BTreeMap::new();
        for trace in &traces {
            let (group, site) = maker(trace);
            *sites.entry(format!("{group}: {site}")).or_insert(0) += 1;
            *by_crate.entry(group).or_insert(0) += 1;
        }
        Counts {
            per_request,
            by_crate,
            sites,
        }
    })
}

// --- attribution --------------------------------------------------------------------------

/// Crates that allocate on behalf of their caller (collections, buffers, header maps, the
/// allocator itself): the allocation is charged to the first frame above them.
const PASS_THROUGH: &[&str] = &[
    "std",
    "hashbrown",
    "http",
    "bytes",
    "slab",
    "indexmap",
    "smallvec",
    "futures_util",
    "futures_channel",
    "futures_core",
    "event_listener",
    "this test",
];

/// The crate group an allocation is charged to, and the frame: the first frame (innermost
/// first) whose crate does not just pass allocations through. Frames are told apart by their
/// source file, since frames inlined into their caller carry no crate path in their name.
fn maker(trace: &Backtrace) -> (String, String) {
    let text = trace.to_string();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let Some((_, symbol)) = line.trim_start().split_once(": ") else {
            continue;
        };
        let file = lines
            .peek()
            .and_then(|next| next.trim_start().strip_prefix("at "))
            .map(str::to_string);
        let Some(krate) = file.as_deref().and_then(crate_of_file) else {
            continue;
        };
        if PASS_THROUGH.contains(&krate.as_str()) {
            continue;
        }
        let place = file.unwrap_or_default();
        let place = place.rsplit('/').next().unwrap_or("");
        return (group(&krate), format!("{symbol} ({place})"));
    }
    ("unknown".to_string(), String::new())
}

/// The crate a source file belongs to: `std` for the toolchain's library, the registry
/// crate's name (`.../registry/src/<index>/hyper-util-0.1.10/src/...` is `hyper_util`), a
/// patched third-party crate's name (`vendor/h2/src/...` is `h2`), and `sluice` for this
/// repository's own crates (`./src/forward.rs`, `dataplane/gateway/...`).
fn crate_of_file(file: &str) -> Option<String> {
    if file.starts_with("/rustc/") || file.contains("/library/") {
        return Some("std".to_string());
    }
    if file.contains("/tests/request_allocations.rs") {
        return Some("this test".to_string());
    }
    if let Some((_, rest)) = file.split_once("/registry/src/") {
        let package = rest.split('/').nth(1)?;
        let name = match package.rfind('-') {
            Some(dash) => &package[..dash],
            None => package,
        };
        return Some(name.replace('-', "_"));
    }
    if let Some((_, rest)) = file.split_once("vendor/") {
        return rest.split('/').next().map(|name| name.replace('-', "_"));
    }
    // The workspace's own files are named relative to where they were compiled from.
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?.parent()?;
    (!file.starts_with('/') || file.starts_with(workspace.to_str()?)).then(|| "sluice".to_string())
}

fn group(krate: &str) -> String {
    match krate {
        "hyper" | "hyper_util" => "hyper",
        "rustls" | "tokio_rustls" | "ring" => "rustls",
        name if name.starts_with("monoio") => "monoio",
        other => other,
    }
    .to_string()
}

// --- the test -----------------------------------------------------------------------------

#[test]
fn the_whole_request_path_makes_the_documented_allocations_per_request_on_each_driver() {
    let files = files();
    let apiserver = start_apiserver(&files.server_cert, &files.server_key);
    let clusters = clusters_dir(&files, apiserver);
    for driver in [Driver::IoUring, Driver::Legacy] {
        let (running, gateway) = start_gateway(driver, clusters.path());
        let counts = count_requests(gateway, &files);
        running.shutdown();
        let traced: usize = counts.by_crate.values().sum();
        let shares: Vec<String> = counts
            .by_crate
            .iter()
            .map(|(krate, count)| format!("{krate} {:.1}", *count as f64 / TRACED as f64))
            .collect();
        println!(
            "{driver}: {:.2} allocations per request on the gateway's thread; traced {:.1} per request: {}",
            counts.per_request,
            traced as f64 / TRACED as f64,
            shares.join(", ")
        );
        for (site, count) in &counts.sites {
            println!("  {:.1} {site}", *count as f64 / TRACED as f64);
        }
        let sluice = counts.by_crate.get("sluice").copied().unwrap_or(0) as f64 / TRACED as f64;
        assert!(
            (sluice - DOCUMENTED_SLUICE).abs() <= MARGIN,
            "{driver}: Sluice's own code made {sluice:.1} allocations per request, documented {DOCUMENTED_SLUICE} +- {MARGIN}"
        );
        assert!(
            (counts.per_request - DOCUMENTED_PER_REQUEST).abs() <= MARGIN,
            "{driver}: {:.2} allocations per request, documented {DOCUMENTED_PER_REQUEST} +- {MARGIN}",
            counts.per_request
        );
    }
}
