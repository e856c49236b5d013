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

mod common;

use std::backtrace::Backtrace;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use common::{
    client_tls, clusters_dir, connect_client, files, on_client_runtime, one_request,
    start_apiserver, start_gateway, Files,
};
use sluice_gateway_proxy::GatewayEndpoint;
use sluice_runtime::{ConnectionHandler, Driver, HandlerFactory, WorkerContext};
use test_support::heap_profile::charged_to;
use test_support::thread_allocations::HookedAllocator;

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
        // No unwrap: a panic inside the allocator would be undefined behaviour.
        if let Ok(mut traces) = TRACES.lock() {
            traces.push(trace);
        }
        IN_TRACE.with(|flag| flag.set(false));
    }
}

// SAFETY: `note_allocation` allocates only for a trace, with `IN_TRACE` set so that those
// allocations return at once, and it never panics (a poisoned traces lock drops the trace).
#[global_allocator]
static GLOBAL: HookedAllocator = unsafe { HookedAllocator::new(note_allocation) };

/// The gateway's listener, marking the worker thread it is built on as the one counted.
struct Counted(GatewayEndpoint);

impl HandlerFactory for Counted {
    fn create(&self, worker: &WorkerContext) -> Rc<dyn ConnectionHandler> {
        GATEWAY_THREAD.with(|flag| flag.set(true));
        self.0.create(worker)
    }
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
    let tls = client_tls(files);
    on_client_runtime(async {
        let connection = connect_client(gateway, &tls).await;
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
            let (group, site) = charged_to(trace);
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

// --- the test -----------------------------------------------------------------------------

#[test]
fn the_whole_request_path_makes_the_documented_allocations_per_request_on_each_driver() {
    let files = files();
    let apiserver = start_apiserver(&files.server_cert, &files.server_key);
    let clusters = clusters_dir(&files, apiserver);
    for driver in [Driver::IoUring, Driver::Legacy] {
        let (running, gateway) = start_gateway(driver, clusters.path(), 64, Counted);
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
