//! Processes under test: spawned pinned to CPUs with `taskset` (which execs, so the pid is the
//! program's own), logging to a file in the run directory, and stopped on drop.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// A process this harness started; SIGTERM then SIGKILL on drop.
#[derive(Debug)]
pub struct Managed {
    pub name: String,
    pub log: PathBuf,
    child: Child,
}

impl Managed {
    /// Starts `program args` with `taskset -c cpu`, stdout and stderr to `dir/name.log`.
    pub fn spawn(
        name: &str,
        cpu: &str,
        dir: &Path,
        program: impl AsRef<std::ffi::OsStr>,
        args: &[&std::ffi::OsStr],
    ) -> anyhow::Result<Self> {
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let err = out.try_clone()?;
        let child = Command::new("taskset")
            .args(["-c", cpu])
            .arg(program.as_ref())
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .env("RUST_LOG", "warn")
            .spawn()
            .with_context(|| format!("cannot start {name} ({:?})", program.as_ref()))?;
        Ok(Self {
            name: name.to_string(),
            log,
            child,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails (with the end of its log) if the process has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); end of {}:\n{}",
                self.name,
                self.log.display(),
                log_tail(&self.log)
            );
        }
        Ok(())
    }

    /// Waits for the JSON `--addresses-file` a Sluice process writes once its listeners are bound.
    pub fn wait_for_addresses(
        &mut self,
        file: &Path,
        timeout: Duration,
    ) -> anyhow::Result<BTreeMap<String, SocketAddr>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(text) = std::fs::read_to_string(file) {
                if let Ok(addresses) = serde_json::from_str(&text) {
                    return Ok(addresses);
                }
            }
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!("{} did not write {} in time", self.name, file.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: signalling a child we spawned and have not reaped yet.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// A loopback port that was free a moment ago, for peers that cannot report the port they bound.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Looks up a listener in an addresses file's map.
pub fn address(addresses: &BTreeMap<String, SocketAddr>, name: &str) -> anyhow::Result<SocketAddr> {
    addresses
        .get(name)
        .copied()
        .with_context(|| format!("no `{name}` listener in {addresses:?}"))
}

/// Waits until `check` passes, giving up (with `what` in the error) after `timeout`.
pub fn wait_until(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last_error = None;
    while Instant::now() < deadline {
        match check() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(error) => last_error = Some(error),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    match last_error {
        Some(error) => Err(error.context(format!("timed out waiting for {what}"))),
        None => bail!("timed out waiting for {what}"),
    }
}
