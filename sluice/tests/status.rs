//! `sluice status` against a real node: its state in a few lines, exit 0 when ready; exit 1
//! with a clear line when nothing answers.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::{start_node, Secrets, BIN};
use test_support::on_both_drivers;

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
