//! `sluice vm-agent` against a real Open vSwitch (userspace netdev datapath) with network
//! namespaces as VMs and real packets (`nc`, `ping`).
#![allow(clippy::unwrap_used)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use test_support::{NetNs, OvsInstance};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const BRIDGE: &str = "brvm";

struct Agent {
    child: Child,
    admin: SocketAddr,
}

impl Agent {
    fn start(ovs: &OvsInstance, policies: &Path) -> Agent {
        let mut child = Command::new(BIN)
            .args(["vm-agent", "--bridge", BRIDGE, "--admin", "127.0.0.1:0"])
            .arg("--policies")
            .arg(policies)
            .arg("--ovs-rundir")
            .arg(ovs.rundir())
            .args(["--stats-interval", "300ms"])
            .env("RUST_LOG", "info,sluice_policy_engine=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let admin = line
            .trim()
            .strip_prefix("admin listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .unwrap();
        let agent = Agent { child, admin };
        assert!(
            wait(Duration::from_secs(20), || agent.get("/readyz").0 == 200),
            "agent never became ready"
        );
        agent
    }

    fn get(&self, path: &str) -> (u16, String) {
        let Ok(mut stream) = TcpStream::connect_timeout(&self.admin, Duration::from_secs(2)) else {
            return (0, String::new());
        };
        let _ = write!(stream, "GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
        let mut text = String::new();
        let _ = stream.read_to_string(&mut text);
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
        (status, body.unwrap_or_default())
    }

    fn metric(&self, prefix: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics");
        body.lines()
            .find(|line| line.starts_with(prefix))
            .and_then(|line| line.rsplit(' ').next()?.parse().ok())
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

fn wait(limit: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Probe {
    Connected,
    Refused,
    TimedOut,
}

/// One TCP connection attempt from `from` to `address:port` with `nc -z`.
fn probe(from: &NetNs, address: &str, port: u16, timeout_secs: &str) -> (Probe, Duration) {
    let started = Instant::now();
    let output = from
        .exec(&[
            "nc",
            "-z",
            "-v",
            "-n",
            "-w",
            timeout_secs,
            address,
            &port.to_string(),
        ])
        .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let outcome = if output.status.success() {
        Probe::Connected
    } else if stderr.contains("refused") {
        Probe::Refused
    } else {
        Probe::TimedOut
    };
    (outcome, took)
}

struct Vms {
    /// Held so the namespace (and its listeners) lives as long as the test.
    _vm1: NetNs,
    vm2: NetNs,
    vm3: NetNs,
    vm1_port: u32,
    listeners: Vec<Child>,
    /// What the port-80 listener received.
    received: tempfile::NamedTempFile,
}

impl Drop for Vms {
    fn drop(&mut self) {
        for listener in &mut self.listeners {
            let _ = listener.kill();
            let _ = listener.wait();
        }
    }
}

fn attach_vms(ovs: &OvsInstance) -> Vms {
    let (vm1, vm2, vm3) = (
        NetNs::new("vma").unwrap(),
        NetNs::new("vmb").unwrap(),
        NetNs::new("vmc").unwrap(),
    );
    let vm1_port = vm1.attach_veth(ovs, BRIDGE, "10.0.0.1/24").unwrap().ofport;
    vm2.attach_veth(ovs, BRIDGE, "10.0.0.2/24").unwrap();
    vm3.attach_veth(ovs, BRIDGE, "10.0.0.3/24").unwrap();
    let received = tempfile::NamedTempFile::new().unwrap();
    let web = Command::new("ip")
        .args([
            "netns",
            "exec",
            vm1.name(),
            "nc",
            "-lk",
            "-n",
            "10.0.0.1",
            "80",
        ])
        .stdin(Stdio::null())
        .stdout(received.reopen().unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let other = vm1.spawn(&["nc", "-lk", "-n", "10.0.0.1", "81"]).unwrap();
    // Both listeners must be up before a test probes them (from vm1 itself, which does not
    // cross the bridge or its flows).
    for port in [80, 81] {
        assert!(
            test_support::wait_until(Duration::from_secs(10), || probe(
                &vm1, "10.0.0.1", port, "1"
            )
            .0 == Probe::Connected),
            "listener on port {port} did not come up"
        );
    }
    Vms {
        _vm1: vm1,
        vm2,
        vm3,
        vm1_port,
        listeners: vec![web, other],
        received,
    }
}

/// vm1 admits TCP 80 from the `clients` group and refuses (Reject) TCP 22 from vm3.
fn web_policy(vm1_port: u32, clients: &str, extra_policies: &str) -> String {
    format!(
        r#"
addressGroups:
  - {{name: clients, members: [{clients}]}}
  - {{name: vm3, members: [10.0.0.3]}}
appliedToGroups:
  - name: vm1
    members: [{{name: vm1-eth0, ofport: {vm1_port}, ips: [10.0.0.1]}}]
policies:
  - name: web
    priority: 50
    appliedTo: [vm1]
    rules:
      - {{name: http, direction: Ingress, action: Allow, peers: {{addressGroups: [clients]}}, services: [{{protocol: TCP, port: 80}}]}}
      - {{name: ssh, direction: Ingress, action: Reject, peers: {{addressGroups: [vm3]}}, services: [{{protocol: TCP, port: 22}}]}}
{extra_policies}"#
    )
}

fn write_policies(path: &Path, text: &str) {
    // Write then rename: the agent never reads a half-written file.
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, text).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

fn wait_generation(agent: &Agent, above: f64) -> f64 {
    let mut seen = 0.0;
    assert!(
        wait(Duration::from_secs(10), || {
            seen = agent.metric("sluice_policy_generation ").unwrap_or(0.0);
            seen > above
        }),
        "the change was never realized (generation {seen})"
    );
    seen
}

#[test]
fn policies_are_enforced_with_real_packets_and_hot_reloaded() {
    let ovs = OvsInstance::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies.yaml");
    write_policies(&policies, "policies: []\n");
    let agent = Agent::start(&ovs, &policies);
    let vms = attach_vms(&ovs);

    // No policy: nothing is isolated.
    assert_eq!(probe(&vms.vm3, "10.0.0.1", 81, "2").0, Probe::Connected);

    let generation = agent.metric("sluice_policy_generation ").unwrap();
    write_policies(&policies, &web_policy(vms.vm1_port, "10.0.0.2", ""));
    let generation = wait_generation(&agent, generation);

    assert_eq!(
        probe(&vms.vm2, "10.0.0.1", 80, "2").0,
        Probe::Connected,
        "allowed"
    );
    assert_eq!(
        probe(&vms.vm2, "10.0.0.1", 81, "1").0,
        Probe::TimedOut,
        "other port dropped"
    );
    assert_eq!(
        probe(&vms.vm3, "10.0.0.1", 80, "1").0,
        Probe::TimedOut,
        "vm3 dropped"
    );
    let (outcome, took) = probe(&vms.vm3, "10.0.0.1", 22, "3");
    assert_eq!(outcome, Probe::Refused, "Reject answers with a TCP RST");
    assert!(took < Duration::from_millis(1500), "refusal took {took:?}");
    // Replies of an admitted connection pass: data both ways over port 80.
    let exchange = vms
        .vm2
        .exec(&[
            "sh",
            "-c",
            "echo ping | nc -n -w 2 -q 1 10.0.0.1 80; echo rc=$?",
        ])
        .unwrap();
    assert!(String::from_utf8_lossy(&exchange.stdout).contains("rc=0"));

    // Per-rule counters follow real packets.
    assert!(
        wait(Duration::from_secs(5), || agent
            .metric(
                r#"sluice_policy_rule_packets_total{policy="web",rule="http",direction="Ingress"}"#
            )
            .unwrap_or(0.0)
            >= 2.0),
        "rule counter did not count the SYNs: {}",
        agent.get("/metrics").1
    );

    // A malformed file is refused, counted, and the running policy stays.
    std::fs::write(&policies, "policies: [{name: broken, priority: nope}]\n").unwrap();
    assert!(wait(Duration::from_secs(5), || agent
        .metric("sluice_policy_reload_errors_total")
        .unwrap_or(0.0)
        >= 1.0));
    assert_eq!(probe(&vms.vm2, "10.0.0.1", 80, "2").0, Probe::Connected);

    // Priority: a higher-priority Drop wins over the Allow.
    let deny = r#"  - name: deny-http
    priority: 5
    appliedTo: [vm1]
    rules:
      - {direction: Ingress, action: Drop, peers: {addressGroups: [clients]}, services: [{protocol: TCP, port: 80}]}
"#;
    write_policies(&policies, &web_policy(vms.vm1_port, "10.0.0.2", deny));
    let generation = wait_generation(&agent, generation);
    assert_eq!(
        probe(&vms.vm2, "10.0.0.1", 80, "1").0,
        Probe::TimedOut,
        "Drop overrides"
    );

    // Back to the web policy, with one connection kept open across adding vm3 to the group.
    write_policies(&policies, &web_policy(vms.vm1_port, "10.0.0.2", ""));
    let generation = wait_generation(&agent, generation);
    let mut session = Command::new("ip")
        .args([
            "netns",
            "exec",
            vms.vm2.name(),
            "nc",
            "-n",
            "10.0.0.1",
            "80",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut session_in = session.stdin.take().unwrap();
    writeln!(session_in, "before").unwrap();
    write_policies(
        &policies,
        &web_policy(vms.vm1_port, "10.0.0.2, 10.0.0.3", ""),
    );
    let generation = wait_generation(&agent, generation);
    writeln!(session_in, "after-update").unwrap();
    assert!(
        wait(Duration::from_secs(3), || std::fs::read_to_string(
            vms.received.path()
        )
        .unwrap_or_default()
        .contains("after-update")),
        "data sent after the update never arrived over the open connection"
    );
    assert_eq!(
        probe(&vms.vm3, "10.0.0.1", 80, "2").0,
        Probe::Connected,
        "vm3 let in"
    );
    assert!(
        session.try_wait().unwrap().is_none(),
        "open connection survived"
    );
    drop(session_in);
    let _ = session.kill();
    let _ = session.wait();

    // Deleting the policy restores the default (everything passes).
    write_policies(&policies, "policies: []\n");
    wait_generation(&agent, generation);
    assert_eq!(probe(&vms.vm3, "10.0.0.1", 81, "2").0, Probe::Connected);
}

/// Outcomes of probes sent every ~50 ms from a background thread.
struct Prober {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<(Instant, Probe)>>>,
}

impl Prober {
    fn start(from: &NetNs, port: u16, timeout_secs: &'static str) -> Prober {
        let namespace = from.name().to_string();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut outcomes = Vec::new();
            while !stopping.load(std::sync::atomic::Ordering::Relaxed) {
                let output = Command::new("ip")
                    .args(["netns", "exec", &namespace, "nc", "-z", "-v", "-n", "-w"])
                    .args([timeout_secs, "10.0.0.1", &port.to_string()])
                    .stdin(Stdio::null())
                    .output()
                    .unwrap();
                let outcome = if output.status.success() {
                    Probe::Connected
                } else if String::from_utf8_lossy(&output.stderr).contains("refused") {
                    Probe::Refused
                } else {
                    Probe::TimedOut
                };
                outcomes.push((Instant::now(), outcome));
                std::thread::sleep(Duration::from_millis(50));
            }
            outcomes
        });
        Prober {
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Vec<(Instant, Probe)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

fn rounds_on_bridge(ovs: &OvsInstance) -> std::collections::BTreeSet<u64> {
    ovs.ovs_ofctl(&["-O", "OpenFlow14", "dump-flows", BRIDGE])
        .unwrap()
        .lines()
        .filter_map(|line| line.trim().strip_prefix("cookie=0x"))
        .filter_map(|rest| u64::from_str_radix(rest.split(',').next()?, 16).ok())
        .map(|cookie| cookie >> 48)
        .collect()
}

#[test]
fn agent_kill_and_ovs_restart_never_open_forbidden_traffic_and_leave_no_stale_flows() {
    let ovs_instance = OvsInstance::start().unwrap();
    let mut ovs = ovs_instance;
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies.yaml");
    write_policies(&policies, "policies: []\n");
    let mut agent = Agent::start(&ovs, &policies);
    let vms = attach_vms(&ovs);
    let generation = agent.metric("sluice_policy_generation ").unwrap();
    write_policies(&policies, &web_policy(vms.vm1_port, "10.0.0.2", ""));
    wait_generation(&agent, generation);
    assert_eq!(probe(&vms.vm2, "10.0.0.1", 80, "2").0, Probe::Connected);
    assert_eq!(rounds_on_bridge(&ovs), [1].into());

    // SIGKILL and restart the agent while probes run: the flows stay on the bridge, and the
    // new run swaps them for round 2 in one bundle.
    let allowed = Prober::start(&vms.vm2, 80, "1");
    let forbidden = Prober::start(&vms.vm3, 81, "1");
    std::thread::sleep(Duration::from_millis(300));
    agent.kill();
    std::thread::sleep(Duration::from_millis(300));
    let agent = Agent::start(&ovs, &policies);
    std::thread::sleep(Duration::from_millis(500));
    let allowed_outcomes = allowed.finish();
    let forbidden_outcomes = forbidden.finish();
    assert_eq!(
        rounds_on_bridge(&ovs),
        [2].into(),
        "stale round-1 flows are gone"
    );
    assert!(
        allowed_outcomes.len() >= 5,
        "too few probes: {allowed_outcomes:?}"
    );
    assert!(
        allowed_outcomes
            .iter()
            .all(|(_, outcome)| *outcome == Probe::Connected),
        "allowed traffic was cut across the agent restart: {allowed_outcomes:?}"
    );
    assert!(
        forbidden_outcomes
            .iter()
            .all(|(_, outcome)| *outcome != Probe::Connected),
        "forbidden traffic passed across the agent restart: {forbidden_outcomes:?}"
    );

    // Restart ovs-vswitchd: the userspace datapath loses every flow; fail mode secure keeps the
    // bridge closed until the agent replays. Measure that closed window.
    let allowed = Prober::start(&vms.vm2, 80, "1");
    let forbidden = Prober::start(&vms.vm3, 81, "1");
    std::thread::sleep(Duration::from_millis(300));
    let restarted = Instant::now();
    ovs.restart_vswitchd().unwrap();
    assert!(
        wait(Duration::from_secs(10), || probe(
            &vms.vm2, "10.0.0.1", 80, "1"
        )
        .0 == Probe::Connected),
        "allowed traffic never came back after the OVS restart"
    );
    std::thread::sleep(Duration::from_millis(300));
    let allowed_outcomes = allowed.finish();
    let forbidden_outcomes = forbidden.finish();
    assert!(
        forbidden_outcomes
            .iter()
            .all(|(_, outcome)| *outcome != Probe::Connected),
        "forbidden traffic passed across the OVS restart: {forbidden_outcomes:?}"
    );
    let last_failure = allowed_outcomes
        .iter()
        .filter(|(_, outcome)| *outcome != Probe::Connected)
        .map(|(at, _)| *at)
        .max();
    let closed = last_failure.map_or(Duration::ZERO, |at| at.saturating_duration_since(restarted));
    println!("closed window after an OVS restart (until the replay): about {closed:?}");
    assert!(closed < Duration::from_secs(5), "replay took {closed:?}");
    assert_eq!(
        rounds_on_bridge(&ovs),
        [2].into(),
        "the replay keeps the round"
    );
    assert!(agent.metric("sluice_policy_replays_total").unwrap_or(0.0) >= 1.0);
}
