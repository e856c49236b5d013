//! Steady unary load from real grpcio clients (`python/rolling_load.py`), for tests that
//! restart nodes under it: the counts can be read while it runs, and the final ones when it
//! is told to stop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{python, python_script, wait_until};

/// The running load; killed on drop if not finished.
pub struct RollingLoad {
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RollingLoad {
    /// Calls `/test.Echo/Unary` of each of `agents` in turn, over one round_robin channel to
    /// every address in `nodes`, from `threads` threads.
    pub fn start(
        nodes: &[std::net::SocketAddr],
        agents: &[i64],
        secret_file: &Path,
        threads: usize,
    ) -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let join = |items: Vec<String>| items.join(",");
        let child = Command::new(python())
            .arg(python_script("rolling_load.py"))
            .arg("--nodes")
            .arg(join(nodes.iter().map(ToString::to_string).collect()))
            .arg("--agents")
            .arg(join(agents.iter().map(ToString::to_string).collect()))
            .arg("--secret-file")
            .arg(secret_file)
            .arg("--stop-file")
            .arg(dir.path().join("stop"))
            .arg("--progress")
            .arg(dir.path().join("progress.json"))
            .arg("--threads")
            .arg(threads.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        Ok(Self {
            child: Some(child),
            dir,
        })
    }

    fn progress_file(&self) -> PathBuf {
        self.dir.path().join("progress.json")
    }

    /// The counts so far (`ok`, `failed`, `codes`, `details`, `per_agent`); all zero before the
    /// first report.
    pub fn progress(&self) -> serde_json::Value {
        std::fs::read_to_string(self.progress_file())
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_else(|| serde_json::json!({"ok": 0, "failed": 0}))
    }

    /// Calls answered OK so far.
    pub fn ok(&self) -> u64 {
        self.progress()["ok"].as_u64().unwrap_or(0)
    }

    /// Waits until `more` calls beyond those answered now were answered OK.
    pub fn wait_for_more(&self, more: u64, timeout: Duration) -> bool {
        let target = self.ok() + more;
        wait_until(timeout, || self.ok() >= target)
    }

    /// Stops the load (calls in flight finish) and returns the final counts.
    pub fn finish(mut self) -> std::io::Result<serde_json::Value> {
        std::fs::write(self.dir.path().join("stop"), b"")?;
        let child = self
            .child
            .take()
            .ok_or_else(|| std::io::Error::other("already finished"))?;
        let output = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let last = stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last)
            .map_err(|error| std::io::Error::other(format!("not JSON ({error}): {stdout}")))
    }
}

impl Drop for RollingLoad {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
