//! The alerting rules against the live `/metrics` of every role (issue 35): a node (with its
//! Redis tracker), `sluice up` (node, agent, gateway, embedded control plane) and a VM agent
//! run, a few calls make the families that only appear on first use appear, and every metric
//! and label that an alert expression, an alert annotation or an input series of the promtool
//! test names must be one some role exports. A renamed metric or label fails here even where
//! the promtool test, fed the old names, still passes.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{client_jwt, start_node_on, Secrets, BIN};
use test_support::{
    assert_driver, http_get, on_both_drivers, wait_until, OvsInstance, RedisServer, SluiceLauncher,
    SluiceProcess, VmAgentProcess,
};

/// Label sets of each sample name (`name_total`, `name_bucket`, ...) seen on some role.
type Exported = BTreeMap<String, BTreeSet<BTreeSet<String>>>;

/// Labels Prometheus itself attaches to every scraped series, and the series it makes.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];
const PROMETHEUS_SERIES: &str = "up";

// The data-plane roles' expositions are written by the runtime of each monoio driver: once
// per driver.
on_both_drivers!(every_name_and_label_the_alerts_use_is_exported_by_a_live_role);

fn every_name_and_label_the_alerts_use_is_exported_by_a_live_role(driver: &str) {
    let mut exported = Exported::new();
    let redis = RedisServer::start().unwrap();
    let secrets = Secrets::on(driver);
    let node = node_with_tracker(&secrets, &redis, driver);
    call_through(&node, &secrets);
    let text = scrape(&node);
    assert_operator_basics("node", &text);
    add_exposition(&mut exported, &text);

    let up = up_with_gateway_traffic(driver);
    let text = scrape(&up);
    assert_operator_basics("up", &text);
    // The gateway's latency is selectable per configured cluster.
    assert!(
        text.lines().any(|line| {
            line.starts_with("sluice_gateway_request_duration_seconds_count{cluster=\"")
                && !line.ends_with(" 0")
        }),
        "no gateway latency by cluster:\n{text}"
    );
    add_exposition(&mut exported, &text);
    let controlplane = embedded_controlplane_url(&up.stdout());
    let text = curl(&[&format!("{controlplane}/metrics")]);
    assert_operator_basics("control plane", &text);
    add_exposition(&mut exported, &text);

    let ovs = OvsInstance::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let agent = vm_agent(&ovs, dir.path());
    let url = format!("http://{}/metrics", agent.admin);
    let text = ovs
        .exec_in_netns(&["curl", "--silent", "--max-time", "5", &url])
        .unwrap();
    assert_operator_basics("vm agent", &text);
    add_exposition(&mut exported, &text);

    // Families that carry a label only once something happened (a panic): their labels come
    // from the constant the runtime writes them with.
    let task_panics = BTreeSet::from([sluice_runtime::TASK_PANICS_LABEL.to_string()]);
    let entry = exported
        .entry("sluice_task_panics_total".into())
        .or_default();
    entry.insert(task_panics);

    let problems = check_rules(&exported);
    assert!(problems.is_empty(), "{driver}:\n{}", problems.join("\n"));
    drop(agent);
    drop(up);
    drop(node);
}

/// What an operator's standard dashboards read from every role (issue 35, finding 7): the
/// client_golang `process_*` families with plausible values, and `sluice_build_info` naming the
/// commit.
fn assert_operator_basics(role: &str, text: &str) {
    let value = |name: &str| -> f64 {
        let line = text
            .lines()
            .find(|line| line.split([' ', '{']).next() == Some(name))
            .unwrap_or_else(|| panic!("{role}: no {name} in\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(value("process_cpu_seconds_total") >= 0.0, "{role}");
    assert!(value("process_resident_memory_bytes") > 1e6, "{role}");
    assert!(
        value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"),
        "{role}"
    );
    let (open, max) = (value("process_open_fds"), value("process_max_fds"));
    assert!(
        open >= 3.0 && open < max,
        "{role}: {open} of {max} descriptors"
    );
    assert!(value("process_threads") >= 1.0, "{role}");
    // Started during this test (generous: a minute of slack either way for a loaded machine).
    let start = value("process_start_time_seconds");
    assert!(
        start <= now + 60.0 && start > now - 3600.0,
        "{role}: started {start}, now {now}"
    );
    let revision = sluice_admin::REVISION;
    assert!(!revision.is_empty() && revision != "unknown", "{revision}");
    let build = format!("sluice_build_info{{version=\"0.1.0\",revision=\"{revision}\",");
    assert!(
        text.lines()
            .any(|line| line.starts_with(&build) && line.ends_with(" 1")),
        "{role}: no {build}...}} 1 in\n{text}"
    );
}

fn prometheus_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus")
}

fn yaml(file: &str) -> serde_norway::Value {
    let text = std::fs::read_to_string(prometheus_dir().join(file)).unwrap();
    serde_norway::from_str(&text).unwrap()
}

/// Every name and label the rules and the promtool test use that no live role exports.
fn check_rules(exported: &Exported) -> Vec<String> {
    let mut problems = Vec::new();
    let mut alerts = 0;
    for group in yaml("sluice-alerts.yaml")["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let name = rule["alert"].as_str().unwrap();
            let expr = rule["expr"].as_str().unwrap();
            let mut annotations = String::new();
            for (_, text) in rule["annotations"].as_mapping().unwrap() {
                annotations.push_str(text.as_str().unwrap());
            }
            problems.extend(check_expression(exported, name, expr, &annotations));
            alerts += 1;
        }
    }
    assert!(alerts >= 23, "only {alerts} alerts");
    let mut inputs = 0;
    for test in yaml("sluice-alerts.test.yaml")["tests"]
        .as_sequence()
        .unwrap()
    {
        for input in test["input_series"].as_sequence().unwrap() {
            let series = input["series"].as_str().unwrap();
            problems.extend(check_input_series(exported, series));
            inputs += 1;
        }
    }
    assert!(inputs >= 100, "only {inputs} input series");
    problems
}

/// The series' name must be exported, with exactly the labels the code gives it (beside the
/// target's own): an input that lacks a label the code sets, or has one it does not, would
/// test an alert on series no role produces.
fn check_input_series(exported: &Exported, series: &str) -> Vec<String> {
    let selector = parse_selectors(series);
    let [(name, labels)] = selector.as_slice() else {
        return vec![format!("input series {series}: not one selector")];
    };
    if name == PROMETHEUS_SERIES {
        return Vec::new();
    }
    let labels: BTreeSet<String> = labels
        .iter()
        .filter(|label| !TARGET_LABELS.contains(&label.as_str()))
        .cloned()
        .collect();
    match exported.get(name) {
        None => vec![format!("input series {series}: no role exports {name}")],
        Some(sets) if !sets.contains(&labels) => vec![format!(
            "input series {series}: {name} is exported with the labels {sets:?}, not {labels:?}"
        )],
        Some(_) => Vec::new(),
    }
}

/// Metric names, matcher labels, grouping labels and `$labels.X` of the annotations.
fn check_expression(
    exported: &Exported,
    alert: &str,
    expr: &str,
    annotations: &str,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut known: BTreeSet<String> = TARGET_LABELS
        .iter()
        .map(|label| label.to_string())
        .collect();
    let selectors = parse_selectors(expr);
    assert!(!selectors.is_empty(), "{alert}: no metric in {expr}");
    for (name, labels) in &selectors {
        if name == PROMETHEUS_SERIES {
            continue;
        }
        let Some(sets) = exported.get(name) else {
            problems.push(format!("{alert}: no role exports {name}"));
            continue;
        };
        let own: BTreeSet<String> = sets.iter().flatten().cloned().collect();
        for label in labels {
            if !own.contains(label) && !TARGET_LABELS.contains(&label.as_str()) {
                problems.push(format!(
                    "{alert}: {name} has no label {label} (it has {own:?})"
                ));
            }
        }
        known.extend(own);
    }
    let grouping = grouping_labels(expr);
    let templated = annotations
        .split("$labels.")
        .skip(1)
        .map(|rest| identifier(rest).to_string());
    for label in grouping.into_iter().chain(templated) {
        if !known.contains(&label) {
            problems.push(format!(
                "{alert}: no metric of the expression has the label {label}"
            ));
        }
    }
    problems
}

/// The leading identifier of `text`.
fn identifier(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(text.len());
    &text[..end]
}

/// `text` without its string literals (a regex such as `".*sluice.*"` names no metric).
fn without_strings(text: &str) -> String {
    let mut out = String::new();
    let mut quoted = false;
    let mut escaped = false;
    for c in text.chars() {
        match (quoted, escaped, c) {
            (true, false, '\\') => escaped = true,
            (true, false, '"') => quoted = false,
            (true, _, _) => escaped = false,
            (false, _, '"') => {
                quoted = true;
                out.push_str("\"\"");
            }
            (false, _, _) => out.push(c),
        }
    }
    out
}

/// Each metric selector of a PromQL expression or series: its name and its matchers' labels.
fn parse_selectors(expr: &str) -> Vec<(String, Vec<String>)> {
    let text = without_strings(expr);
    let mut selectors = Vec::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
        let word = identifier(&rest[start..]);
        let after = rest[start + word.len()..].trim_start();
        rest = &rest[start + word.len()..];
        let metric = word.starts_with("sluice_") || word == PROMETHEUS_SERIES;
        if !metric || after.starts_with('(') {
            continue;
        }
        let mut labels = Vec::new();
        if let Some(body) = after.strip_prefix('{') {
            let body = &body[..body.find('}').unwrap()];
            for matcher in body.split(',').map(str::trim).filter(|m| !m.is_empty()) {
                labels.push(identifier(matcher).to_string());
            }
        }
        selectors.push((word.to_string(), labels));
    }
    selectors
}

/// The labels of every `by (...)`, `without (...)`, `on (...)` and `ignoring (...)`.
fn grouping_labels(expr: &str) -> Vec<String> {
    let text = without_strings(expr);
    let mut labels = Vec::new();
    for keyword in ["by", "without", "on", "ignoring"] {
        for (at, _) in text.match_indices(keyword) {
            let before = text[..at].chars().last();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let Some(list) = text[at + keyword.len()..].trim_start().strip_prefix('(') else {
                continue;
            };
            let list = &list[..list.find(')').unwrap()];
            labels.extend(list.split(',').map(|label| label.trim().to_string()));
        }
    }
    labels.retain(|label| !label.is_empty());
    labels
}

/// Adds the sample names and label sets of a Prometheus text exposition; a family declared
/// with no samples yet adds its sample names with no label set.
fn add_exposition(exported: &mut Exported, text: &str) {
    for line in text.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let mut words = declared.split_whitespace();
            let (family, kind) = (words.next().unwrap(), words.next().unwrap_or(""));
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            for suffix in suffixes {
                exported.entry(format!("{family}{suffix}")).or_default();
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let head = &line[..line.rfind(' ').unwrap_or(line.len())];
        let Some((name, labels)) = parse_selectors(head).into_iter().next() else {
            continue;
        };
        exported
            .entry(name)
            .or_default()
            .insert(labels.into_iter().collect());
    }
}

fn scrape(process: &SluiceProcess) -> String {
    http_get(process.address("admin"), "/metrics").unwrap().body
}

fn curl(args: &[&str]) -> String {
    let output = Command::new("curl")
        .args(["--silent", "--insecure", "--max-time", "10"])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A node on `driver` with the Redis agent tracker, so that the tracker's families are there.
fn node_with_tracker(secrets: &Secrets, redis: &RedisServer, driver: &str) -> SluiceProcess {
    let private = format!(
        "  private_jwt: {{secret_file: '{}', issuer: nodes}}\n",
        secrets.jwt_secret.display()
    );
    let redis = format!("redis:\n  url: '{}'\n  key_prefix: alerts\n", redis.url());
    start_node_on(secrets, "1s", 1 << 20, None, driver, &private, &redis, None)
}

/// A call with a refused credential and one for an agent no node holds: the node's call and
/// credential families exist once it has counted one of each.
fn call_through(node: &SluiceProcess, secrets: &Secrets) {
    let url = format!("http://{}/test.Echo/Unary", node.address("external"));
    for token in ["not-a-jwt".to_string(), client_jwt(secrets, 60)] {
        curl(&[
            "--http2-prior-knowledge",
            "--request",
            "POST",
            "--header",
            "content-type: application/grpc",
            "--header",
            "te: trailers",
            "--header",
            &format!("authorization: Bearer {token}"),
            "--header",
            "sluice-agent-id: 7",
            "--data-binary",
            "",
            &url,
        ]);
    }
    // Counted when the call ends, which may be just after curl has its answer.
    let counted = wait_until(Duration::from_secs(10), || {
        let text = scrape(node);
        text.contains("sluice_tunnel_auth_failures_total{")
            && text.contains("sluice_tunnel_requests_total{")
    });
    assert!(
        counted,
        "the node did not count both calls:\n{}",
        scrape(node)
    );
}

/// `sluice up` on `driver` after a `kubectl get pods` through its gateway.
fn up_with_gateway_traffic(driver: &str) -> SluiceProcess {
    let up = SluiceLauncher::new(BIN)
        .unwrap()
        .args([
            "up",
            "--ephemeral-ports",
            "--workers",
            "1",
            "--driver",
            driver,
        ])
        .stop_with(libc::SIGINT)
        .spawn()
        .expect("sluice up starts");
    assert!(wait_until(Duration::from_secs(15), || up
        .stdout()
        .contains("Press Ctrl-C to stop.")));
    assert_driver(&scrape(&up), driver);
    let stdout = up.stdout();
    let kubectl = stdout
        .lines()
        .find(|line| {
            line.trim_start().starts_with("kubectl --kubeconfig") && line.contains("get pods")
        })
        .unwrap();
    let words: Vec<&str> = kubectl.split_whitespace().collect();
    let listed = Command::new(words[0]).args(&words[1..]).output().unwrap();
    assert!(listed.status.success(), "{listed:?}");
    up
}

/// The embedded control plane's URL, from `up`'s banner.
fn embedded_controlplane_url(banner: &str) -> String {
    let (_, rest) = banner.split_once("the control plane at ").unwrap();
    rest[..rest.find(',').unwrap()].to_string()
}

/// A VM agent where its bridge's ports are (the private OVS's namespace), so that its eBPF
/// counters load.
fn vm_agent(ovs: &OvsInstance, dir: &Path) -> VmAgentProcess {
    let policies = dir.join("policies.yaml");
    std::fs::write(&policies, "policies: []\n").unwrap();
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", ovs.netns(), BIN, "vm-agent"])
        .args(["--bridge", "bralert", "--admin", "127.0.0.1:0"])
        .arg("--policies")
        .arg(&policies)
        .arg("--ovs-rundir")
        .arg(ovs.rundir());
    VmAgentProcess::spawn(command).unwrap()
}
