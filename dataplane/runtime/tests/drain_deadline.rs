//! In-flight work gets up to the drain timeout, then it is cut; the report says how much.

mod common;

use std::time::{Duration, Instant};

use common::{builder, listener, LineClient, LineService, DRIVERS};
use sluice_runtime::{Phase, Placement};

#[test]
fn work_longer_than_the_drain_timeout_is_cut_at_the_deadline() {
    for driver in DRIVERS {
        let (mut server, lifecycle) = builder(driver, 2, Duration::from_millis(300));
        let id = server
            .bind("echo", &listener("127.0.0.1:0"), Placement::Workers)
            .unwrap();
        let address = server.local_addr(id);
        let stats = server.stats(id);
        let service = LineService::new(Duration::from_secs(30));
        let slow_started = service.slow_started.clone();
        server.serve(id, service);
        let running = server.start().unwrap();

        let mut client = LineClient::connect(address).unwrap();
        client.send("slow").unwrap();
        assert!(test_support::wait_until(Duration::from_secs(5), || {
            slow_started.load(std::sync::atomic::Ordering::SeqCst) == 1
        }));
        let began = Instant::now();
        let report = running.shutdown();
        assert_eq!(report.connections_cut, 1, "{driver}");
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "{driver}: stopped near the deadline"
        );
        assert_eq!(
            client.receive().unwrap_or_default(),
            "",
            "{driver}: cut connection is closed"
        );
        assert_eq!(lifecycle.phase(), Phase::Stopped);
        assert_eq!(
            stats.active.sum(),
            0,
            "{driver}: active gauge returns to zero"
        );
    }
}

#[test]
fn idle_server_stops_at_once() {
    for driver in DRIVERS {
        let (mut server, _) = builder(driver, 2, Duration::from_secs(30));
        let id = server
            .bind("echo", &listener("127.0.0.1:0"), Placement::Workers)
            .unwrap();
        server.serve(id, LineService::new(Duration::ZERO));
        let running = server.start().unwrap();
        let report = running.shutdown();
        assert_eq!(report.connections_cut, 0);
        assert!(
            report.elapsed < Duration::from_secs(2),
            "{driver}: {:?}",
            report.elapsed
        );
    }
}
