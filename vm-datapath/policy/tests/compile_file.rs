//! A policy file end to end: load from disk, compile, and have real `ovs-ofctl` parse every flow
//! (OpenFlow 1.3) so the text is exactly what OVS accepts: prerequisites, masks, conjunctions.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use sluice_policy::compile::{compile, compile_to_text, CompileOptions};
use sluice_policy::load::load_file;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn options() -> CompileOptions {
    CompileOptions {
        round: 2,
        control_plane: vec![
            "192.168.1.10:6443".parse().unwrap(),
            "[fd00::10]:443".parse().unwrap(),
        ],
    }
}

#[test]
fn compiled_flows_are_accepted_by_ovs_ofctl() {
    let set = load_file(&fixture("three-vms.yaml")).unwrap();
    let flows = compile(&set, &options()).unwrap();
    let text = compile_to_text(&set, &options()).unwrap();
    assert_eq!(text.lines().count(), flows.len());

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows.txt");
    std::fs::write(&path, &text).unwrap();
    let output = Command::new("ovs-ofctl")
        .args(["-O", "OpenFlow13", "parse-flows"])
        .arg(&path)
        .output()
        .expect("ovs-ofctl (openvswitch-switch) must be installed");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "ovs-ofctl rejected the flows: {}\n{text}",
        String::from_utf8_lossy(&output.stderr)
    );
    let parsed = stdout
        .lines()
        .filter(|l| l.contains("OFPT_FLOW_MOD"))
        .count();
    assert_eq!(parsed, flows.len(), "{stdout}");
    // Every conjunction referenced has its conj_id flow, and every clause count is consistent.
    for flow in &flows {
        for action in &flow.actions {
            if let sluice_openflow::flow::Action::Conjunction {
                id,
                clause,
                n_clauses,
            } = action
            {
                assert!(
                    *clause >= 1 && clause <= n_clauses && *n_clauses >= 2,
                    "{flow}"
                );
                assert!(
                    flows.iter().any(|f| f.matches.conj_id == Some(*id)),
                    "conjunction {id} has no conj_id flow"
                );
            }
        }
    }
}

#[test]
fn broken_file_is_refused_with_file_path_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.yaml");
    let text = std::fs::read_to_string(fixture("three-vms.yaml"))
        .unwrap()
        .replace("port: 80}", "port: 80, endPort: 70000}")
        .replace("addressGroups: [vm3]", "addressGroups: [vm4]");
    std::fs::write(&path, text).unwrap();
    let error = load_file(&path).unwrap_err();
    let origin = path.display().to_string();
    let lines: Vec<String> = error.to_string().lines().map(String::from).collect();
    assert_eq!(
        lines,
        [
            format!("{origin}: policies[0].rules[0].services[0].endPort: 70000 is not a valid port"),
            format!(
                "{origin}: policies[0].rules[1].peers.addressGroups[0]: address group \"vm4\" is not defined in addressGroups"
            ),
        ]
    );
}
