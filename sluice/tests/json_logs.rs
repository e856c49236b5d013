//! Every long-running role logs JSON when asked (`--log-format json`): `sluice up` and
//! `sluice vm-agent` here (`run` and `agent` take `logging.format`, checked in `up.rs`, and the
//! control plane in its own tests). Every stderr line must parse as one JSON object.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::process::Command;
use std::time::Duration;

use test_support::{
    is_root, prerequisite, program_on_path, wait_until, OvsInstance, SluiceLauncher, SluiceProcess,
    VmAgentProcess,
};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// Each stderr line as JSON (a line that is not fails the test), then their messages.
fn json_messages(stderr: &str) -> Vec<String> {
    assert!(!stderr.trim().is_empty(), "no log at all");
    stderr
        .lines()
        .map(|line| {
            let event: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|error| panic!("not JSON ({error}): {line}\nstderr:\n{stderr}"));
            assert!(event["level"].is_string(), "{line}");
            event["message"].as_str().unwrap_or_default().to_string()
        })
        .collect()
}

fn stop(mut process: SluiceProcess) -> String {
    process.signal(libc::SIGTERM);
    let status = process
        .wait_exit(Duration::from_secs(20))
        .expect("exits after SIGTERM");
    assert_eq!(status.code(), Some(0), "stderr:\n{}", process.stderr());
    process.stderr()
}

#[test]
fn up_logs_json_when_asked() {
    let process = SluiceLauncher::new(BIN)
        .unwrap()
        .args(["up", "--ephemeral-ports", "--log-format", "json"])
        .stop_with(libc::SIGINT)
        .spawn()
        .expect("sluice up starts");
    assert!(
        wait_until(Duration::from_secs(60), || process
            .stdout()
            .contains("Press Ctrl-C to stop.")),
        "stdout: {}\nstderr: {}",
        process.stdout(),
        process.stderr()
    );
    let messages = json_messages(&stop(process));
    for expected in ["ready", "stopped"] {
        assert!(
            messages.iter().any(|message| message == expected),
            "{expected:?} not in {messages:?}"
        );
    }
}

#[test]
fn vm_agent_logs_json_when_asked() {
    if !prerequisite("root", is_root(), "CI runs the tests as root")
        || !prerequisite(
            "Open vSwitch",
            program_on_path("ovs-vswitchd"),
            "scripts/test.sh installs openvswitch-switch",
        )
    {
        return;
    }
    let ovs = OvsInstance::start().unwrap();
    let policies = tempfile::tempdir().unwrap();
    let mut command = Command::new(BIN);
    command
        .args(["vm-agent", "--bridge", "brjson", "--admin", "127.0.0.1:0"])
        .arg("--policies")
        .arg(policies.path())
        .arg("--ovs-rundir")
        .arg(ovs.rundir())
        .args(["--log-format", "json"]);
    let mut agent = VmAgentProcess::spawn(command).unwrap();
    let ready = format!("http://{}/readyz", agent.admin);
    assert!(
        wait_until(Duration::from_secs(20), || Command::new("curl")
            .args(["-sf", &ready])
            .status()
            .is_ok_and(|status| status.success())),
        "the agent never became ready; log:\n{}",
        agent.log()
    );
    agent.kill();
    let messages = json_messages(&agent.log());
    assert!(
        messages.len() >= 2,
        "the agent logged its start: {messages:?}"
    );
}
