//! Configuration reload (SIGHUP) of a real `sluice run` node with real clients (Python grpcio +
//! PyJWT) and a real agent and backend: a rotated JWT secret refuses the old key's tokens (on
//! a connection that used them before, too) and accepts the new one's; `tunnel.max_wait` and
//! `logging.level` change live; an invalid file changes nothing and is counted and logged with
//! file, field and reason; a field that needs a restart is named and not applied while the
//! rest of the same reload is. systemd hears RELOADING=1 and READY=1 around each reload.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use common::{
    agents_yaml, assert_driver, client_args, metric, start_agent, wait_for_idle_tunnels, Secrets,
    BIN,
};
use serde_json::Value;
use test_support::{
    on_both_drivers, python, python_script, tunnel_client, GrpcBackend, SluiceLauncher,
    SluiceProcess,
};

// A reload is read and applied by the workers' runtime: once per monoio driver (the node and
// its agent share it; every reloaded file keeps it).
on_both_drivers!(
    a_rotated_jwt_secret_and_a_new_max_wait_apply_on_sighup,
    an_invalid_file_keeps_the_last_good_config_and_restart_fields_are_named,
);

fn node_yaml(secrets: &Secrets, level: &str, max_wait: &str, external: &str) -> String {
    format!(
        "runtime: {{workers: 2, drain_timeout: 2s, driver: {driver}}}\n\
         logging: {{level: {level}}}\n\
         listeners:\n  admin: {{address: '127.0.0.1:0'}}\n  agent: {{address: '127.0.0.1:0'}}\n  \
         external: {{address: '{external}'}}\n\
         tunnel:\n  node_name: reload-node\n  max_wait: {max_wait}\n  agents:\n{agents}  \
         jwt: {{secret_file: '{secret}'}}\n",
        agents = agents_yaml(secrets),
        secret = secrets.jwt_secret.display(),
        driver = secrets.driver,
    )
}

/// A node whose config file the test rewrites, and the datagram socket it notifies.
struct Node {
    process: SluiceProcess,
    config: PathBuf,
    notify: UnixDatagram,
    _notify_dir: tempfile::TempDir,
}

impl Node {
    fn start(yaml: &str) -> Self {
        let notify_dir = tempfile::tempdir().unwrap();
        let socket_path = notify_dir.path().join("notify.sock");
        let notify = UnixDatagram::bind(&socket_path).unwrap();
        notify
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let launcher = SluiceLauncher::new(BIN).unwrap();
        let config = launcher.write_file("node.yaml", yaml).unwrap();
        let process = launcher
            .env("NOTIFY_SOCKET", socket_path.to_str().unwrap())
            .arg("run")
            .arg("--config")
            .arg(&config)
            .spawn()
            .expect("node starts");
        let node = Self {
            process,
            config,
            notify,
            _notify_dir: notify_dir,
        };
        assert!(node.next_notification().lines().any(|l| l == "READY=1"));
        node
    }

    fn next_notification(&self) -> String {
        let mut buffer = [0u8; 1024];
        let read = self.notify.recv(&mut buffer).expect("a notification");
        String::from_utf8_lossy(&buffer[..read]).into_owned()
    }

    fn reloads(&self, result: &str) -> f64 {
        metric(
            &self.process,
            &format!("sluice_config_reloads_total{{result=\"{result}\"}}"),
        )
        .unwrap_or(-1.0)
    }

    /// Rewrites the file (when given), sends SIGHUP and waits for systemd's RELOADING=1 then
    /// READY=1, which the node sends once the reload is over.
    fn reload(&self, yaml: Option<&str>) {
        if let Some(yaml) = yaml {
            std::fs::write(&self.config, yaml).unwrap();
        }
        self.process.signal(libc::SIGHUP);
        let reloading = self.next_notification();
        assert!(
            reloading.lines().any(|l| l == "RELOADING=1")
                && reloading.lines().any(|l| l.starts_with("MONOTONIC_USEC=")),
            "{reloading:?}"
        );
        let ready = self.next_notification();
        assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    }

    /// The `details` of a call to agent 8, which never connects: the node gives up after its
    /// `max_wait` and says how long it waited.
    fn absent_agent_details(&self, secrets: &Secrets) -> String {
        let mut args = client_args(&self.process, secrets, 8);
        args.extend(["--timeout".into(), "30".into()]);
        let absent = tunnel_client("unary", &args);
        assert_eq!(absent["code"], "DEADLINE_EXCEEDED", "{absent}");
        absent["details"].as_str().unwrap().to_string()
    }
}

/// `reload_client.py`: one channel, a call before the rotation, two after.
struct RotationClient {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl RotationClient {
    fn start(node: &SluiceProcess, secret_file: &Path) -> Self {
        let mut child = Command::new(python())
            .arg(python_script("reload_client.py"))
            .args(["--node", &node.address("external").to_string()])
            .args(["--agent-id", "7", "--secret-file"])
            .arg(secret_file)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run reload_client.py");
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self { child, stdout }
    }

    fn line(&mut self) -> Value {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"))
    }

    fn go_on(&mut self) -> Value {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
        let result = self.line();
        assert!(self.child.wait().unwrap().success());
        result
    }
}

impl Drop for RotationClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn a_rotated_jwt_secret_and_a_new_max_wait_apply_on_sighup(driver: &str) {
    let secrets = Secrets::on(driver);
    let backend = GrpcBackend::start().expect("grpc backend");
    let node = Node::start(&node_yaml(&secrets, "info", "300ms", "127.0.0.1:0"));
    assert_driver(&node.process, driver);
    let _agent = start_agent(&secrets, 7, &node.process, backend.address, 10, None);
    wait_for_idle_tunnels(&node.process, 1.0);
    assert_eq!(node.reloads("applied"), 0.0);
    assert_eq!(metric(&node.process, "sluice_config_generation"), Some(1.0));

    let mut client = RotationClient::start(&node.process, &secrets.jwt_secret);
    assert_eq!(client.line()["before"], "OK");
    // Key rotation: only the secret file changes; the reload reads it again.
    std::fs::write(
        &secrets.jwt_secret,
        "rotated-secret-fedcba9876543210fedcba98\n",
    )
    .unwrap();
    node.reload(None);
    assert_eq!(node.reloads("applied"), 1.0);
    let after = client.go_on();
    assert_eq!(after["old_token"], "UNAUTHENTICATED", "{after}");
    assert_eq!(after["new_token"], "OK", "{after}");
    let fresh = tunnel_client("unary", &client_args(&node.process, &secrets, 7));
    assert_eq!(fresh["code"], "OK", "{fresh}");

    // A limit: tunnel.max_wait 300ms -> 1200ms, seen in what the node says when it gives up.
    assert!(node
        .absent_agent_details(&secrets)
        .contains("after waiting 300ms"));
    node.reload(Some(&node_yaml(&secrets, "info", "1200ms", "127.0.0.1:0")));
    assert_eq!(node.reloads("applied"), 2.0);
    let details = node.absent_agent_details(&secrets);
    assert!(details.contains("after waiting 1.2s"), "{details}");
    assert_eq!(metric(&node.process, "sluice_config_generation"), Some(3.0));
    assert_eq!(node.reloads("invalid"), 0.0);
    let stamp = metric(
        &node.process,
        "sluice_config_last_reload_success_timestamp_seconds",
    )
    .unwrap();
    assert!(stamp > 1.7e9, "{stamp}");
}

fn an_invalid_file_keeps_the_last_good_config_and_restart_fields_are_named(driver: &str) {
    let secrets = Secrets::on(driver);
    let backend = GrpcBackend::start().expect("grpc backend");
    let node = Node::start(&node_yaml(&secrets, "warn", "300ms", "127.0.0.1:0"));
    assert_driver(&node.process, driver);
    let _agent = start_agent(&secrets, 7, &node.process, backend.address, 10, None);
    wait_for_idle_tunnels(&node.process, 1.0);
    let config = node.config.display().to_string();

    // Invalid: nothing applies, the failure is counted and logged with file, field and reason.
    node.reload(Some(&node_yaml(&secrets, "warn", "soon", "127.0.0.1:0")));
    assert_eq!(node.reloads("invalid"), 1.0);
    assert_eq!(
        metric(&node.process, "sluice_config_last_reload_successful"),
        Some(0.0)
    );
    let stderr = node.process.stderr();
    let refused = stderr
        .lines()
        .find(|line| {
            line.contains("configuration reload refused") && line.contains("tunnel.max_wait")
        })
        .unwrap_or_else(|| panic!("no refusal naming the field:\n{stderr}"));
    assert!(refused.contains(&config), "{refused}");
    assert!(
        refused.contains("soon"),
        "the reason quotes the value: {refused}"
    );
    let served = tunnel_client("unary", &client_args(&node.process, &secrets, 7));
    assert_eq!(served["code"], "OK", "still serving: {served}");
    assert!(node
        .absent_agent_details(&secrets)
        .contains("after waiting 300ms"));

    // A listener address needs a restart: named, not applied; the same reload's live fields
    // (max_wait, and the log level, which makes the info line below visible) still apply.
    node.reload(Some(&node_yaml(&secrets, "info", "900ms", "127.0.0.1:1")));
    assert_eq!(node.reloads("restart_required"), 1.0);
    assert_eq!(
        metric(&node.process, "sluice_config_last_reload_successful"),
        Some(1.0)
    );
    let stderr = node.process.stderr();
    assert!(
        stderr
            .lines()
            .any(|line| line.contains("listeners.external") && line.contains("needs a restart")),
        "{stderr}"
    );
    assert!(
        stderr
            .lines()
            .any(|line| line.contains("configuration reloaded")),
        "logging.level info applied live: {stderr}"
    );
    let details = node.absent_agent_details(&secrets);
    assert!(details.contains("after waiting 900ms"), "{details}");
    // The external listener stayed where it was bound.
    let served = tunnel_client("unary", &client_args(&node.process, &secrets, 7));
    assert_eq!(served["code"], "OK", "{served}");
    assert_eq!(node.reloads("applied"), 0.0);
}
