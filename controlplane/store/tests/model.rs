//! The model-based property cases (`conformance/model.rs`) on the embedded store, with small
//! watch buffers so that watchers lag and resume.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;
mod conformance;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use conformance::model::{lists_match, step, watches_match};
use proptest::prelude::*;
use sluice_store::{EmbeddedConfig, Store};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

#[test]
fn watches_deliver_every_change_once_in_order() {
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new(Config::with_cases(48));
    let lags = AtomicUsize::new(0);
    let cases = (proptest::collection::vec(step(false), 1..40), 1usize..6);
    let outcome = runner.run(&cases, |(steps, watch_buffer)| {
        let config = EmbeddedConfig {
            watch_buffer,
            progress_interval: Duration::from_millis(2),
            ..EmbeddedConfig::default()
        };
        let (store, _dir) = common::open_with(config);
        let store: Arc<dyn Store> = Arc::new(store);
        let lagged = runtime().block_on(watches_match(store, steps));
        lags.fetch_add(lagged, Ordering::Relaxed);
        Ok(())
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
    // The cases must exercise the cut-and-resume path, not only the happy one.
    assert!(
        lags.load(Ordering::Relaxed) > 0,
        "no watch lagged in any case"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn lists_gets_and_watches_survive_compaction(
        steps in proptest::collection::vec(step(true), 1..40),
        page in 0usize..4,
    ) {
        let (store, _dir) = common::open();
        runtime().block_on(lists_match(Arc::new(store), steps, page));
    }
}
