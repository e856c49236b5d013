//! The Kubernetes manifests of `deploy/kubernetes/` (issues 18 and 35) checked offline, since
//! there is no apiserver here for `kubectl apply --dry-run`:
//! - against the API's types: `test-support/python/validate_manifests.py` validates every object
//!   with the official Python client's models (generated from the apiserver's OpenAPI: unknown
//!   fields, missing required fields and wrong types are errors);
//! - against each other and what ships: every image is the one `scripts/build-image.sh` builds,
//!   every port a probe, Service or PodMonitor names is a port of the pods it selects, every
//!   config file a container's args name is a key of a ConfigMap mounted there, and every such
//!   config passes the real `sluice check-config`;
//! - against the drain: a pod's grace period outlasts its preStop sleep and its drain.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

fn validate(args: &[&str], files: &[PathBuf]) -> Output {
    Command::new(test_support::python())
        .arg(test_support::python_script("validate_manifests.py"))
        .args(args)
        .args(files)
        .output()
        .expect("the test venv's python (scripts/test.sh creates it)")
}

fn manifests() -> Vec<PathBuf> {
    let dir = test_support::workspace_root().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    files
}

/// Every object of every manifest, as parsed by the validator's YAML loader.
fn objects() -> Vec<Value> {
    let output = validate(&["--dump"], &manifests());
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice::<Value>(&output.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// A workload's pod template: its name, labels and spec.
struct Pod<'a> {
    name: String,
    labels: &'a Value,
    spec: &'a Value,
}

fn pods(objects: &[Value]) -> Vec<Pod<'_>> {
    objects
        .iter()
        .filter(|object| {
            matches!(
                object["kind"].as_str(),
                Some("Deployment" | "DaemonSet" | "StatefulSet")
            )
        })
        .map(|object| Pod {
            name: object["metadata"]["name"].as_str().unwrap().to_string(),
            labels: &object["spec"]["template"]["metadata"]["labels"],
            spec: &object["spec"]["template"]["spec"],
        })
        .collect()
}

fn containers<'a>(pod: &Pod<'a>) -> &'a [Value] {
    pod.spec["containers"].as_array().unwrap()
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn port_names(pod: &Pod) -> Vec<String> {
    containers(pod)
        .iter()
        .flat_map(|container| container["ports"].as_array().cloned().unwrap_or_default())
        .map(|port| port["name"].as_str().unwrap().to_string())
        .collect()
}

/// The pods whose labels include every label of `selector`; panics when none does.
fn selected<'a, 'b>(pods: &'b [Pod<'a>], selector: &Value, who: &str) -> Vec<&'b Pod<'a>> {
    let selector = selector.as_object().unwrap();
    let chosen: Vec<_> = pods
        .iter()
        .filter(|pod| {
            selector
                .iter()
                .all(|(key, value)| pod.labels[key] == *value)
        })
        .collect();
    assert!(!chosen.is_empty(), "{who} selects no pod");
    chosen
}

fn config_map<'a>(objects: &'a [Value], name: &str) -> Option<&'a Value> {
    objects.iter().find(|object| {
        object["kind"] == "ConfigMap" && object["metadata"]["name"].as_str() == Some(name)
    })
}

/// The `--config FILE` (or `--config=FILE`) of a container's args.
fn config_file(container: &Value) -> Option<String> {
    let args = strings(&container["args"]);
    args.iter().enumerate().find_map(|(index, arg)| {
        if let Some(file) = arg.strip_prefix("--config=") {
            return Some(file.to_string());
        }
        (*arg == "--config").then(|| args[index + 1].to_string())
    })
}

/// The ConfigMap key a path inside a container is, when a ConfigMap volume (or a projected
/// volume's ConfigMap source) is mounted over it: (ConfigMap name, key).
fn config_map_key(pod: &Pod, container: &Value, path: &str) -> Option<(String, String)> {
    let volumes = pod.spec["volumes"].as_array().unwrap();
    container["volumeMounts"]
        .as_array()?
        .iter()
        .find_map(|mount| {
            let key = path
                .strip_prefix(mount["mountPath"].as_str()?)?
                .strip_prefix('/')?;
            let volume = volumes
                .iter()
                .find(|volume| volume["name"] == mount["name"])?;
            let mut sources = vec![&volume["configMap"]];
            if let Some(projected) = volume["projected"]["sources"].as_array() {
                sources.extend(projected.iter().map(|source| &source["configMap"]));
            }
            sources
                .into_iter()
                .find_map(|source| source["name"].as_str())
                .map(|name| (name.to_string(), key.to_string()))
        })
}

#[test]
fn every_manifest_matches_the_api_types() {
    let output = validate(&[], &manifests());
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(said.contains("20 objects checked, 0 problems"), "{said}");
}

#[test]
fn a_mistake_is_caught_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replicas: two\n  template: {spec: {containers: [{name: a, image: b, prot: 1}]}}\n---\napiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata: {name: m}\nspec:\n  podMetricsEndpoints: [{port: admin, tlsConfig: {insecure: true}}]\n",
    )
    .unwrap();
    let output = validate(&[], &[bad]);
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{said}");
    for problem in [
        "Deployment/x: spec.selector: Field required",
        "Deployment/x: spec.replicas:",
        "Deployment/x: spec.template.spec.containers.0.prot: Extra inputs are not permitted",
        "PodMonitor/m: PodMonitor.spec.podMetricsEndpoints[0].tlsConfig.insecure: not a field of PodMonitor",
        "PodMonitor/m: PodMonitor.spec.selector: required",
    ] {
        assert!(said.contains(problem), "missing {problem:?} in:\n{said}");
    }
}

#[test]
fn every_image_is_the_one_the_script_builds() {
    let objects = objects();
    let pods = pods(&objects);
    // build-image.sh names the image sluice:VERSION after the binary's version (tests/image.rs
    // checks the archive's name), which is this package's.
    let image = format!("sluice:{}", env!("CARGO_PKG_VERSION"));
    let mut seen = 0;
    for pod in &pods {
        for container in containers(pod) {
            assert_eq!(container["image"], image.as_str(), "{}", pod.name);
            // Loaded into the nodes, never pulled: no registry holds it.
            assert_eq!(container["imagePullPolicy"], "IfNotPresent", "{}", pod.name);
            seen += 1;
        }
    }
    assert_eq!(
        seen, 4,
        "a container per role: node, agent, vm-agent, controlplane"
    );
}

#[test]
fn every_port_named_is_a_port_of_the_pods_it_selects() {
    let objects = objects();
    let pods = pods(&objects);
    for pod in &pods {
        let ports = port_names(pod);
        for container in containers(pod) {
            for probe in ["readinessProbe", "livenessProbe"] {
                let port = container[probe]["httpGet"]["port"].as_str();
                let port = port.unwrap_or_else(|| panic!("{}: no {probe} by port name", pod.name));
                assert!(
                    ports.iter().any(|name| name == port),
                    "{}: {probe} {port}",
                    pod.name
                );
                let path = container[probe]["httpGet"]["path"].as_str().unwrap();
                let expected = if probe == "readinessProbe" {
                    "/readyz"
                } else {
                    "/healthz"
                };
                assert_eq!(path, expected, "{}", pod.name);
            }
        }
    }
    let mut monitored = Vec::new();
    for object in &objects {
        let name = object["metadata"]["name"].as_str().unwrap();
        let (selector, wanted) = match object["kind"].as_str().unwrap() {
            "Service" => (
                &object["spec"]["selector"],
                object["spec"]["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|port| &port["targetPort"])
                    .collect::<Vec<_>>(),
            ),
            "PodMonitor" => (
                &object["spec"]["selector"]["matchLabels"],
                object["spec"]["podMetricsEndpoints"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|endpoint| &endpoint["port"])
                    .collect(),
            ),
            _ => continue,
        };
        for pod in selected(&pods, selector, name) {
            if object["kind"] == "PodMonitor" {
                monitored.push(pod.name.clone());
            }
            for port in &wanted {
                let port = port.as_str().unwrap();
                assert!(
                    port_names(pod).iter().any(|p| p == port),
                    "{name}: {port} on {}",
                    pod.name
                );
            }
        }
    }
    monitored.sort();
    let mut all: Vec<_> = pods.iter().map(|pod| pod.name.clone()).collect();
    all.sort();
    assert_eq!(monitored, all, "a PodMonitor for every role");
}

#[test]
fn every_variable_the_args_use_comes_from_the_env() {
    let objects = objects();
    for pod in pods(&objects) {
        for container in containers(&pod) {
            let env: Vec<_> = container["env"].as_array().cloned().unwrap_or_default();
            for arg in strings(&container["args"]) {
                for part in arg.split("$(").skip(1) {
                    let variable = part.split(')').next().unwrap();
                    assert!(
                        env.iter().any(|entry| entry["name"] == variable),
                        "{}: $({variable}) in {arg} is not in env",
                        pod.name
                    );
                }
            }
        }
    }
}

/// Writes a ConfigMap's config where the test can run it: `/etc/sluice/` (the mount path)
/// becomes `dir`, and every other file the config names there (what the role's Secret
/// holds) gets a stand-in: a CA certificate for `.crt`, a 48-byte secret otherwise.
fn materialize(config: &str, dir: &Path, ca: &Path) -> PathBuf {
    let mount = "/etc/sluice/";
    for piece in config.split(mount).skip(1) {
        let name: String = piece
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || "._-/".contains(*c))
            .collect();
        let stand_in = dir.join(&name);
        if name.ends_with(".crt") {
            std::fs::copy(ca, &stand_in).unwrap();
        } else {
            std::fs::write(
                &stand_in,
                "a stand-in secret of forty-eight bytes, no more\n",
            )
            .unwrap();
        }
    }
    let file = dir.join("config.yaml");
    std::fs::write(&file, config.replace(mount, &format!("{}/", dir.display()))).unwrap();
    file
}

/// `runtime.drain_timeout` of a config, in seconds (it must be set, in whole seconds).
fn drain_timeout(config: &str) -> u64 {
    let line = config
        .lines()
        .find(|line| line.trim_start().starts_with("drain_timeout:"));
    let value = line
        .expect("the config sets runtime.drain_timeout")
        .split(':')
        .nth(1)
        .unwrap();
    value.trim().strip_suffix('s').unwrap().parse().unwrap()
}

/// What a node does after SIGTERM before its drain starts: withdraw from Redis and serve on
/// for 1.5 s (docs/OPERATIONS.md, "Upgrade and rolling restart"), rounded up.
const WITHDRAWAL_SECONDS: u64 = 2;
/// The control plane's own drain (`sluice/src/controlplane/mod.rs`, `serve(.., 10 s)`).
const CONTROLPLANE_DRAIN_SECONDS: u64 = 10;

#[test]
fn every_config_file_is_in_a_mounted_config_map_and_passes_check_config() {
    let objects = objects();
    let certificates = test_support::Certificates::generate(&[]).unwrap();
    let mut checked = 0;
    for pod in pods(&objects) {
        let container = &containers(&pod)[0];
        let args = strings(&container["args"]);
        let grace = pod.spec["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap_or(30);
        let pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
            .as_u64()
            .unwrap_or(0);
        if args[0] == "controlplane" {
            assert!(
                grace > pre_stop + CONTROLPLANE_DRAIN_SECONDS,
                "{}",
                pod.name
            );
        }
        let Some(file) = config_file(container) else {
            continue;
        };
        let (name, key) = config_map_key(&pod, container, &file)
            .unwrap_or_else(|| panic!("{}: {file} is in no mounted ConfigMap", pod.name));
        let map = config_map(&objects, &name).unwrap_or_else(|| panic!("no ConfigMap {name}"));
        let config = map["data"][&key]
            .as_str()
            .unwrap_or_else(|| panic!("ConfigMap {name} has no key {key}"));
        let dir = tempfile::tempdir().unwrap();
        let path = materialize(config, dir.path(), &certificates.ca_cert);
        let output = Command::new(BIN)
            .arg("check-config")
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            "ok",
            "{name}/{key}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let withdrawal = if config.contains("redis:") {
            WITHDRAWAL_SECONDS
        } else {
            0
        };
        assert!(
            grace > pre_stop + withdrawal + drain_timeout(config),
            "{}: terminationGracePeriodSeconds {grace} does not outlast the drain",
            pod.name
        );
        checked += 1;
    }
    assert_eq!(checked, 2, "the node's and the agent's configs");
}
