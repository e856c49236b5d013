//! The runtime serves connections on every worker core, with each driver, over real sockets.

mod common;

use std::time::Duration;

use common::{builder, listener, LineClient, LineService, DRIVERS};
use sluice_runtime::{Phase, Placement};

#[test]
fn every_worker_core_accepts_and_serves_with_each_driver() {
    for driver in DRIVERS {
        let (mut server, lifecycle) = builder(driver, 2, Duration::from_secs(5));
        let id = server
            .bind("echo", &listener("127.0.0.1:0"), Placement::Workers)
            .unwrap();
        let address = server.local_addr(id);
        let stats = server.stats(id);
        server.serve(id, LineService::new(Duration::ZERO));
        assert_eq!(lifecycle.phase(), Phase::Starting);
        let running = server
            .start()
            .unwrap_or_else(|error| panic!("{driver}: {error}"));
        assert_eq!(lifecycle.phase(), Phase::Ready);

        let mut workers_seen = [false; 2];
        // SO_REUSEPORT hashes each connection's 4-tuple onto one of the two sockets; 64 fresh
        // connections all landing on one socket has probability 2^-63.
        for _ in 0..64 {
            let mut client = LineClient::connect(address).unwrap();
            let reply = client.call("ping").unwrap();
            let worker: usize = reply
                .trim()
                .strip_prefix("pong from worker ")
                .and_then(|index| index.parse().ok())
                .unwrap_or_else(|| panic!("{driver}: unexpected reply {reply:?}"));
            workers_seen[worker] = true;
        }
        assert_eq!(
            workers_seen,
            [true, true],
            "{driver}: both workers answered"
        );
        assert!(
            stats.accepted.get(0) > 0 && stats.accepted.get(1) > 0,
            "{driver}: per-core counters {stats:?}"
        );
        assert_eq!(stats.accepted.sum(), 64, "{driver}");
        // The reply is written before the request is counted, so the last count may trail it.
        assert!(
            test_support::wait_until(Duration::from_secs(5), || stats.requests.sum() == 64),
            "{driver}: {stats:?}"
        );
        assert!(
            test_support::wait_until(Duration::from_secs(5), || stats.active.sum() == 0),
            "{driver}: connections closed"
        );

        let report = running.shutdown();
        assert_eq!(report.connections_cut, 0, "{driver}");
        assert_eq!(lifecycle.phase(), Phase::Stopped);
    }
}

#[test]
fn a_panicking_handler_closes_its_connection_and_the_worker_keeps_serving() {
    for driver in DRIVERS {
        let (mut server, _) = builder(driver, 1, Duration::from_secs(5));
        let id = server
            .bind("echo", &listener("127.0.0.1:0"), Placement::Workers)
            .unwrap();
        let address = server.local_addr(id);
        let stats = server.stats(id);
        server.serve(id, LineService::new(Duration::ZERO));
        let running = server.start().unwrap();

        let mut doomed = LineClient::connect(address).unwrap();
        doomed.send("panic").unwrap();
        assert_eq!(
            doomed.receive().unwrap(),
            "",
            "{driver}: panicking connection is closed"
        );
        assert!(
            test_support::wait_until(Duration::from_secs(5), || stats.panics.sum() == 1),
            "{driver}"
        );

        let mut healthy = LineClient::connect(address).unwrap();
        assert_eq!(
            healthy.call("ping").unwrap(),
            "pong from worker 0\n",
            "{driver}"
        );
        drop(healthy);
        running.shutdown();
    }
}

#[test]
fn max_connections_per_worker_holds_further_connections_in_the_backlog() {
    for driver in DRIVERS {
        let (mut server, _) = builder(driver, 1, Duration::from_secs(5));
        let mut config = listener("127.0.0.1:0");
        config.max_connections_per_worker = 2;
        let id = server.bind("echo", &config, Placement::Workers).unwrap();
        let address = server.local_addr(id);
        let stats = server.stats(id);
        server.serve(id, LineService::new(Duration::ZERO));
        let running = server.start().unwrap();

        let mut first = LineClient::connect(address).unwrap();
        let mut second = LineClient::connect(address).unwrap();
        assert!(first.call("ping").is_ok() && second.call("ping").is_ok());
        // The third connection completes its TCP handshake in the kernel backlog but is not
        // accepted (so not served) until one of the first two closes.
        let mut third = LineClient::connect(address).unwrap();
        third.send("ping").unwrap();
        // A check that nothing happens cannot wait for an event: 300 ms is many times what an
        // accept and a reply take on an idle worker, so a served third connection would show.
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(stats.accepted.sum(), 2, "{driver}: third connection waits");
        drop(first);
        assert_eq!(third.receive().unwrap(), "pong from worker 0\n", "{driver}");
        assert_eq!(stats.accepted.sum(), 3, "{driver}");
        drop((second, third));
        running.shutdown();
    }
}

#[test]
fn a_listener_without_a_handler_is_a_start_error() {
    let (mut server, _) = builder(sluice_runtime::Driver::Legacy, 1, Duration::from_secs(1));
    server
        .bind("orphan", &listener("127.0.0.1:0"), Placement::Workers)
        .unwrap();
    let error = server.start().unwrap_err();
    assert_eq!(
        error.to_string(),
        "listener orphan was declared but no handler was attached"
    );
}
