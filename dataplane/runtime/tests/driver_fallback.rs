//! When io_uring cannot be set up (here: blocked by seccomp, as container runtimes do), `auto`
//! falls back to the legacy epoll driver and serves; `uring` refuses to start.

mod common;

use std::time::Duration;

use common::{listener, LineClient, LineService};
use sluice_config::DriverChoice;
use sluice_runtime::{
    select_driver, Driver, Lifecycle, Placement, RuntimeError, RuntimeOptions, ServerBuilder,
};

#[test]
fn auto_falls_back_to_legacy_when_io_uring_is_blocked() {
    // Before the filter, this kernel has io_uring: auto picks it.
    let unfiltered = select_driver(DriverChoice::Auto, 256).unwrap();
    assert_eq!(unfiltered.driver, Driver::IoUring);
    assert_eq!(unfiltered.fallback_reason, None);

    // The filter applies to this thread and the worker threads it starts, not to other tests.
    std::thread::spawn(|| {
        test_support::block_io_uring_in_this_thread().expect("install seccomp filter");

        let selection = select_driver(DriverChoice::Auto, 256).unwrap();
        assert_eq!(selection.driver, Driver::Legacy);
        let reason = selection
            .fallback_reason
            .clone()
            .expect("fallback reason is reported");
        assert!(reason.contains("Function not implemented"), "{reason}");

        let required = select_driver(DriverChoice::Uring, 256).unwrap_err();
        assert!(
            matches!(required, RuntimeError::UringRequired(_)),
            "{required}"
        );
        assert!(required
            .to_string()
            .starts_with("io_uring is required (driver: uring) but cannot be set up"));

        let lifecycle = std::sync::Arc::new(Lifecycle::new());
        let mut server = ServerBuilder::new(
            RuntimeOptions {
                workers: 2,
                driver: selection,
                uring_entries: 256,
                drain_timeout: Duration::from_secs(5),
            },
            lifecycle,
        );
        let id = server
            .bind("echo", &listener("127.0.0.1:0"), Placement::Workers)
            .unwrap();
        let address = server.local_addr(id);
        server.serve(id, LineService::new(Duration::ZERO));
        let running = server
            .start()
            .expect("legacy workers start under the filter");
        let mut client = LineClient::connect(address).unwrap();
        assert!(client
            .call("ping")
            .unwrap()
            .starts_with("pong from worker "));
        drop(client);
        running.shutdown();
    })
    .join()
    .expect("filtered thread");
}
