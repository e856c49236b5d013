//! The daemon keeps its heap in small pages: mimalloc's huge-page arenas would make each worker
//! thread's first allocations a 2 MiB resident page (`main.rs`, `keep_memory_in_small_pages`),
//! from the first allocation on.

mod common;

use common::{assert_driver, run_node, stop_cleanly};
use test_support::{on_both_drivers, prerequisite};

// Each driver's runtime makes its own first allocations (io_uring's rings, epoll's event
// buffers): once per monoio driver.
on_both_drivers!(the_running_daemon_has_transparent_huge_pages_off);

/// The `THP_enabled` line of `/proc/PID/status` (kernels since 6.1 print it).
fn transparent_huge_pages(pid: i32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("THP_enabled:"))
        .map(|value| value.trim().to_string())
}

fn the_running_daemon_has_transparent_huge_pages_off(driver: &str) {
    let mut process = run_node(&format!(
        "runtime: {{workers: 2, drain_timeout: 2s, driver: {driver}}}\n\
         listeners: {{admin: {{address: '127.0.0.1:0'}}}}\n"
    ));
    assert_driver(&process, driver);
    let enabled = transparent_huge_pages(process.pid());
    if !prerequisite(
        "the THP_enabled line of /proc/PID/status (Linux 6.1 or later)",
        enabled.is_some(),
        "CI's machines run a later kernel",
    ) {
        stop_cleanly(&mut process);
        return;
    }
    let enabled = enabled.unwrap_or_default();
    assert_eq!(enabled, "0", "huge pages are still allowed for the daemon");
    // Set before the runtime's first allocation, so not even mimalloc's first arena is huge.
    let rollup = std::fs::read_to_string(format!("/proc/{}/smaps_rollup", process.pid()))
        .expect("smaps_rollup of the daemon");
    let huge = rollup
        .lines()
        .find_map(|line| line.strip_prefix("AnonHugePages:"))
        .map(|value| value.trim().to_string());
    assert_eq!(huge.as_deref(), Some("0 kB"), "{rollup}");
    // This test runner itself is not affected: the flag is the daemon's own.
    assert_eq!(
        transparent_huge_pages(std::process::id() as i32).as_deref(),
        Some("1")
    );
    stop_cleanly(&mut process);
}
