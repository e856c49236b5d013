//! The tree's dependency rules, checked on the workspace's own `cargo metadata`:
//! - the control plane and the data plane meet only through the foundation crates;
//! - the VM data path depends on nothing of the other planes;
//! - the pure crates (codecs, compilers, request info, routing vocabulary) pull in no async runtime;
//! - the production binary links the apiserver simulator only through the `demo` feature.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Workspace packages by name: (folder relative to the workspace root, dependency kinds).
struct Workspace {
    root: PathBuf,
    metadata: Value,
}

impl Workspace {
    fn load() -> Self {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the binary crate sits in the workspace")
            .to_path_buf();
        // Resolved for this platform only: the lock file's other-platform packages need not be
        // downloaded, so this works offline on a machine that has built the workspace.
        let output = Command::new(env!("CARGO"))
            .args(["metadata", "--format-version", "1", "--locked", "--offline"])
            .args(["--filter-platform", &host_triple()])
            .current_dir(&root)
            .output()
            .expect("cargo metadata runs");
        assert!(
            output.status.success(),
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let metadata = serde_json::from_slice(&output.stdout).expect("cargo metadata is JSON");
        Self { root, metadata }
    }

    /// Every workspace package's name -> its folder's first component (`dataplane`, ...).
    fn planes(&self) -> BTreeMap<String, String> {
        let members: BTreeSet<&str> = self.metadata["workspace_members"]
            .as_array()
            .expect("workspace_members")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        self.packages()
            .filter(|package| members.contains(package["id"].as_str().unwrap_or_default()))
            .map(|package| {
                let manifest = Path::new(package["manifest_path"].as_str().unwrap_or_default());
                let folder = manifest
                    .parent()
                    .and_then(|dir| dir.strip_prefix(&self.root).ok())
                    .and_then(|relative| relative.components().next())
                    .map(|first| first.as_os_str().to_string_lossy().into_owned())
                    .unwrap_or_default();
                (
                    package["name"].as_str().unwrap_or_default().to_string(),
                    folder,
                )
            })
            .collect()
    }

    fn packages(&self) -> impl Iterator<Item = &Value> {
        self.metadata["packages"]
            .as_array()
            .expect("packages")
            .iter()
    }

    fn package(&self, name: &str) -> &Value {
        self.packages()
            .find(|package| package["name"] == name)
            .unwrap_or_else(|| panic!("no package {name}"))
    }

    /// Normal (non-dev, non-build) dependencies of a package: (name, optional).
    fn normal_dependencies(&self, name: &str) -> Vec<(String, bool)> {
        self.package(name)["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .filter(|dependency| dependency["kind"].is_null())
            .map(|dependency| {
                (
                    dependency["name"].as_str().unwrap_or_default().to_string(),
                    dependency["optional"].as_bool().unwrap_or(false),
                )
            })
            .collect()
    }

    /// Every package reachable from `name` through normal, non-optional dependencies.
    fn closure(&self, name: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![name.to_string()];
        while let Some(next) = stack.pop() {
            if !seen.insert(next.clone()) {
                continue;
            }
            if self
                .packages()
                .any(|package| package["name"] == next.as_str())
            {
                for (dependency, optional) in self.normal_dependencies(&next) {
                    if !optional {
                        stack.push(dependency);
                    }
                }
            }
        }
        seen
    }
}

/// Sluice runs on Linux only (io_uring), built for the machine's own architecture.
fn host_triple() -> String {
    format!("{}-unknown-linux-gnu", std::env::consts::ARCH)
}

/// Which planes a plane's crates may depend on (besides their own).
fn allowed(plane: &str) -> &'static [&'static str] {
    match plane {
        "foundation" => &[],
        "proto" => &[],
        "dataplane" => &["foundation", "proto"],
        "controlplane" => &["foundation", "proto"],
        "vm-datapath" => &["foundation"],
        "ebpf" => &["foundation"],
        "tools" => &["foundation"],
        // The binary, fixtures, benches and the harness wire or exercise everything.
        _ => &[
            "foundation",
            "proto",
            "dataplane",
            "controlplane",
            "vm-datapath",
            "ebpf",
            "tools",
            "test-support",
        ],
    }
}

/// The VM agent is a role, like the binary: it wires the VM data path to the control plane's
/// watch client (its policies, its VirtualMachine, its runtime info reports) and to the eBPF
/// counters on the bridge's ports. These two arrows, and no other, leave its plane; every other
/// `vm-datapath/` crate still depends on `foundation/` only.
const ROLE_ARROWS: &[(&str, &str)] = &[
    ("sluice-vm-agent", "sluice-watch-client"),
    ("sluice-vm-agent", "sluice-ebpf"),
];

#[test]
fn planes_meet_only_through_the_foundation() {
    let workspace = Workspace::load();
    let planes = workspace.planes();
    assert!(planes.len() > 15, "workspace members: {planes:?}");
    let mut violations = Vec::new();
    for (name, plane) in &planes {
        for (dependency, _) in workspace.normal_dependencies(name) {
            let Some(target) = planes.get(&dependency) else {
                continue;
            };
            let role_arrow = ROLE_ARROWS.contains(&(name.as_str(), dependency.as_str()));
            if target != plane && !allowed(plane).contains(&target.as_str()) && !role_arrow {
                violations.push(format!("{name} ({plane}) -> {dependency} ({target})"));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "arrows across planes: {violations:#?}"
    );
}

#[test]
fn pure_crates_pull_in_no_async_runtime() {
    let workspace = Workspace::load();
    for pure in [
        "sluice-openflow",
        "sluice-policy",
        "sluice-policy-model",
        "sluice-gateway",
        "sluice-config-error",
        "sluice-upstream-cluster",
        "sluice-apimachinery",
        "sluice-kube-tunnel",
    ] {
        let closure = workspace.closure(pure);
        let runtimes: Vec<&String> = closure
            .iter()
            .filter(|name| ["tokio", "monoio", "async-std", "smol"].contains(&name.as_str()))
            .collect();
        assert!(runtimes.is_empty(), "{pure} pulls in {runtimes:?}");
    }
}

#[test]
fn the_binary_links_the_simulator_only_for_the_demo() {
    let workspace = Workspace::load();
    let simulator = workspace
        .normal_dependencies("sluice")
        .into_iter()
        .find(|(name, _)| name == "sluice-apiserver-sim");
    assert_eq!(
        simulator,
        Some(("sluice-apiserver-sim".to_string(), true)),
        "the simulator must be an optional dependency"
    );
    let features = &workspace.package("sluice")["features"];
    assert_eq!(
        features["demo"],
        serde_json::json!(["dep:sluice-apiserver-sim"])
    );
    assert!(
        !workspace.closure("sluice").contains("sluice-apiserver-sim"),
        "something else links the simulator into the binary"
    );
}
