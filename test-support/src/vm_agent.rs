//! `sluice vm-agent` as a child process: started from a command line the test builds (plain, or
//! wrapped in `ip netns exec` to run inside a VM's namespace), its admin address read from its
//! first stdout line, its log kept in a temporary file and printed when a test fails, and the
//! process killed on drop.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};

#[derive(Debug)]
pub struct VmAgentProcess {
    child: Child,
    /// The admin endpoint (`/metrics`, `/healthz`, `/readyz`) as the agent printed it.
    pub admin: String,
    log: tempfile::NamedTempFile,
}

impl VmAgentProcess {
    /// Spawns `command` (whose agent listens with `--admin <ip>:0`) and waits for its
    /// `admin listening on ADDR` line.
    pub fn spawn(mut command: Command) -> std::io::Result<Self> {
        let log = tempfile::NamedTempFile::new()?;
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log.reopen()?)
            .spawn()?;
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            BufReader::new(stdout).read_line(&mut line)?;
        }
        let Some(admin) = line.trim().strip_prefix("admin listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(log.path()).unwrap_or_default();
            return Err(std::io::Error::other(format!(
                "the agent's first line was {line:?}, not its admin address; log:\n{log}"
            )));
        };
        Ok(VmAgentProcess {
            admin: admin.to_string(),
            child,
            log,
        })
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for VmAgentProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- vm-agent log ---\n{}", self.log());
        }
    }
}

/// The value of the first sample of a Prometheus text exposition that starts with `series`
/// (a name, or a name with its labels).
pub fn metric_value(exposition: &str, series: &str) -> Option<f64> {
    exposition
        .lines()
        .find(|line| line.starts_with(series))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
}
