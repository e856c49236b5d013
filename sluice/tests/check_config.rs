//! `sluice check-config` and the daemon agree on what is wrong with a config file.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

const THREE_MISTAKES: &str = "\
runtime:
  workers: none
  drain_timeout: 30s
listeners:
  admin:
    address: \"x:y\"
    max_conections_per_worker: 10
";

fn expected_errors(path: &str) -> Vec<String> {
    vec![
        format!("{path}: listeners.admin.max_conections_per_worker: unknown field"),
        format!("{path}: runtime.workers: invalid worker count \"none\": expected \"auto\" or a number"),
        format!(
            "{path}: listeners.admin.address: invalid socket address \"x:y\": expected IP:PORT such as 127.0.0.1:9901 or [::1]:9901"
        ),
    ]
}

#[test]
fn three_mistakes_are_three_errors_with_paths_and_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, THREE_MISTAKES).unwrap();
    let output = Command::new(BIN)
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<String> = stderr.lines().map(str::to_string).collect();
    let path = path.display().to_string();
    let mut expected = expected_errors(&path);
    expected.push(format!("3 error(s) in {path}"));
    assert_eq!(lines, expected);
    assert!(output.stdout.is_empty());
}

#[test]
fn the_daemon_refuses_the_same_file_with_the_same_messages() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, THREE_MISTAKES).unwrap();
    let addresses = dir.path().join("addresses.json");
    let output = Command::new(BIN)
        .arg("run")
        .arg("--config")
        .arg(&path)
        .arg("--addresses-file")
        .arg(&addresses)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    for error in expected_errors(&path.display().to_string()) {
        assert!(stderr.contains(&error), "missing {error:?} in:\n{stderr}");
    }
    assert!(
        stderr.contains("refusing to start: 3 configuration error(s)"),
        "{stderr}"
    );
    assert!(!addresses.exists(), "nothing was started");
}

#[test]
fn a_valid_file_is_ok() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("good.yaml");
    std::fs::write(
        &path,
        "runtime: {workers: 2}\nlisteners: {admin: {address: '127.0.0.1:0'}}\n",
    )
    .unwrap();
    let output = Command::new(BIN)
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout), "ok\n");
}

#[test]
fn an_unreadable_file_names_itself() {
    let output = Command::new(BIN)
        .args(["check-config", "/nonexistent/sluice.yaml"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("/nonexistent/sluice.yaml: cannot read file:"),
        "{stderr}"
    );
}
