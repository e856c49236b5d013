//! `sluice status` against a real node: its state in a few lines, exit 0 when ready; exit 1
//! with a clear line when nothing answers. Against a real control plane over HTTPS (`--ca`):
//! its version, revision and readiness; exit 1 naming the URL when its certificate is not the
//! CA's, exit 2 when the CA file is not one.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::{start_node, Secrets, BIN};
use test_support::{on_both_drivers, Certificates, ControlPlane};

// The status is read from the node's admin listener, served by the same runtime as the data
// plane: once per monoio driver.
on_both_drivers!(status_prints_a_running_node_and_fails_clearly_without_one);

fn status_prints_a_running_node_and_fails_clearly_without_one(driver: &str) {
    let secrets = Secrets::on(driver);
    // Checked to run on `driver` (common::start_node_on).
    let node = start_node(&secrets, "2s", 1 << 20, None);
    let admin = node.address("admin").to_string();
    let output = Command::new(BIN)
        .args(["status", "--admin", &admin])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    assert!(
        header.starts_with("Sluice ") && header.ends_with(": ready"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|line| line.trim_start().starts_with("tunnel ") && line.contains("0 agents")),
        "{text}"
    );
    assert!(text.contains("panics                 none"), "{text}");

    drop(node);
    let output = Command::new(BIN)
        .args(["status", "--admin", &admin, "--timeout", "1s"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let said = String::from_utf8_lossy(&output.stderr);
    // Refused once the port is closed; reset if the dying node still held it.
    assert!(
        said.starts_with("sluice status: ") && said.contains(&admin),
        "{said}"
    );
}

// The control plane runs on tokio, not monoio: one run.
#[test]
fn status_reads_the_control_plane_over_https_and_refuses_a_wrong_ca() {
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    let admin = cp.address.to_string();
    let ca = cp.ca_file();
    let status = |ca: &std::path::Path| {
        Command::new(BIN)
            .args(["status", "--admin", &admin, "--timeout", "5s", "--ca"])
            .arg(ca)
            .output()
            .unwrap()
    };

    let output = status(&ca);
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let header = text.lines().next().unwrap();
    // sluice_build_info's version and revision, then what it runs and its /readyz.
    let version = format!("Sluice {} (", env!("CARGO_PKG_VERSION"));
    assert!(
        header.starts_with(&version) && header.ends_with("), control plane on tokio: ready"),
        "{text}"
    );
    // The admin token the control plane issued at its first start is counted.
    assert!(
        text.lines()
            .any(|line| line.trim_start().starts_with("store ")
                && line.contains("revision ")
                && line.contains("1 token(s)")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|line| line.trim_start().starts_with("clients ")),
        "{text}"
    );

    // A CA that did not sign the control plane's certificate: the handshake fails, the line
    // names the URL and the reason, and the exit is 1 (cannot read it; docs/CONFIG.md).
    let other = Certificates::generate(&[]).unwrap();
    let output = status(&other.ca_cert);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.starts_with(&format!("sluice status: TLS with https://{admin} failed"))
            && said.contains("UnknownIssuer"),
        "{said}"
    );
    assert!(output.stdout.is_empty(), "{output:?}");

    // Without --ca the HTTPS listener does not answer plain HTTP: exit 1, never "ready".
    let output = Command::new(BIN)
        .args(["status", "--admin", &admin, "--timeout", "5s"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains(&admin) && said.contains("needs --ca"),
        "{said}"
    );

    // A file that holds no CA is what was given wrong: exit 2, naming the file.
    let output = status(&other.server_key);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("--ca") && said.contains(&other.server_key.display().to_string()),
        "{said}"
    );
}
