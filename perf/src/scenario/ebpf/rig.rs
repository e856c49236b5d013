//! The eBPF scenario's rig: the two namespaces and their veth pair, the trafgen flood, the
//! receiving socket, `kernel.bpf_stats_enabled` (restored on drop) and CPU pinning.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::{A_ADDR, BPF_STATS, B_ADDR, PAYLOAD, PORT};
use crate::process::Managed;

/// trafgen in its own process group: SIGINT to the group (parent and worker) stops it.
pub(super) struct Flood {
    pub(super) process: Managed,
    pub(super) stopped: bool,
}

impl Flood {
    pub(super) fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        if let Ok(pid) = libc::pid_t::try_from(self.process.pid()) {
            // SAFETY: signalling the process group of a child we spawned as its leader (setsid).
            unsafe { libc::kill(-pid, libc::SIGINT) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && self.process.check_alive().is_ok() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Flood {
    /// On an error path too; `Managed`'s own drop then reaps (or kills) the parent.
    fn drop(&mut self) {
        self.stop();
    }
}

pub(super) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".to_string())
}

pub(super) fn trafgen_version() -> anyhow::Result<String> {
    let output = Command::new("trafgen")
        .arg("--version")
        .output()
        .context("running trafgen (apt-get install netsniff-ng)")?;
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .next()
        .unwrap_or("trafgen")
        .trim()
        .to_string())
}

/// `kernel.bpf_stats_enabled` as found, put back at the end (and on drop, on error).
pub(super) struct BpfStats {
    pub(super) old: String,
}

impl BpfStats {
    pub(super) fn remember() -> anyhow::Result<Self> {
        let old = std::fs::read_to_string(BPF_STATS)
            .with_context(|| format!("reading {BPF_STATS}"))?
            .trim()
            .to_string();
        Ok(Self { old })
    }

    pub(super) fn set(&self, enabled: bool) -> anyhow::Result<()> {
        let value = if enabled { "1" } else { "0" };
        std::fs::write(BPF_STATS, value).with_context(|| format!("writing {BPF_STATS}"))
    }

    pub(super) fn restore(self) -> anyhow::Result<()> {
        std::fs::write(BPF_STATS, &self.old).with_context(|| format!("writing {BPF_STATS}"))
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(BPF_STATS, &self.old);
    }
}

pub(super) fn command(command: &mut Command) -> anyhow::Result<String> {
    let output = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A network namespace made here, deleted on drop (with the veth end inside it).
pub(super) struct Netns(pub(super) String);

impl Netns {
    pub(super) fn new(name: String) -> anyhow::Result<Self> {
        command(Command::new("ip").args(["netns", "add", &name]))?;
        let ns = Netns(name);
        // No IPv6: no router solicitations or neighbour discovery in the counts.
        ns.exec(&[
            "sh",
            "-c",
            "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6 && \
             echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6",
        ])?;
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub(super) fn exec(&self, args: &[&str]) -> anyhow::Result<String> {
        command(
            Command::new("ip")
                .args(["netns", "exec", &self.0])
                .args(args),
        )
    }

    /// Runs `body` on a thread inside this namespace (setns(2) moves only that thread).
    pub(super) fn run<T: Send>(&self, body: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
        let file = File::open(format!("/run/netns/{}", self.0))
            .with_context(|| format!("opening namespace {}", self.0))?;
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: setns(2) on an open namespace file; it moves only this thread.
                    let entered = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                    if entered != 0 {
                        bail!("setns: {}", std::io::Error::last_os_error());
                    }
                    Ok(body())
                })
                .join()
                .map_err(|_| anyhow::anyhow!("the thread in namespace {} panicked", self.0))?
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Namespaces a (`va`, 10.79.0.1) and b (`vb`, 10.79.0.2), veth between, static ARP.
pub(super) struct Pair {
    pub(super) a: Netns,
    pub(super) b: Netns,
    pub(super) va: String,
    pub(super) vb: String,
}

pub(super) struct Rx {
    pub(super) packets: u64,
    pub(super) dropped: u64,
}

impl Pair {
    pub(super) fn new() -> anyhow::Result<Self> {
        // Unique per harness process; interface names stay under 16 bytes.
        let id = std::process::id();
        let a = Netns::new(format!("sluice-perf-{id}-a"))?;
        let b = Netns::new(format!("sluice-perf-{id}-b"))?;
        let (va, vb) = (format!("spa{id}"), format!("spb{id}"));
        command(Command::new("ip").args([
            "link", "add", &va, "netns", &a.0, "type", "veth", "peer", "name", &vb, "netns", &b.0,
        ]))?;
        let pair = Pair { a, b, va, vb };
        for (ns, dev, addr) in [(&pair.a, &pair.va, A_ADDR), (&pair.b, &pair.vb, B_ADDR)] {
            ns.exec(&["ip", "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ns.exec(&["ip", "link", "set", dev, "up"])?;
        }
        // Permanent neighbours: no ARP on the wire.
        let (mac_a, mac_b) = (pair.mac_a()?, pair.mac_b()?);
        for (ns, dev, peer, mac) in [
            (&pair.a, &pair.va, B_ADDR, &mac_b),
            (&pair.b, &pair.vb, A_ADDR, &mac_a),
        ] {
            ns.exec(&[
                "ip",
                "neigh",
                "replace",
                peer,
                "lladdr",
                mac,
                "dev",
                dev,
                "nud",
                "permanent",
            ])?;
        }
        Ok(pair)
    }

    pub(super) fn mac_a(&self) -> anyhow::Result<String> {
        Ok(self
            .a
            .exec(&["cat", &format!("/sys/class/net/{}/address", self.va)])?
            .trim()
            .to_string())
    }

    pub(super) fn mac_b(&self) -> anyhow::Result<String> {
        Ok(self
            .b
            .exec(&["cat", &format!("/sys/class/net/{}/address", self.vb)])?
            .trim()
            .to_string())
    }

    /// One packet, repeated: Ethernet, IPv4, UDP (trafgen fills in lengths and checksums).
    pub(super) fn trafgen_config(&self) -> anyhow::Result<String> {
        Ok(format!(
            "{{ eth(da={}, sa={}), ipv4(saddr={A_ADDR}, daddr={B_ADDR}, ttl=64), \
             udp(sp=4000, dp={PORT}), fill(0x5a, {PAYLOAD}) }}\n",
            self.mac_b()?,
            self.mac_a()?
        ))
    }

    /// `vb`'s receive counters, from /proc/net/dev as seen inside namespace b.
    pub(super) fn rx(&self) -> anyhow::Result<Rx> {
        let text = self
            .b
            .run(|| std::fs::read_to_string("/proc/thread-self/net/dev"))??;
        parse_net_dev(&text, &self.vb).with_context(|| format!("no {} in /proc/net/dev", self.vb))
    }
}

pub(super) fn parse_net_dev(text: &str, dev: &str) -> Option<Rx> {
    text.lines().find_map(|line| {
        let (name, fields) = line.split_once(':')?;
        if name.trim() != dev {
            return None;
        }
        // receive: bytes packets errs drop fifo frame compressed multicast, then transmit.
        let fields: Vec<u64> = fields
            .split_whitespace()
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        Some(Rx {
            packets: *fields.get(1)?,
            dropped: *fields.get(3)?,
        })
    })
}

/// The UDP socket in namespace b that reads the flood, on its own thread pinned to the
/// receiver CPU: without a reader the stack would answer port-unreachable (or fill a buffer).
pub(super) struct Receiver {
    pub(super) read: Arc<AtomicU64>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    pub(super) fn start(pair: &Pair, cpu: &str) -> anyhow::Result<Self> {
        let socket = pair
            .b
            .run(|| std::net::UdpSocket::bind((B_ADDR, PORT)))?
            .context("binding the receiving socket")?;
        socket.set_read_timeout(Some(Duration::from_millis(100)))?;
        let cpus = crate::affinity::parse_cpus(cpu)?;
        let read = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("perf-udp-reader".to_string())
            .spawn({
                let (read, stop) = (read.clone(), stop.clone());
                move || {
                    // Best effort: an unpinned reader still reads.
                    if let Err(error) = crate::affinity::pin_this_thread(&cpus) {
                        eprintln!("cannot pin the UDP reader: {error}");
                    }
                    let mut buffer = [0u8; 2048];
                    while !stop.load(Ordering::Relaxed) {
                        if socket.recv(&mut buffer).is_ok() {
                            read.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })?;
        Ok(Self {
            read,
            stop,
            thread: Some(thread),
        })
    }

    pub(super) fn read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
