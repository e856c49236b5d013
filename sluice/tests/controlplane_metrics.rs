//! The control plane's `/metrics` as an operator reads it (issue 35, finding 7): the request
//! latency labelled by `verb`, watch events counted as each is sent (a watch that stays open
//! shows its traffic), `sluice_build_info` with the commit, and the `process_*` families.
#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;
use test_support::{wait_until, ControlPlane};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const AGENTS: &str = "/apis/tunnel.sluice.dev/v1alpha1/agents";

fn agent(name: &str, id: usize) -> String {
    json!({"apiVersion": "tunnel.sluice.dev/v1alpha1", "kind": "Agent",
        "metadata": {"name": name},
        "spec": {"id": id, "tokenSha256": "0".repeat(64)}})
    .to_string()
}

/// The value of the sample whose name and labels are exactly `series`.
fn value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

fn metrics(cp: &ControlPlane) -> String {
    let (code, body) = cp.curl("GET", "/metrics", None);
    assert_eq!(code, 200, "{body}");
    body
}

/// A watch of the agents that stays open until the test kills it.
struct OpenWatch(Child);

impl OpenWatch {
    fn start(cp: &ControlPlane) -> Self {
        let child = Command::new("curl")
            .args(["--silent", "--no-buffer", "--cacert"])
            .arg(cp.ca_file())
            .args([
                "--header",
                &format!("Authorization: Bearer {}", cp.admin_token()),
            ])
            .arg(format!("{}{AGENTS}?watch=1", cp.url()))
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        Self(child)
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn watch_events_are_counted_while_the_watch_is_open_and_latency_is_by_verb() {
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    let _watch = OpenWatch::start(&cp);
    let watchers = "sluice_controlplane_watchers{resource=\"agents\"}";
    assert!(
        wait_until(Duration::from_secs(10), || value(&metrics(&cp), watchers)
            == Some(1.0)),
        "the watch never opened:\n{}",
        metrics(&cp)
    );
    for (id, name) in ["agent-1", "agent-2"].into_iter().enumerate() {
        let (code, body) = cp.curl("POST", AGENTS, Some(&agent(name, id + 1)));
        assert_eq!(code, 201, "{body}");
    }
    let (code, body) = cp.curl("DELETE", &format!("{AGENTS}/agent-1"), None);
    assert_eq!(code, 200, "{body}");

    let event = |kind: &str| {
        format!("sluice_controlplane_watch_events_total{{resource=\"agents\",type=\"{kind}\"}}")
    };
    let counted = wait_until(Duration::from_secs(10), || {
        let text = metrics(&cp);
        value(&text, &event("ADDED")) == Some(2.0) && value(&text, &event("DELETED")) == Some(1.0)
    });
    let text = metrics(&cp);
    assert!(counted, "events not counted as sent:\n{text}");
    // Still the one open watch: counted while it runs, not when it ends.
    assert_eq!(value(&text, watchers), Some(1.0), "{text}");
    assert_eq!(value(&text, &event("MODIFIED")), Some(0.0), "{text}");

    let creates = "sluice_controlplane_request_duration_seconds_count{verb=\"create\"}";
    assert!(value(&text, creates) >= Some(2.0), "{text}");
    let deletes = "sluice_controlplane_request_duration_seconds_count{verb=\"delete\"}";
    assert!(value(&text, deletes) >= Some(1.0), "{text}");
    assert!(
        !text.contains("request_duration_seconds_count{reason="),
        "{text}"
    );
}

#[test]
fn the_serving_certificate_expiry_is_exported() {
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    let text = metrics(&cp);
    let series = "sluice_tls_certificate_expiry_timestamp_seconds{listener=\"controlplane\"}";
    let expected = test_support::not_after_by_openssl(&cp.pki_dir().join("server.crt"));
    assert_eq!(value(&text, series), Some(expected), "{text}");
}

#[test]
fn the_control_plane_reports_its_build_and_process() {
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    let text = metrics(&cp);
    let build = format!(
        "sluice_build_info{{version=\"{}\",revision=\"{}\",driver=\"tokio\"}}",
        env!("CARGO_PKG_VERSION"),
        sluice_admin::REVISION
    );
    assert_eq!(value(&text, &build), Some(1.0), "{text}");
    assert_ne!(sluice_admin::REVISION, "unknown");
    // A control plane that just started may not have used one 10 ms tick of CPU yet.
    let cpu = value(&text, "process_cpu_seconds_total");
    assert!(cpu.is_some_and(|seconds| seconds >= 0.0), "{text}");
    for name in [
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
        "process_threads",
    ] {
        assert!(
            value(&text, name).is_some_and(|v| v > 0.0),
            "{name}:\n{text}"
        );
    }
}
