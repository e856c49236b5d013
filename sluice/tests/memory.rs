//! The daemon keeps its heap in small pages: mimalloc's huge-page arenas would make each worker
//! thread's first allocations a 2 MiB resident page (`main.rs`, `keep_memory_in_small_pages`).

use std::time::Duration;

use test_support::SluiceLauncher;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// The `THP_enabled` line of `/proc/PID/status` (kernels since 6.1 print it).
fn transparent_huge_pages(pid: i32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("THP_enabled:"))
        .map(|value| value.trim().to_string())
}

#[test]
fn the_running_daemon_has_transparent_huge_pages_off() {
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let config = launcher
        .write_file(
            "sluice.yaml",
            "runtime: {workers: 2, drain_timeout: 2s}\nlisteners: {admin: {address: '127.0.0.1:0'}}\n",
        )
        .unwrap();
    let mut process = launcher
        .arg("run")
        .arg("--config")
        .arg(&config)
        .spawn()
        .unwrap();
    let Some(enabled) = transparent_huge_pages(process.pid()) else {
        process.signal(libc::SIGTERM);
        eprintln!("SKIP: this kernel's /proc/PID/status has no THP_enabled line");
        return;
    };
    assert_eq!(enabled, "0", "huge pages are still allowed for the daemon");
    // This test runner itself is not affected: the flag is the daemon's own.
    assert_eq!(
        transparent_huge_pages(std::process::id() as i32).as_deref(),
        Some("1")
    );
    process.signal(libc::SIGTERM);
    assert_eq!(
        process
            .wait_exit(Duration::from_secs(5))
            .and_then(|status| status.code()),
        Some(0)
    );
}
