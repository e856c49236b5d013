//! `sluice up`'s VM policy pillar. As root with Open vSwitch installed: two network namespaces
//! as VMs joined by a veth pair, a private userspace Open vSwitch for vm1, the VM objects and
//! the `demo` policy in the embedded control plane, and `sluice vm-agent` inside vm1 taking its
//! `eth0` over and enforcing the policy. Otherwise, or when any step fails, one line saying why
//! and the policy's compiled flows; `up` goes on with its other pillars either way.

mod banner;
mod forward;
mod network;
mod ovs;
pub mod policy;

use std::net::Ipv4Addr;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::demo::controlplane::DemoControlPlane;
use forward::Forwarder;
use network::DemoVms;
use ovs::DemoOvs;

/// The bridge the agent creates in vm1's Open vSwitch.
const BRIDGE: &str = "br-vm";
/// How long a stopping child (the agent, the OVS daemons) gets after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// The agent's heartbeat: short, so `kubectl get vm` shows it Connected soon after start.
const REPORT_INTERVAL: &str = "5s";
/// The programs the demo runs.
const PROGRAMS: [&str; 6] = [
    "ip",
    "ethtool",
    "ovsdb-tool",
    "ovsdb-server",
    "ovs-vswitchd",
    "ovs-vsctl",
];

/// What `up` shows of the VM pillar.
#[derive(Debug)]
pub enum VmPillar {
    Running(Box<VmDemo>),
    /// Not started: why, and the demo policy's flows for a VM whose `eth0` is on port 1.
    NotStarted {
        reason: String,
        vm1_ip: Ipv4Addr,
        vm2_ip: Ipv4Addr,
        flows: Result<String, String>,
    },
}

/// The running VM demo; everything it created goes on drop.
#[derive(Debug)]
pub struct VmDemo {
    pub vm1: String,
    pub vm2: String,
    pub vm1_ip: Ipv4Addr,
    pub vm2_ip: Ipv4Addr,
    pub agent_log: PathBuf,
    /// Never read: held so that dropping the demo tears it down.
    #[allow(dead_code)]
    parts: Parts,
}

/// What the demo created, torn down in reverse order: the agent (SIGTERM, so it stops
/// cleanly), the forwarder (its listening socket holds vm1's namespace), ovs-vswitchd and
/// ovsdb-server, the namespaces (and with them the veth pair, the taken-over uplink and the
/// bridge's devices), then the directory.
#[derive(Debug)]
struct Parts {
    dir: PathBuf,
    agent: Option<Child>,
    forwarder: Option<Forwarder>,
    ovs: Option<DemoOvs>,
    vms: Option<DemoVms>,
}

impl Drop for Parts {
    fn drop(&mut self) {
        if let Some(agent) = self.agent.take() {
            stop_child(agent);
        }
        self.forwarder = None;
        self.ovs = None;
        self.vms = None;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// SIGTERM, up to [`STOP_TIMEOUT`] to exit, then SIGKILL.
fn stop_child(mut child: Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) on our own child, not yet reaped, so the pid is still ours.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let started = Instant::now();
    while started.elapsed() < STOP_TIMEOUT {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(program))
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
    })
}

/// What this machine lacks for the demo, in the words of the one line `up` prints.
fn missing_prerequisites() -> Vec<String> {
    let mut missing = Vec::new();
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        missing.push("root".to_string());
    }
    missing.extend(
        PROGRAMS
            .iter()
            .filter(|program| !on_path(program))
            .map(|program| program.to_string()),
    );
    if !Path::new(ovs::SCHEMA).is_file() {
        missing.push(ovs::SCHEMA.to_string());
    }
    missing
}

impl VmPillar {
    /// Starts the demo when this machine can run it; never fails `up`.
    pub fn start(demo_dir: &Path, controlplane: &DemoControlPlane) -> Self {
        let missing = missing_prerequisites();
        if !missing.is_empty() {
            return Self::not_started(format!(
                "needs root and Open vSwitch; missing: {}",
                missing.join(", ")
            ));
        }
        match VmDemo::start(demo_dir, controlplane) {
            Ok(demo) => VmPillar::Running(Box::new(demo)),
            Err(error) => {
                // Logging is not set up yet at this point of `up`: one line on stderr.
                eprintln!("sluice up: VM policy demo not started, cleaned up, going on without it: {error:#}");
                Self::not_started(format!("failed: {error:#}"))
            }
        }
    }

    /// The fallback: `reason` and the flows for the addresses this process would have used.
    pub fn not_started(reason: String) -> Self {
        let (vm1_ip, vm2_ip) =
            network::vm_addresses(network::candidate_subnet(std::process::id(), 0));
        VmPillar::NotStarted {
            reason,
            vm1_ip,
            vm2_ip,
            flows: policy::compiled_flows(vm1_ip, vm2_ip).map_err(|error| format!("{error:#}")),
        }
    }
}

impl VmDemo {
    fn start(demo_dir: &Path, controlplane: &DemoControlPlane) -> anyhow::Result<Self> {
        let dir = demo_dir.join("vm");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        // From here on, a failure drops `parts`, which removes whatever was created.
        let mut parts = Parts {
            dir: dir.clone(),
            agent: None,
            forwarder: None,
            ovs: None,
            vms: None,
        };
        network::remove_stale_namespaces();
        let vms = parts.vms.insert(DemoVms::create()?);
        let (vm1, vm2, vm1_ip, vm2_ip) = (vms.vm1.clone(), vms.vm2.clone(), vms.vm1_ip, vms.vm2_ip);
        parts.ovs = Some(DemoOvs::start(&dir, &vm1)?);
        parts.forwarder = Some(Forwarder::start(&vm1, controlplane.address)?);
        let token_file = dir.join("vm1.token");
        controlplane.store_vm_demo(
            policy::control_plane_objects(vm1_ip, vm2_ip),
            "vm1",
            &token_file,
        )?;
        let agent_log = dir.join("vm-agent.log");
        parts.agent = Some(spawn_agent(
            &dir,
            &vm1,
            controlplane.ca_file(),
            &token_file,
            &agent_log,
        )?);
        Ok(VmDemo {
            vm1,
            vm2,
            vm1_ip,
            vm2_ip,
            agent_log,
            parts,
        })
    }
}

/// `sluice vm-agent` (this very binary) inside vm1, watching vm1 on the control plane through
/// the forwarder; its output goes to `log`.
fn spawn_agent(
    dir: &Path,
    vm1: &str,
    ca_file: &Path,
    token_file: &Path,
    log: &Path,
) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("finding the sluice binary")?;
    let log_file =
        std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", vm1])
        .arg(exe)
        .args(["vm-agent", "--bridge", BRIDGE, "--vm", "vm1"])
        .arg("--controlplane")
        .arg(format!("https://{}", forward::VM_SIDE))
        .arg("--controlplane-ca")
        .arg(ca_file)
        .arg("--token-file")
        .arg(token_file)
        .arg("--state-dir")
        .arg(dir.join("vm1-state"))
        .arg("--ovs-rundir")
        .arg(dir)
        .args([
            "--admin",
            "127.0.0.1:0",
            "--report-interval",
            REPORT_INTERVAL,
        ])
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file);
    crate::demo::cluster::die_with_parent(&mut command);
    command.spawn().context("starting the VM agent")
}
