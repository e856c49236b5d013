//! The VM agent's eBPF counters (issue 16): the agent runs where its bridge's ports are (the
//! private OVS's namespace), attaches the counting programs to every port, follows ports that
//! come and go, counts real traffic exactly, and a restart leaves exactly one of our programs
//! on each hook.
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::Duration;

use test_support::{in_netns, metric_value, wait_until, NetNs, OvsInstance, VmAgentProcess};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const BRIDGE: &str = "brebpf";
const DATAGRAMS: u16 = 40;
const PAYLOAD: usize = 100;

fn start_agent(ovs: &OvsInstance, policies: &std::path::Path) -> VmAgentProcess {
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", ovs.netns(), BIN, "vm-agent"])
        .args(["--bridge", BRIDGE, "--admin", "127.0.0.1:0"])
        .arg("--policies")
        .arg(policies)
        .arg("--ovs-rundir")
        .arg(ovs.rundir())
        .args(["--stats-interval", "200ms"]);
    VmAgentProcess::spawn(command).unwrap()
}

fn metrics(ovs: &OvsInstance, agent: &VmAgentProcess) -> String {
    let url = format!("http://{}/metrics", agent.admin);
    ovs.exec_in_netns(&["curl", "--silent", "--max-time", "5", &url])
        .unwrap_or_default()
}

/// Our programs on `device`'s TCX hooks (ingress, egress), read inside the OVS namespace. A
/// failed query panics: read as "no programs", it would pass every "released" check.
fn programs(ovs: &OvsInstance, device: &str) -> (Vec<String>, Vec<String>) {
    let name = device.to_string();
    in_netns(ovs.netns(), move || sluice_ebpf::tcx_programs(&name))
        .unwrap()
        .unwrap_or_else(|error| panic!("the TCX query of {device} failed: {error}"))
}

fn one_each() -> (Vec<String>, Vec<String>) {
    (
        vec!["sluice_ingress".to_string()],
        vec!["sluice_egress".to_string()],
    )
}

/// `count` datagrams of `payload` bytes from `from` to `to`, each from its own source port.
fn send_datagrams(from: &NetNs, to: &str, count: u16, payload: usize) {
    let script = format!(
        "import socket\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         for _ in range({count}):\n\
         \x20   s.sendto(b'x' * {payload}, ('{to}', 9))\n"
    );
    let output = from.exec(&["python3", "-c", &script]).unwrap();
    assert!(output.status.success(), "{output:?}");
}

fn series(interface: &str, direction: &str, what: &str) -> String {
    format!("sluice_ebpf_{what}_total{{interface=\"{interface}\",direction=\"{direction}\",protocol=\"udp\"}}")
}

#[test]
fn the_agent_counts_every_port_follows_ports_and_restarts_without_doubling() {
    let ovs = OvsInstance::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies.yaml");
    std::fs::write(&policies, "policies: []\n").unwrap();
    let mut agent = start_agent(&ovs, &policies);
    assert!(
        wait_until(Duration::from_secs(10), || metric_value(
            &metrics(&ovs, &agent),
            "sluice_ebpf_enabled"
        ) == Some(1.0)),
        "{}",
        agent.log()
    );

    // Two VMs plugged in after the agent started: both ports get the programs.
    let vm1 = NetNs::new("ebvm").unwrap();
    let vm2 = NetNs::new("ebvm").unwrap();
    let port1 = vm1.attach_veth(&ovs, BRIDGE, "10.66.0.1/24").unwrap();
    let port2 = vm2.attach_veth(&ovs, BRIDGE, "10.66.0.2/24").unwrap();
    for vm in [&vm1, &vm2] {
        vm.run(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])
            .unwrap();
    }
    for port in [&port1, &port2] {
        assert!(
            wait_until(Duration::from_secs(10), || programs(&ovs, &port.host_name)
                == one_each()),
            "{} never got its programs: {:?}\n{}",
            port.host_name,
            programs(&ovs, &port.host_name),
            agent.log()
        );
    }

    // Exactly what was sent: vm1's datagrams enter the bridge at its port and leave at vm2's.
    vm1.run(&["ping", "-c", "1", "-W", "2", "10.66.0.2"])
        .unwrap();
    send_datagrams(&vm1, "10.66.0.2", DATAGRAMS, PAYLOAD);
    let frame = (14 + 20 + 8 + PAYLOAD) as f64;
    let expected = [
        (
            series(&port1.host_name, "ingress", "packets"),
            f64::from(DATAGRAMS),
        ),
        (
            series(&port1.host_name, "ingress", "bytes"),
            f64::from(DATAGRAMS) * frame,
        ),
        (
            series(&port2.host_name, "egress", "packets"),
            f64::from(DATAGRAMS),
        ),
        (
            series(&port2.host_name, "egress", "bytes"),
            f64::from(DATAGRAMS) * frame,
        ),
    ];
    assert!(
        wait_until(Duration::from_secs(5), || {
            let text = metrics(&ovs, &agent);
            expected
                .iter()
                .all(|(series, value)| metric_value(&text, series) == Some(*value))
        }),
        "counters differ from what was sent ({DATAGRAMS} datagrams of {frame} bytes):\n{}",
        metrics(&ovs, &agent)
            .lines()
            .filter(|line| line.starts_with("sluice_ebpf"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        metric_value(
            &metrics(&ovs, &agent),
            &series(&port1.host_name, "egress", "packets")
        )
        .unwrap_or(0.0),
        0.0,
        "no UDP went back to vm1"
    );

    // A port removed from the bridge is released.
    ovs.ovs_vsctl(&["del-port", BRIDGE, &port2.host_name])
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || programs(&ovs, &port2.host_name)
            == (vec![], vec![])),
        "the removed port kept its programs: {:?}",
        programs(&ovs, &port2.host_name)
    );
    assert_eq!(
        metric_value(&metrics(&ovs, &agent), "sluice_ebpf_attached_interfaces"),
        Some(1.0)
    );

    // A killed and restarted agent: exactly one of our programs per hook.
    agent.kill();
    let agent = start_agent(&ovs, &policies);
    assert!(
        wait_until(Duration::from_secs(10), || metric_value(
            &metrics(&ovs, &agent),
            "sluice_ebpf_attached_interfaces"
        ) == Some(1.0)),
        "{}",
        agent.log()
    );
    assert!(
        wait_until(Duration::from_secs(5), || programs(&ovs, &port1.host_name)
            == one_each()),
        "after a restart: {:?}",
        programs(&ovs, &port1.host_name)
    );
}
