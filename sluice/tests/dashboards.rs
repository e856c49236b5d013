//! The Grafana dashboards of `deploy/grafana/` (issue 18): a real Prometheus (Debian
//! `prometheus`) on loopback scrapes `sluice up --nodes 2` (node with the Redis tracker, agent,
//! gateway), a VM agent and a control plane (over HTTPS), and every query of every panel returns
//! data — no query ends in `or vector(0)`, which answers whatever the metric does. The
//! exceptions are the families in [`NO_SERIES_HERE`], whose series appear only on an event this
//! test cannot cause: their query may come back empty only if a scraped target exports the
//! family.
//!
//! Each board filters every query by its `job` and `instance` variables and takes every range as
//! `$__rate_interval` (checked on the text, and by querying one instance and one that does not
//! exist); every family a query names must be exported by a scraped role.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use test_support::{
    http_get, wait_until, ControlPlane, OvsInstance, SluiceLauncher, SluiceProcess, VmAgentProcess,
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
    /// Scrapes `targets` over HTTP and the control plane at `controlplane` over HTTPS, trusting
    /// `ca_file`.
    fn start(targets: &[String], controlplane: &str, ca_file: &Path) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        let quoted: Vec<String> = targets.iter().map(|target| format!("'{target}'")).collect();
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
                 scrape_configs:\n  - job_name: sluice\n    static_configs: [{{targets: [{}]}}]\n\
                 \x20 - job_name: controlplane\n    scheme: https\n    tls_config: {{ca_file: '{}'}}\n\
                 \x20   static_configs: [{{targets: ['{controlplane}']}}]\n",
                quoted.join(", "),
                ca_file.display()
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

/// `sluice up` with two nodes (so the first runs the Redis tracker) and some traffic through its
/// tunnel and its gateway, so that the latency histograms have observations, plus one call with
/// a token of the wrong audience, so that a refused credential is counted.
fn up_with_traffic() -> SluiceProcess {
    let up = SluiceLauncher::new(BIN)
        .unwrap()
        .args(["up", "--ephemeral-ports", "--workers", "1", "--nodes", "2"])
        .stop_with(libc::SIGINT)
        .spawn()
        .expect("sluice up starts");
    assert!(wait_until(Duration::from_secs(15), || up
        .stdout()
        .contains("Press Ctrl-C to stop.")));
    let stdout = up.stdout();
    let words = tunnel_client_words(&stdout);
    assert!(wait_until(Duration::from_secs(15), || Command::new(
        test_support::python()
    )
    .args(&words)
    .current_dir(test_support::workspace_root())
    .output()
    .is_ok_and(
        |output| String::from_utf8_lossy(&output.stdout).trim() == "hello"
    )));
    let refused = Command::new(test_support::python())
        .args(&words)
        .args(["--audience", "not-the-node"])
        .current_dir(test_support::workspace_root())
        .output()
        .unwrap();
    assert!(!refused.status.success(), "{refused:?}");
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

/// The Python tunnel client's arguments for the banner's tunnel call (the call's node, agent
/// and secret, whichever client the banner prints: the Python script's flags or `sluice
/// call`'s), so the test's client can also send a token of the wrong audience.
fn tunnel_client_words(banner: &str) -> Vec<String> {
    let line = banner
        .lines()
        .find(|line| line.contains("--jwt-secret-file"))
        .unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |flags: &[&str]| {
        let at = words.iter().position(|word| flags.contains(word)).unwrap();
        words[at + 1].to_string()
    };
    vec![
        "scripts/tunnel_client.py".to_string(),
        "--node".to_string(),
        after(&["--node", "--endpoint"]),
        "--agent-id".to_string(),
        after(&["--agent-id", "--agent"]),
        "--jwt-secret-file".to_string(),
        after(&["--jwt-secret-file"]),
        "hello".to_string(),
    ]
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

/// Families whose series appear only on an event this test cannot cause, and the event: a panel
/// of one shows its `noValue` (0) until then. Their query may return nothing, but only while a
/// scraped target exports the family (`# TYPE` line), so a misspelt name or an unscraped role
/// still fails.
const NO_SERIES_HERE: &[(&str, &str)] = &[
    ("sluice_task_panics", "a contained panic"),
    (
        "sluice_ebpf_packets",
        "a bridge port in the VM agent's own namespace (sluice/tests/vm_agent_ebpf.rs has them; \
         this agent's bridge ports live in the OVS namespace, out of Prometheus's reach)",
    ),
];

/// The `/metrics` texts of every scraped target.
fn exported(targets: &[String], controlplane: &str, ca_file: &Path) -> String {
    let mut text = String::new();
    for target in targets {
        let address = target.parse().unwrap();
        text.push_str(&http_get(address, "/metrics").unwrap().body);
    }
    let output = Command::new("curl")
        .args(["--silent", "--max-time", "10", "--cacert"])
        .arg(ca_file)
        .arg(format!("https://{controlplane}/metrics"))
        .output()
        .unwrap();
    let controlplane = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(controlplane.contains("sluice_vm_state"), "{controlplane}");
    text + &controlplane
}

/// Whether an empty answer to `expr` is allowed: it reads a family of [`NO_SERIES_HERE`], and
/// some target exports that family.
fn empty_is_allowed(expr: &str, exported: &str) -> bool {
    NO_SERIES_HERE.iter().any(|(family, _)| {
        expr.contains(&format!("{family}_total"))
            && exported
                .lines()
                .any(|line| line.starts_with(&format!("# TYPE {family} counter")))
    })
}

/// What Grafana puts for `$__rate_interval` with a 15 s scrape interval (4 × 15 s); this test's
/// Prometheus scrapes every second, so the window holds many samples.
const RATE_INTERVAL: &str = "1m";

/// The board's query variable `name`, which must be a multi-value one with an "All" value.
fn variable<'a>(board: &'a Value, path: &Path, name: &str) -> &'a Value {
    let found = board["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|variable| variable["name"] == name)
        .unwrap_or_else(|| panic!("{}: no `{name}` variable", path.display()));
    assert_eq!(found["type"], "query", "{}: {name}", path.display());
    assert_eq!(found["includeAll"], true, "{}: {name}", path.display());
    assert!(found["allValue"].is_string(), "{}: {name}", path.display());
    found
}

/// `expr` as Grafana sends it with every variable at its "All" value (`instance`: `instance`'s).
fn with_variables(expr: &str, job: &str, instance: &str) -> String {
    expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$job", job)
        .replace("$instance", instance)
}

/// The metric names of `expr` (Sluice's and the `process_*` ones) with each one's matchers.
fn selectors(expr: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for (start, _) in expr
        .match_indices("sluice_")
        .chain(expr.match_indices("process_"))
    {
        if expr[..start]
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            continue;
        }
        let name: String = expr[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let rest = &expr[start + name.len()..];
        let matchers = match rest.strip_prefix('{') {
            Some(body) => body[..body.find('}').unwrap()].to_string(),
            None => String::new(),
        };
        found.push((name, matchers));
    }
    found
}

/// What every query must do whatever the data: filter each selector by the board's `job` and
/// `instance` variables, and take every range as `$__rate_interval` (a fixed `[1m]` is empty
/// under a slower scrape and jagged under a faster one).
fn check_query_shape(path: &Path, expr: &str) {
    let shown = path.display();
    assert!(
        !expr.contains("vector("),
        "{expr}: answers without the metric"
    );
    let found = selectors(expr);
    assert!(!found.is_empty(), "{shown}: {expr}: no metric");
    for (name, matchers) in found {
        for wanted in ["job=~\"$job\"", "instance=~\"$instance\""] {
            assert!(
                matchers.split(',').any(|matcher| matcher == wanted),
                "{shown}: {expr}: {name} is not filtered by {wanted}"
            );
        }
    }
    for (at, _) in expr.match_indices('[') {
        assert!(
            expr[at..].starts_with("[$__rate_interval]"),
            "{shown}: {expr}: a range other than [$__rate_interval]"
        );
    }
}

/// Every family a query names must be one a scraped target exports now (`# TYPE` line):
/// a dashboard of names no role exports draws nothing, whatever its queries answer.
fn check_exported_names(path: &Path, expr: &str, exported: &str) {
    for (name, _) in selectors(expr) {
        let family = ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(&name);
        assert!(
            exported
                .lines()
                .any(|line| line.starts_with(&format!("# TYPE {family} "))),
            "{}: {expr}: no scraped role exports {family}",
            path.display()
        );
    }
}

/// The panels issue 35 asks for, found by what they query.
fn check_required_panels(exprs: &[(String, String)]) {
    let on = |board: &str, needle: &str| {
        exprs
            .iter()
            .any(|(file, expr)| file == board && expr.contains(needle))
    };
    assert!(on(
        "sluice-gateway.json",
        "sum by (le, cluster) (rate(sluice_gateway_request_duration_seconds_bucket"
    ));
    assert!(on(
        "sluice-tunnel.json",
        "sum by (le, route) (rate(sluice_tunnel_request_duration_seconds_bucket"
    ));
    for family in [
        "rate(process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "sluice_build_info",
        "sluice_tls_certificate_expiry_timestamp_seconds",
    ] {
        assert!(on("sluice-runtime.json", family), "runtime: {family}");
    }
}

#[test]
fn every_panel_query_returns_data_from_a_real_prometheus() {
    let up = up_with_traffic();
    let ovs = OvsInstance::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let agent = vm_agent(&ovs, dir.path());
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    let targets = [up.address("admin").to_string(), agent.admin.clone()];
    let controlplane = cp.address.to_string();
    let prometheus = Prometheus::start(&targets, &controlplane, &cp.ca_file());
    assert!(
        wait_until(Duration::from_secs(30), || prometheus
            .query("count_over_time(up[1m]) >= 4")
            .len()
            == 3),
        "prometheus did not scrape the three targets: {:?}",
        prometheus.query("up")
    );
    let exported = exported(&targets, &controlplane, &cp.ca_file());
    let boards = test_support::workspace_root().join("deploy/grafana");
    let mut exprs = Vec::new();
    let mut empty = Vec::new();
    for entry in std::fs::read_dir(boards).unwrap() {
        let path = entry.unwrap().path();
        let board: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let job = variable(&board, &path, "job")["allValue"].as_str().unwrap();
        let instance = variable(&board, &path, "instance");
        // The variable's own query lists the instances (`label_values(SELECTOR, instance)`).
        let definition = instance["definition"].as_str().unwrap();
        let selector = definition
            .strip_prefix("label_values(")
            .and_then(|rest| rest.strip_suffix(", instance)"))
            .unwrap_or_else(|| panic!("{}: {definition}", path.display()));
        let listed = prometheus.query(&format!(
            "count by (instance) ({})",
            with_variables(selector, job, "")
        ));
        assert!(
            !listed.is_empty(),
            "{}: {definition}: {listed:?}",
            path.display()
        );
        let all = instance["allValue"].as_str().unwrap();
        for panel in board["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                check_query_shape(&path, expr);
                check_exported_names(&path, expr, &exported);
                let result = prometheus.query(&with_variables(expr, job, all));
                if result.is_empty() && !empty_is_allowed(expr, &exported) {
                    empty.push(format!(
                        "{}: panel {}: {expr}",
                        path.display(),
                        panel["title"]
                    ));
                }
                // One instance chosen: no series of another one gets through.
                let one = with_variables(expr, job, &targets[0]);
                for series in prometheus.query(&one) {
                    let shown = &series["metric"]["instance"];
                    assert!(shown.is_null() || shown == &targets[0], "{one}: {series}");
                }
                assert!(
                    prometheus
                        .query(&with_variables(expr, job, "no-such-instance"))
                        .is_empty(),
                    "{expr}: answers for an instance that does not exist"
                );
                let file = path.file_name().unwrap().to_string_lossy().to_string();
                exprs.push((file, expr.to_string()));
            }
        }
    }
    assert!(empty.is_empty(), "queries without data: {empty:#?}");
    assert!(exprs.len() >= 33, "only {} queries", exprs.len());
    check_required_panels(&exprs);
    check_labelled_latency(&prometheus);
    // Every name must also be one Sluice registers (the fault-only families included).
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

/// The latency panels split as drawn: the gateway's by a configured cluster name, the tunnel's
/// into local and remote calls.
fn check_labelled_latency(prometheus: &Prometheus) {
    let window = RATE_INTERVAL;
    let gateway = prometheus.query(&format!(
        "sum by (cluster) (rate(sluice_gateway_request_duration_seconds_count[{window}]))"
    ));
    assert!(
        gateway.iter().any(|series| series["metric"]["cluster"]
            .as_str()
            .is_some_and(|c| !c.is_empty())),
        "{gateway:?}"
    );
    let tunnel = prometheus.query(
        "sum by (route) (sluice_tunnel_request_duration_seconds_count{route=~\"local|remote\"}) > 0",
    );
    assert!(!tunnel.is_empty(), "no local or remote call counted");
}
