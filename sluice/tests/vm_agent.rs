//! `sluice vm-agent` against a real Open vSwitch (userspace netdev datapath) with network
//! namespaces as VMs and real packets (`nc`, `ping`).
#![allow(clippy::unwrap_used)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use test_support::{metric_value, NetNs, OvsInstance, VmAgentProcess};

// The Reject meter's flood test, in a file of its own beside this one (not a test binary of its
// own: it shares the agent and VM helpers above).
#[path = "vm_agent/reject_meter.rs"]
mod reject_meter;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const BRIDGE: &str = "brvm";

/// The agent process, reached on its admin address.
struct Agent(VmAgentProcess);

impl Agent {
    fn start(ovs: &OvsInstance, policies: &Path) -> Agent {
        Agent::start_with(ovs, policies, &[])
    }

    /// Starts the agent with `extra` flags after the usual ones.
    fn start_with(ovs: &OvsInstance, policies: &Path, extra: &[&str]) -> Agent {
        let mut command = Command::new(BIN);
        command
            .args(["vm-agent", "--bridge", BRIDGE, "--admin", "127.0.0.1:0"])
            .arg("--policies")
            .arg(policies)
            .arg("--ovs-rundir")
            .arg(ovs.rundir())
            .args(["--stats-interval", "300ms"])
            .args(extra)
            .env("RUST_LOG", "info,sluice_policy_engine=debug");
        let agent = Agent(VmAgentProcess::spawn(command).unwrap());
        assert!(
            wait(Duration::from_secs(20), || agent.get("/readyz").0 == 200),
            "agent never became ready"
        );
        agent
    }

    fn get(&self, path: &str) -> (u16, String) {
        let Ok(admin) = self.0.admin.parse::<SocketAddr>() else {
            return (0, String::new());
        };
        let Ok(mut stream) = TcpStream::connect_timeout(&admin, Duration::from_secs(2)) else {
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
        metric_value(&self.get("/metrics").1, prefix)
    }

    fn log(&self) -> String {
        self.0.log()
    }

    fn kill(&mut self) {
        self.0.kill();
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

/// UDP port of the `stats` rule, whose counters the tests check to the packet.
const STATS_PORT: u16 = 5000;

/// vm1 admits TCP 80 and UDP 5000 from the `clients` group and refuses (Reject) TCP 22 from vm3.
fn web_policy(vm1_port: u32, clients: &str) -> String {
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
      - {{name: stats, direction: Ingress, action: Allow, peers: {{addressGroups: [clients]}}, services: [{{protocol: UDP, port: {STATS_PORT}}}]}}
"#
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

/// Sends `count` UDP datagrams of `payload` bytes from `from` to vm1's stats port, each from
/// its own source port, so that each one is a new conntrack connection.
fn send_datagrams(from: &NetNs, count: u16, payload: usize) {
    let script = format!(
        "import socket\n\
         for port in range(41000, 41000 + {count}):\n\
         \x20   s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         \x20   s.bind(('0.0.0.0', port))\n\
         \x20   s.sendto(b'x' * {payload}, ('10.0.0.1', {STATS_PORT}))\n\
         \x20   s.close()\n"
    );
    let output = from.exec(&["python3", "-c", &script]).unwrap();
    assert!(output.status.success(), "{output:?}");
}

/// The agent runs from a policy directory: files appear, change, break and disappear under it.
#[test]
fn policies_are_enforced_with_real_packets_and_hot_reloaded() {
    let ovs = OvsInstance::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies.d");
    std::fs::create_dir(&policies).unwrap();
    let web = policies.join("10-web.yaml");
    // Starts from an empty directory: no policy.
    let agent = Agent::start(&ovs, &policies);
    let vms = attach_vms(&ovs);

    // No policy: nothing is isolated.
    assert_eq!(probe(&vms.vm3, "10.0.0.1", 81, "2").0, Probe::Connected);

    let generation = agent.metric("sluice_policy_generation ").unwrap();
    write_policies(&web, &web_policy(vms.vm1_port, "10.0.0.2"));
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
    // The bound is the behaviour: a refusal answers at once, where a drop would run into the
    // probe's 3 s timeout; 1.5 s of margin for starting nc in the namespace on a loaded machine.
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

    // Per-rule counters count exactly the packets sent. Each datagram comes from its own source
    // port, so each is conntrack state +new and reaches the rule's conj_id flow once (later
    // packets of a connection, and vm1's ICMP port-unreachable answers, are +est/+rel and pass
    // in the conntrack table before any rule). Flow stats count whole Ethernet frames:
    // 14 (Ethernet) + 20 (IPv4) + 8 (UDP) + payload, no VLAN tag, above the 60-byte minimum.
    const DATAGRAMS: u16 = 25;
    const PAYLOAD: usize = 100;
    let packets =
        r#"sluice_policy_rule_packets_total{policy="web",rule="stats",direction="Ingress"}"#;
    let bytes = r#"sluice_policy_rule_bytes_total{policy="web",rule="stats",direction="Ingress"}"#;
    assert_eq!(
        agent.metric(packets),
        Some(0.0),
        "{}",
        agent.get("/metrics").1
    );
    send_datagrams(&vms.vm2, DATAGRAMS, PAYLOAD);
    assert!(
        wait(Duration::from_secs(5), || agent
            .metric(packets)
            .unwrap_or(0.0)
            >= f64::from(DATAGRAMS)),
        "rule counter did not count the datagrams: {}",
        agent.get("/metrics").1
    );
    // A stats poll after the datagrams, proved by another rule's counter: one TCP connect from
    // vm2 to port 80 is one SYN on the `http` rule, and the poll that shows it read every flow
    // after that SYN, so after the datagrams. A counter counting anything else would have moved.
    let http = r#"sluice_policy_rule_packets_total{policy="web",rule="http",direction="Ingress"}"#;
    let a_later_stats_poll = || {
        let before = agent.metric(http).unwrap_or(0.0);
        assert_eq!(probe(&vms.vm2, "10.0.0.1", 80, "2").0, Probe::Connected);
        assert!(
            wait(Duration::from_secs(5), || agent.metric(http).unwrap_or(0.0)
                > before),
            "no stats poll counted the SYN: {}",
            agent.get("/metrics").1
        );
    };
    a_later_stats_poll();
    assert_eq!(agent.metric(packets), Some(f64::from(DATAGRAMS)));
    assert_eq!(
        agent.metric(bytes),
        Some(f64::from(DATAGRAMS) * (14 + 20 + 8 + PAYLOAD) as f64)
    );
    // vm3 is not in the clients group: its datagrams never reach the rule.
    send_datagrams(&vms.vm3, 5, PAYLOAD);
    a_later_stats_poll();
    assert_eq!(agent.metric(packets), Some(f64::from(DATAGRAMS)));
    assert!(
        agent.metric(http).unwrap_or(0.0) >= 2.0,
        "rule counter did not count the SYNs"
    );

    // A bad file next to a good one: the whole directory is refused, the error names the file,
    // the path inside it and the reason, and the running policy stays.
    let broken = policies.join("90-broken.yaml");
    std::fs::write(
        &broken,
        "policies: [{name: web, priority: 7, appliedTo: [vm1]}]\n",
    )
    .unwrap();
    assert!(wait(Duration::from_secs(5), || agent
        .metric("sluice_policy_reload_errors_total")
        .unwrap_or(0.0)
        >= 1.0));
    let log = agent.log();
    let reported = log.lines().find(|line| line.contains("policies refused"));
    let reported = reported.unwrap_or_else(|| panic!("no refusal logged:\n{log}"));
    for part in [
        broken.display().to_string(),
        "policies[0].name".to_string(),
        format!("is already defined in {}", web.display()),
    ] {
        assert!(reported.contains(&part), "{part:?} missing in {reported:?}");
    }
    assert_eq!(probe(&vms.vm2, "10.0.0.1", 80, "2").0, Probe::Connected);
    std::fs::remove_file(&broken).unwrap();

    // Priority: a higher-priority Drop, in a file of its own that appears, wins over the Allow;
    // it uses groups defined in the other file.
    let deny = policies.join("50-deny.json");
    write_policies(
        &deny,
        r#"{"policies": [{"name": "deny-http", "priority": 5, "appliedTo": ["vm1"],
            "rules": [{"direction": "Ingress", "action": "Drop",
                       "peers": {"addressGroups": ["clients"]},
                       "services": [{"protocol": "TCP", "port": 80}]}]}]}"#,
    );
    let generation = wait_generation(&agent, generation);
    assert_eq!(
        probe(&vms.vm2, "10.0.0.1", 80, "1").0,
        Probe::TimedOut,
        "Drop overrides"
    );

    // The file disappears: back to the web policy alone, with one connection kept open across
    // adding vm3 to the group.
    std::fs::remove_file(&deny).unwrap();
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
    write_policies(&web, &web_policy(vms.vm1_port, "10.0.0.2, 10.0.0.3"));
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

    // Deleting the last file restores the default (everything passes).
    std::fs::remove_file(&web).unwrap();
    wait_generation(&agent, generation);
    assert_eq!(probe(&vms.vm3, "10.0.0.1", 81, "2").0, Probe::Connected);
}

/// Outcomes of probes sent every ~50 ms from a background thread.
struct Prober {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    thread: Option<std::thread::JoinHandle<Vec<(Instant, Probe)>>>,
}

impl Prober {
    fn start(from: &NetNs, port: u16, timeout_secs: &'static str) -> Prober {
        let namespace = from.name().to_string();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counting = count.clone();
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
                counting.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
            outcomes
        });
        Prober {
            stop,
            count,
            thread: Some(thread),
        }
    }

    /// Waits until the prober has made `more` probes beyond what it had made when called.
    fn wait_for_more(&self, more: usize) {
        let target = self.count.load(std::sync::atomic::Ordering::Relaxed) + more;
        assert!(
            wait(Duration::from_secs(20), || self
                .count
                .load(std::sync::atomic::Ordering::Relaxed)
                >= target),
            "the allowed-side prober stalled"
        );
    }

    fn finish(mut self) -> Vec<(Instant, Probe)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

/// Connects to vm1's port 80 from a namespace every ~5 ms (50 ms timeout per attempt, a new
/// socket each time) until stopped, and reports the longest time between two successful
/// connects: how long allowed traffic was cut, to about a probe's length.
struct GapProber {
    child: Child,
    stop: std::path::PathBuf,
    /// Successful connects so far (the script prints `ok` for each).
    successes: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The script's last line: `<gap> <failed> <probes>`.
    summary: Option<std::thread::JoinHandle<String>>,
}

impl GapProber {
    const SCRIPT: &'static str = "\
import os, socket, sys, time
stop = sys.argv[1]
last_ok = None
gap = 0.0
failed = probes = 0
while not os.path.exists(stop):
    started = time.monotonic()
    s = socket.socket()
    s.settimeout(0.05)
    try:
        s.connect(('10.0.0.1', 80))
        if last_ok is not None:
            gap = max(gap, started - last_ok)
        last_ok = started
        print('ok', flush=True)
    except OSError:
        failed += 1
    finally:
        s.close()
    probes += 1
    time.sleep(0.005)
print(f'{gap:.3f} {failed} {probes}')
";

    fn start(from: &NetNs, dir: &Path) -> GapProber {
        let stop = dir.join("gap-prober.stop");
        let _ = std::fs::remove_file(&stop);
        let mut child = Command::new("ip")
            .args(["netns", "exec", from.name(), "python3", "-c", Self::SCRIPT])
            .arg(&stop)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let successes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counting = successes.clone();
        let stdout = child.stdout.take().unwrap();
        let summary = std::thread::spawn(move || {
            let mut last = String::new();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line == "ok" {
                    counting.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                } else {
                    last = line;
                }
            }
            last
        });
        GapProber {
            child,
            stop,
            successes,
            summary: Some(summary),
        }
    }

    /// Waits until `more` connects succeeded beyond those made when called.
    fn wait_for_successes(&self, more: usize) {
        let target = self.successes.load(std::sync::atomic::Ordering::Relaxed) + more;
        assert!(
            wait(Duration::from_secs(20), || self
                .successes
                .load(std::sync::atomic::Ordering::Relaxed)
                >= target),
            "the allowed side never connected again"
        );
    }

    /// The longest gap, failed probes, all probes.
    fn finish(mut self) -> (Duration, u32, u32) {
        std::fs::write(&self.stop, "").unwrap();
        let _ = self.child.wait();
        let text = self.summary.take().unwrap().join().unwrap();
        let mut fields = text.split_whitespace();
        let mut next = || {
            fields
                .next()
                .unwrap_or_else(|| panic!("prober said {text:?}"))
        };
        let gap = Duration::from_secs_f64(next().parse().unwrap());
        (gap, next().parse().unwrap(), next().parse().unwrap())
    }
}

impl Drop for GapProber {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CLOCK_MONOTONIC in seconds: the clock Python's `time.monotonic()` reads, so the probers'
/// times and the test's windows compare.
fn monotonic_now() -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the valid, local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as f64 + now.tv_nsec as f64 / 1e9
}

/// Probes the forbidden side as densely as [`GapProber`] probes the allowed one: a new
/// non-blocking connect to vm1's `port` every ~5 ms, each given 200 ms to connect, be refused or
/// time out (a dropped SYN). Each probe samples the datapath when its SYN crosses it, so a
/// forbidden window longer than a few milliseconds cannot slip between two probes. Every
/// settled probe is printed as it settles: `<monotonic start> <outcome>`.
struct DenseProber {
    child: Child,
    stop: std::path::PathBuf,
    outcomes: std::sync::Arc<std::sync::Mutex<Vec<(f64, Probe)>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl DenseProber {
    const SCRIPT: &'static str = "\
import errno, os, select, socket, sys, time
stop, port = sys.argv[1], int(sys.argv[2])
pending = []
def settle(now, final):
    global pending
    sockets = [s for _, s in pending]
    writable = set(select.select([], sockets, [], 0)[1]) if sockets else set()
    keep = []
    for started, s in pending:
        if s in writable:
            error = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            outcome = 'connected' if error == 0 else ('refused' if error == errno.ECONNREFUSED else 'error')
        elif final or now - started > 0.2:
            outcome = 'timedout'
        else:
            keep.append((started, s))
            continue
        s.close()
        print(f'{started:.6f} {outcome}', flush=True)
    pending = keep
while not os.path.exists(stop):
    s = socket.socket()
    s.setblocking(False)
    started = time.monotonic()
    s.connect_ex(('10.0.0.1', port))
    pending.append((started, s))
    time.sleep(0.005)
    settle(time.monotonic(), False)
deadline = time.monotonic() + 0.2
while pending and time.monotonic() < deadline:
    time.sleep(0.01)
    settle(time.monotonic(), False)
settle(time.monotonic(), True)
";

    fn start(from: &NetNs, port: u16, dir: &Path) -> DenseProber {
        let stop = dir.join(format!("dense-prober-{port}.stop"));
        let _ = std::fs::remove_file(&stop);
        let mut child = Command::new("ip")
            .args(["netns", "exec", from.name(), "python3", "-c", Self::SCRIPT])
            .arg(&stop)
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let outcomes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let collected = outcomes.clone();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let mut fields = line.split_whitespace();
                let started: f64 = fields.next().and_then(|t| t.parse().ok()).unwrap_or(0.0);
                let outcome = match fields.next() {
                    Some("connected") => Probe::Connected,
                    Some("refused") => Probe::Refused,
                    _ => Probe::TimedOut,
                };
                collected.lock().unwrap().push((started, outcome));
            }
        });
        DenseProber {
            child,
            stop,
            outcomes,
            reader: Some(reader),
        }
    }

    /// How many probes that started at or after `since` (monotonic seconds) have settled.
    fn settled_since(&self, since: f64) -> usize {
        self.outcomes
            .lock()
            .unwrap()
            .iter()
            .filter(|(started, _)| *started >= since)
            .count()
    }

    /// Waits until at least `count` probes started at or after `since` have settled.
    fn wait_for(&self, count: usize, since: f64) {
        assert!(
            wait(Duration::from_secs(10), || self.settled_since(since)
                >= count),
            "the forbidden-side prober made {} probes, not {count}",
            self.settled_since(since)
        );
    }

    fn finish(mut self) -> Vec<(f64, Probe)> {
        std::fs::write(&self.stop, "").unwrap();
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        std::mem::take(&mut *self.outcomes.lock().unwrap())
    }
}

impl Drop for DenseProber {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asserts that no forbidden probe connected, and that the window `[from, to]` (monotonic
/// seconds) was sampled densely: at least one probe started per 50 ms of it on average (the
/// prober aims at one per ~5 ms; 10x is the margin for a loaded machine) and never fewer than 10.
fn assert_forbidden_closed(outcomes: &[(f64, Probe)], from: f64, to: f64, what: &str) {
    let passed: Vec<_> = outcomes
        .iter()
        .filter(|(_, outcome)| *outcome == Probe::Connected)
        .collect();
    assert!(
        passed.is_empty(),
        "forbidden traffic passed across {what}: {} of {} probes connected, first at {:?} (window {from:.3}..{to:.3})",
        passed.len(),
        outcomes.len(),
        passed.first()
    );
    let inside = outcomes
        .iter()
        .filter(|(started, _)| (from..=to).contains(started))
        .count();
    let window = to - from;
    let minimum = ((window / 0.05) as usize).max(10);
    println!("{what}: {inside} forbidden probes in the {window:.3} s window, none connected");
    assert!(
        inside >= minimum,
        "only {inside} forbidden probes inside the {window:.3} s window of {what} (at least {minimum})"
    );
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
    write_policies(&policies, &web_policy(vms.vm1_port, "10.0.0.2"));
    wait_generation(&agent, generation);
    assert_eq!(probe(&vms.vm2, "10.0.0.1", 80, "2").0, Probe::Connected);
    assert_eq!(rounds_on_bridge(&ovs), [1].into());

    // SIGKILL and restart the agent while probes run: the flows stay on the bridge, and the
    // new run swaps them for round 2 in one bundle.
    let allowed = Prober::start(&vms.vm2, 80, "1");
    let forbidden = DenseProber::start(&vms.vm3, 81, dir.path());
    // Both probers are under way before the kill.
    let probing_since = monotonic_now();
    allowed.wait_for_more(3);
    forbidden.wait_for(10, probing_since);
    let window_from = monotonic_now();
    agent.kill();
    // Probes while no agent runs at all (the flows alone enforce).
    allowed.wait_for_more(3);
    forbidden.wait_for(10, window_from);
    let agent = Agent::start(&ovs, &policies);
    assert!(
        wait(Duration::from_secs(10), || rounds_on_bridge(&ovs)
            == [2].into()),
        "the new agent never swapped in round 2: stale round-1 flows remain"
    );
    let window_to = monotonic_now();
    // And probes after the swap.
    allowed.wait_for_more(3);
    forbidden.wait_for(10, window_to);
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
    assert_forbidden_closed(
        &forbidden_outcomes,
        window_from,
        window_to,
        "the agent restart",
    );

    // Restart ovs-vswitchd: the userspace datapath loses every flow; fail mode secure keeps the
    // bridge closed until the agent replays. Measure that closed window.
    let allowed = GapProber::start(&vms.vm2, dir.path());
    let forbidden = DenseProber::start(&vms.vm3, 81, dir.path());
    let probing_since = monotonic_now();
    allowed.wait_for_successes(3);
    forbidden.wait_for(10, probing_since);
    let window_from = monotonic_now();
    let restarted = Instant::now();
    ovs.restart_vswitchd().unwrap();
    let switch_back = restarted.elapsed();
    assert!(
        wait(Duration::from_secs(10), || probe(
            &vms.vm2, "10.0.0.1", 80, "1"
        )
        .0 == Probe::Connected),
        "allowed traffic never came back after the OVS restart"
    );
    let window_to = monotonic_now();
    // The gap prober has seen traffic come back too, and the forbidden side is probed after.
    allowed.wait_for_successes(3);
    forbidden.wait_for(10, window_to);
    let (closed, failed, probes) = allowed.finish();
    let forbidden_outcomes = forbidden.finish();
    assert_forbidden_closed(
        &forbidden_outcomes,
        window_from,
        window_to,
        "the OVS restart",
    );
    println!(
        "OVS restart: ovs-vswitchd accepted OpenFlow again after {switch_back:?}; allowed \
         traffic closed for {closed:?} (longest gap between successful connects; {failed} of \
         {probes} probes failed)"
    );
    assert!(
        failed > 0,
        "the restart cut nothing: the probe cannot see the window"
    );
    // The bound is the behaviour: the agent replays on its own as soon as the switch is back
    // (typically well under a second), not at a reconcile timer; 5 s leaves the margin.
    assert!(closed < Duration::from_secs(5), "replay took {closed:?}");
    // A restart the way `ovs-ctl restart` does it: other_config:flow-restore-wait=true first.
    // The new ovs-vswitchd forwards nothing, flows or not, until the key is cleared: the agent
    // clears it once its replay is in.
    ovs.ovs_vsctl(&[
        "set",
        "Open_vSwitch",
        ".",
        "other_config:flow-restore-wait=true",
    ])
    .unwrap();
    let allowed = GapProber::start(&vms.vm2, dir.path());
    let forbidden = DenseProber::start(&vms.vm3, 81, dir.path());
    let probing_since = monotonic_now();
    allowed.wait_for_successes(3);
    forbidden.wait_for(10, probing_since);
    let window_from = monotonic_now();
    ovs.restart_vswitchd().unwrap();
    assert!(
        wait(Duration::from_secs(10), || probe(
            &vms.vm2, "10.0.0.1", 80, "1"
        )
        .0 == Probe::Connected),
        "allowed traffic never came back after a flow-restore-wait restart"
    );
    let window_to = monotonic_now();
    allowed.wait_for_successes(3);
    forbidden.wait_for(10, window_to);
    let (closed, _, _) = allowed.finish();
    let forbidden_outcomes = forbidden.finish();
    assert_forbidden_closed(
        &forbidden_outcomes,
        window_from,
        window_to,
        "the flow-restore-wait restart",
    );
    let other_config = ovs
        .ovs_vsctl(&["get", "Open_vSwitch", ".", "other_config"])
        .unwrap();
    assert!(
        !other_config.contains("flow-restore-wait"),
        "the agent left {other_config}"
    );
    println!("OVS restart with flow-restore-wait: allowed traffic closed for {closed:?}");
    // The bound is the behaviour: the agent replays on its own as soon as the switch is back
    // (typically well under a second), not at a reconcile timer; 5 s leaves the margin.
    assert!(closed < Duration::from_secs(5), "replay took {closed:?}");
    assert_eq!(
        rounds_on_bridge(&ovs),
        [2].into(),
        "the replay keeps the round"
    );
    assert!(agent.metric("sluice_policy_replays_total").unwrap_or(0.0) >= 1.0);
}

/// Reject over IPv6: the agent answers TCP with a RST and other protocols with ICMPv6
/// destination unreachable, which the sender's own stack accepts (checksums, quoting).
#[test]
fn ipv6_reject_answers_with_reset_and_icmpv6_unreachable() {
    let ovs = OvsInstance::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies.yaml");
    write_policies(&policies, "policies: []\n");
    let agent = Agent::start(&ovs, &policies);
    let (vm1, vm3) = (NetNs::new("vmd").unwrap(), NetNs::new("vme").unwrap());
    let vm1_port = vm1.attach_veth(&ovs, BRIDGE, "10.0.1.1/24").unwrap().ofport;
    vm3.attach_veth(&ovs, BRIDGE, "10.0.1.3/24").unwrap();
    // nodad: usable at once instead of after duplicate address detection (about a second).
    vm1.run(&["ip", "addr", "add", "fd00::1/64", "dev", "eth0", "nodad"])
        .unwrap();
    vm3.run(&["ip", "addr", "add", "fd00::3/64", "dev", "eth0", "nodad"])
        .unwrap();
    // Listeners behind the Reject rules: a reply from vm1 itself would prove the packet passed.
    let mut listeners = [
        vm1.spawn(&["nc", "-6", "-lk", "-n", "fd00::1", "22"])
            .unwrap(),
        vm1.spawn(&["nc", "-6", "-u", "-lk", "-n", "fd00::1", "53"])
            .unwrap(),
    ];
    assert!(
        test_support::wait_until(Duration::from_secs(10), || probe(&vm3, "fd00::1", 22, "1")
            .0
            == Probe::Connected),
        "IPv6 listener unreachable before the policy"
    );

    let generation = agent.metric("sluice_policy_generation ").unwrap();
    write_policies(
        &policies,
        &format!(
            r#"
addressGroups:
  - {{name: vm3, members: ["fd00::3"]}}
appliedToGroups:
  - name: vm1
    members: [{{name: vm1-eth0, ofport: {vm1_port}, ips: ["fd00::1"]}}]
policies:
  - name: closed
    priority: 1
    appliedTo: [vm1]
    rules:
      - {{name: ssh, direction: Ingress, action: Reject, peers: {{addressGroups: [vm3]}}, services: [{{protocol: TCP, port: 22}}]}}
      - {{name: dns, direction: Ingress, action: Reject, peers: {{addressGroups: [vm3]}}, services: [{{protocol: UDP, port: 53}}]}}
      - {{name: ping, direction: Ingress, action: Reject, peers: {{addressGroups: [vm3]}}, services: [{{protocol: ICMP}}]}}
"#
        ),
    );
    wait_generation(&agent, generation);

    let (outcome, took) = probe(&vm3, "fd00::1", 22, "3");
    assert_eq!(outcome, Probe::Refused, "TCP gets a RST over IPv6");
    // The bound is the behaviour: a refusal answers at once, where a drop would run into the
    // probe's 3 s timeout; 1.5 s of margin for starting nc in the namespace on a loaded machine.
    assert!(took < Duration::from_millis(1500), "refusal took {took:?}");

    // A connected UDP socket reports an ICMPv6 port unreachable as ECONNREFUSED.
    let udp = vm3
        .exec(&[
            "python3",
            "-c",
            "import socket\n\
             s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n\
             s.settimeout(3)\n\
             s.connect(('fd00::1', 53))\n\
             s.send(b'query')\n\
             try:\n\
             \x20   s.recv(100)\n\
             \x20   print('answered')\n\
             except ConnectionRefusedError:\n\
             \x20   print('refused')\n\
             except socket.timeout:\n\
             \x20   print('timeout')\n",
        ])
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&udp.stdout).trim(),
        "refused",
        "{udp:?}"
    );

    let ping = vm3
        .exec(&["ping", "-6", "-n", "-c", "1", "-W", "3", "fd00::1"])
        .unwrap();
    let ping_text = String::from_utf8_lossy(&ping.stdout);
    assert!(
        ping_text.contains("Administratively prohibited"),
        "{ping_text}"
    );

    assert!(
        wait(Duration::from_secs(3), || {
            let (_, metrics) = agent.get("/metrics");
            let value = |kind: &str| {
                metrics
                    .lines()
                    .find(|line| {
                        line.starts_with(&format!(
                            "sluice_policy_reject_replies_total{{kind=\"{kind}\"}}"
                        ))
                    })
                    .and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            value("tcp_reset") >= 1.0 && value("icmp_unreachable") >= 2.0
        }),
        "reject replies not counted: {}",
        agent.get("/metrics").1
    );
    for listener in &mut listeners {
        let _ = listener.kill();
        let _ = listener.wait();
    }
}
