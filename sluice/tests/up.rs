//! `sluice up` end to end: it prints its endpoints, curl reads valid Prometheus text from the
//! printed /metrics, /readyz is 200, and Ctrl-C (SIGINT) stops it with exit 0 within 2 s; as
//! root with Open vSwitch, its VM policy demo enforces the printed policy and leaves nothing
//! behind.
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use test_support::{
    is_root, prerequisite, program_on_path, wait_until, SluiceLauncher, SluiceProcess, ROOT_IN_CI,
};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

fn curl(url: &str) -> (String, String) {
    let output = Command::new("curl")
        .args([
            "--silent",
            "--show-error",
            "--max-time",
            "10",
            "--write-out",
            "\n%{http_code}",
            url,
        ])
        .output()
        .expect("curl is installed (scripts/test.sh installs it)");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
    (code.to_string(), body.to_string())
}

/// Parses the text with the reference Python client's OpenMetrics parser (strict) and lists
/// the families it found.
fn parse_with_python(text: &str) -> Vec<String> {
    let script = "import sys\n\
        from prometheus_client.openmetrics.parser import text_string_to_metric_families\n\
        for family in text_string_to_metric_families(sys.stdin.read()):\n\
        \x20   print(family.name, family.type, len(family.samples))\n";
    let mut child = Command::new(test_support::python())
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("python stdin")
        .write_all(text.as_bytes())
        .expect("write metrics to python");
    let output = child.wait_with_output().expect("python exits");
    assert!(
        output.status.success(),
        "OpenMetrics parser rejected the text: {}\n{text}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// `sluice up --ephemeral-ports` with `args`, once it has printed its whole banner.
fn start_up(args: &[&str], within: Duration) -> SluiceProcess {
    let process = SluiceLauncher::new(BIN)
        .unwrap()
        .args(["up", "--ephemeral-ports"])
        .args(args)
        .spawn()
        .expect("sluice up starts");
    assert!(
        wait_until(within, || process
            .stdout()
            .contains("Press Ctrl-C to stop.")),
        "stdout: {}\nstderr: {}",
        process.stdout(),
        process.stderr()
    );
    process
}

#[test]
fn up_prints_endpoints_serves_metrics_and_stops_on_ctrl_c() {
    let process = SluiceLauncher::new(BIN)
        .unwrap()
        .args(["up", "--ephemeral-ports", "--workers", "2"])
        .spawn()
        .expect("sluice up starts");
    let admin = process.address("admin");
    let printed = format!("http://{admin}/metrics");
    // The banner's last line: once it is out, the whole banner is (the URL comes earlier).
    assert!(
        wait_until(Duration::from_secs(5), || process
            .stdout()
            .contains("Press Ctrl-C to stop.")),
        "stdout: {}",
        process.stdout()
    );
    let stdout = process.stdout();
    assert!(stdout.contains(&format!("curl {printed}")), "{stdout}");
    assert!(stdout.contains("Press Ctrl-C to stop."), "{stdout}");

    // Take the URL from what was printed, as a user would.
    let url = stdout
        .split_whitespace()
        .find(|word| word.starts_with("http://") && word.ends_with("/metrics"))
        .expect("a /metrics URL is printed");
    let (code, metrics) = curl(url);
    assert_eq!(code, "200");
    let families = parse_with_python(&metrics);
    assert!(
        families
            .iter()
            .any(|family| family.starts_with("sluice_build_info gauge 1")),
        "{families:?}"
    );
    assert!(
        families
            .iter()
            .any(|family| family.starts_with("sluice_connections_accepted counter")),
        "{families:?}"
    );
    assert!(
        metrics.contains(&format!(
            "sluice_build_info{{version=\"0.1.0\",revision=\"{}\",driver=\"io_uring\"}} 1",
            sluice_admin::REVISION
        )),
        "{metrics}"
    );
    // The printed tunnel command works as printed (tests/call.rs runs it without Python):
    // through node, tunnel and agent to the demo echo backend.
    let call = printed_line(&stdout, " call --endpoint ").to_string();
    let (called, reply) = run_printed(&call);
    assert!(called && reply == "hello\n", "{call}: {reply}");
    // Many calls over the same connections, through the demo's own echo backend (a Sluice
    // forwarder must not send the empty DATA frames h2 peers count and cut off after 100).
    let external = call
        .split_whitespace()
        .skip_while(|word| *word != "--endpoint")
        .nth(1)
        .expect("the call names the node")
        .to_string();
    let secret = stdout
        .split_whitespace()
        .find(|word| word.ends_with("/jwt.secret"))
        .expect("the client command names the secret")
        .to_string();
    let calls = test_support::tunnel_client(
        "concurrency",
        &[
            "--node",
            &external,
            "--agent-id",
            "1",
            "--secret-file",
            &secret,
            "--clients",
            "4",
            "--requests",
            "150",
        ]
        .map(String::from),
    );
    assert_eq!(calls["calls"], 600, "{calls}");
    assert_eq!(calls["mismatches"], 0, "{calls}");
    let (code, body) = curl(&format!("http://{admin}/readyz"));
    assert_eq!((code.as_str(), body.as_str()), ("200", "ready\n"));
    // The printed kubectl command works as printed: through the gateway to the simulator.
    let kubectl = stdout
        .lines()
        .find(|line| line.trim_start().starts_with("kubectl --kubeconfig"))
        .expect("a kubectl command is printed")
        .trim()
        .to_string();
    let words: Vec<&str> = kubectl.split_whitespace().collect();
    let output = Command::new(words[0])
        .args(&words[1..])
        .output()
        .expect("kubectl is installed");
    let listed = String::from_utf8_lossy(&output.stdout);
    assert!(
        listed.contains("hello-sluice"),
        "{listed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    the_printed_kubectl_reaches_the_cluster_behind_nat(&stdout, "this node's tunnel");

    let mut process = process;
    let sent = Instant::now();
    process.signal(libc::SIGINT);
    let status = process
        .wait_exit(Duration::from_secs(5))
        .expect("exits after Ctrl-C");
    let took = sent.elapsed();
    assert_eq!(status.code(), Some(0), "stderr: {}", process.stderr());
    assert!(took < Duration::from_secs(2), "idle stop took {took:?}");
    assert!(process.stderr().contains("stopped"), "{}", process.stderr());
}

#[test]
fn sigterm_stops_the_daemon_with_exit_0_and_json_logs_when_asked() {
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let config = launcher
        .write_file(
            "sluice.yaml",
            "runtime: {workers: 1, driver: legacy, drain_timeout: 2s}\nlogging: {format: json}\nlisteners: {admin: {address: '127.0.0.1:0'}}\n",
        )
        .unwrap();
    let mut process = launcher
        .arg("run")
        .arg("--config")
        .arg(&config)
        .spawn()
        .unwrap();
    let (code, _) = curl(&format!("http://{}/healthz", process.address("admin")));
    assert_eq!(code, "200");
    process.signal(libc::SIGTERM);
    let status = process
        .wait_exit(Duration::from_secs(5))
        .expect("exits after SIGTERM");
    assert_eq!(status.code(), Some(0));
    let stderr = process.stderr();
    let mut messages = Vec::new();
    for line in stderr.lines() {
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|error| panic!("not JSON ({error}): {line}"));
        messages.push(event["message"].as_str().unwrap_or_default().to_string());
    }
    for expected in ["I/O driver selected", "ready", "stopped"] {
        assert!(
            messages.iter().any(|message| message == expected),
            "{expected:?} not in {messages:?}"
        );
    }
    assert!(stderr.contains("\"signal\":\"SIGTERM\""), "{stderr}");
}

/// A closed terminal or a lost SSH session sends SIGHUP: `up` stops as on Ctrl-C, exit 0,
/// and removes its directory (JWT secret, admin kubeconfig, CA key), the network namespaces
/// of its VM demo (as root with Open vSwitch) and its child processes.
#[test]
fn sighup_stops_up_and_leaves_nothing_behind() {
    let mut process = start_up(&["--workers", "1"], Duration::from_secs(15));
    let stdout = process.stdout();
    let demo_dir = stdout
        .split_whitespace()
        .find(|word| word.ends_with("/jwt.secret"))
        .map(|word| std::path::PathBuf::from(word).with_file_name(""))
        .expect("the demo directory is printed");
    assert!(demo_dir.is_dir(), "{}", demo_dir.display());
    let ours = format!("-{}", process.pid());
    let namespaces_of_up = || {
        Command::new("ip")
            .args(["netns", "list"])
            .output()
            .map(|output| {
                String::from_utf8_lossy(&output.stdout)
                    .lines()
                    .filter(|line| line.starts_with("sluice-up-") && line.contains(&ours))
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    let created = namespaces_of_up();
    if vm_demo_prerequisites() && !stdout.contains("VM policy demo: not started") {
        assert!(!created.is_empty(), "the VM demo made no namespace");
    }

    process.signal(libc::SIGHUP);
    let status = process
        .wait_exit(Duration::from_secs(15))
        .expect("exits after SIGHUP");
    let stderr = process.stderr();
    assert_eq!(status.code(), Some(0), "stderr: {stderr}");
    assert!(stderr.contains("SIGHUP"), "{stderr}");
    assert!(stderr.contains("stopped"), "{stderr}");
    assert!(!demo_dir.exists(), "{} left behind", demo_dir.display());
    assert_eq!(namespaces_of_up(), Vec::<String>::new(), "of {created:?}");
    let processes = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let processes = String::from_utf8_lossy(&processes.stdout);
    let dir = demo_dir.to_string_lossy();
    let dir = dir.trim_end_matches('/');
    assert!(
        !processes.lines().any(|line| line.contains(dir)),
        "processes of the demo left behind:\n{processes}"
    );
}

#[test]
fn a_busy_port_fails_start_up_with_the_listener_named() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = holder.local_addr().unwrap();
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let config = launcher
        .write_file(
            "sluice.yaml",
            &format!("listeners: {{admin: {{address: '{taken}'}}}}\n"),
        )
        .unwrap();
    let mut process = launcher
        .arg("run")
        .arg("--config")
        .arg(&config)
        .spawn_unready()
        .unwrap();
    let status = process.wait_exit(Duration::from_secs(10)).expect("exits");
    assert_eq!(status.code(), Some(1));
    assert!(
        process
            .stderr()
            .contains(&format!("cannot bind listener admin to {taken}")),
        "{}",
        process.stderr()
    );
}

#[test]
fn up_with_three_nodes_routes_the_printed_call_through_redis_and_cleans_up() {
    let process = start_up(&["--nodes", "3"], Duration::from_secs(10));
    let stdout = process.stdout();
    assert!(stdout.contains("keeps its tunnels on node-3"), "{stdout}");
    let node3_admin = stdout
        .lines()
        .find(|line| line.trim_start().starts_with("node-3"))
        .and_then(|line| {
            line.split(", ")
                .find_map(|part| part.split("admin ").nth(1).map(str::to_string))
        })
        .expect("node-3's admin address is printed");
    let demo_dir = stdout
        .split_whitespace()
        .find(|word| word.ends_with("/jwt.secret"))
        .map(|word| std::path::PathBuf::from(word).with_file_name(""))
        .expect("the demo directory is printed");

    // The printed command calls node 1; the agent is on node 3. Run as printed, with nothing on
    // PATH (no Python needed).
    let call = printed_line(&stdout, " call --endpoint ").to_string();
    let words: Vec<&str> = call.split_whitespace().collect();
    let output = Command::new(words[0])
        .args(&words[1..])
        .env_clear()
        .env("PATH", "/nonexistent")
        .output()
        .expect("the printed sluice call runs");
    assert_eq!(
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).as_ref()
        ),
        (Some(0), "hello\n"),
        "{call}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (code, metrics) = curl(&format!("http://{node3_admin}/metrics"));
    assert_eq!(code, "200");
    assert!(
        metrics.contains("sluice_tunnel_private_requests_total{code=\"OK\"} 1"),
        "node 3 served the call on its private endpoint: {metrics}"
    );
    the_printed_kubectl_reaches_the_cluster_behind_nat(&stdout, "Redis -> node-3");

    let mut process = process;
    process.signal(libc::SIGINT);
    let status = process
        .wait_exit(Duration::from_secs(10))
        .expect("exits after Ctrl-C");
    assert_eq!(status.code(), Some(0), "stderr: {}", process.stderr());
    // The child nodes and redis-server are gone with their directory.
    assert!(!demo_dir.exists(), "{} removed", demo_dir.display());
    let (code, _) = curl(&format!("http://{node3_admin}/healthz"));
    assert_eq!(code, "000", "node 3 stopped");
}

#[test]
fn up_with_nodes_but_no_redis_server_says_what_to_install() {
    let mut process = SluiceLauncher::new(BIN)
        .unwrap()
        .args(["up", "--nodes", "2", "--ephemeral-ports"])
        .env("PATH", "/nonexistent")
        .spawn_unready()
        .unwrap();
    let status = process.wait_exit(Duration::from_secs(10)).expect("exits");
    assert_eq!(status.code(), Some(1));
    assert!(
        process.stderr().contains("apt install redis-server"),
        "{}",
        process.stderr()
    );
}

/// The printed kubectl command for the cluster behind NAT works as printed: client -> gateway
/// -> the demo agent's tunnel (`path` says which way the banner says it goes) -> simulator.
fn the_printed_kubectl_reaches_the_cluster_behind_nat(stdout: &str, path: &str) {
    let line = printed_line(stdout, "--context behind-nat get pods");
    assert!(stdout.contains(path), "{stdout}");
    let (ok, output) = run_printed(line);
    assert!(ok && output.contains("hello-sluice"), "{line}: {output}");
}

/// Runs a printed command line (a `# comment` after it is not part of it); (success, output).
fn run_printed(line: &str) -> (bool, String) {
    let command = line.split('#').next().unwrap_or_default();
    let words: Vec<&str> = command.split_whitespace().collect();
    let output = Command::new(words[0])
        .args(&words[1..])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("cannot run {command}: {error}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

fn printed_line<'a>(stdout: &'a str, needle: &str) -> &'a str {
    stdout
        .lines()
        .map(str::trim)
        .find(|line| line.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in\n{stdout}"))
}

/// Whether the VM demo can run here: root, and the programs it starts (`scripts/test.sh`
/// installs them: openvswitch-switch, ethtool, netcat-openbsd, iputils-ping). A missing one
/// fails the test in CI and skips it loudly elsewhere.
fn vm_demo_prerequisites() -> bool {
    if !prerequisite(
        "root (the demo makes network namespaces)",
        is_root(),
        ROOT_IN_CI,
    ) {
        return false;
    }
    [
        "ovs-vswitchd",
        "ovsdb-server",
        "ovsdb-tool",
        "ethtool",
        "nc",
        "ping",
    ]
    .into_iter()
    .all(|program| {
        prerequisite(
            program,
            program_on_path(program),
            "scripts/test.sh installs it (openvswitch-switch, ethtool, netcat-openbsd, iputils-ping)",
        )
    })
}

#[test]
fn up_runs_the_vm_policy_demo_enforces_it_and_cleans_up() {
    if !vm_demo_prerequisites() {
        return;
    }
    let process = start_up(&["--workers", "1"], Duration::from_secs(15));
    let stdout = process.stdout();
    assert!(
        !stdout.contains("VM policy demo: not started"),
        "{stdout}\n{}",
        process.stderr()
    );
    let get_vm = printed_line(&stdout, " get vm ");
    let kubeconfig = get_vm
        .split_whitespace()
        .nth(2)
        .expect("kubectl --kubeconfig FILE get vm")
        .to_string();
    let ping = printed_line(&stdout, " ping -c 3 ").to_string();
    let probe = printed_line(&stdout, " nc -zv -w 2 ").to_string();
    let namespaces: Vec<String> = ["vm1 ", "vm2 "]
        .iter()
        .map(|vm| {
            let line = printed_line(&stdout, &format!("{vm} "));
            line.split_whitespace()
                .skip_while(|word| *word != "namespace")
                .nth(1)
                .expect("the VM's namespace is printed")
                .to_string()
        })
        .collect();
    let demo_dir = stdout
        .split_whitespace()
        .find(|word| word.ends_with("/jwt.secret"))
        .map(|word| std::path::PathBuf::from(word).with_file_name(""))
        .expect("the demo directory is printed");
    let kubectl = |args: &[&str]| {
        let output = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .output()
            .expect("kubectl is installed");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let agent_log =
        || std::fs::read_to_string(demo_dir.join("vm/vm-agent.log")).unwrap_or_default();

    assert!(
        wait_until(Duration::from_secs(30), || kubectl(&[
            "get",
            "vm",
            "vm1",
            "-o",
            "jsonpath={.status.state}"
        ]) == "AgentedConnected"),
        "vm1 never AgentedConnected; agent log:\n{}",
        agent_log()
    );
    // Connected comes with the agent's first report; the policy is realized in that report or
    // the next: wait for it, or a probe could pass before the flows are in.
    assert!(
        wait_until(Duration::from_secs(30), || kubectl(&[
            "get",
            "vmnp",
            "demo",
            "-o",
            "jsonpath={.status.realizedVMs}"
        ]) == "1"),
        "the demo policy never realized; agent log:\n{}",
        agent_log()
    );
    let (pinged, output) = run_printed(&ping);
    assert!(pinged, "allowed ICMP from vm2 failed: {ping}\n{output}");
    let started = Instant::now();
    let (connected, output) = run_printed(&probe);
    assert!(
        !connected && !output.contains("refused") && started.elapsed() >= Duration::from_secs(1),
        "TCP 22 from vm2 must time out (dropped), took {:?}: {output}",
        started.elapsed()
    );
    // Without the policy, the same probe is refused at once by vm1's own stack.
    let deleted = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["delete", "vmnp", "demo"])
        .status()
        .expect("kubectl");
    assert!(deleted.success());
    assert!(
        wait_until(Duration::from_secs(15), || run_printed(&probe)
            .1
            .contains("refused")),
        "TCP 22 never refused after the policy went; agent log:\n{}",
        agent_log()
    );

    let mut process = process;
    process.signal(libc::SIGINT);
    let status = process
        .wait_exit(Duration::from_secs(15))
        .expect("exits after Ctrl-C");
    assert_eq!(status.code(), Some(0), "stderr: {}", process.stderr());
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let netns = String::from_utf8_lossy(&netns.stdout);
    for name in &namespaces {
        assert!(
            !netns.contains(name.as_str()),
            "{name} left behind: {netns}"
        );
    }
    // The veth pair lived only in the two namespaces; nothing of the demo is on the host.
    let links = Command::new("ip").args(["-o", "link"]).output().unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(
        !links.contains("eth0~") && !links.contains("br-vm"),
        "{links}"
    );
    let processes = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let processes = String::from_utf8_lossy(&processes.stdout);
    let dir = demo_dir.to_string_lossy();
    let dir = dir.trim_end_matches('/');
    assert!(
        !processes.lines().any(|line| line.contains(dir)),
        "processes of the demo left behind:\n{processes}"
    );
    assert!(!demo_dir.exists(), "{} removed", demo_dir.display());
}

#[test]
fn up_goes_on_without_the_vm_demo_when_it_fails_to_start_and_cleans_up_its_part() {
    if !vm_demo_prerequisites() {
        return;
    }
    // vm2's namespace name is taken before `up` starts (the shell execs it, keeping its pid),
    // so the demo fails after creating vm1's namespace.
    let script = format!(
        "ip netns add sluice-up-vm2-$$ && exec {BIN} up --ephemeral-ports --workers 1 \"$@\""
    );
    let process = SluiceLauncher::new("sh")
        .unwrap()
        .args(["-c", &script, "sh"])
        .spawn()
        .expect("sluice up starts without the VM demo");
    let pid = process.pid();
    let taken = format!("sluice-up-vm2-{pid}");
    let release = || {
        let _ = Command::new("ip").args(["netns", "del", &taken]).status();
    };
    let printed = wait_until(Duration::from_secs(15), || {
        process.stdout().contains("Press Ctrl-C to stop.")
    });
    let stdout = process.stdout();
    let stderr = process.stderr();
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let netns = String::from_utf8_lossy(&netns.stdout).into_owned();
    let mut process = process;
    process.signal(libc::SIGINT);
    let status = process.wait_exit(Duration::from_secs(15));
    release();
    assert!(printed, "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stdout.contains("VM policy demo: not started (failed: ") && stdout.contains(&taken),
        "{stdout}"
    );
    assert!(
        stdout.contains("actions=conjunction("),
        "the flows are printed: {stdout}"
    );
    assert!(
        stderr.contains("VM policy demo not started, cleaned up"),
        "{stderr}"
    );
    assert!(
        !netns.contains(&format!("sluice-up-vm1-{pid}")),
        "vm1's namespace was not removed: {netns}"
    );
    assert_eq!(status.and_then(|status| status.code()), Some(0));
}
