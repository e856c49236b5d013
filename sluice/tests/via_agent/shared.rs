//! What both agent-server suites (`gateway_via_agent.rs`, `gateway_via_agent_multinode.rs`)
//! use: files, the agent's token digest, metrics, and the lines of a streaming client.
#![allow(dead_code)] // each suite uses its own subset

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Output;

use test_support::SluiceProcess;

/// The agent's tunnel token (the node knows its SHA-256).
pub const AGENT_TOKEN: &str = "agent-7-tunnel-token-0123456789";
/// The credential the agent presents to its apiserver (a service account's, in a pod).
pub const AGENT_SA_TOKEN: &str = "agent-7-service-account-token";

pub fn write(dir: &Path, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

pub fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// The sum of every series of `process`'s metrics whose line starts with `series`.
pub fn metric(process: &SluiceProcess, series: &str) -> f64 {
    let Ok(answer) = test_support::http_get(process.address("admin"), "/metrics") else {
        return 0.0;
    };
    answer
        .body
        .lines()
        .filter(|line| line.starts_with(series))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The lines of `stdout` as they come, read on a thread.
pub fn lines_of(stdout: std::process::ChildStdout) -> std::sync::mpsc::Receiver<String> {
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    received
}

/// kubectl's output, which must have succeeded.
pub fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "kubectl failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}
