//! The etcd backend against a real `etcd` started with a small `--quota-backend-bytes`: its
//! NOSPACE refusal is the store's typed quota error (507 at the API), not an outage (503), and
//! reads and deletes go on, as with the embedded store's quota.
//!
//! Without an `etcd` binary the test skips with a message, unless `CI` is set.
#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice_store::{EtcdConfig, EtcdStore, QuotaFull, Store, StoreError};
use test_support::{etcd_or_skip, EtcdServer};

/// The backend quota of the test's etcd member: 1 MiB, filled by a few writes.
const QUOTA_BYTES: u64 = 1024 * 1024;

async fn connect(endpoint: &str) -> EtcdStore {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let config = EtcdConfig {
            endpoints: vec![endpoint.to_string()],
            dial_timeout: Duration::from_millis(500),
            request_timeout: Duration::from_secs(5),
            ..EtcdConfig::default()
        };
        match EtcdStore::connect(config).await {
            Ok(store) => return store,
            Err(error) if Instant::now() < deadline => {
                let _ = error;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("etcd did not come up: {error}"),
        }
    }
}

#[tokio::test]
async fn etcds_nospace_is_the_typed_quota_error_and_reads_and_deletes_go_on() {
    if !etcd_or_skip("etcds_nospace_is_the_typed_quota_error_and_reads_and_deletes_go_on") {
        return;
    }
    let etcd = EtcdServer::start_with_quota(QUOTA_BYTES).unwrap();
    let store = connect(&etcd.endpoint()).await;
    let value = || Bytes::from(vec![b'v'; 256 * 1024]);
    let mut written = Vec::new();
    let refused = loop {
        assert!(
            written.len() < 200,
            "200 values of 256 KiB never filled a 1 MiB quota"
        );
        if written.len() >= 4 {
            // etcd compares the quota with its backend's size, which grows when a batch is
            // committed (every 100 ms): on a busy machine 40 quick writes fit in one batch.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let key = format!("/k/{}", written.len());
        match store.create(&key, value()).await {
            Ok(_) => written.push(key),
            Err(error) => break error,
        }
    };
    assert!(
        matches!(
            refused,
            StoreError::QuotaExceeded {
                full: QuotaFull::Etcd
            }
        ),
        "{refused:?}"
    );
    assert_eq!(refused.http_status(), 507);
    assert!(refused.to_string().contains("alarm disarm"), "{refused}");
    assert!(!written.is_empty());
    assert!(store.get(&written[0]).await.unwrap().is_some());
    store.delete(&written[0], None).await.unwrap();
}
