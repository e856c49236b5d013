//! Real gRPC peers written with Python grpcio (nobody here wrote them): a backend server and a
//! client that runs named checks (see `python/tunnel_client.py`).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{python, wait_until, workspace_root};

/// A helper script of `test-support/python/`.
pub fn python_script(name: &str) -> PathBuf {
    workspace_root().join("test-support/python").join(name)
}

/// `python/grpc_backend.py` on a free loopback port, killed on drop.
#[derive(Debug)]
pub struct GrpcBackend {
    child: Child,
    pub address: SocketAddr,
    _dir: tempfile::TempDir,
    cancel_file: PathBuf,
    calls_file: PathBuf,
}

impl GrpcBackend {
    pub fn start() -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let cancel_file = dir.path().join("cancelled");
        let calls_file = dir.path().join("calls");
        let mut child = Command::new(python())
            .arg(python_script("grpc_backend.py"))
            .env("CANCEL_FILE", &cancel_file)
            .env("CALLS_FILE", &calls_file)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let port: u16 = line
            .trim()
            .strip_prefix("PORT ")
            .and_then(|port| port.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("grpc_backend.py said {line:?}")))?;
        Ok(Self {
            child,
            address: SocketAddr::from(([127, 0, 0, 1], port)),
            _dir: dir,
            cancel_file,
            calls_file,
        })
    }

    /// How many `/test.Echo/Unary` calls reached this backend so far.
    pub fn unary_calls(&self) -> usize {
        std::fs::read_to_string(&self.calls_file)
            .map(|text| text.lines().count())
            .unwrap_or(0)
    }

    /// The file a `/test.Echo/Hang` call creates as it begins (the call reached the backend).
    pub fn hang_started_file(&self) -> PathBuf {
        self.cancel_file.with_extension("started")
    }

    /// Whether a `/test.Echo/Hang` call saw its cancellation (within `timeout`).
    pub fn saw_cancellation(&self, timeout: Duration) -> bool {
        wait_until(timeout, || self.cancel_file.exists())
    }
}

impl Drop for GrpcBackend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs one check of `python/tunnel_client.py` and returns the JSON it printed last.
pub fn tunnel_client(check: &str, args: &[String]) -> serde_json::Value {
    let output = Command::new(python())
        .arg(python_script("tunnel_client.py"))
        .arg(check)
        .args(args)
        .output()
        .expect("run tunnel_client.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "tunnel_client.py {check} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|error| panic!("not JSON ({error}): {stdout}"))
}

/// Starts a check in the background with stdout piped (for calls that must be in flight while
/// the test does something else).
pub fn spawn_tunnel_client(check: &str, args: &[String]) -> Child {
    Command::new(python())
        .arg(python_script("tunnel_client.py"))
        .arg(check)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run tunnel_client.py")
}
