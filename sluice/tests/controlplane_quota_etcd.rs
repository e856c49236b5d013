//! The control plane on a real etcd started with a 1 MiB `--quota-backend-bytes`: when etcd's
//! space is exceeded, writes are 507 `StorageQuotaExceeded` saying how to recover (as with the
//! embedded store's quota, not a 503 outage), while reads and deletes go on.
//! Objects of 100 KiB: curl takes the body as an argument, at most 128 KiB.
//! Built with the `etcd` feature only (scripts/test.sh enables it).
#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used)]

use serde_json::{json, Value};
use test_support::{etcd_or_skip, ControlPlane, EtcdServer};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const AGENTS: &str = "/apis/tunnel.sluice.dev/v1alpha1/agents";

/// The backend quota of the test's etcd member: 1 MiB, filled by a few 100 KiB objects.
const QUOTA_BYTES: u64 = 1024 * 1024;

fn agent(name: &str, id: usize) -> String {
    json!({"apiVersion": "tunnel.sluice.dev/v1alpha1", "kind": "Agent",
        "metadata": {"name": name, "annotations": {"note": "x".repeat(100 * 1024)}},
        "spec": {"id": id, "tokenSha256": "0".repeat(64)}})
    .to_string()
}

#[test]
fn etcds_space_exceeded_is_507_and_reads_and_deletes_go_on() {
    if !etcd_or_skip("etcds_space_exceeded_is_507_and_reads_and_deletes_go_on") {
        return;
    }
    let etcd = EtcdServer::start_with_quota(QUOTA_BYTES).unwrap();
    let cp = ControlPlane::start(BIN, &["--etcd-endpoints", &etcd.endpoint()]).unwrap();
    let mut created = Vec::new();
    let (code, body) = loop {
        assert!(
            created.len() < 40,
            "40 objects of 100 KiB never filled 1 MiB"
        );
        let name = format!("fill-{}", created.len());
        let (code, body) = cp.curl("POST", AGENTS, Some(&agent(&name, created.len() + 1)));
        if code != 201 {
            break (code, body);
        }
        created.push(name);
    };
    let status: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(code, 507, "{body}");
    assert_eq!(status["reason"], "StorageQuotaExceeded", "{body}");
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|message| message.contains("alarm disarm")),
        "{body}"
    );
    assert!(!created.is_empty());
    let (code, body) = cp.curl("GET", &format!("{AGENTS}/{}", created[0]), None);
    assert_eq!(code, 200, "{body}");
    let (code, body) = cp.curl("GET", AGENTS, None);
    assert_eq!(code, 200, "{body}");
    let (code, body) = cp.curl("DELETE", &format!("{AGENTS}/{}", created[0]), None);
    assert_eq!(code, 200, "{body}");
}
