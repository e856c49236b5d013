//! `sluice policy compile`.
#![allow(clippy::unwrap_used)]

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

#[test]
fn compile_prints_the_flows_of_a_valid_file() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../controlplane/policy/tests/fixtures/three-vms.yaml"
    );
    let output = Command::new(BIN)
        .args(["policy", "compile", fixture])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        text.lines().any(|line| line.contains("conjunction(")),
        "{text}"
    );
    assert!(
        text.lines().any(|line| line.contains("controller(")),
        "Reject rule: {text}"
    );
}

#[test]
fn compile_refuses_a_bad_file_with_path_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    std::fs::write(
        &file,
        "policies: [{name: web, priority: nope, appliedTo: []}]\n",
    )
    .unwrap();
    let output = Command::new(BIN)
        .arg("policy")
        .arg("compile")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("bad.yaml") && stderr.contains("policies[0]"),
        "{stderr}"
    );
}
