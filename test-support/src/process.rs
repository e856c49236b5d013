use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::wait_until;

/// Prepares a `sluice` process: a temporary directory for its config and logs, and the
/// `--addresses-file` through which it reports the addresses it bound (tests bind port 0).
#[derive(Debug)]
pub struct SluiceLauncher {
    command: Command,
    dir: tempfile::TempDir,
    stop_signal: Option<i32>,
}

impl SluiceLauncher {
    /// `binary` is the path Cargo gives integration tests as `env!("CARGO_BIN_EXE_sluice")`.
    pub fn new(binary: impl AsRef<Path>) -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut command = Command::new(binary.as_ref());
        command.stdin(Stdio::null());
        Ok(Self {
            command,
            dir,
            stop_signal: None,
        })
    }

    /// The process is stopped with `signal` when dropped (then killed if it has not exited
    /// within [`GRACEFUL_STOP`]), so it cleans up what it made outside its directory, as
    /// `sluice up` removes its `/tmp/sluice-up-<pid>`; without it, a drop kills it at once.
    pub fn stop_with(mut self, signal: i32) -> Self {
        self.stop_signal = Some(signal);
        self
    }

    /// The process's private directory (removed with the process).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file into the process's directory and returns its path.
    pub fn write_file(&self, name: &str, contents: &str) -> std::io::Result<PathBuf> {
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents)?;
        Ok(path)
    }

    pub fn arg(mut self, arg: impl AsRef<std::ffi::OsStr>) -> Self {
        self.command.arg(arg);
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.command.args(args);
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.command.env(key, value);
        self
    }

    /// For hooks such as `pre_exec` (the io_uring fallback test installs a seccomp filter).
    pub fn command_mut(&mut self) -> &mut Command {
        &mut self.command
    }

    /// Starts the process and waits until it has written its addresses file (it does so once
    /// every listener is bound and the workers run), or fails with its stderr.
    pub fn spawn(self) -> std::io::Result<SluiceProcess> {
        let mut process = self.spawn_unready()?;
        let addresses_file = process.dir.path().join("addresses.json");
        let ready = wait_until(Duration::from_secs(30), || {
            addresses_file.exists() || !matches!(process.child.try_wait(), Ok(None))
        });
        if !ready || !addresses_file.exists() {
            let _ = process.child.kill();
            let _ = process.child.wait();
            return Err(std::io::Error::other(format!(
                "sluice did not report ready; stderr:\n{}",
                process.stderr()
            )));
        }
        let text = std::fs::read_to_string(&addresses_file)?;
        let parsed: BTreeMap<String, String> =
            serde_json::from_str(&text).map_err(std::io::Error::other)?;
        for (name, address) in parsed {
            let address = address.parse().map_err(std::io::Error::other)?;
            process.addresses.insert(name, address);
        }
        Ok(process)
    }

    /// Starts the process without waiting for readiness (for tests of start-up failures).
    pub fn spawn_unready(mut self) -> std::io::Result<SluiceProcess> {
        let stdout = self.dir.path().join("stdout.log");
        let stderr = self.dir.path().join("stderr.log");
        self.command
            .arg("--addresses-file")
            .arg(self.dir.path().join("addresses.json"))
            .stdout(std::fs::File::create(&stdout)?)
            .stderr(std::fs::File::create(&stderr)?);
        let child = self.command.spawn()?;
        Ok(SluiceProcess {
            child,
            stop_signal: self.stop_signal,
            dir: self.dir,
            stdout,
            stderr,
            addresses: BTreeMap::new(),
        })
    }
}

/// A running `sluice` process, killed on drop if still alive.
#[derive(Debug)]
pub struct SluiceProcess {
    child: Child,
    /// Sent on drop before the kill (see [`SluiceLauncher::stop_with`]).
    stop_signal: Option<i32>,
    dir: tempfile::TempDir,
    stdout: PathBuf,
    stderr: PathBuf,
    /// Listener name -> bound address, as the process reported them.
    pub addresses: BTreeMap<String, SocketAddr>,
}

impl SluiceProcess {
    /// The bound address of a listener; panics with the known names if absent.
    pub fn address(&self, listener: &str) -> SocketAddr {
        *self
            .addresses
            .get(listener)
            .unwrap_or_else(|| panic!("no listener {listener:?} in {:?}", self.addresses))
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends a signal (`libc::SIGTERM`, `libc::SIGINT`, ...).
    pub fn signal(&self, signal: i32) {
        assert!(
            self.try_signal(signal),
            "kill({}, {signal}) failed",
            self.pid()
        );
    }

    /// Sends a signal; false if the kernel refused (the process is gone, for one).
    fn try_signal(&self, signal: i32) -> bool {
        // SAFETY: kill(2) with our own child's pid and a valid signal number has no memory effects.
        unsafe { libc::kill(self.pid(), signal) == 0 }
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// How long a dropped process given a stop signal has to exit before it is killed.
pub const GRACEFUL_STOP: Duration = Duration::from_secs(15);

impl Drop for SluiceProcess {
    fn drop(&mut self) {
        if let (Some(signal), Ok(None)) = (self.stop_signal, self.child.try_wait()) {
            if self.try_signal(signal) && self.wait_exit(GRACEFUL_STOP).is_some() {
                return;
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
