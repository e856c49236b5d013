//! The Grafana dashboards of `deploy/grafana/` (issue 18): a real Prometheus (Debian
//! `prometheus`) on loopback scrapes `sluice up` (node, agent, gateway) and a VM agent, and
//! every query of every panel returns data.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use test_support::{
    http_get, wait_until, OvsInstance, SluiceLauncher, SluiceProcess, VmAgentProcess,
};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

struct Prometheus {
    child: Child,
    address: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(targets: &[String]) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        let quoted: Vec<String> = targets.iter().map(|target| format!("'{target}'")).collect();
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
                 scrape_configs:\n  - job_name: sluice\n    static_configs: [{{targets: [{}]}}]\n",
                quoted.join(", ")
            ),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus is installed (Debian prometheus; scripts/test.sh installs it)");
        let prometheus = Prometheus {
            child,
            address: port,
            _dir: dir,
        };
        assert!(
            wait_until(Duration::from_secs(30), || http_get(port, "/-/ready")
                .is_ok_and(|answer| answer.status == 200)),
            "prometheus never became ready"
        );
        prometheus
    }

    /// An instant query's result vector.
    fn query(&self, expr: &str) -> Vec<Value> {
        let output = Command::new("curl")
            .args(["--silent", "--max-time", "10", "--get"])
            .arg(format!("http://{}/api/v1/query", self.address))
            .args(["--data-urlencode", &format!("query={expr}")])
            .output()
            .unwrap();
        let answer: Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
        assert_eq!(answer["status"], "success", "{expr}: {answer}");
        answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

/// `sluice up` with some traffic through its tunnel and its gateway, so that the latency
/// histograms have observations.
fn up_with_traffic() -> SluiceProcess {
    let up = SluiceLauncher::new(BIN)
        .unwrap()
        .args(["up", "--ephemeral-ports", "--workers", "1"])
        .spawn()
        .expect("sluice up starts");
    assert!(wait_until(Duration::from_secs(15), || up
        .stdout()
        .contains("Press Ctrl-C to stop.")));
    let stdout = up.stdout();
    let tunnel = stdout
        .lines()
        .find(|line| line.contains("scripts/tunnel_client.py"))
        .unwrap()
        .to_string();
    let words: Vec<&str> = tunnel.split_whitespace().skip(1).collect();
    assert!(wait_until(Duration::from_secs(15), || Command::new(
        test_support::python()
    )
    .args(&words)
    .current_dir(test_support::workspace_root())
    .output()
    .is_ok_and(
        |output| String::from_utf8_lossy(&output.stdout).trim() == "hello"
    )));
    let kubectl = stdout
        .lines()
        .find(|line| {
            line.trim_start().starts_with("kubectl --kubeconfig") && line.contains("get pods")
        })
        .unwrap()
        .to_string();
    let words: Vec<&str> = kubectl.split_whitespace().collect();
    let listed = Command::new(words[0]).args(&words[1..]).output().unwrap();
    assert!(listed.status.success(), "{listed:?}");
    up
}

fn vm_agent(ovs: &OvsInstance, dir: &Path) -> VmAgentProcess {
    let fixture =
        test_support::workspace_root().join("vm-datapath/policy/tests/fixtures/three-vms.yaml");
    let policies = dir.join("policies.yaml");
    std::fs::copy(fixture, &policies).unwrap();
    let mut command = Command::new(BIN);
    command
        .args(["vm-agent", "--bridge", "brdash", "--admin", "127.0.0.1:0"])
        .arg("--policies")
        .arg(&policies)
        .arg("--ovs-rundir")
        .arg(ovs.rundir());
    VmAgentProcess::spawn(command).unwrap()
}

#[test]
fn every_panel_query_returns_data_from_a_real_prometheus() {
    let up = up_with_traffic();
    let ovs = OvsInstance::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let agent = vm_agent(&ovs, dir.path());
    let prometheus = Prometheus::start(&[up.address("admin").to_string(), agent.admin.clone()]);
    assert!(
        wait_until(Duration::from_secs(30), || prometheus
            .query("count_over_time(up[1m]) >= 4")
            .len()
            == 2),
        "prometheus did not scrape both targets"
    );
    let boards = test_support::workspace_root().join("deploy/grafana");
    let mut checked = 0;
    for entry in std::fs::read_dir(boards).unwrap() {
        let path = entry.unwrap().path();
        let board: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for panel in board["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                let result = prometheus.query(expr);
                assert!(
                    !result.is_empty(),
                    "{}: panel {:?}: {expr} returned no data",
                    path.display(),
                    panel["title"]
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 25, "only {checked} queries");
    // `... or vector(0)` answers even for a misspelt metric, and a role this test does not
    // scrape (the control plane, a Redis tracker) exports some: every name must be registered.
    let sources = test_support::metric_names::registering_sources();
    for entry in std::fs::read_dir(test_support::workspace_root().join("deploy/grafana")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for name in test_support::metric_names::sluice_names(&text) {
            if name == "sluice_" || !name.starts_with("sluice_") || name.ends_with('_') {
                continue;
            }
            assert!(
                test_support::metric_names::is_registered(&sources, &name),
                "the dashboards use {name}, which no Sluice code registers"
            );
        }
    }
    drop(agent);
    drop(up);
}
