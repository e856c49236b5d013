//! The command line as an operator meets it: one exit code per outcome (docs/CONFIG.md, "Exit
//! codes"), `--addresses-file` only where it means something, `status --admin HOST:PORT`.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// An admin endpoint that answers every request with `readyz` for /readyz and a minimal
/// Prometheus text for /metrics, until the test ends.
fn fake_admin(readyz: u16) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            // The whole head, so the client is not cut off mid-request.
            let mut request = Vec::new();
            let mut chunk = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16384 {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(read) => request.extend_from_slice(&chunk[..read]),
                }
            }
            let head = String::from_utf8_lossy(&request);
            let (status, body) = if head.starts_with("GET /readyz ") {
                (readyz, String::new())
            } else {
                (
                    200,
                    "# TYPE sluice_build_info gauge\nsluice_build_info{version=\"0.1.0\",driver=\"legacy\"} 1\n"
                        .to_string(),
                )
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    address
}

fn status(admin: &str) -> (Option<i32>, String) {
    let output = Command::new(BIN)
        .args(["status", "--timeout", "2s", "--admin", admin])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

#[test]
fn not_ready_usage_errors_and_unreachable_have_codes_of_their_own() {
    let ready = fake_admin(200);
    let not_ready = fake_admin(503);
    assert_eq!(status(&ready.to_string()).0, Some(0));
    let (code, text) = status(&not_ready.to_string());
    assert_eq!(code, Some(3), "not ready: {text}");
    // A closed port: nothing answers.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (code, text) = status(&closed.to_string());
    assert_eq!(code, Some(1), "unreachable: {text}");
    // Called wrongly: a usage error, apart from "not ready".
    let output = Command::new(BIN)
        .args(["status", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let output = Command::new(BIN).arg("no-such-command").output().unwrap();
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn status_takes_a_host_name() {
    let not_ready = fake_admin(503);
    let (code, text) = status(&format!("localhost:{}", not_ready.port()));
    assert_eq!(code, Some(3), "{text}");
    let output = Command::new(BIN)
        .args(["status", "--admin", "localhost"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "a port is required");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--admin"),
        "the flag is named"
    );
}

fn help(args: &[&str]) -> String {
    let output = Command::new(BIN).args(args).arg("--help").output().unwrap();
    assert!(output.status.success(), "{args:?}: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn addresses_file_is_offered_only_by_the_roles_that_bind_listeners() {
    for binds in [&["run"][..], &["agent"], &["up"], &["controlplane"]] {
        assert!(help(binds).contains("--addresses-file"), "{binds:?}");
    }
    for binds_nothing in [
        &["vm-agent"][..],
        &["status"],
        &["check-config"],
        &["policy", "compile"],
        &["controlplane", "token", "create"],
        &["call"],
    ] {
        assert!(
            !help(binds_nothing).contains("--addresses-file"),
            "{binds_nothing:?}"
        );
        let output = Command::new(BIN)
            .args(binds_nothing)
            .args(["--addresses-file", "/tmp/x"])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{binds_nothing:?}");
    }
}

#[test]
fn the_help_of_up_and_vm_agent_says_what_they_do_now() {
    let up = help(&["up"]);
    for part in ["gateway", "control", "VM policy", "SIGHUP"] {
        assert!(up.contains(part), "{part:?} missing from up --help:\n{up}");
    }
    let vm_agent = help(&["vm-agent"]);
    for part in ["--controlplane", "--vm", "/readyz"] {
        assert!(
            vm_agent.lines().next().unwrap_or_default().contains(part)
                || vm_agent
                    .split("Usage:")
                    .next()
                    .unwrap_or_default()
                    .contains(part),
            "{part:?} missing from vm-agent --help's summary:\n{vm_agent}"
        );
    }
}

#[test]
fn version_names_the_commit() {
    let output = Command::new(BIN).arg("--version").output().unwrap();
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    let revision = sluice_admin::REVISION;
    assert_eq!(
        text.trim_end(),
        format!("sluice {} (commit {revision})", env!("CARGO_PKG_VERSION"))
    );
    // Built from this checkout: the commit is known (12 hex digits), not the tarball fallback.
    let in_git = Command::new("git")
        .args(["rev-parse", "--git-dir"])
        .output()
        .is_ok_and(|output| output.status.success());
    if in_git {
        assert!(
            revision.len() == 12 && revision.chars().all(|c| c.is_ascii_hexdigit()),
            "{revision:?}"
        );
    }
}

/// Every subcommand, as its man page is named (`sluice-<path>.1`).
const SUBCOMMANDS: [&str; 12] = [
    "up",
    "run",
    "agent",
    "vm-agent",
    "controlplane",
    "controlplane-token",
    "controlplane-token-create",
    "policy",
    "policy-compile",
    "status",
    "check-config",
    "completions",
];

#[test]
fn completions_are_generated_from_the_cli_for_each_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let output = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(output.status.success(), "{shell}: {output:?}");
        let script = String::from_utf8(output.stdout).unwrap();
        for word in ["check-config", "vm-agent", "addresses-file"] {
            assert!(script.contains(word), "{shell} completion lacks {word}");
        }
        if shell == "bash" {
            let mut check = Command::new("bash")
                .arg("-n")
                .stdin(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            check
                .stdin
                .take()
                .unwrap()
                .write_all(script.as_bytes())
                .unwrap();
            assert!(
                check.wait().unwrap().success(),
                "bash -n refuses the script"
            );
        }
    }
    let unknown = Command::new(BIN)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(
        unknown.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}

/// The pages a package installs: one per subcommand, each one groff formats without a warning.
#[test]
fn man_pages_cover_every_subcommand_and_format_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(BIN)
        .args(["man", "--out-dir"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let mut pages = vec!["sluice.1".to_string()];
    pages.extend(SUBCOMMANDS.iter().map(|name| format!("sluice-{name}.1")));
    for page in &pages {
        let path = dir.path().join(page);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(".TH ") && text.contains(".SH NAME"), "{page}");
        let formatted = Command::new("groff")
            .args(["-man", "-Tutf8", "-ww", "-z"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            formatted.status.success() && formatted.stderr.is_empty(),
            "{page}: {}",
            String::from_utf8_lossy(&formatted.stderr)
        );
    }
    let run = std::fs::read_to_string(dir.path().join("sluice-run.1")).unwrap();
    assert!(
        run.contains("config"),
        "sluice-run.1 names its --config flag"
    );
}
