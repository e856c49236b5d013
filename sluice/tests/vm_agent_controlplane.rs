//! `sluice vm-agent --controlplane --vm vm1`: an agent on the VM's host (its VirtualMachine
//! names no uplink: the VM's ports are already on the bridge) enforcing its span of the control
//! plane's policy objects on a real Open vSwitch bridge (userspace datapath), following
//! changes. The uplink takeover and the rest of the lifecycle: `vm_lifecycle.rs`.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use test_support::{
    examples, http_get, metric_value, wait_until, ControlPlane, OvsInstance, VmAgentProcess,
};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const BRIDGE: &str = "brcp";

struct Agent(VmAgentProcess);

impl Agent {
    fn start(ovs: &OvsInstance, cp: &ControlPlane, dir: &std::path::Path) -> Agent {
        let token = dir.join("vm1.token");
        std::fs::write(&token, cp.token("vm-agent", "vm1")).unwrap();
        let mut command = Command::new(BIN);
        command
            .args(["vm-agent", "--bridge", BRIDGE, "--admin", "127.0.0.1:0"])
            .args(["--controlplane", &cp.url(), "--vm", "vm1"])
            .args(["--report-interval", "1s", "--state-dir"])
            .arg(dir.join("state"))
            .arg("--controlplane-ca")
            .arg(cp.ca_file())
            .arg("--controlplane-token-file")
            .arg(&token)
            .arg("--ovs-rundir")
            .arg(ovs.rundir());
        Agent(VmAgentProcess::spawn(command).unwrap())
    }

    fn metric(&self, series: &str) -> Option<f64> {
        let admin: SocketAddr = self.0.admin.parse().ok()?;
        metric_value(&http_get(admin, "/metrics").ok()?.body, series)
    }

    fn log(&self) -> String {
        self.0.log()
    }
}

/// The bridge's flows; empty while the agent has not created the bridge yet.
fn flows(ovs: &OvsInstance) -> String {
    ovs.ovs_ofctl(&["-O", "OpenFlow13", "dump-flows", BRIDGE])
        .unwrap_or_default()
}

#[test]
fn a_vm_agent_enforces_its_span_from_the_control_plane_and_follows_changes() {
    let ovs = OvsInstance::start().unwrap();
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    let objects = format!(
        "{}\n---\n{}\n---\n{}",
        examples::APPLIED_TO_GROUP,
        examples::NETWORK_POLICY,
        examples::ADDRESS_GROUP
    );
    let created = cp.kubectl(&["create", "-f", "-"], Some(&objects));
    assert!(created.status.success(), "{created:?}");
    let vm = r#"{"apiVersion": "vm.sluice.dev/v1alpha1", "kind": "VirtualMachine",
        "metadata": {"name": "vm1"}, "spec": {"management": "Agented"}}"#;
    let applied = cp.kubectl(&["apply", "-f", "-"], Some(vm));
    assert!(applied.status.success(), "{applied:?}");
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&ovs, &cp, dir.path());

    // vm1's interface and the policy's peers are on the bridge; vm4's interface is not (the
    // server sent vm1 only its own members of the group).
    assert!(
        wait_until(Duration::from_secs(15), || flows(&ovs)
            .contains("10.0.1.0/24")),
        "the policy never reached the bridge; agent log:\n{}",
        agent.log()
    );
    let installed = flows(&ovs);
    assert!(
        installed.contains("10.0.0.1") && !installed.contains("10.0.0.4"),
        "{installed}"
    );

    // A new peer in the address group: the agent re-realizes within moments.
    let patched = cp.kubectl(
        &[
            "patch",
            "adg",
            "web-clients",
            "--type=json",
            "-p",
            r#"[{"op":"add","path":"/spec/members/-","value":"10.9.9.9"}]"#,
        ],
        None,
    );
    assert!(patched.status.success(), "{patched:?}");
    assert!(
        wait_until(Duration::from_secs(10), || flows(&ovs).contains("10.9.9.9")),
        "the group change never reached the bridge; agent log:\n{}",
        agent.log()
    );
    // The policy deleted: its flows go (the address group is then outside vm1's span too).
    let deleted = cp.kubectl(&["delete", "vmnp", "web"], None);
    assert!(deleted.status.success(), "{deleted:?}");
    assert!(
        wait_until(Duration::from_secs(10), || !flows(&ovs)
            .contains("10.9.9.9")),
        "the deleted policy's flows stayed; agent log:\n{}",
        agent.log()
    );
    assert!(
        agent.metric("sluice_controlplane_watch_connected{resource=\"networkpolicies\"}")
            == Some(1.0)
    );
    assert_eq!(
        agent.metric("sluice_policy_reload_errors_total"),
        Some(0.0),
        "{}",
        agent.log()
    );
}
