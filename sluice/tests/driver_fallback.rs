//! The binary falls back to epoll when io_uring is blocked (as Docker's seccomp profile does),
//! says so in its log and metrics, and refuses to start when io_uring was required.

mod common;

use std::time::Duration;

use common::{stop_cleanly, BIN};
use test_support::{block_io_uring_for_command, http_get, SluiceLauncher};

#[test]
fn auto_driver_falls_back_to_legacy_and_reports_it() {
    let mut launcher =
        SluiceLauncher::new(BIN)
            .unwrap()
            .args(["up", "--ephemeral-ports", "--workers", "2"]);
    block_io_uring_for_command(launcher.command_mut()).unwrap();
    let mut process = launcher.spawn().expect("starts on the legacy driver");
    let stderr = process.stderr();
    assert!(
        stderr.contains("io_uring cannot be set up; falling back to the legacy (epoll) driver"),
        "{stderr}"
    );
    assert!(stderr.contains("Function not implemented"), "{stderr}");
    assert!(
        process.stdout().contains("on the legacy driver"),
        "{}",
        process.stdout()
    );
    let metrics = http_get(process.address("admin"), "/metrics").unwrap().body;
    assert!(
        metrics.contains(&format!(
            "sluice_build_info{{version=\"0.1.0\",revision=\"{}\",driver=\"legacy\"}} 1",
            sluice_admin::REVISION
        )),
        "{metrics}"
    );
    stop_cleanly(&mut process);
}

#[test]
fn required_uring_refuses_to_start_when_blocked() {
    let mut launcher =
        SluiceLauncher::new(BIN)
            .unwrap()
            .args(["up", "--ephemeral-ports", "--driver", "uring"]);
    block_io_uring_for_command(launcher.command_mut()).unwrap();
    let mut process = launcher.spawn_unready().unwrap();
    let status = process.wait_exit(Duration::from_secs(10)).expect("exits");
    assert_eq!(status.code(), Some(1));
    assert!(
        process
            .stderr()
            .contains("io_uring is required (driver: uring) but cannot be set up"),
        "{}",
        process.stderr()
    );
}

#[test]
fn forced_legacy_driver_is_used_without_fallback_warning() {
    let mut process = SluiceLauncher::new(BIN)
        .unwrap()
        .args([
            "up",
            "--ephemeral-ports",
            "--driver",
            "legacy",
            "--workers",
            "1",
        ])
        .spawn()
        .unwrap();
    let metrics = http_get(process.address("admin"), "/metrics").unwrap().body;
    assert!(metrics.contains("driver=\"legacy\""), "{metrics}");
    assert!(metrics.contains("sluice_workers 1"), "{metrics}");
    assert!(
        !process.stderr().contains("falling back"),
        "{}",
        process.stderr()
    );
    process.signal(libc::SIGINT);
    assert_eq!(
        process
            .wait_exit(Duration::from_secs(5))
            .and_then(|status| status.code()),
        Some(0)
    );
}
