//! Graceful drain on a real SIGTERM: a slow request started before the signal completes, a new
//! connection after it is refused, and /readyz says 503 "draining" throughout. One test in this
//! file because it signals its own process.

mod common;

use std::io::ErrorKind;
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{default_options, start, LineClient, DRIVERS};
use sluice_runtime::{Phase, StopSignals};
use test_support::{http_get, wait_until};

#[test]
fn sigterm_drains_in_flight_work_refuses_new_connections_and_reports_draining() {
    for driver in DRIVERS {
        let signals = StopSignals::install().expect("install signal handlers");
        let harness = start(driver, Duration::from_millis(1500), default_options());
        let ready = http_get(harness.admin, "/readyz").unwrap();
        assert_eq!(
            (ready.status, ready.body.as_str()),
            (200, "ready\n"),
            "{driver}"
        );

        let mut in_flight = LineClient::connect(harness.data).unwrap();
        in_flight.send("slow").unwrap();
        let slow_started = harness.slow_started.clone();
        assert!(
            wait_until(Duration::from_secs(5), || slow_started
                .load(Ordering::SeqCst)
                == 1),
            "{driver}"
        );

        // SAFETY: kill(2) on our own pid; the handler installed above turns it into a message.
        assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGTERM) }, 0);
        assert_eq!(signals.wait(harness.lifecycle.clone()), "SIGTERM");
        let lifecycle = harness.lifecycle.clone();
        let admin = harness.admin;
        let data = harness.data;
        let running = harness.running;
        let shutdown = std::thread::spawn(move || running.shutdown());

        assert!(
            wait_until(Duration::from_secs(5), || lifecycle.phase()
                == Phase::Draining),
            "{driver}"
        );
        let draining = http_get(admin, "/readyz").unwrap();
        assert_eq!(
            (draining.status, draining.body.as_str()),
            (503, "draining\n"),
            "{driver}"
        );
        let refused = wait_until(
            Duration::from_secs(2),
            || matches!(TcpStream::connect(data), Err(error) if error.kind() == ErrorKind::ConnectionRefused),
        );
        assert!(
            refused,
            "{driver}: new connections are refused while draining"
        );
        let health = http_get(admin, "/healthz").unwrap();
        assert_eq!(
            health.status, 200,
            "{driver}: the process is alive while draining"
        );

        assert_eq!(
            in_flight.receive().unwrap(),
            "done\n",
            "{driver}: in-flight request completed"
        );
        let report = shutdown.join().expect("shutdown thread");
        assert_eq!(report.connections_cut, 0, "{driver}");
        assert_eq!(lifecycle.phase(), Phase::Stopped);
        assert!(
            TcpStream::connect(admin).is_err(),
            "{driver}: admin listener closed after the drain"
        );
    }
}
