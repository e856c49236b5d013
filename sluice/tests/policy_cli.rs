//! `sluice policy compile`.
#![allow(clippy::unwrap_used)]

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

#[test]
fn compile_prints_the_flows_of_a_valid_file() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../vm-datapath/policy/tests/fixtures/three-vms.yaml"
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

#[test]
fn compile_takes_a_directory_as_one_policy_set() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../vm-datapath/policy/tests/fixtures/three-vms.yaml"
    );
    let compile = |path: &std::path::Path| {
        Command::new(BIN)
            .arg("policy")
            .arg("compile")
            .arg(path)
            .output()
            .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture, dir.path().join("10-three-vms.yaml")).unwrap();
    let from_dir = compile(dir.path());
    assert!(from_dir.status.success(), "{from_dir:?}");
    assert_eq!(
        from_dir.stdout,
        compile(std::path::Path::new(fixture)).stdout,
        "a directory holding one file compiles like the file"
    );

    // The same policies again in a second file: refused, naming both files.
    std::fs::copy(fixture, dir.path().join("20-copy.yml")).unwrap();
    let output = compile(dir.path());
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.lines().any(|line| line.contains("20-copy.yml:")
            && line.contains("already defined in")
            && line.contains("10-three-vms.yaml")),
        "{stderr}"
    );
}
