//! A heap profiler for tests: which blocks the marked threads allocated while tracking was on
//! and still hold, each charged to the crate and frame that allocated it. A test installs
//! [`LiveBlocks`] as its global allocator, marks the threads it measures (a server's worker),
//! and reads what quiet connections keep (`dataplane/gateway-proxy/tests/
//! idle_connection_memory.rs`, `dataplane/tunnel/tests/idle_agent_memory.rs`). The attribution
//! also serves the allocation counts of `dataplane/gateway-proxy/tests/request_allocations.rs`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

static TRACKING: AtomicBool = AtomicBool::new(false);
/// Live blocks allocated by marked threads while tracking: address -> (size, where).
static LIVE: Mutex<Option<HashMap<usize, (usize, Backtrace)>>> = Mutex::new(None);

thread_local! {
    static MARKED: Cell<bool> = const { Cell::new(false) };
    /// Set while this thread updates the table (whose own allocations are not measured).
    static IN_TABLE: Cell<bool> = const { Cell::new(false) };
}

/// The system allocator, recording the blocks marked threads allocate while tracking is on.
pub struct LiveBlocks;

/// Marks the calling thread as one whose allocations are tracked.
pub fn mark_this_thread() {
    MARKED.with(|flag| flag.set(true));
}

/// Starts tracking (blocks allocated before are not seen).
pub fn start() {
    TRACKING.store(true, Ordering::Relaxed);
}

/// Stops tracking: the blocks allocated since [`start`] and not freed yet, with their size.
pub fn stop() -> Vec<(usize, Backtrace)> {
    TRACKING.store(false, Ordering::Relaxed);
    let live = LIVE.lock().map(|mut live| live.take()).unwrap_or_default();
    live.unwrap_or_default().into_values().collect()
}

/// What `count` equal things (connections) hold each: bytes in all, and by site (group: frame
/// [block size]) bytes and blocks each, largest first.
pub fn per_thing(blocks: &[(usize, Backtrace)], count: usize) -> (f64, Vec<(String, f64, f64)>) {
    let mut by_site: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for (size, trace) in blocks {
        let (group, site) = charged_to(trace);
        let entry = by_site
            .entry(format!("{group}: {site} [{size} B]"))
            .or_default();
        entry.0 += 1;
        entry.1 += size;
    }
    let each = |value: usize| value as f64 / count.max(1) as f64;
    let total = each(by_site.values().map(|(_, bytes)| bytes).sum());
    let mut sites: Vec<_> = by_site
        .into_iter()
        .map(|(site, (blocks, bytes))| (site, each(bytes), each(blocks)))
        .collect();
    sites.sort_by(|a, b| b.1.total_cmp(&a.1));
    (total, sites)
}

/// Prints what [`per_thing`] found, as `label: N bytes of live heap per THING` and its 16
/// largest sites (shown with `--nocapture`).
pub fn print(label: &str, thing: &str, per_thing: f64, sites: &[(String, f64, f64)]) {
    println!("{label}: {per_thing:.0} bytes of live heap per {thing}");
    for (site, bytes, blocks) in sites.iter().take(16) {
        let site: String = site.chars().take(160).collect();
        println!("  {bytes:7.0} B in {blocks:.2} blocks per {thing}: {site}");
    }
}

/// Runs `update` on the table unless tracking is off, this thread is inside it already, or
/// (`marked_only`) this thread is not marked.
fn with_table(marked_only: bool, update: impl FnOnce(&mut HashMap<usize, (usize, Backtrace)>)) {
    if !TRACKING.load(Ordering::Relaxed) || IN_TABLE.try_with(Cell::get).unwrap_or(true) {
        return;
    }
    if marked_only && !MARKED.try_with(Cell::get).unwrap_or(false) {
        return;
    }
    IN_TABLE.with(|flag| flag.set(true));
    if let Ok(mut live) = LIVE.lock() {
        update(live.get_or_insert_with(HashMap::new));
    }
    IN_TABLE.with(|flag| flag.set(false));
}

fn allocated(pointer: *mut u8, size: usize) {
    with_table(true, |live| {
        live.insert(pointer as usize, (size, Backtrace::force_capture()));
    });
}

fn freed(pointer: *mut u8) {
    // Any thread may free a block a marked thread allocated.
    with_table(false, |live| {
        live.remove(&(pointer as usize));
    });
}

// SAFETY: forwards to the system allocator unchanged; the table is updated with tracking
// turned off for the updating thread, so its own allocations do not recurse.
unsafe impl GlobalAlloc for LiveBlocks {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as our caller's.
        let pointer = unsafe { System.alloc(layout) };
        allocated(pointer, layout.size());
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        freed(pointer);
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(pointer, layout) }
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        freed(pointer);
        // SAFETY: same contract as our caller's.
        let moved = unsafe { System.realloc(pointer, layout, size) };
        allocated(moved, size);
        moved
    }
}

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
pub fn charged_to(trace: &Backtrace) -> (String, String) {
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
    // The tests' own files (their allocators and rigs, this profiler), named relative to
    // their crate or not.
    if file.starts_with("tests/") || file.contains("/tests/") || file.contains("test-support/") {
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
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
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
