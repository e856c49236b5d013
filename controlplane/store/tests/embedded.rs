//! The conformance cases (see `conformance/mod.rs`) on the embedded store.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;
#[macro_use]
mod conformance;

use std::sync::Arc;
use std::time::Duration;

use sluice_store::{EmbeddedConfig, EmbeddedStore, Store};
use tempfile::TempDir;

/// An embedded store in a temporary directory.
struct Embedded {
    dir: TempDir,
}

#[async_trait::async_trait]
impl conformance::Backend for Embedded {
    async fn open(&self, max_value_bytes: usize) -> Arc<dyn Store> {
        let config = EmbeddedConfig {
            max_value_bytes,
            progress_interval: Duration::from_millis(30),
            ..EmbeddedConfig::default()
        };
        let path = self.dir.path().join("store.redb");
        Arc::new(EmbeddedStore::open_with(path, config).expect("the store opens"))
    }
}

fn embedded(_case: &str) -> Option<Embedded> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    Some(Embedded { dir })
}

conformance_tests!(embedded);
