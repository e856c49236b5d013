//! vm1's private Open vSwitch: its own `ovsdb-server` and userspace `ovs-vswitchd` with
//! database, sockets, pid files and logs in the demo directory, so the demo never touches a
//! system instance and two demos run side by side. ovs-vswitchd runs inside vm1's namespace,
//! where the agent's bridge and the uplink it takes over live (its netdev datapath also creates
//! tap devices there, not on the host).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::network::run;
use super::stop_child;

pub const SCHEMA: &str = "/usr/share/openvswitch/vswitch.ovsschema";
/// How long each daemon may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The two daemons, stopped (SIGTERM, so ovs-vswitchd removes its tap devices) on drop.
#[derive(Debug)]
pub struct DemoOvs {
    dir: PathBuf,
    ovsdb: Option<Child>,
    vswitchd: Option<Child>,
}

impl DemoOvs {
    /// Creates the database in `dir` and starts both daemons; returns once ovs-vswitchd has
    /// applied the initial configuration.
    pub fn start(dir: &Path, netns: &str) -> anyhow::Result<Self> {
        let mut ovs = DemoOvs {
            dir: dir.to_path_buf(),
            ovsdb: None,
            vswitchd: None,
        };
        let db = dir.join("conf.db");
        run(Command::new("ovsdb-tool")
            .arg("create")
            .arg(&db)
            .arg(SCHEMA))?;
        let mut ovsdb = ovs.daemon("ovsdb-server", None);
        ovsdb
            .arg(&db)
            .arg(format!("--remote=punix:{}", ovs.db_socket().display()));
        ovs.ovsdb = Some(ovsdb.spawn().context("starting ovsdb-server")?);
        let socket = ovs.db_socket();
        let started = Instant::now();
        // Connect, not just look: the socket file exists from bind(), and until listen() a
        // client is refused (seen under load: `ovs-vsctl init` failed with ECONNREFUSED).
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "ovsdb-server did not accept connections on {}",
                    socket.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        ovs.vsctl(&["--no-wait", "init"])?;
        let mut vswitchd = ovs.daemon("ovs-vswitchd", Some(netns));
        vswitchd.arg(format!("unix:{}", socket.display()));
        ovs.vswitchd = Some(vswitchd.spawn().context("starting ovs-vswitchd")?);
        // Without --no-wait, ovs-vsctl returns once ovs-vswitchd has applied the change.
        ovs.vsctl(&["set", "Open_vSwitch", ".", "external_ids:sluice-up=ready"])
            .context("ovs-vswitchd did not come up")?;
        Ok(ovs)
    }

    /// The OVSDB socket (in the run directory, where the agent looks by default).
    pub fn db_socket(&self) -> PathBuf {
        self.dir.join("db.sock")
    }

    fn daemon(&self, program: &str, netns: Option<&str>) -> Command {
        let mut command = match netns {
            Some(netns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns, program]);
                command
            }
            None => Command::new(program),
        };
        let file = |suffix: &str| self.dir.join(format!("{program}.{suffix}"));
        command
            .env("OVS_RUNDIR", &self.dir)
            .env("OVS_LOGDIR", &self.dir)
            .env("OVS_DBDIR", &self.dir)
            .arg(format!("--unixctl={}", file("ctl").display()))
            .arg(format!("--pidfile={}", file("pid").display()))
            .arg(format!("--log-file={}", file("log").display()))
            .arg("--no-chdir")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        crate::demo::cluster::die_with_parent(&mut command);
        command
    }

    fn vsctl(&self, args: &[&str]) -> anyhow::Result<String> {
        let timeout = format!("--timeout={}", START_TIMEOUT.as_secs());
        run(Command::new("ovs-vsctl")
            .env("OVS_RUNDIR", &self.dir)
            .arg(format!("--db=unix:{}", self.db_socket().display()))
            .arg(timeout)
            .args(args))
    }
}

impl Drop for DemoOvs {
    fn drop(&mut self) {
        if let Some(child) = self.vswitchd.take() {
            stop_child(child);
        }
        if let Some(child) = self.ovsdb.take() {
            stop_child(child);
        }
    }
}
