//! The control plane on a real etcd started with a 1 MiB `--quota-backend-bytes`: when etcd's
//! space is exceeded, writes are 507 `StorageQuotaExceeded` saying how to recover (as with the
//! embedded store's quota, not a 503 outage), while reads and deletes go on.
//! Objects of 100 KiB: curl takes the body as an argument, at most 128 KiB.
//! Built with the `etcd` feature only (scripts/test.sh enables it).
#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use test_support::{etcd_or_skip, wait_until, ControlPlane};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const AGENTS: &str = "/apis/tunnel.sluice.dev/v1alpha1/agents";

/// An etcd member with a 1 MiB backend quota, killed on drop.
struct SmallEtcd {
    child: Child,
    endpoint: String,
    _dir: tempfile::TempDir,
}

impl Drop for SmallEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn start_small_etcd() -> SmallEtcd {
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = (free_port(), free_port());
    let endpoint = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new("etcd")
        .args(["--name", "small", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--listen-client-urls", &endpoint])
        .args(["--advertise-client-urls", &endpoint])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("small={peer_url}")])
        .args(["--quota-backend-bytes", "1048576"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let health = format!("{endpoint}/health");
    let up = wait_until(Duration::from_secs(20), || {
        Command::new("curl")
            .args(["-sf", "--max-time", "2", &health])
            .output()
            .is_ok_and(|output| String::from_utf8_lossy(&output.stdout).contains("true"))
    });
    assert!(up, "etcd did not become healthy");
    SmallEtcd {
        child,
        endpoint,
        _dir: dir,
    }
}

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
    let etcd = start_small_etcd();
    let cp = ControlPlane::start(BIN, &["--etcd-endpoints", &etcd.endpoint]).unwrap();
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
