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

/// `check-config FILE` and `run --config FILE`: (exit code, stderr) of each.
fn check_and_run(path: &std::path::Path) -> ((Option<i32>, String), (Option<i32>, String)) {
    let outcome = |args: &[&str]| {
        let output = Command::new(BIN)
            .args(args)
            .arg(path)
            .output()
            .expect("sluice runs");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    (outcome(&["check-config"]), outcome(&["run", "--config"]))
}

/// What a start reads beyond the file is checked too: check-config exits 2 with the error
/// naming the field, and `run` refuses with the very same lines, each printed once.
fn assert_refused_alike(path: &std::path::Path, expected: &str) {
    let ((check_code, check_err), (run_code, run_err)) = check_and_run(path);
    assert_eq!(check_code, Some(2), "check-config:\n{check_err}");
    assert_eq!(run_code, Some(2), "run:\n{run_err}");
    assert!(
        check_err.contains(expected),
        "{expected:?} not in:\n{check_err}"
    );
    let errors: Vec<&str> = check_err
        .lines()
        .filter(|l| !l.contains(" error(s) in "))
        .collect();
    for line in &errors {
        assert_eq!(
            run_err.matches(line).count(),
            1,
            "{line:?} not printed exactly once by run:\n{run_err}"
        );
    }
    assert!(run_err.contains("refusing to start: "), "{run_err}");
}

#[test]
fn an_invalid_cluster_file_is_refused_by_check_config_and_run_alike() {
    let dir = tempfile::tempdir().unwrap();
    let clusters = dir.path().join("clusters");
    std::fs::create_dir(&clusters).unwrap();
    std::fs::write(
        clusters.join("bad.yaml"),
        "apiVersion: proxy.sluice.dev/v1alpha1\nkind: UpstreamCluster\nmetadata: {name: bad}\nspec: {servers: 7}\n",
    )
    .unwrap();
    let path = dir.path().join("gateway.yaml");
    std::fs::write(
        &path,
        format!(
            "listeners:\n  admin: {{address: '127.0.0.1:0'}}\n  gateway: {{address: '127.0.0.1:0'}}\ngateway:\n  clusters_dir: '{}'\n",
            clusters.display()
        ),
    )
    .unwrap();
    assert_refused_alike(
        &path,
        &format!("{}: gateway.clusters_dir: ", path.display()),
    );
    let ((_, check_err), _) = check_and_run(&path);
    assert!(
        check_err.contains(&format!(
            "{}: spec.servers: ",
            clusters.join("bad.yaml").display()
        )),
        "the cluster file and its field are named:\n{check_err}"
    );
}

#[test]
fn a_garbage_pem_certificate_is_refused_by_check_config_and_run_alike() {
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("garbage.pem");
    std::fs::write(&pem, "this is not a certificate\n").unwrap();
    let secret = dir.path().join("jwt.secret");
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef").unwrap();
    let path = dir.path().join("node.yaml");
    std::fs::write(
        &path,
        format!(
            "listeners:\n  admin: {{address: '127.0.0.1:0'}}\n  agent: {{address: '127.0.0.1:0'}}\n  external:\n    address: '127.0.0.1:0'\n    tls: {{cert_file: '{pem}', key_file: '{pem}'}}\ntunnel:\n  jwt: {{secret_file: '{secret}'}}\n",
            pem = pem.display(),
            secret = secret.display()
        ),
    )
    .unwrap();
    assert_refused_alike(
        &path,
        &format!(
            "{}: listeners.external.tls.cert_file: {}: ",
            path.display(),
            pem.display()
        ),
    );
    assert_refused_alike(
        &path,
        &format!(
            "{}: listeners.external.tls.key_file: {}: ",
            path.display(),
            pem.display()
        ),
    );
}

/// A gateway config whose clusters directory holds `behind-nat`, a cluster with an endpoint and
/// an agent server; `with_tunnel` adds a tunnel node, `key` sets the assertion key file.
fn agent_server_gateway(
    dir: &std::path::Path,
    certs: &test_support::Certificates,
    with_tunnel: bool,
    key: Option<&std::path::Path>,
) -> std::path::PathBuf {
    let clusters = dir.join("clusters");
    std::fs::create_dir_all(&clusters).expect("clusters directory");
    std::fs::write(
        clusters.join("behind-nat.yaml"),
        format!(
            "apiVersion: proxy.sluice.dev/v1alpha1\nkind: UpstreamCluster\nmetadata: {{name: behind-nat}}\nspec:\n  servers:\n  - endpoint: https://127.0.0.1:6443\n  - agent: {{id: 42}}\n  clientConfig: {{bearerToken: gateway-token, caFile: '{ca}'}}\n  secureServing: {{certFile: '{cert}', keyFile: '{key}'}}\n",
            ca = certs.ca_cert.display(),
            cert = certs.server_cert.display(),
            key = certs.server_key.display(),
        ),
    )
    .expect("cluster file");
    let secret = dir.join("jwt.secret");
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef").expect("jwt secret");
    let (listeners, tunnel) = if with_tunnel {
        (
            "  agent: {address: '127.0.0.1:0'}\n  external: {address: '127.0.0.1:0'}\n",
            format!("tunnel:\n  jwt: {{secret_file: '{}'}}\n", secret.display()),
        )
    } else {
        ("", String::new())
    };
    let key = key.map_or(String::new(), |key| {
        format!("  agent_assertion_key_file: '{}'\n", key.display())
    });
    let path = dir.join("gateway.yaml");
    std::fs::write(
        &path,
        format!(
            "listeners:\n  admin: {{address: '127.0.0.1:0'}}\n  gateway: {{address: '127.0.0.1:0'}}\n{listeners}{tunnel}gateway:\n  clusters_dir: '{}'\n{key}",
            clusters.display()
        ),
    )
    .expect("config file");
    path
}

#[test]
fn an_agent_server_needs_the_tunnel_and_the_assertion_key_in_the_same_config() {
    let dir = tempfile::tempdir().unwrap();
    let certs = test_support::Certificates::generate(&[]).unwrap();
    let cluster_file = dir.path().join("clusters/behind-nat.yaml");
    let field = format!(
        "{}: metadata.name=\"behind-nat\" spec.servers[1].agent: an agent server needs",
        cluster_file.display()
    );
    // Neither: the cluster's file, field and both reasons.
    let path = agent_server_gateway(dir.path(), &certs, false, None);
    assert_refused_alike(&path, &format!("{field} a tunnel section and gateway.agent_assertion_key_file in the gateway's config: the gateway reaches agents only through the tunnel node in its own process, and signs each request's user for the agent"));
    // A tunnel but no key.
    let path = agent_server_gateway(dir.path(), &certs, true, None);
    assert_refused_alike(
        &path,
        &format!("{field} gateway.agent_assertion_key_file in the gateway's config"),
    );
    // A key that is not an Ed25519 private key: refused naming the field and the file.
    let path = agent_server_gateway(dir.path(), &certs, true, Some(&certs.server_key));
    assert_refused_alike(
        &path,
        &format!(
            "{}: gateway.agent_assertion_key_file: {} holds a private key that is not an Ed25519 key",
            path.display(),
            certs.server_key.display()
        ),
    );
    // A key but no tunnel.
    let key = dir.path().join("gateway-assertion.pem");
    let ed25519 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    std::fs::write(&key, ed25519.serialize_pem()).unwrap();
    let path = agent_server_gateway(dir.path(), &certs, false, Some(&key));
    assert_refused_alike(
        &path,
        &format!("{field} a tunnel section in the gateway's config"),
    );
    // Both: accepted.
    let path = agent_server_gateway(dir.path(), &certs, true, Some(&key));
    let (code, stderr) = check_only(&path);
    assert_eq!(code, Some(0), "{stderr}");
}

/// `check-config FILE` alone: its exit code and stderr.
fn check_only(path: &std::path::Path) -> (Option<i32>, String) {
    let output = Command::new(BIN)
        .arg("check-config")
        .arg(path)
        .output()
        .expect("sluice runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
