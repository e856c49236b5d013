use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::wait_until;

const SCHEMA: &str = "/usr/share/openvswitch/vswitch.ovsschema";

/// A private Open vSwitch for one test: its own `ovsdb-server` and userspace `ovs-vswitchd`
/// with database, sockets, pid files and logs in a temporary directory (`OVS_RUNDIR`,
/// `OVS_LOGDIR`, `OVS_DBDIR` point there), so tests never touch the system instance and run in
/// parallel. No kernel module is needed: bridges use the `netdev` datapath. Killed on drop.
///
/// ovs-vswitchd runs in a network namespace of its own: the netdev datapath creates a tap
/// device named `ovs-netdev` plus one per bridge, which would collide between instances in one
/// namespace. Ports attached to its bridges (see [`crate::NetNs::attach_veth`]) live there too.
#[derive(Debug)]
pub struct OvsInstance {
    dir: tempfile::TempDir,
    netns: String,
    ovsdb: Child,
    vswitchd: Option<Child>,
}

/// A network device or namespace name (at most 15 bytes, Linux's interface name limit) unique
/// to this process and call: `prefix` (at most 5 bytes are kept), the process id in 6 hex
/// digits (Linux pids stay below 2^22 = 0x400000) and a counter in 3. Fixed widths, so two
/// processes never make the same name (with variable widths, pid 0x1a + call 2 and pid 0x1 +
/// call 0xa2 both gave "…1a2"); concurrent test processes have distinct pids.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let prefix: String = prefix.chars().take(5).collect();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{prefix}{:06x}{:03x}",
        std::process::id() % 0x100_0000,
        n % 0x1000
    )
}

impl OvsInstance {
    /// Creates the database and starts both daemons; returns once ovs-vswitchd has applied the
    /// initial configuration.
    pub fn start() -> std::io::Result<Self> {
        // A short path: unix socket paths are limited to 107 bytes.
        let dir = tempfile::Builder::new().prefix("ovs").tempdir_in("/tmp")?;
        let db = dir.path().join("conf.db");
        run(Command::new("ovsdb-tool")
            .arg("create")
            .arg(&db)
            .arg(SCHEMA))?;
        let ovsdb = Self::daemon(dir.path(), "ovsdb-server", None)
            .arg(&db)
            .arg(format!(
                "--remote=punix:{}",
                dir.path().join("db.sock").display()
            ))
            .spawn()
            .map_err(|e| missing("ovsdb-server", e))?;
        let netns = unique_name("ovs");
        let mut instance = OvsInstance {
            dir,
            netns: netns.clone(),
            ovsdb,
            vswitchd: None,
        };
        run(Command::new("ip").args(["netns", "add", &netns]))?;
        instance.exec_in_netns(&["ip", "link", "set", "lo", "up"])?;
        let db_sock = instance.db_socket();
        if !wait_until(Duration::from_secs(10), || db_sock.exists()) {
            return Err(instance.failure("ovsdb-server did not create its socket"));
        }
        instance.vsctl_no_wait(&["init"])?;
        instance.start_vswitchd()?;
        Ok(instance)
    }

    fn daemon(dir: &Path, program: &str, netns: Option<&str>) -> Command {
        let mut command = match netns {
            Some(netns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns, program]);
                command
            }
            None => Command::new(program),
        };
        command
            .env("OVS_RUNDIR", dir)
            .env("OVS_LOGDIR", dir)
            .env("OVS_DBDIR", dir)
            .arg(format!(
                "--unixctl={}",
                dir.join(format!("{program}.ctl")).display()
            ))
            .arg(format!(
                "--pidfile={}",
                dir.join(format!("{program}.pid")).display()
            ))
            .arg(format!(
                "--log-file={}",
                dir.join(format!("{program}.log")).display()
            ))
            .arg("--no-chdir")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
    }

    fn start_vswitchd(&mut self) -> std::io::Result<()> {
        let child = Self::daemon(self.dir.path(), "ovs-vswitchd", Some(&self.netns))
            .arg(format!("unix:{}", self.db_socket().display()))
            .spawn()
            .map_err(|e| missing("ovs-vswitchd", e))?;
        self.vswitchd = Some(child);
        // Without --no-wait, ovs-vsctl returns once ovs-vswitchd has applied the change.
        self.ovs_vsctl(&["set", "Open_vSwitch", ".", "external_ids:sluice-test=ready"])
            .map_err(|e| self.failure(&format!("ovs-vswitchd did not come up: {e}")))?;
        // After a restart the old management sockets are still on disk until the new process
        // replaces them: wait until each bridge's socket accepts connections.
        let bridges = self.ovs_vsctl(&["list-br"])?;
        for bridge in bridges.lines().filter(|line| !line.is_empty()) {
            let socket = self.mgmt_socket(bridge);
            if !wait_until(Duration::from_secs(10), || {
                std::os::unix::net::UnixStream::connect(&socket).is_ok()
            }) {
                return Err(
                    self.failure(&format!("{} never accepted connections", socket.display()))
                );
            }
        }
        Ok(())
    }

    /// Kills ovs-vswitchd (as a crash would: every flow is lost) and starts it again on the same
    /// database; returns once it has re-created the bridges.
    pub fn restart_vswitchd(&mut self) -> std::io::Result<()> {
        if let Some(mut child) = self.vswitchd.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.start_vswitchd()
    }

    /// The process id of ovs-vswitchd (e.g. to SIGSTOP it and test timeouts).
    pub fn vswitchd_pid(&self) -> Option<u32> {
        self.vswitchd.as_ref().map(Child::id)
    }

    /// The network namespace ovs-vswitchd and its ports live in.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// Runs a command in ovs-vswitchd's network namespace (e.g. `ip link add` for a port).
    pub fn exec_in_netns(&self, args: &[&str]) -> std::io::Result<String> {
        run(Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .args(args))
    }

    /// The database socket (`unix:` path for OVSDB clients).
    pub fn db_socket(&self) -> PathBuf {
        self.dir.path().join("db.sock")
    }

    /// Where bridge management sockets (`<bridge>.mgmt`) live.
    pub fn rundir(&self) -> &Path {
        self.dir.path()
    }

    /// The OpenFlow management socket of `bridge`.
    pub fn mgmt_socket(&self, bridge: &str) -> PathBuf {
        self.dir.path().join(format!("{bridge}.mgmt"))
    }

    fn vsctl_no_wait(&self, args: &[&str]) -> std::io::Result<String> {
        let mut full = vec!["--no-wait"];
        full.extend_from_slice(args);
        self.ovs_vsctl(&full)
    }

    /// Runs `ovs-vsctl` against this instance's database; the output on success, stderr in the
    /// error otherwise.
    pub fn ovs_vsctl(&self, args: &[&str]) -> std::io::Result<String> {
        run(Command::new("ovs-vsctl")
            .env("OVS_RUNDIR", self.dir.path())
            .arg(format!("--db=unix:{}", self.db_socket().display()))
            .arg("--timeout=20")
            .args(args))
    }

    /// Runs `ovs-ofctl` with this instance's run directory, so a bridge name finds its
    /// management socket here.
    pub fn ovs_ofctl(&self, args: &[&str]) -> std::io::Result<String> {
        run(Command::new("ovs-ofctl")
            .env("OVS_RUNDIR", self.dir.path())
            .args(args))
    }

    /// A command for `ovs-ofctl` with the environment set, for callers that feed stdin.
    pub fn ovs_ofctl_command(&self) -> Command {
        let mut command = Command::new("ovs-ofctl");
        command.env("OVS_RUNDIR", self.dir.path());
        command
    }

    /// Both daemons' logs, for failure messages.
    pub fn logs(&self) -> String {
        ["ovsdb-server.log", "ovs-vswitchd.log"]
            .iter()
            .map(|name| {
                let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
                format!("--- {name} ---\n{text}")
            })
            .collect()
    }

    fn failure(&self, what: &str) -> std::io::Error {
        std::io::Error::other(format!("{what}\n{}", self.logs()))
    }
}

impl Drop for OvsInstance {
    fn drop(&mut self) {
        if let Some(mut child) = self.vswitchd.take() {
            terminate(&mut child);
        }
        terminate(&mut self.ovsdb);
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// SIGTERM (so ovs-vswitchd removes its tap devices), then SIGKILL if it lingers.
fn terminate(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) on our own child's pid; it has not been reaped yet, so the pid is ours.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    let exited = wait_until(Duration::from_secs(5), || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    if !exited {
        let _ = child.kill();
    }
    let _ = child.wait();
}

fn missing(program: &str, error: std::io::Error) -> std::io::Error {
    std::io::Error::other(format!(
        "cannot run {program} (apt install openvswitch-switch): {error}"
    ))
}

/// Runs a command to completion; stdout on success, an error naming it with stderr otherwise.
pub(crate) fn run(command: &mut Command) -> std::io::Result<String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| std::io::Error::other(format!("cannot run {command:?}: {e}")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(std::io::Error::other(format!(
            "{command:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}
