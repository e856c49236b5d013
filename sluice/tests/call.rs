//! `sluice call` against `sluice up`, as a new operator meets it: the command the banner prints
//! is run exactly as printed, with no Python, no virtualenv and nothing at all on `PATH`, and the
//! echo backend's reply comes back through node, tunnel and agent; a call the node refuses
//! names its gRPC status and exits 64 + the code.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use test_support::{wait_until, SluiceLauncher, SluiceProcess};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// `sluice up --ephemeral-ports --workers 1`, once its banner is printed.
fn start_up() -> SluiceProcess {
    let process = SluiceLauncher::new(BIN)
        .unwrap()
        .args(["up", "--ephemeral-ports", "--workers", "1"])
        .stop_with(libc::SIGINT)
        .spawn()
        .expect("sluice up starts");
    assert!(
        wait_until(Duration::from_secs(15), || process
            .stdout()
            .contains("Press Ctrl-C to stop.")),
        "stdout: {}\nstderr: {}",
        process.stdout(),
        process.stderr()
    );
    process
}

/// The banner's `sluice call` line, split into words as a shell would (no quoting is printed).
fn printed_call(stdout: &str) -> Vec<String> {
    let line = stdout
        .lines()
        .map(str::trim)
        .find(|line| line.contains(" call --endpoint "))
        .unwrap_or_else(|| panic!("no sluice call line in\n{stdout}"));
    line.split_whitespace().map(str::to_string).collect()
}

/// Runs `words` with an empty environment: `PATH` is an empty directory (no python, no venv,
/// no other program) and the working directory another one, so nothing of the checkout helps.
fn run_bare(words: &[String]) -> Output {
    let empty = tempfile::tempdir().unwrap();
    let bin = empty.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    Command::new(&words[0])
        .args(&words[1..])
        .env_clear()
        .env("PATH", &bin)
        .current_dir(empty.path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("cannot run {words:?}: {error}"))
}

fn with(words: &[String], flag: &str, value: &str) -> Vec<String> {
    let mut words = words.to_vec();
    let at = words
        .iter()
        .position(|word| word == flag)
        .unwrap_or_else(|| panic!("{flag} not in {words:?}"));
    words[at + 1] = value.to_string();
    words
}

fn text(output: &Output) -> (Option<i32>, String, String) {
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_printed_call_reaches_the_echo_backend_without_python_and_refusals_name_their_status() {
    let process = start_up();
    let words = printed_call(&process.stdout());
    assert!(
        Path::new(&words[0]).is_absolute() || words[0] == "sluice",
        "{words:?}"
    );
    let (code, stdout, stderr) = text(&run_bare(&words));
    assert_eq!((code, stdout.as_str()), (Some(0), "hello\n"), "{stderr}");

    // Binary bytes go through unchanged with --output raw.
    let payload: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let file = process.dir().join("payload.bin");
    std::fs::write(&file, &payload).unwrap();
    let mut raw = with(&words, "--data", "unused");
    let at = raw.iter().position(|word| word == "--data").unwrap();
    raw.splice(
        at..at + 2,
        [
            "--data-file".to_string(),
            file.display().to_string(),
            "--output".to_string(),
            "raw".to_string(),
        ],
    );
    let output = run_bare(&raw);
    assert_eq!(output.status.code(), Some(0), "{:?}", text(&output));
    assert!(
        output.stdout == payload,
        "{} bytes back",
        output.stdout.len()
    );

    // The message from standard input.
    let mut piped = with(&words, "--data", "unused");
    let at = piped.iter().position(|word| word == "--data").unwrap();
    piped[at] = "--data-file".to_string();
    piped[at + 1] = "-".to_string();
    let mut child = Command::new(&piped[0])
        .args(&piped[1..])
        .env_clear()
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"from stdin").unwrap();
    let (code, stdout, stderr) = text(&child.wait_with_output().unwrap());
    assert_eq!(
        (code, stdout.as_str()),
        (Some(0), "from stdin\n"),
        "{stderr}"
    );

    // A JWT signed with another key: the node refuses it, named on stderr, 64 + 16.
    let wrong = process.dir().join("wrong.secret");
    std::fs::write(&wrong, "not the secret of this node, but long enough\n").unwrap();
    let (code, stdout, stderr) = text(&run_bare(&with(
        &words,
        "--jwt-secret-file",
        &wrong.display().to_string(),
    )));
    assert_eq!(code, Some(80), "{stdout}{stderr}");
    assert!(
        stderr.contains("UNAUTHENTICATED (gRPC status 16): token signature does not verify"),
        "{stderr}"
    );
    assert!(stdout.is_empty(), "{stdout}");

    // No agent 2 anywhere: the deadline (sent as grpc-timeout) ends the call, 64 + 4.
    let started = Instant::now();
    let mut no_agent = with(&words, "--agent", "2");
    no_agent.extend(["--timeout".to_string(), "1s".to_string()]);
    let (code, _, stderr) = text(&run_bare(&no_agent));
    assert_eq!(code, Some(68), "{stderr}");
    assert!(stderr.contains("DEADLINE_EXCEEDED"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // Nothing listens: UNAVAILABLE, 64 + 14, naming the address.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let (code, _, stderr) = text(&run_bare(&with(&words, "--endpoint", &closed)));
    assert_eq!(code, Some(78), "{stderr}");
    assert!(
        stderr.contains("UNAVAILABLE") && stderr.contains(&format!("cannot connect to {closed}")),
        "{stderr}"
    );

    // Called wrongly: a usage error, exit 2, before anything is dialled.
    let (code, _, stderr) = text(&run_bare(&with(
        &words,
        "--jwt-secret-file",
        "/nonexistent/jwt.secret",
    )));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--jwt-secret-file"), "{stderr}");
    let (code, _, stderr) = text(&run_bare(&with(
        &words,
        "--endpoint",
        "https://127.0.0.1:1",
    )));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("needs --ca"), "{stderr}");
}

/// Over TLS: the node's certificate checked against `--ca` for `--server-name` (or the host);
/// ListConnectedAgents, which the node answers itself, needs no agent.
#[test]
fn tls_trusts_only_the_given_ca_for_the_server_name() {
    let certs = test_support::Certificates::generate(&["node.test"]).unwrap();
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let secret = launcher
        .write_file("jwt.secret", "0123456789abcdef0123456789abcdef\n")
        .unwrap();
    let config = launcher
        .write_file(
            "node.yaml",
            &format!(
                "runtime: {{workers: 1, driver: legacy}}\nlisteners:\n  admin: {{address: '127.0.0.1:0'}}\n  agent: {{address: '127.0.0.1:0'}}\n  external:\n    address: '127.0.0.1:0'\n    tls: {{cert_file: '{}', key_file: '{}'}}\ntunnel:\n  jwt: {{secret_file: '{}'}}\n",
                certs.server_cert.display(),
                certs.server_key.display(),
                secret.display()
            ),
        )
        .unwrap();
    let node = launcher
        .arg("run")
        .arg("--config")
        .arg(&config)
        .spawn()
        .unwrap();
    let external = node.address("external");
    let call = |endpoint: &str, extra: &[&str]| {
        let mut words: Vec<String> = [
            BIN,
            "call",
            "--endpoint",
            endpoint,
            "--agent",
            "1",
            "--jwt-secret-file",
            &secret.display().to_string(),
            "--ca",
            &certs.ca_cert.display().to_string(),
            "sluice.agents.v1.Agents/ListConnectedAgents",
        ]
        .map(String::from)
        .to_vec();
        words.extend(extra.iter().map(|word| word.to_string()));
        text(&run_bare(&words))
    };
    let (code, _, stderr) = call(&format!("https://{external}"), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, _, stderr) = call(&external.to_string(), &["--server-name", "node.test"]);
    assert_eq!(code, Some(0), "{stderr}");
    // A name the certificate does not carry: no connection, so UNAVAILABLE naming TLS.
    let (code, _, stderr) = call(&external.to_string(), &["--server-name", "other.test"]);
    assert_eq!(code, Some(78), "{stderr}");
    assert!(stderr.contains("TLS handshake"), "{stderr}");
    // --ca says TLS, http:// says cleartext: refused before dialling.
    let (code, _, stderr) = call(&format!("http://{external}"), &[]);
    assert_eq!(
        code,
        Some(2),
        "--ca with http:// is a usage error: {stderr}"
    );
}
