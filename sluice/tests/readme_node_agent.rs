//! The README's minimal node and agent, started with the README's own commands on one host:
//! both come up on their default admin ports (9901 and 9902), and the agent's tunnels reach the
//! node. The YAML and the commands are read from README.md, so the README cannot drift; only
//! what names this host's files and free ports is substituted.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use sha2::{Digest, Sha256};
use test_support::{assert_driver, on_both_drivers, wait_until, Certificates, SluiceLauncher};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// The two cases use the same fixed default admin ports: one at a time.
static DEFAULT_PORTS: Mutex<()> = Mutex::new(());

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap()
}

/// The YAML block after "A minimal node and agent:", as (node, agent) documents.
fn minimal_configs(readme: &str) -> (String, String) {
    let after = readme
        .split_once("A minimal node and agent:")
        .expect("README has its minimal node and agent")
        .1;
    let block = after
        .split_once("```yaml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("a yaml block")
        .0;
    let (node, agent) = block.split_once("\n---\n").expect("two documents");
    (node.to_string(), agent.to_string())
}

/// The arguments of the README's `sluice <role> --config FILE` line (its comment dropped).
fn command_of(readme: &str, role: &str) -> Vec<String> {
    let prefix = format!("sluice {role} --config ");
    let line = readme
        .lines()
        .find(|line| line.starts_with(&prefix))
        .unwrap_or_else(|| panic!("README shows `{prefix}...`"));
    let command = line.split('#').next().unwrap();
    command
        .split_whitespace()
        .skip(1)
        .map(str::to_string)
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn curl(url: &str) -> (String, String) {
    let output = Command::new("curl")
        .args([
            "-s",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            "--max-time",
            "5",
            url,
        ])
        .output()
        .expect("curl is installed");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.to_string(), body.to_string())
}

on_both_drivers!(the_readme_node_and_agent_start_together_on_one_host);

fn the_readme_node_and_agent_start_together_on_one_host(driver: &str) {
    let _ports = DEFAULT_PORTS.lock().unwrap_or_else(|e| e.into_inner());
    // A previous case's io_uring rings release their sockets after the process is reaped
    // (the kernel tears a ring down asynchronously): allow them a few seconds.
    for port in [9901, 9902] {
        assert!(
            wait_until(Duration::from_secs(10), || std::net::TcpListener::bind((
                "127.0.0.1",
                port
            ))
            .is_ok()),
            "127.0.0.1:{port} is taken by another process: this test needs the default admin ports"
        );
    }
    let readme = readme();
    let (node_yaml, agent_yaml) = minimal_configs(&readme);
    let certs = Certificates::generate(&[]).unwrap();
    let etc = tempfile::tempdir().unwrap();
    let etc_path = format!("{}/", etc.path().display());
    let token = "readme-agent-token-0123456789abcdef";
    std::fs::write(etc.path().join("agent.token"), token).unwrap();
    std::fs::write(
        etc.path().join("jwt.secret"),
        "0123456789abcdef0123456789abcdef",
    )
    .unwrap();
    std::fs::copy(&certs.ca_cert, etc.path().join("ca.pem")).unwrap();
    let (agent_port, external_port) = (free_port(), free_port());
    let here = |yaml: &str| {
        yaml.replace("/etc/sluice/", &etc_path)
            .replace("node-key.pem", &certs.server_key.display().to_string())
            .replace("node.pem", &certs.server_cert.display().to_string())
            .replace("0.0.0.0:8150", &format!("127.0.0.1:{agent_port}"))
            .replace("0.0.0.0:8151", &format!("127.0.0.1:{external_port}"))
            .replace("node.example.com:8150", &format!("localhost:{agent_port}"))
            .replace(
                "<sha256 of agent 7's token>",
                &hex::encode(Sha256::digest(token.as_bytes())),
            )
    };
    let node_yaml = here(&node_yaml);
    let agent_yaml = here(&agent_yaml);
    assert!(
        !node_yaml.contains("admin") && !agent_yaml.contains("admin"),
        "the README's pair relies on the default admin ports"
    );
    std::fs::write(etc.path().join("node.yaml"), &node_yaml).unwrap();
    std::fs::write(etc.path().join("agent.yaml"), &agent_yaml).unwrap();
    let start = |role: &str| {
        let args: Vec<String> = command_of(&readme, role)
            .into_iter()
            .map(|arg| arg.replace("/etc/sluice/", &etc_path))
            .collect();
        SluiceLauncher::new(BIN)
            .unwrap()
            .args(&args)
            .args(["--driver", driver, "--workers", "1"])
            .spawn()
            .unwrap_or_else(|error| {
                panic!("{role} did not start: {error}\n{node_yaml}\n{agent_yaml}")
            })
    };
    let node = start("run");
    let agent = start("agent");
    assert_eq!(node.address("admin").port(), 9901);
    assert_eq!(agent.address("admin").port(), 9902);
    for process in [&node, &agent] {
        let (code, _) = curl(&format!("http://{}/readyz", process.address("admin")));
        assert_eq!(code, "200", "{}", process.stderr());
        let (_, metrics) = curl(&format!("http://{}/metrics", process.address("admin")));
        assert_driver(&metrics, driver);
    }
    assert!(
        wait_until(Duration::from_secs(10), || curl(
            "http://127.0.0.1:9901/metrics"
        )
        .1
        .lines()
        .any(|line| line == "sluice_tunnel_connected_agents 1")),
        "the agent never reached the node; node:\n{}\nagent:\n{}",
        node.stderr(),
        agent.stderr()
    );
}
