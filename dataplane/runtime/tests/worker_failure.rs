//! A worker thread that dies must not leave the process half-dead: readiness flips to 503
//! ("failed") and the process stops (`lifecycle.failed` fires, which ends `StopSignals::wait`).

mod common;

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use common::{builder, listener, LineClient, LineService, DRIVERS};
use sluice_runtime::{
    BackgroundTask, ConnectionHandler, HandlerFactory, Phase, Placement, StopSignal, WorkerContext,
};

/// A worker's own task that panics a moment after start-up.
struct PanickingTask;

impl BackgroundTask for PanickingTask {
    fn run(
        &self,
        _worker: &WorkerContext,
        _stop: Arc<StopSignal>,
    ) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(async {
            monoio::time::sleep(Duration::from_millis(50)).await;
            panic!("background task bug");
        })
    }
}

#[test]
fn a_worker_whose_own_task_panics_fails_the_process_instead_of_lingering() {
    for driver in DRIVERS {
        let (mut server, lifecycle) = builder(driver, 2, Duration::from_secs(1));
        let id = server
            .bind("echo", &listener("127.0.0.1:0"), Placement::Workers)
            .unwrap();
        let address = server.local_addr(id);
        server.serve(id, LineService::new(Duration::ZERO));
        server.spawn_background(PanickingTask);
        let running = server.start().unwrap();
        assert!(
            test_support::wait_until(Duration::from_secs(5), || lifecycle.failed.is_fired()),
            "{driver}: the failure must stop the process"
        );
        assert_eq!(
            lifecycle.phase(),
            Phase::Failed,
            "{driver}: /readyz answers 503"
        );
        assert!(
            sluice_runtime::task_panics_of("background") >= 1,
            "{driver}"
        );
        // The other worker still answers while the process drains.
        let mut client = LineClient::connect(address).unwrap();
        assert!(client.call("ping").unwrap().starts_with("pong"), "{driver}");
        drop(client);
        running.shutdown();
        assert_eq!(
            lifecycle.phase(),
            Phase::Failed,
            "{driver}: stays failed after the drain"
        );
    }
}

/// A factory whose handler cannot be built on worker 1: that worker's thread dies outside any
/// task.
struct FailsOnWorkerOne;

impl HandlerFactory for FailsOnWorkerOne {
    fn create(&self, worker: &WorkerContext) -> Rc<dyn ConnectionHandler> {
        assert!(worker.index != 1, "cannot build a handler on worker 1");
        LineService::new(Duration::ZERO).create(worker)
    }
}

#[test]
fn a_worker_thread_that_dies_is_a_failure_not_a_hang() {
    let (mut server, lifecycle) =
        builder(sluice_runtime::Driver::Legacy, 2, Duration::from_secs(1));
    let id = server
        .bind("echo", &listener("127.0.0.1:0"), Placement::Workers)
        .unwrap();
    server.serve(id, FailsOnWorkerOne);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(
            server
                .start()
                .map(|running| running.shutdown())
                .map_err(|e| e.to_string()),
        );
    });
    let started = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("start-up must not hang on a dead worker");
    let error = started.unwrap_err();
    assert!(error.contains("panicked"), "{error}");
    assert_eq!(lifecycle.phase(), Phase::Failed);
}
